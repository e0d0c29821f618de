"""2-D pooling kernels (max and average) over each worker's samples; no communication.

Max pooling also returns, per output pixel, the position of the maximum
inside its window (i * kw + j, the first maximum on ties) as a matrix of
the output's shape: small integers, exact in the index dtype the master
chose, and an ordinary matrix, so that a recorded training step replays it
like any other. A max pool told that its input is a relu's output
(`after_relu`) marks the windows whose maximum is 0 with position -1, which
no input pixel matches: the backward pass then also applies the relu's
mask, exactly (a pixel the relu zeroed can only be the maximum of a window
whose maximum is 0), and the relu's own backward pass is skipped. Average
pooling divides by kh*kw, padding included (PyTorch's
count_include_pad=True). Padding of a max pool is -inf.
"""
from typing import NamedTuple

import numpy as np

from ... import backend, memory
from ...errors import DMathError
from ...planning import conv as window
from ...planning.conv import Geometry
from ...runtime import define
from ...gpu import launcher as cuda
from . import args, rows
from ..base import dispatch, new_meta
from .windows import channels_first, channels_last_into, images, padded, tap, windows

#: float16 represents every integer up to 2**11 exactly (max-pool window positions)
_F16_EXACT_INT = 2048
_POOL_MODES = ("max", "average")


class PoolArgs(NamedTuple):
    """Static arguments of `nn_pool2d` and `nn_pool2d_backward`."""
    geometry: Geometry   # a ceil-mode pool's has eh, ew: windows past the image read only what they reach
    mode: str            # 'max' or 'average'
    channels_last: bool  # the batches (and argmax) are channels-last rows (format.py)
    after_relu: bool = False  # max only: windows whose maximum is not positive get argmax -1


POOL2D = define("nn_pool2d", PoolArgs)
POOL2D_BACKWARD = define("nn_pool2d_backward", PoolArgs)


# ---- master halves ----------------------------------------------------------------------
def _pool_args(op, image, kernel, stride, padding, mode, channels_last, what, after_relu=False, ceil_mode=False):
    """`op`'s checked static arguments."""
    if mode not in _POOL_MODES:
        raise DMathError(f"{what}: mode must be 'max' or 'average', got {mode!r}")
    ceil_mode = args.flag(ceil_mode, f"{what}: ceil_mode")
    after_relu = args.flag(after_relu, f"{what}: after_relu")
    if ceil_mode and mode != "max":
        raise DMathError(f"{what}: ceil_mode applies to max pooling (an average's divisor at the edge is "
                         f"PyTorch's own rule, not implemented here)")
    if after_relu and mode != "max":
        raise DMathError(f"{what}: after_relu applies to max pooling only (an average pool's gradient reaches "
                         f"every pixel of its window, so it cannot carry the relu's mask)")
    return op.static(geometry=window.pool_geometry(image, kernel, stride, padding, what, ceil_mode), mode=mode,
                     channels_last=args.flag(channels_last, f"{what}: channels_last"), after_relu=after_relu)


def _argmax_dtype(dtype, taps):
    return "float32" if dtype == "float16" and taps > _F16_EXACT_INT else dtype


def pool2d(x, image_shape, kernel, stride=None, padding=(0, 0), mode="max", channels_last=False, after_relu=False,
           ceil_mode=False):
    """Max or average pooling of an image batch x (N, C*H*W): (Y, argmax).

    kernel, stride (default: the kernel) and padding are ints or (h, w)
    pairs. Y is (N, C*Ho*Wo) in x's row layout. For 'max', argmax is a
    matrix of Y's shape holding the position i*kw + j of each maximum in its
    window (exact small integers, in Y's dtype; float32 for float16 windows
    of more than 2048 taps), to pass to pool2d_backward; None for 'average',
    which divides by kh*kw including padding (PyTorch's count_include_pad).
    channels_last: x, Y and argmax are channels-last rows (N, H*W*C)
    (dmath.nn.to_channels_last); image_shape is still (C, H, W).
    after_relu (max only): x is a relu's output. A window whose maximum is
    not positive gets argmax -1, so pool2d_backward's dX is also masked by
    the relu (exactly what where(x, dX, 0) gives) and the relu's backward
    can be skipped. ceil_mode (max only): PyTorch's, Ho = ceil((H + 2p - k)
    / s) + 1 (less one where the last window would start in the padding);
    the windows that reach past the image pool what they cover (no padded
    copy of the batch is made).
    """
    x = args.rows(x, "pool2d: x")
    image = window.image(image_shape, x.shape[1], "pool2d")
    static = _pool_args(POOL2D, image, kernel, stride, padding, mode, channels_last, "pool2d", after_relu,
                        ceil_mode)
    g = static.geometry
    shape = (x.shape[0], image[0] * g.out_h * g.out_w)
    outs = [new_meta(x.layout, shape, x.dtype)]
    if mode == "max":
        outs.append(new_meta(x.layout, shape, _argmax_dtype(x.dtype, g.taps)))
    made, _ = dispatch("nn_pool2d", [x], outs, static=static)
    return (made[0], made[1]) if mode == "max" else (made[0], None)


