"""GPU kernels of batch normalisation on channels-last batches (the layout cuDNN's convolutions give).

A batch of channels-last image rows is an (M, C) array: M = samples x
pixels rows, one column per channel. Written with array expressions, the
NumPy kernels of norm.py make each channel's sums along a transposed view
(reads strided by C) and several full-size float32 temporaries per call;
on a GPU that made BatchNorm most of a ResNet step. Here:

- `channel_sums`: each thread owns one channel of a chunk of rows, so a
  warp reads 32 adjacent channels of a row (coalesced), accumulating in
  double; the chunks' partial sums (a few MB) are added by one reduction.
  The statistics take one pass: the sums of (x - k) and (x - k)^2 around
  a shift k every worker holds alike (the running mean), summed over the
  workers by one all-reduce; in double, var = S2/M - (S1/M)^2 loses
  nothing that float32 data holds unless the batch mean is some 10^6
  standard deviations from the shift (the float32 E[x^2] - E[x]^2 is why
  the NumPy kernel takes two passes). The backward pass sums
  [sum(g), sum(g * (x - mean))] with g = dy, masked by y > 0 after a fused
  relu.
- `normalize`: y = (x - mean) * scale + shift (+ r, a residual) (relu), one pass.
- `input_gradient`: dx = a * g + b * (x - mean) + c per channel, one pass;
- y (forward), dy and y (backward) may be a window of wider rows: channels
  off .. off + C of rows of ld values, a concatenation's slice written and
  read in place (an Inception module's branches, dmath.nn.batchnorm's window);
  with a residual it also writes dr = g (dy masked by y > 0), so a
  residual block's tail costs no pass of its own in either direction.

Values are read into float (double for double data) and written with one
rounding, as the other GPU kernels (dmath/gpu/launcher.py).
"""
import warnings

import numpy as np

from ... import backend, memory
from ...gpu import launcher

SOURCE = r"""
template <typename T, int MODE, bool RELU>
__global__ void dm_bn_sums(const T* x, const T* dy, const T* y, const double* mean, double* partial,
                           long long M, int C, long long rows, long long ld, int off) {
    int c = blockIdx.y * blockDim.x + threadIdx.x;
    if (c >= C) return;
    long long r0 = (long long)blockIdx.x * rows;
    long long r1 = r0 + rows < M ? r0 + rows : M;
    double m = MODE > 0 ? mean[c] : 0.0;
    double s0 = 0.0, s1 = 0.0;
    for (long long r = r0; r < r1; ++r) {
        long long i = r * C + c;
        double v = (double)dm_val(x[i]);
        if (MODE == 0) {
            s0 += v;
        } else if (MODE == 3) {
            double d = v - m;
            s0 += d;
            s1 += d * d;
        } else if (MODE == 1) {
            double d = v - m;
            s0 += d * d;
        } else {
            long long j = r * ld + off + c;         // dy and y: channels off.. of rows of ld
            double g = (double)dm_val(dy[j]);
            if (RELU && !(dm_val(y[j]) > 0)) g = 0.0;
            s0 += g;
            s1 += g * (v - m);
        }
    }
    int k = MODE >= 2 ? 2 : 1;
    partial[((long long)blockIdx.x * k) * C + c] = s0;
    if (MODE >= 2) partial[((long long)blockIdx.x * k + 1) * C + c] = s1;
}

template <typename T, bool RELU, bool RES>
__global__ void dm_bn_normalize(const T* x, const T* res, T* y, const typename Acc<T>::type* mean,
                                const typename Acc<T>::type* scale, const typename Acc<T>::type* shift,
                                long long total, int C, long long ld, int off) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= total) return;
    long long r = i / C;
    int c = (int)(i - r * C);
    typename Acc<T>::type v = (dm_val(x[i]) - mean[c]) * scale[c] + shift[c];
    if (RES) v += dm_val(res[i]);
    if (RELU && v < 0) v = 0;
    y[r * ld + off + c] = dm_cast<T>(v);       // y: channels off.. of rows of ld (a concatenation's)
}

template <typename T, bool RELU, bool DR>
__global__ void dm_bn_dx(const T* dy, const T* x, const T* y, T* dx, T* dr, const typename Acc<T>::type* mean,
                         const typename Acc<T>::type* a, const typename Acc<T>::type* b,
                         const typename Acc<T>::type* c0, long long total, int C, long long ld, int off) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= total) return;
    long long r = i / C;
    int c = (int)(i - r * C);
    long long j = r * ld + off + c;             // dy and y: channels off.. of rows of ld
    T raw = dy[j];
    typename Acc<T>::type g = dm_val(raw);
    bool masked = RELU && !(dm_val(y[j]) > 0);
    if (masked) g = 0;
    if (DR) dr[i] = masked ? dm_cast<T>(0.0) : raw;     // the residual's gradient: dy where y > 0, exactly
    dx[i] = dm_cast<T>(a[c] * g + b[c] * (dm_val(x[i]) - mean[c]) + c0[c]);
}
"""