def pool2d_backward(dy, argmax, image_shape, kernel, stride=None, padding=(0, 0), mode="max", channels_last=False,
                    ceil_mode=False):
    """d loss / d x of pool2d: dX (N, C*H*W) in dy's row layout and dtype.

    argmax: the matrix pool2d returned (required for 'max'; ignored for
    'average', pass None). The other arguments are pool2d's.
    """
    dy = args.rows(dy, "pool2d_backward: dy")
    image = window.image(image_shape, None, "pool2d_backward")
    static = _pool_args(POOL2D_BACKWARD, image, kernel, stride, padding, mode, channels_last, "pool2d_backward",
                        ceil_mode=ceil_mode)
    g = static.geometry
    args.expect_shape(dy, (dy.shape[0], image[0] * g.out_h * g.out_w),
                      f"pool2d_backward: dy (pool2d's output for a {g.out_h}x{g.out_w} window grid: the same "
                      f"kernel, stride, padding and ceil_mode as the forward call's)")
    inputs = [dy]
    if mode == "max":
        args.require(argmax, "pool2d_backward: argmax (from pool2d with mode='max')")
        args.expect_shape(argmax, dy.shape, "pool2d_backward: argmax")
        inputs.append(args.like(argmax, dy, "pool2d_backward: argmax"))
    out = new_meta(dy.layout, (dy.shape[0], image[0] * image[1] * image[2]), dy.dtype)
    return dispatch("nn_pool2d_backward", inputs, [out], static=static)[0][0]


# ---- kernels -------------------------------------------------------------------------------
@POOL2D.kernel(capturable=True)
def _pool2d(call):
    """Input X; outputs Y[, argmax] (n, C*Ho*Wo). Channels-last rows are converted at the edges."""
    g, mode, last = call.entry.static.geometry, call.entry.static.mode, call.entry.static.channels_last
    x = rows.local(call.inputs[0])
    if x is None:
        return rows.nothing_here(call)
    if last:
        x = channels_first(x, g.channels, g.height, g.width)
    n = x.shape[0]
    outs = rows.new_output(call, 0) + (rows.new_output(call, 1) if mode == "max" else [])
    # channels-last: computed into NCHW temporaries, converted into the outputs at the end
    res = [memory.empty(o.shape, o.dtype) for o in outs] if last else outs
    y = res[0].reshape(n, g.channels, g.out_h, g.out_w)
    if mode == "average":
        cdt = rows.compute_dtype(x.dtype)
        v = windows(padded(images(x, g), g, 0, cdt), g)
        y[...] = v.sum(axis=(2, 3)) * (1.0 / g.taps)
    else:
        _max_taps(x, g, y, res[1].reshape(y.shape))
        if call.entry.static.after_relu:
            backend.current().xp.copyto(res[1], -1, where=res[0] <= 0)
    if last:
        for o, r in zip(outs, res):
            channels_last_into(o, r, g.channels, g.out_h, g.out_w)
    return [rows.shard(call, k, [o]) for k, o in enumerate(outs)]


def _max_taps(x, g, y, arg):
    """y, arg (n, C, Ho, Wo) = the window maxima of the NCHW rows x and their positions."""
    # the max is exact in the data's own dtype: no widening needed. One pass per kernel tap over
    # the output (a strided slab each), keeping the first maximum as argmax does; NaN wins and stays.
    # Only the image's pixels can be a window's position (PyTorch's rule: a window of -inf values
    # routes its gradient to its first pixel, not to the padding), as the CUDA kernels decide
    xp = backend.current().xp
    xpad = padded(images(x, g), g, -np.inf, x.dtype)
    oy, ox = np.arange(g.out_h) * g.sh - g.ph, np.arange(g.out_w) * g.sw - g.pw     # each window's first tap
    taken = np.zeros((g.out_h, g.out_w), dtype=bool)        # a position chosen yet (per window)
    for i in range(g.kh):
        for j in range(g.kw):
            inside = ((oy + i >= 0) & (oy + i < g.height))[:, None] & ((ox + j >= 0) & (ox + j < g.width))[None, :]
            if not inside.any():
                continue
            slab = tap(xpad, g, i, j)
            if not taken.any() and inside.all():            # the first tap, inside every window
                y[...] = slab
                arg.fill(i * g.kw + j)
            else:
                better = (slab > y) | (xp.isnan(slab) & ~xp.isnan(y))
                if not (taken.all() and inside.all()):      # (the usual pass needs no masks)
                    better = xp.asarray(inside) & (xp.asarray(~taken) | better)
                xp.copyto(y, slab, where=better)
                xp.copyto(arg, i * g.kw + j, where=better)
            taken |= inside


@POOL2D_BACKWARD.kernel(capturable=True)
def _pool2d_backward(call):
    """Inputs dY[, argmax]; output dX (n, C*H*W).

    One pass per kernel tap: each adds its (n, C, Ho, Wo) slab of gradient
    (masked by argmax for max pooling) into the padded input gradient. Channels-last rows are
    converted at the edges.
    """
    g, mode, last = call.entry.static.geometry, call.entry.static.mode, call.entry.static.channels_last
    dy = rows.local(call.inputs[0])
    if dy is None:
        return rows.nothing_here(call)
    n = dy.shape[0]
    if last:
        dy = channels_first(dy, g.channels, g.out_h, g.out_w)
    cdt = rows.compute_dtype(dy.dtype)
    dy4 = dy.reshape(n, g.channels, g.out_h, g.out_w).astype(cdt, copy=False)
    xp = backend.current().xp
    dpad = memory.zeros((n, g.channels, g.height + 2 * g.ph + g.eh, g.width + 2 * g.pw + g.ew), cdt)
    if mode == "average":
        scaled = dy4 * (1.0 / g.taps)
        for i in range(g.kh):
            for j in range(g.kw):
                slab = tap(dpad, g, i, j)
                slab += scaled
    else:
        am = rows.local(call.inputs[1])
        am = (channels_first(am, g.channels, g.out_h, g.out_w) if last else am).reshape(dy4.shape)
        for i in range(g.kh):
            for j in range(g.kw):
                slab = tap(dpad, g, i, j)
                slab += xp.where(am == i * g.kw + j, dy4, 0)
    (dx,) = rows.new_output(call, 0)
    inner = dpad[:, :, g.ph:g.ph + g.height, g.pw:g.pw + g.width]
    if last:
        dx.reshape(n, g.height, g.width, g.channels)[...] = inner.transpose(0, 2, 3, 1)
    else:
        dx.reshape(n, g.channels, g.height, g.width)[...] = inner
    return [rows.shard(call, 0, [dx])]