_TYPES = launcher.C_TYPES
#: the sums' threads: one per (chunk of rows, channel); about this many in all
_SUM_THREADS = 1 << 18


def _names():
    out = []
    for t in _TYPES.values():
        for relu in ("false", "true"):
            out += [f"dm_bn_sums<{t}, {mode}, {relu}>" for mode in (0, 1, 2, 3)]
            for extra in ("false", "true"):
                out += [f"dm_bn_normalize<{t}, {relu}, {extra}>", f"dm_bn_dx<{t}, {relu}, {extra}>"]
    return out


def _fn(name, dtype, *params):
    expression = f"{name}<{', '.join((_TYPES[np.dtype(dtype).name],) + tuple(params))}>"
    return launcher.function(SOURCE, expression, _names())


#: None until the module is first compiled; then whether it compiled (else the array kernels run)
_COMPILED = None


def usable(x2):
    """Whether the GPU kernels take this local batch: a C-contiguous device array, and the module
    compiled here (a compiler that refuses it leaves BatchNorm to norm.py's array kernels, with a
    warning, rather than failing a training step)."""
    global _COMPILED
    if not (backend.current().is_gpu and x2.flags.c_contiguous):
        return False
    if _COMPILED is None:
        try:
            _fn("dm_bn_sums", "float32", "0", "false")
            _COMPILED = True
        except Exception as exc:        # noqa: BLE001 - any compiler failure: the array kernels still work
            warnings.warn(f"dmath: the BatchNorm GPU kernels did not compile ({exc}); using the array kernels")
            _COMPILED = False
    return _COMPILED


def _acc(dtype):
    return np.float64 if np.dtype(dtype) == np.float64 else np.float32


def channel_sums(mode, x2, mean=None, dy2=None, y2=None, off=0):
    """Per-channel sums (double, shape (k, C)) of the (M, C) batch x2 (see the module docstring).
    mode 0: [sum x]; 1: [sum (x - mean)^2]; 2: [sum g, sum g (x - mean)], g = dy2 (masked by y2 > 0
    when y2 is given); 3: [sum (x - mean), sum (x - mean)^2] around a shift given as `mean` (one pass
    for both statistics). mean: a double array of C values (modes 1 to 3). dy2 and y2 may be wider
    (M, L) arrays whose channels off .. off + C are read."""
    xp = backend.current().xp
    M, C = x2.shape
    k = 2 if mode >= 2 else 1
    if M == 0 or C == 0:
        return xp.zeros((k, C), dtype=np.float64)
    threads = min(256, 32 * -(-C // 32))
    chunks = max(1, min(M, _SUM_THREADS // C))
    rows = -(-M // chunks)
    chunks = -(-M // rows)
    partial = memory.empty((chunks, k, C), np.float64)
    relu = "true" if y2 is not None else "false"
    fn = _fn("dm_bn_sums", x2.dtype, str(mode), relu)
    dummy = x2
    fn((chunks, -(-C // threads)), (threads,),
       (x2, dy2 if dy2 is not None else dummy, y2 if y2 is not None else dummy,
        mean if mean is not None else partial, partial, np.int64(M), np.int32(C), np.int64(rows),
        np.int64(dy2.shape[1] if dy2 is not None else C), np.int32(off)))
    return partial.sum(axis=0)


def normalize(x2, out2, mean, scale, shift, relu, res2=None, off=0):
    """out2 = (x2 - mean) * scale + shift (+ res2) per channel (relu: then max(., 0)); the
    per-channel arrays in float (double for double data); res2: None or an (M, C) array like x2;
    out2 may be a wider (M, L) array, written in its channels off .. off + C only."""
    acc = _acc(x2.dtype)
    args = [a.astype(acc, copy=False) for a in (mean, scale, shift)]
    total = x2.size
    fn = _fn("dm_bn_normalize", x2.dtype, "true" if relu else "false", "true" if res2 is not None else "false")
    launcher.launch(fn, total, (x2, res2 if res2 is not None else x2, out2, *args, np.int64(total),
                                np.int32(x2.shape[1]), np.int64(out2.shape[1]), np.int32(off)))


def input_gradient(dy2, x2, y2, dx2, mean, a, b, c0, dr2=None, off=0):
    """dx2 = a * g + b * (x2 - mean) + c0 per channel, g = dy2 masked by y2 > 0 when y2 is given;
    dr2: None, or an (M, C) array that receives g (a residual's gradient) in the same pass. dy2 and
    y2 may be wider (M, L) arrays whose channels off .. off + C are read."""
    acc = _acc(x2.dtype)
    args = [v.astype(acc, copy=False) for v in (mean, a, b, c0)]
    total = x2.size
    fn = _fn("dm_bn_dx", x2.dtype, "true" if y2 is not None else "false", "true" if dr2 is not None else "false")
    launcher.launch(fn, total, (dy2, x2, y2 if y2 is not None else x2, dx2, dr2 if dr2 is not None else dx2,
                                *args, np.int64(total), np.int32(x2.shape[1]), np.int64(dy2.shape[1]),
                                np.int32(off)))