# ---- CUDA kernels ------------------------------------------------------------------------------
# cuDNN's pooling (its resample operation) is not reachable through the frontend's Python graph
# API, so the GPU runs these: one thread per output (forward) or per input pixel (backward,
# gathering from the windows that cover it: no atomics, the same sums on every run). Pooling
# reads and writes each value once: memory-bound, as cuDNN's own kernels are.
_CUDA_SOURCE = r"""
struct Win { int C, H, W, Ho, Wo, kh, kw, sh, sw, ph, pw; };
#define DM_WIN_ARGS int C, int H, int W, int Ho, int Wo, int kh, int kw, int sh, int sw, int ph, int pw
#define DM_WIN Win g = {C, H, W, Ho, Wo, kh, kw, sh, sw, ph, pw}

// The bodies are templates on the index type: 32-bit index arithmetic (divisions above all) is
// several times cheaper on a GPU than 64-bit, so arrays below 2**31 elements take the int path.
// Channels-last (nhwc): a pixel's C values are adjacent, so an image plane is read with stride C
// from the sample's start plus the channel.
template <typename T, typename A, typename I>
__device__ void pool_fwd(const T* x, T* y, A* arg, const Win& g, I o, int is_max, int nhwc, int after_relu) {
    typedef typename Acc<T>::type R;
    const R neg_inf = (R)__longlong_as_double(0xfff0000000000000ULL);
    int ox, oy, es;
    const T* src;
    if (nhwc) {
        I q = o / g.C;
        ox = (int)(q % g.Wo); oy = (int)((q / g.Wo) % g.Ho);
        src = x + (q / ((I)g.Wo * g.Ho)) * g.H * g.W * g.C + (int)(o % g.C);
        es = g.C;
    } else {
        ox = (int)(o % g.Wo); oy = (int)((o / g.Wo) % g.Ho);
        src = x + (o / ((I)g.Wo * g.Ho)) * g.H * g.W;
        es = 1;
    }
    R best = 0, sum = 0;
    int at = -1;
    for (int i = 0; i < g.kh; ++i) {
        int yy = oy * g.sh - g.ph + i;
        for (int j = 0; j < g.kw; ++j) {
            int xx = ox * g.sw - g.pw + j;
            bool inside = yy >= 0 && yy < g.H && xx >= 0 && xx < g.W;
            R v = inside ? dm_val(src[(I)(yy * g.W + xx) * es]) : (is_max ? neg_inf : (R)0);
            if (is_max) {
                // the first maximum in (i, j) order among the image's pixels (a padding tap is never the
                // position: PyTorch's rule, which a window of -inf values shows); NaN wins and stays
                if (inside && (at < 0 || v > best || (v != v && best == best))) { best = v; at = i * g.kw + j; }
            } else {
                sum += v;
            }
        }
    }
    // after a relu, a window whose maximum is 0 routes no gradient (-1 matches no tap): the relu's mask
    if (is_max && after_relu && best <= (R)0) at = -1;
    if (is_max) { y[o] = dm_cast<T>((double)best); arg[o] = dm_cast<A>((double)at); }
    else { y[o] = dm_cast<T>((double)(sum / (R)(g.kh * g.kw))); }
}

template <typename T, typename A>
__global__ void dm_pool_fwd(const T* x, T* y, A* arg, DM_WIN_ARGS, long long total, int is_max, int nhwc,
                            int after_relu) {
    DM_WIN;
    long long o = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (o >= total) return;
    if (total <= 2147483647LL) pool_fwd<T, A, int>(x, y, arg, g, (int)o, is_max, nhwc, after_relu);
    else pool_fwd<T, A, long long>(x, y, arg, g, o, is_max, nhwc, after_relu);
}

// a / d for 0 <= a < 2**24: a float estimate (off by at most one) and one correction step. A GPU
// has no integer divider: a 32-bit division is a sequence of some twenty instructions, and the
// index arithmetic of pooling's backward pass was most of its time.
__device__ __forceinline__ int dm_div(int a, int d, float inv) {
    int q = (int)((float)a * inv);
    int r = a - q * d;
    return r < 0 ? q - 1 : (r >= d ? q + 1 : q);
}

struct Recip { float sh, sw; int fast; };   // 1/sh, 1/sw; fast: divide through them (dm_div)

// d loss / d x at pixel (yy, xx) of one (sample, channel) plane: the sum of the output gradients
// of the windows that cover it (of the windows whose maximum it was, for max pooling); the
// plane's outputs start at `base`, `es` apart.
// the outputs whose window covers the padded position (ys, xs): oy in [ceil((ys - kh + 1) / sh), ys / sh]
// (clipped to the output), ox likewise
__device__ __forceinline__ void covering(const Win& g, int ys, int xs, Recip r, int& oy0, int& oy1, int& ox0,
                                         int& ox1) {
    if (r.fast) {
        oy0 = ys - g.kh + 1 > 0 ? dm_div(ys - g.kh + g.sh, g.sh, r.sh) : 0; oy1 = min(dm_div(ys, g.sh, r.sh), g.Ho - 1);
        ox0 = xs - g.kw + 1 > 0 ? dm_div(xs - g.kw + g.sw, g.sw, r.sw) : 0; ox1 = min(dm_div(xs, g.sw, r.sw), g.Wo - 1);
    } else {
        oy0 = ys - g.kh + 1 > 0 ? (ys - g.kh + g.sh) / g.sh : 0; oy1 = min(ys / g.sh, g.Ho - 1);
        ox0 = xs - g.kw + 1 > 0 ? (xs - g.kw + g.sw) / g.sw : 0; ox1 = min(xs / g.sw, g.Wo - 1);
    }
}

template <typename T, typename A, typename I>
__device__ T pool_gather(const T* dy, const A* arg, const Win& g, I base, int es, int yy, int xx, int is_max,
                         Recip r) {
    int ys = yy + g.ph, xs = xx + g.pw;
    int oy0, oy1, ox0, ox1;
    covering(g, ys, xs, r, oy0, oy1, ox0, ox1);
    typedef typename Acc<T>::type R;
    R acc = 0;
    for (int oy = oy0; oy <= oy1; ++oy) {
        const int tap_y = (ys - oy * g.sh) * g.kw + xs;
        for (int ox = ox0; ox <= ox1; ++ox) {
            const I at = base + (I)(oy * g.Wo + ox) * es;
            if (!is_max || (int)dm_val(arg[at]) == tap_y - ox * g.sw) acc += dm_val(dy[at]);
        }
    }
    return dm_cast<T>((double)(is_max ? acc : acc / (R)(g.kh * g.kw)));
}

template <typename T, typename A, typename I>
__device__ void pool_bwd(const T* dy, const A* arg, T* dx, const Win& g, I p, int is_max, int nhwc) {
    int xx, yy, es;
    I base;         // the (sample, channel) plane's first output gradient; es: its stride
    if (nhwc) {
        I q = p / g.C;
        xx = (int)(q % g.W); yy = (int)((q / g.W) % g.H);
        base = (q / ((I)g.W * g.H)) * g.Ho * g.Wo * g.C + (int)(p % g.C);
        es = g.C;
    } else {
        xx = (int)(p % g.W); yy = (int)((p / g.W) % g.H);
        base = (p / ((I)g.W * g.H)) * g.Ho * g.Wo;
        es = 1;
    }
    dx[p] = pool_gather<T, A, I>(dy, arg, g, base, es, yy, xx, is_max, Recip{0.f, 0.f, 0});
}

template <typename T, typename A>
__global__ void dm_pool_bwd(const T* dy, const A* arg, T* dx, DM_WIN_ARGS, long long total, int is_max, int nhwc) {
    DM_WIN;
    long long p = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (p >= total) return;
    if (total <= 2147483647LL) pool_bwd<T, A, int>(dy, arg, dx, g, (int)p, is_max, nhwc);
    else pool_bwd<T, A, long long>(dy, arg, dx, g, p, is_max, nhwc);
}

// The same on a 2-D grid: y = the sample, x = the pixel and channel within it (fewer than 2**24
// values), so every index comes from dm_div (reciprocals given by the host).
template <typename T, typename A>
__global__ void dm_pool_bwd_2d(const T* dy, const A* arg, T* dx, DM_WIN_ARGS, int per_sample, float ic, float iw,
                               float ih, float ish, float isw, int is_max, int nhwc) {
    DM_WIN;
    int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= per_sample) return;
    long long n = blockIdx.y;
    int xx, yy, q, es;
    long long base;
    if (nhwc) {
        q = dm_div(t, C, ic);               // pixel y * W + x
        yy = dm_div(q, W, iw); xx = q - yy * W;
        base = n * Ho * Wo * C + (t - q * C);
        es = C;
    } else {
        q = dm_div(t, W, iw);               // plane row c * H + y
        int c = dm_div(q, H, ih);
        xx = t - q * W; yy = q - c * H;
        base = (n * C + c) * Ho * Wo;
        es = 1;
    }
    dx[n * per_sample + t] = pool_gather<T, A, long long>(dy, arg, g, base, es, yy, xx, is_max, Recip{ish, isw, 1});
}

// Channels-last with V adjacent channels per thread (C % V == 0, every array 16-byte aligned): the
// window's index arithmetic is done once for V values, and each tap is one vector load of V values
// (16 bytes for float16 x 8). One value per thread left these kernels bound by their integer
// arithmetic, ten times slower than their memory traffic. The comparisons and the order of the sums
// are those of the kernels above, value by value, so the results are the same bits.
// K (and S, backward) > 0: the window's size (and stride) compiled in, 3x3 and 2x2 being nearly every
// network's pools: the loops unroll and every tap's load is issued before the first comparison waits
// for one (with runtime bounds a thread waited on its loads one after the other: pooling ran at a
// third of the memory's bandwidth). K = 0: any window, read from the arguments.
template <typename T, int V> struct alignas(sizeof(T) * V) Vec { T v[V]; };

// Float16 max pooling, two channels an instruction: the data's bits as half2 pairs, compared by
// PTX's per-half masks (0xFFFF where true; sm_53 on) and selected by bit operations. Converting
// each value to float to compare it made the float16 kernels instruction bound (2 TB/s where
// float32 ran at 3.2). The comparisons are the float path's, so the results are the same bits.
__device__ __forceinline__ unsigned h2_gtu(unsigned a, unsigned b) {
    unsigned d; asm("set.gtu.u32.f16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b)); return d; }
__device__ __forceinline__ unsigned h2_nan(unsigned a) {
    unsigned d; asm("set.nan.u32.f16x2 %0, %1, %1;" : "=r"(d) : "r"(a)); return d; }
__device__ __forceinline__ unsigned h2_le(unsigned a, unsigned b) {
    unsigned d; asm("set.le.u32.f16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b)); return d; }
__device__ __forceinline__ unsigned h2_eq(unsigned a, unsigned b) {
    unsigned d; asm("set.eq.u32.f16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b)); return d; }
__device__ __forceinline__ unsigned h2_pick(unsigned m, unsigned a, unsigned b) { return (a & m) | (b & ~m); }
// a window position (an exact small integer) as the half bits of both halves
__device__ __forceinline__ unsigned h2_index(int i) {
    unsigned s = __half_as_ushort(__int2half_rn(i)); return s | (s << 16); }
#define DM_H2_MINUS_ONE 0xBC00BC00u

// The max pool of one window for V float16 channels (sizeof(T) == 2): the float path's rule, pair by
// pair. A tap updates where it is the window's first image pixel, or greater, or the first NaN (a
// NaN maximum stays); an empty window gives 0 and -1, as the float path.
template <typename T, int V, int K>
__device__ __forceinline__ void pool_max_h2(const T* __restrict__ src, T* __restrict__ y, T* __restrict__ arg,
                                            long long o, int y0, int x0, int H, int W, int C, int kh, int kw,
                                            int after_relu) {
    constexpr int P = V * (int)sizeof(T) / 4;
    typedef Vec<unsigned, P> Words;
    const int KH = K ? K : kh, KW = K ? K : kw;
    unsigned best[P], at[P];
#pragma unroll
    for (int p = 0; p < P; ++p) { best[p] = 0u; at[p] = DM_H2_MINUS_ONE; }
    bool taken = false;
#pragma unroll
    for (int i = 0; i < KH; ++i) {
        const int yy = y0 + i;
        const bool row_in = yy >= 0 && yy < H;
#pragma unroll
        for (int j = 0; j < KW; ++j) {
            const int xx = x0 + j;
            if (row_in && xx >= 0 && xx < W) {
                const Words w = *reinterpret_cast<const Words*>(src + (long long)(yy * W + xx) * C);
                const unsigned force = taken ? 0u : ~0u, tap = h2_index(i * KW + j);
#pragma unroll
                for (int p = 0; p < P; ++p) {
                    const unsigned up = (h2_gtu(w.v[p], best[p]) & ~h2_nan(best[p])) | force;
                    best[p] = h2_pick(up, w.v[p], best[p]);
                    at[p] = h2_pick(up, tap, at[p]);
                }
                taken = true;
            }
        }
    }
    Words out, pos;
#pragma unroll
    for (int p = 0; p < P; ++p) {
        out.v[p] = best[p];
        pos.v[p] = after_relu ? h2_pick(h2_le(best[p], 0u), DM_H2_MINUS_ONE, at[p]) : at[p];
    }
    *reinterpret_cast<Words*>(y + o) = out;
    *reinterpret_cast<Words*>(arg + o) = pos;
}

template <typename T, int V, int K>
__global__ void dm_pool_fwd_vec(const T* __restrict__ x, T* __restrict__ y, T* __restrict__ arg, DM_WIN_ARGS,
                                int per_sample, float icv, float iwo, int is_max, int after_relu) {
    typedef typename Acc<T>::type R;
    int t = blockIdx.x * blockDim.x + threadIdx.x;      // (output pixel, channel group) within a sample
    if (t >= per_sample) return;
    long long n = blockIdx.y;
    const int groups = C / V;
    const int KH = K ? K : kh, KW = K ? K : kw;
    int q = dm_div(t, groups, icv);
    int oy = dm_div(q, Wo, iwo), ox = q - oy * Wo;
    const int y0 = oy * sh - ph, x0 = ox * sw - pw;
    const T* src = x + n * H * W * C + (t - q * groups) * V;
    if (sizeof(T) == 2 && is_max) {
        pool_max_h2<T, V, K>(src, y, arg, n * (long long)per_sample * V + (long long)t * V, y0, x0, H, W, C, kh, kw,
                             after_relu);
        return;
    }
    const R neg_inf = (R)__longlong_as_double(0xfff0000000000000ULL);
    R best[V], sum[V];
    int at[V];
#pragma unroll
    for (int k = 0; k < V; ++k) { best[k] = 0; sum[k] = 0; at[k] = -1; }
#pragma unroll
    for (int i = 0; i < KH; ++i) {
        const int yy = y0 + i;
        const bool row_in = yy >= 0 && yy < H;
#pragma unroll
        for (int j = 0; j < KW; ++j) {
            const int xx = x0 + j;
            Vec<T, V> v;
            const bool inside = row_in && xx >= 0 && xx < W;
            if (inside) v = *reinterpret_cast<const Vec<T, V>*>(src + (long long)(yy * W + xx) * C);
#pragma unroll
            for (int k = 0; k < V; ++k) {
                R a = inside ? dm_val(v.v[k]) : (is_max ? neg_inf : (R)0);
                if (is_max) {
                    if (inside && (at[k] < 0 || a > best[k] || (a != a && best[k] == best[k]))) {
                        best[k] = a; at[k] = i * KW + j;
                    }
                } else {
                    sum[k] += a;
                }
            }
        }
    }
    Vec<T, V> out, pos;
#pragma unroll
    for (int k = 0; k < V; ++k) {
        if (is_max) {
            if (after_relu && best[k] <= (R)0) at[k] = -1;
            out.v[k] = dm_cast<T>((double)best[k]);
            pos.v[k] = dm_cast<T>((double)at[k]);
        } else {
            out.v[k] = dm_cast<T>((double)(sum[k] / (R)(KH * KW)));
        }
    }
    long long o = n * (long long)per_sample * V + (long long)t * V;
    *reinterpret_cast<Vec<T, V>*>(y + o) = out;
    if (is_max) *reinterpret_cast<Vec<T, V>*>(arg + o) = pos;
}

// one covering output's contribution to a backward thread's V sums
template <typename T, int V>
__device__ __forceinline__ void pool_bwd_add(const T* __restrict__ dy, const T* __restrict__ arg, long long at,
                                             int tap, int is_max, typename Acc<T>::type* acc) {
    if (sizeof(T) == 2 && is_max) {
        // float16: a pair's positions compared as half bits, the gradient masked by bits (a
        // masked-out value adds +0, which leaves every sum as it was: a sum starting at +0 is never -0)
        constexpr int P = V * (int)sizeof(T) / 4;
        typedef Vec<unsigned, P> Words;
        const Words d = *reinterpret_cast<const Words*>(dy + at), a = *reinterpret_cast<const Words*>(arg + at);
        const unsigned want = h2_index(tap);
#pragma unroll
        for (int p = 0; p < P; ++p) {
            const unsigned m = d.v[p] & h2_eq(a.v[p], want);
            const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&m));
            acc[2 * p] += f.x;
            acc[2 * p + 1] += f.y;
        }
        return;
    }
    Vec<T, V> d = *reinterpret_cast<const Vec<T, V>*>(dy + at);
    if (is_max) {
        Vec<T, V> a = *reinterpret_cast<const Vec<T, V>*>(arg + at);
#pragma unroll
        for (int k = 0; k < V; ++k) if ((int)dm_val(a.v[k]) == tap) acc[k] += dm_val(d.v[k]);
    } else {
#pragma unroll
        for (int k = 0; k < V; ++k) acc[k] += dm_val(d.v[k]);
    }
}

template <typename T, int V, int K, int S>
__global__ void dm_pool_bwd_vec(const T* __restrict__ dy, const T* __restrict__ arg, T* __restrict__ dx,
                                DM_WIN_ARGS, int per_sample, float icv, float iw, float ish, float isw, int is_max) {
    DM_WIN;
    typedef typename Acc<T>::type R;
    int t = blockIdx.x * blockDim.x + threadIdx.x;      // (input pixel, channel group) within a sample
    if (t >= per_sample) return;
    long long n = blockIdx.y;
    const int groups = C / V;
    const int KH = K ? K : kh, KW = K ? K : kw;
    int q = dm_div(t, groups, icv);
    int yy = dm_div(q, W, iw), xx = q - yy * W;
    int ys = yy + ph, xs = xx + pw;
    int oy0, oy1, ox0, ox1;
    constexpr int SC = S ? S : 1;   // (the general instance's S is 0 and unused)
    if (K) {    // constant divisors: the compiler's shifts and multiplies
        oy0 = ys - K + 1 > 0 ? (ys - K + SC) / SC : 0; oy1 = min(ys / SC, Ho - 1);
        ox0 = xs - K + 1 > 0 ? (xs - K + SC) / SC : 0; ox1 = min(xs / SC, Wo - 1);
    } else {
        covering(g, ys, xs, Recip{ish, isw, 1}, oy0, oy1, ox0, ox1);
    }
    long long base = n * Ho * Wo * C + (t - q * groups) * V;
    R acc[V];
#pragma unroll
    for (int k = 0; k < V; ++k) acc[k] = 0;
    if (K) {
        // at most ceil(K / S) covering outputs a direction: fixed trip counts, predicated, in the
        // (oy, ox) order of the loops below (the same sums, bit for bit)
        constexpr int CK = K ? (K + SC - 1) / SC : 1;
#pragma unroll
        for (int a = 0; a < CK; ++a) {
            const int oy = oy0 + a;
            if (oy <= oy1) {
                const int tap_y = (ys - oy * SC) * KW + xs;
#pragma unroll
                for (int b = 0; b < CK; ++b) {
                    const int ox = ox0 + b;
                    if (ox <= ox1)
                        pool_bwd_add<T, V>(dy, arg, base + (long long)(oy * Wo + ox) * C, tap_y - ox * SC, is_max, acc);
                }
            }
        }
    } else {
        for (int oy = oy0; oy <= oy1; ++oy) {
            const int tap_y = (ys - oy * sh) * kw + xs;
            for (int ox = ox0; ox <= ox1; ++ox)
                pool_bwd_add<T, V>(dy, arg, base + (long long)(oy * Wo + ox) * C, tap_y - ox * sw, is_max, acc);
        }
    }
    Vec<T, V> out;
#pragma unroll
    for (int k = 0; k < V; ++k) out.v[k] = dm_cast<T>((double)(is_max ? acc[k] : acc[k] / (R)(KH * KW)));
    *reinterpret_cast<Vec<T, V>*>(dx + n * (long long)per_sample * V + (long long)t * V) = out;
}
"""
#: the windows (kh = kw = K) and strides (sh = sw = S) compiled into the vector kernels; 0: any
_FWD_WINDOWS = (0, 2, 3)
_BWD_WINDOWS = ((0, 0), (3, 1), (3, 2), (2, 2))
#: take the compiled-in windows where they apply (False: always the general instance; for
#: benchmarks/probes/pool_kernels.py, which times both in one run)
COMPILED_WINDOWS = True
_INSTANCES = ([f"dm_pool_{d}<{t}, {a}>" for d in ("fwd", "bwd", "bwd_2d") for t in cuda.C_TYPES.values()
               for a in cuda.C_TYPES.values()]
              + [f"dm_pool_fwd_vec<{t}, {v}, {k}>" for t in cuda.C_TYPES.values() for v in (2, 4, 8)
                 for k in _FWD_WINDOWS]
              + [f"dm_pool_bwd_vec<{t}, {v}, {k}, {s}>" for t in cuda.C_TYPES.values() for v in (2, 4, 8)
                 for k, s in _BWD_WINDOWS])
#: the 2-D backward kernel's limits: a sample's values below 2**24 (dm_div), samples within a grid's y
_DIV_EXACT, _GRID_Y = 1 << 24, 65535


def _vector_width(arrays, channels, per_sample, n):
    """Channels per thread of the channels-last vector kernels (8, 4 or 2 values, at most 16 bytes,
    dividing the channel count; every array aligned to that many bytes), or 0 when they do not apply:
    an argmax of another dtype, no samples, more than a grid's y of them, or a sample too large for
    dm_div."""
    dtype = arrays[0].dtype
    if any(a.dtype != dtype for a in arrays) or not 0 < n <= _GRID_Y or per_sample >= _DIV_EXACT:
        return 0
    for v in (8, 4, 2):
        nbytes = v * dtype.itemsize
        if nbytes <= 16 and channels % v == 0 and all(a.data.ptr % nbytes == 0 for a in arrays):
            return v
    return 0


def _compiled_window(g, backward):
    """The vector kernel's compiled-in window for geometry g: (K,) forward, (K, S) backward; zeros for
    a window of another shape, which the general instance reads from its arguments."""
    if not COMPILED_WINDOWS:
        return (0, 0) if backward else (0,)
    if backward:
        pair = (g.kh, g.sh) if g.kh == g.kw and g.sh == g.sw else (0, 0)
        return pair if pair in _BWD_WINDOWS else (0, 0)
    return (g.kh,) if g.kh == g.kw and g.kh in _FWD_WINDOWS else (0,)


def _vector_kernel(direction, dtype, v, window=(0,)):
    params = ", ".join(str(k) for k in (cuda.C_TYPES[str(dtype)], v) + tuple(window))
    return cuda.function(_CUDA_SOURCE, f"dm_pool_{direction}_vec<{params}>", _INSTANCES)


def _cuda_kernel(direction, dtype, arg_dtype):
    name = f"dm_pool_{direction}<{cuda.C_TYPES[str(dtype)]}, {cuda.C_TYPES[str(arg_dtype)]}>"
    return cuda.function(_CUDA_SOURCE, name, _INSTANCES)


def _win(g):
    return tuple(np.int32(v) for v in (g.channels, g.height, g.width, g.out_h, g.out_w, g.kh, g.kw, g.sh, g.sw,
                                       g.ph, g.pw))


def forward_cuda(x, out, am, g, is_max, channels_last, after_relu=False):
    """The GPU pool of the contiguous rows x into out (and am, argmax; for average a dummy of out's
    type): the channels-last vector kernel where it applies, else one thread per output."""
    n = out.shape[0]
    v = _vector_width((x, out, am), g.channels, g.out_h * g.out_w * g.channels, n) if channels_last else 0
    if v:
        per_sample = g.out_h * g.out_w * g.channels // v
        fn = _vector_kernel("fwd", x.dtype, v, _compiled_window(g, backward=False))
        recips = tuple(np.float32(1.0 / d) for d in (g.channels // v, g.out_w))
        fn(((per_sample + 255) // 256, n), (256,), (x, out, am) + _win(g) + (np.int32(per_sample),) + recips
           + (np.int32(is_max), np.int32(after_relu)))
    else:
        fn = _cuda_kernel("fwd", x.dtype, am.dtype)
        cuda.launch(fn, out.size, (x, out, am) + _win(g) + (np.int64(out.size), np.int32(is_max),
                                                             np.int32(channels_last), np.int32(after_relu)))


def backward_cuda(dy, am, dx, g, is_max, channels_last):
    """The GPU pool's input gradient dx from the contiguous dy (and am, argmax; for average dy again):
    each input pixel gathers from the windows covering it (no atomics: the same sums every run)."""
    n, per_sample = dx.shape
    nhwc = np.int32(channels_last)
    v = _vector_width((dy, am, dx), g.channels, per_sample, n) if channels_last else 0
    if v:
        fn = _vector_kernel("bwd", dy.dtype, v, _compiled_window(g, backward=True))
        recips = tuple(np.float32(1.0 / d) for d in (g.channels // v, g.width, g.sh, g.sw))
        fn(((per_sample // v + 255) // 256, n), (256,),
           (dy, am, dx) + _win(g) + (np.int32(per_sample // v),) + recips + (np.int32(is_max),))
    elif 0 < n <= _GRID_Y and per_sample < _DIV_EXACT:
        fn = _cuda_kernel("bwd_2d", dy.dtype, am.dtype)
        recips = tuple(np.float32(1.0 / v) for v in (g.channels, g.width, g.height, g.sh, g.sw))
        fn(((per_sample + 255) // 256, n), (256,),
           (dy, am, dx) + _win(g) + (np.int32(per_sample),) + recips + (np.int32(is_max), nhwc))
    else:
        fn = _cuda_kernel("bwd", dy.dtype, am.dtype)
        cuda.launch(fn, dx.size, (dy, am, dx) + _win(g) + (np.int64(dx.size), np.int32(is_max), nhwc))


@POOL2D.kernel(backend="gpu", capturable=True)
def _pool2d_cuda(call):
    """nn_pool2d as one CUDA kernel: each output reads its window once."""
    import cupy
    static = call.entry.static
    x = rows.local(call.inputs[0])
    if x is None:
        return rows.nothing_here(call)
    (out,) = rows.new_output(call, 0)
    is_max = static.mode == "max"
    am = rows.new_output(call, 1)[0] if is_max else out        # a dummy of a valid type for average
    forward_cuda(cupy.ascontiguousarray(x), out, am, static.geometry, is_max, static.channels_last,
                 static.after_relu)
    shards = [rows.shard(call, 0, [out])]
    if is_max:
        shards.append(rows.shard(call, 1, [am]))
    return shards


@POOL2D_BACKWARD.kernel(backend="gpu", capturable=True)
def _pool2d_backward_cuda(call):
    """nn_pool2d_backward as one CUDA kernel (backward_cuda)."""
    import cupy
    static = call.entry.static
    dy = rows.local(call.inputs[0])
    if dy is None:
        return rows.nothing_here(call)
    dy = cupy.ascontiguousarray(dy)
    is_max = static.mode == "max"
    am = cupy.ascontiguousarray(rows.local(call.inputs[1])) if is_max else dy
    (dx,) = rows.new_output(call, 0)
    backward_cuda(dy, am, dx, static.geometry, is_max, static.channels_last)
    return [rows.shard(call, 0, [dx])]
