"""GPU kernels of batch normalisation on channels-last batches (the layout cuDNN's convolutions give).

A batch of channels-last image rows is an (M, C) array: M = samples x
pixels rows, one column per channel. Written with array expressions, the
NumPy kernels of norm.py make each channel's sums along a transposed view
(reads strided by C), several full-size temporaries and some twenty small
kernels per call; on a GPU that made BatchNorm most of a ResNet step. Here
a training step's BatchNorm is four launches each way (sums, their
reduction over the blocks, a per-channel `finalize`, the elementwise pass),
plus the all-reduce of the sums when the batch is split over workers.

Layout of the work: a block of 256 threads is TX x TY, TX threads along a
row's channels and TY rows at a time; each thread owns V adjacent channels
(V x the element size = 16 bytes when C and the addresses allow: one
vector load per row, so a warp reads whole 128-byte lines) and walks down
the rows with a grid stride, keeping its channels' constants in registers
(no index arithmetic per element beyond one multiply-add). The elementwise
passes load DM_EW_ROWS rows before writing any and start _EW_BLOCKS_PER_SM
blocks a multiprocessor, so a thread walks many rows with its loads in
flight and fetches its channels' constants once: with one row per thread
and 32 blocks a multiprocessor a small layer's pass waited on latency
(GoogLeNet's 57 layers at batch 256 on an H200, benchmarks/probes/
bn_small_batch.py: normalise 1.23 -> 0.98 ms, dx 2.03 -> 1.53 ms).

- `channel_sums`: per thread, sums in double over its rows; the block adds
  its TY partial sums in shared memory as a tree (row 0 adding them one
  after another cost a narrow layer 10-17 us a launch at any batch) and
  writes one row of partial sums per block (grid rows sized to fill the GPU); one reduction adds those
  (deterministic: no atomics, the same bits every run). The statistics
  take one pass: the sums of (x - k) and (x - k)^2 around a shift k every
  worker holds alike (the running mean), summed over the workers by one
  all-reduce; in double, var = S2/M - (S1/M)^2 loses nothing that float32
  data holds unless the batch mean is some 10^6 standard deviations from
  the shift (the float32 E[x^2] - E[x]^2 is why the NumPy kernel takes two
  passes). The backward pass sums [sum(g), sum(g * (x - mean))] with
  g = dy, masked after a fused relu: by y > 0, or, without a residual,
  where the forward's value (x - mean) * scale + shift was positive,
  recomputed from x with the forward's own constants and multiply-add
  (no read of y: one pass of the three, and of dx's four, fewer).
- `finalize_forward` / `finalize_backward`: every per-channel quantity of
  the step (mean, 1/std, the running statistics updated in place, the
  normalisation's scale; dgamma, dbeta and dx's coefficients) in one
  launch of C threads.
- `normalize`: y = (x - mean) * scale + shift (+ r, a residual) (relu), one pass.
- `input_gradient`: dx = a * g + b * (x - mean) + c per channel, one pass;
  with a residual it also writes dr = g (dy masked by y > 0), so a
  residual block's tail costs no pass of its own in either direction.
- y (forward), dy and y (backward) may be a window of wider rows: channels
  off .. off + C of rows of ld values, a concatenation's slice written and
  read in place (an Inception module's branches, dmath.nn.batchnorm's window).

Values are read into float (double for double data) and written with one
rounding, as the other GPU kernels (dmath/gpu/launcher.py).
"""
import warnings

import numpy as np

from ... import backend, memory
from ...gpu import launcher

SOURCE = r"""
// rows an elementwise kernel (normalize, dx) loads before it writes any: loads in flight per thread
#define DM_EW_ROWS 4
template <typename T, int V> struct __align__(sizeof(T) * V) dm_vec { T v[V]; };

template <typename T, int V>
__device__ __forceinline__ dm_vec<T, V> dm_load(const T* p, long long i) {
    return *reinterpret_cast<const dm_vec<T, V>*>(p + i);
}

// a + b per element, computed and rounded as the elementwise add kernel does (dmath.add): a gradient
// given as two terms reads as the very sum that add would have written
template <typename T, int V>
__device__ __forceinline__ dm_vec<T, V> dm_vadd(const dm_vec<T, V>& a, const dm_vec<T, V>& b) {
    dm_vec<T, V> r;
#pragma unroll
    for (int v = 0; v < V; ++v) r.v[v] = dm_cast<T>(dm_val(a.v[v]) + dm_val(b.v[v]));
    return r;
}

// the relu's mask recomputed from x: the forward's own value (x - mean) * scale + shift in its type and
// order (the same multiply-add), so the same elements count as the forward's Y > 0 (up to a positive value
// that rounds to zero in T)
template <typename A>
__device__ __forceinline__ A dm_bn_affine(A xa, A m, A s, A b) { return (xa - m) * s + b; }

template <typename A>
__device__ __forceinline__ bool dm_bn_on(A xa, A m, A s, A b) { return dm_bn_affine<A>(xa, m, s, b) > 0; }

// a thread's channels' scale and shift of the forward's normalisation, as dm_bn_finalize_fwd made them:
// scale = stats' 1/std (rounded to S) times gamma in double, rounded to A; shift = beta
template <typename G, typename A, int V>
__device__ __forceinline__ void dm_bn_mask_consts(const A* __restrict__ stats, const G* __restrict__ gamma,
        const G* __restrict__ beta, int C, int c0, A (&s)[V], A (&b)[V]) {
#pragma unroll
    for (int v = 0; v < V; ++v) {
        s[v] = (A)((double)stats[C + c0 + v] * (double)dm_val(gamma[c0 + v]));
        b[v] = (A)(double)dm_val(beta[c0 + v]);
    }
}

// one row's part of dm_bn_sums: MODE 3 adds d and d^2 (d = x - m), MODE 2 g and g d (g = dy; MASK 1: masked
// by y > 0, MASK 2: masked where the forward's relu cut, recomputed from x)
template <typename T, int V, int MODE, int MASK>
__device__ __forceinline__ void dm_bn_row(const dm_vec<T, V>& xv, const dm_vec<T, V>& gv, const dm_vec<T, V>& yv,
        const double (&m)[V], const typename Acc<T>::type (&ms)[V], const typename Acc<T>::type (&mb)[V],
        double (&s0)[V], double (&s1)[V]) {
    typedef typename Acc<T>::type A;
#pragma unroll
    for (int v = 0; v < V; ++v) {
        const double d = (double)dm_val(xv.v[v]) - m[v];
        if (MODE == 3) {
            s0[v] += d;
            s1[v] += d * d;
        } else {
            double g = (double)dm_val(gv.v[v]);
            if (MASK == 1 && !(dm_val(yv.v[v]) > 0)) g = 0.0;
            if (MASK == 2 && !dm_bn_on<A>(dm_val(xv.v[v]), (A)m[v], ms[v], mb[v])) g = 0.0;
            s0[v] += g;
            s1[v] += g * d;
        }
    }
}

// blockDim (TX, TY) = 256 threads; grid (ceil(C / V / TX), rows of blocks); MODE 3: [sum d, sum d^2],
// d = x - mean (mean: the shift); MODE 2: [sum g, sum g (x - mean)], g = dy masked by y > 0 (MASK 1) or
// where the forward's relu cut (MASK 2: from x, stats, gamma and beta of G); two: dy is dy + dy2
template <typename T, int V, int MODE, int MASK, typename G>
__global__ void __launch_bounds__(256) dm_bn_sums(const T* __restrict__ x, const T* __restrict__ dy,
        const T* __restrict__ y, const typename Acc<T>::type* __restrict__ mean,
        const typename Acc<T>::type* __restrict__ stats, const G* __restrict__ gamma, const G* __restrict__ beta,
        double* __restrict__ partial, long long M, int C, long long ld, int off, const T* __restrict__ dy2,
        int two) {
    typedef typename Acc<T>::type A;
    __shared__ double sm[2 * V * 256];
    const int tx = threadIdx.x, ty = threadIdx.y, TX = blockDim.x, TY = blockDim.y;
    const int c0 = (blockIdx.x * TX + tx) * V;
    const bool active = c0 < C;
    double m[V], s0[V], s1[V];
    A ms[V], mb[V];
#pragma unroll
    for (int v = 0; v < V; ++v) {
        m[v] = active ? (double)mean[c0 + v] : 0.0; s0[v] = 0.0; s1[v] = 0.0; ms[v] = 0; mb[v] = 0;
    }
    if (MASK == 2 && active) dm_bn_mask_consts<G, A, V>(stats, gamma, beta, C, c0, ms, mb);
    if (active) {
        const long long step = (long long)gridDim.y * TY;
        long long r = (long long)blockIdx.y * TY + ty;
        // U rows loaded before any is summed: several loads in flight per thread (the double sums
        // keep few threads on a multiprocessor; one load at a time held the statistics to half the
        // device's bandwidth). The rows are summed in the same order as one at a time.
        constexpr int U = MODE == 3 ? 4 : 2;
        for (; r + (U - 1) * step < M; r += U * step) {
            dm_vec<T, V> xv[U], gv[U], yv[U];
#pragma unroll
            for (int u = 0; u < U; ++u) {
                xv[u] = dm_load<T, V>(x, (r + u * step) * C + c0);
                if (MODE != 3) {
                    const long long j = (r + u * step) * ld + off + c0;    // dy and y: channels off.. of rows of ld
                    gv[u] = dm_load<T, V>(dy, j);
                    if (two) gv[u] = dm_vadd<T, V>(gv[u], dm_load<T, V>(dy2, j));
                    if (MASK == 1) yv[u] = dm_load<T, V>(y, j);
                }
            }
#pragma unroll
            for (int u = 0; u < U; ++u) dm_bn_row<T, V, MODE, MASK>(xv[u], gv[u], yv[u], m, ms, mb, s0, s1);
        }
        for (; r < M; r += step) {
            dm_vec<T, V> xv = dm_load<T, V>(x, r * C + c0), gv, yv;
            if (MODE != 3) {
                const long long j = r * ld + off + c0;
                gv = dm_load<T, V>(dy, j);
                if (two) gv = dm_vadd<T, V>(gv, dm_load<T, V>(dy2, j));
                if (MASK == 1) yv = dm_load<T, V>(y, j);
            }
            dm_bn_row<T, V, MODE, MASK>(xv, gv, yv, m, ms, mb, s0, s1);
        }
    }
    const int t = ty * TX + tx;
#pragma unroll
    for (int v = 0; v < V; ++v) { sm[(2 * v) * 256 + t] = s0[v]; sm[(2 * v + 1) * 256 + t] = s1[v]; }
    __syncthreads();
    // the block's TY rows added as a tree (TY is a power of two; a fixed order: the same bits every run).
    // Row 0 adding the rows one after another took 2 V TY dependent shared-memory adds: with few channels
    // (TY 64 or 128) some 10-17 us a launch whatever the batch, most of a small layer's sums
    for (int h = TY / 2; h > 0; h >>= 1) {
        if (ty < h) {
#pragma unroll
            for (int k = 0; k < 2 * V; ++k) sm[k * 256 + t] += sm[k * 256 + t + h * TX];
        }
        __syncthreads();
    }
    if (ty == 0 && active) {
#pragma unroll
        for (int k = 0; k < 2 * V; ++k)
            partial[((long long)blockIdx.y * 2 + (k & 1)) * C + c0 + (k >> 1)] = sm[k * 256 + tx];
    }
}

// channel c's two sums from `parts` partial rows of [2][C] doubles (the blocks' rows of dm_bn_sums; 1 when
// they were added up already, or all-reduced over the workers). A block of (DM_FIN_X, DM_FIN_Y) threads
// takes DM_FIN_X channels: row ty adds the partial rows ty, ty + DM_FIN_Y, ..., then the block's first row
// adds the rows' sums in order (the same sums at every run). Returns whether this thread goes on (the
// first row, a channel of the batch): the others have done their part.
#define DM_FIN_X 32
#define DM_FIN_Y 32
__device__ __forceinline__ bool dm_bn_partials(const double* __restrict__ s, int C, int parts, int& c,
        double& s0, double& s1) {
    __shared__ double sh0[DM_FIN_Y][DM_FIN_X], sh1[DM_FIN_Y][DM_FIN_X];
    c = blockIdx.x * DM_FIN_X + threadIdx.x;
    double a = 0.0, b = 0.0;
    if (c < C) {
        for (int g = threadIdx.y; g < parts; g += DM_FIN_Y) {
            a += s[(long long)g * 2 * C + c];
            b += s[(long long)g * 2 * C + C + c];
        }
    }
    sh0[threadIdx.y][threadIdx.x] = a;
    sh1[threadIdx.y][threadIdx.x] = b;
    __syncthreads();
    if (threadIdx.y != 0 || c >= C) return false;
    s0 = sh0[0][threadIdx.x];
    s1 = sh1[0][threadIdx.x];
    for (int r = 1; r < DM_FIN_Y; ++r) {
        s0 += sh0[r][threadIdx.x];
        s1 += sh1[r][threadIdx.x];
    }
    return true;
}

// every per-channel quantity of a training forward from the (all-reduced) sums s = [S1; S2] around the
// shift k (`parts` partial rows of them; k is the running mean): mean, inv = 1/sqrt(var + eps), the
// updated running statistics times `share` written to rm, rv (k and rv_in in place and share 1, or a
// worker's Partial terms of them: share 1 / workers, one rounding), and the normalisation's mean,
// scale = inv * gamma (inv rounded as stats hold it) and shift = beta in the elementwise kernel's type
template <typename G, typename R, typename S, typename A>
__global__ void dm_bn_finalize_fwd(const double* __restrict__ s, const R* k, const R* rv_in,
        const G* __restrict__ gamma, const G* __restrict__ beta, R* rm, R* rv, S* stats,
        A* mean_a, A* scale_a, A* shift_a, double inv_count, double momentum, double unbias,
        double eps, double share, int C, int parts) {
    int c;
    double s0, s1;
    if (!dm_bn_partials(s, C, parts, c, s0, s1)) return;
    double off = s0 * inv_count;
    const double old_m = (double)k[c], old_v = (double)rv_in[c];
    double mean = old_m + off;
    double var = s1 * inv_count - off * off;
    if (var < 0) var = 0;
    rm[c] = (R)(share * ((1.0 - momentum) * old_m + momentum * mean));
    rv[c] = (R)(share * ((1.0 - momentum) * old_v + (momentum * unbias) * var));
    double inv = 1.0 / sqrt(var + eps);
    stats[c] = (S)mean;
    stats[C + c] = (S)inv;
    mean_a[c] = (A)mean;
    // from 1/std as stats keep it: a backward that recomputes the relu's mask makes the same scale
    scale_a[c] = (A)((double)(S)inv * (double)dm_val(gamma[c]));
    shift_a[c] = (A)(double)dm_val(beta[c]);
}

// dgamma, dbeta and dx = a g + b (x - mean) + c0 from the (all-reduced) sums s = [sum g; sum g (x - mean)]
template <typename G, typename S, typename A>
__global__ void dm_bn_finalize_bwd(const double* __restrict__ s, const S* __restrict__ stats,
        const G* __restrict__ gamma, G* dgamma, G* dbeta, A* mean_a, A* a_out, A* b_out, A* c_out,
        double inv_count, int training, int C, int parts) {
    int c;
    double db, dg;
    if (!dm_bn_partials(s, C, parts, c, db, dg)) return;
    const double r = (double)stats[C + c];
    dg *= r;
    double a = (double)dm_val(gamma[c]) * r;
    dgamma[c] = dm_cast<G>(dg);
    dbeta[c] = dm_cast<G>(db);
    mean_a[c] = (A)stats[c];
    a_out[c] = (A)a;
    b_out[c] = (A)(training ? -a * r * dg * inv_count : 0.0);
    c_out[c] = (A)(training ? -a * db * inv_count : 0.0);
}

// one row of dm_bn_normalize: channels c0.. of row r
template <typename T, int V, bool RELU, bool RES>
__device__ __forceinline__ void dm_bn_normalize_row(const dm_vec<T, V>& xv, const dm_vec<T, V>& rv, T* __restrict__ y,
        const typename Acc<T>::type (&m)[V], const typename Acc<T>::type (&s)[V],
        const typename Acc<T>::type (&b)[V], long long r, long long ld, int off, int c0) {
    typedef typename Acc<T>::type A;
    dm_vec<T, V> out;
#pragma unroll
    for (int v = 0; v < V; ++v) {
        A val = dm_bn_affine<A>(dm_val(xv.v[v]), m[v], s[v], b[v]);
        if (RES) val += dm_val(rv.v[v]);
        if (RELU && val < 0) val = 0;
        out.v[v] = dm_cast<T>(val);
    }
    // y: channels off.. of rows of ld (a concatenation's slice; ld = C, off = 0 for a batch of its own)
    *reinterpret_cast<dm_vec<T, V>*>(y + r * ld + off + c0) = out;
}

template <typename T, int V, bool RELU, bool RES>
__global__ void __launch_bounds__(256) dm_bn_normalize(const T* __restrict__ x, const T* __restrict__ res,
        T* __restrict__ y, const typename Acc<T>::type* __restrict__ mean,
        const typename Acc<T>::type* __restrict__ scale, const typename Acc<T>::type* __restrict__ shift,
        long long M, int C, long long ld, int off) {
    typedef typename Acc<T>::type A;
    const int c0 = (blockIdx.x * blockDim.x + threadIdx.x) * V;
    if (c0 >= C) return;
    A m[V], s[V], b[V];
#pragma unroll
    for (int v = 0; v < V; ++v) { m[v] = mean[c0 + v]; s[v] = scale[c0 + v]; b[v] = shift[c0 + v]; }
    const long long step = (long long)gridDim.y * blockDim.y;
    long long r = (long long)blockIdx.y * blockDim.y + threadIdx.y;
    // DM_EW_ROWS rows loaded before any is written: loads in flight, as dm_bn_sums keeps them
    for (; r + (DM_EW_ROWS - 1) * step < M; r += DM_EW_ROWS * step) {
        dm_vec<T, V> xv[DM_EW_ROWS], rv[DM_EW_ROWS];
#pragma unroll
        for (int u = 0; u < DM_EW_ROWS; ++u) {
            xv[u] = dm_load<T, V>(x, (r + u * step) * C + c0);
            if (RES) rv[u] = dm_load<T, V>(res, (r + u * step) * C + c0);
        }
#pragma unroll
        for (int u = 0; u < DM_EW_ROWS; ++u)
            dm_bn_normalize_row<T, V, RELU, RES>(xv[u], rv[u], y, m, s, b, r + u * step, ld, off, c0);
    }
    for (; r < M; r += step) {
        dm_vec<T, V> xv = dm_load<T, V>(x, r * C + c0), rv;
        if (RES) rv = dm_load<T, V>(res, r * C + c0);
        dm_bn_normalize_row<T, V, RELU, RES>(xv, rv, y, m, s, b, r, ld, off, c0);
    }
}

// one row of dm_bn_dx (g: dy, or dy + dy2, as read)
template <typename T, int V, int MASK, bool DR>
__device__ __forceinline__ void dm_bn_dx_row(const dm_vec<T, V>& gv, const dm_vec<T, V>& xv, const dm_vec<T, V>& yv,
        T* __restrict__ dx, T* __restrict__ dr, const typename Acc<T>::type (&m)[V],
        const typename Acc<T>::type (&av)[V], const typename Acc<T>::type (&bv)[V],
        const typename Acc<T>::type (&cv)[V], const typename Acc<T>::type (&ms)[V],
        const typename Acc<T>::type (&mb)[V], long long i) {
    typedef typename Acc<T>::type A;
    dm_vec<T, V> out, rout;
#pragma unroll
    for (int v = 0; v < V; ++v) {
        A g = dm_val(gv.v[v]);
        const A xa = dm_val(xv.v[v]);
        const bool masked = (MASK == 1 && !(dm_val(yv.v[v]) > 0)) ||
                            (MASK == 2 && !dm_bn_on<A>(xa, m[v], ms[v], mb[v]));
        if (masked) g = 0;
        if (DR) rout.v[v] = masked ? dm_cast<T>(0.0) : gv.v[v];   // the residual's gradient, exactly
        out.v[v] = dm_cast<T>(av[v] * g + bv[v] * (xa - m[v]) + cv[v]);
    }
    *reinterpret_cast<dm_vec<T, V>*>(dx + i) = out;
    if (DR) *reinterpret_cast<dm_vec<T, V>*>(dr + i) = rout;
}

// dx = a g + b (x - mean) + c0; g = dy masked by y > 0 (MASK 1) or where the forward's relu cut (MASK 2,
// recomputed from x as dm_bn_sums does); DR: g also written to dr (a residual's gradient); two: dy is
// dy + dy2
template <typename T, int V, int MASK, bool DR, typename G>
__global__ void __launch_bounds__(256) dm_bn_dx(const T* __restrict__ dy, const T* __restrict__ x,
        const T* __restrict__ y, T* __restrict__ dx, T* __restrict__ dr,
        const typename Acc<T>::type* __restrict__ mean, const typename Acc<T>::type* __restrict__ a,
        const typename Acc<T>::type* __restrict__ b, const typename Acc<T>::type* __restrict__ c0v,
        const typename Acc<T>::type* __restrict__ stats, const G* __restrict__ gamma, const G* __restrict__ beta,
        long long M, int C, long long ld, int off, const T* __restrict__ dy2, int two) {
    typedef typename Acc<T>::type A;
    const int c0 = (blockIdx.x * blockDim.x + threadIdx.x) * V;
    if (c0 >= C) return;
    A m[V], av[V], bv[V], cv[V], ms[V], mb[V];
#pragma unroll
    for (int v = 0; v < V; ++v) {
        m[v] = mean[c0 + v]; av[v] = a[c0 + v]; bv[v] = b[c0 + v]; cv[v] = c0v[c0 + v]; ms[v] = 0; mb[v] = 0;
    }
    if (MASK == 2) dm_bn_mask_consts<G, A, V>(stats, gamma, beta, C, c0, ms, mb);
    const long long step = (long long)gridDim.y * blockDim.y;
    long long r = (long long)blockIdx.y * blockDim.y + threadIdx.y;
    // DM_EW_ROWS rows loaded before any is written (loads in flight); dy and y: channels off.. of rows of ld
    for (; r + (DM_EW_ROWS - 1) * step < M; r += DM_EW_ROWS * step) {
        dm_vec<T, V> gv[DM_EW_ROWS], xv[DM_EW_ROWS], yv[DM_EW_ROWS];
#pragma unroll
        for (int u = 0; u < DM_EW_ROWS; ++u) {
            const long long i = (r + u * step) * C + c0, j = (r + u * step) * ld + off + c0;
            gv[u] = dm_load<T, V>(dy, j);
            xv[u] = dm_load<T, V>(x, i);
            if (two) gv[u] = dm_vadd<T, V>(gv[u], dm_load<T, V>(dy2, j));
            if (MASK == 1) yv[u] = dm_load<T, V>(y, j);
        }
#pragma unroll
        for (int u = 0; u < DM_EW_ROWS; ++u)
            dm_bn_dx_row<T, V, MASK, DR>(gv[u], xv[u], yv[u], dx, dr, m, av, bv, cv, ms, mb, (r + u * step) * C + c0);
    }
    for (; r < M; r += step) {
        const long long i = r * C + c0, j = r * ld + off + c0;
        dm_vec<T, V> gv = dm_load<T, V>(dy, j), xv = dm_load<T, V>(x, i), yv;
        if (two) gv = dm_vadd<T, V>(gv, dm_load<T, V>(dy2, j));
        if (MASK == 1) yv = dm_load<T, V>(y, j);
        dm_bn_dx_row<T, V, MASK, DR>(gv, xv, yv, dx, dr, m, av, bv, cv, ms, mb, i);
    }
}
"""

_TYPES = launcher.C_TYPES
#: elements per thread when they make a 16-byte vector (C a multiple of it, 16-byte aligned arrays)
_VEC = {"float16": 8, "float32": 4, "float64": 2}
#: (gamma, running statistics, stats, elementwise constants) dtypes the finalize kernels are built for:
#: the models' own (float16 data: float16 or float32 gamma, float32 statistics); others take array code
_FINAL = {("float16", "float32", "float32", "float32"), ("float32", "float32", "float32", "float32"),
          ("float64", "float64", "float64", "float64")}
#: blocks of the sums kernel per multiprocessor (each thread then walks many rows: few partial sums)
_SUM_BLOCKS_PER_SM = 2
#: the statistics pass (mode 3) of 4- and 8-byte data: twice the blocks read ResNet-50's float32 batches
#: at 2.9-3.0 TB/s instead of 2.6-2.7 on an H100 (benchmarks/probes/bn_sums_variants.py); float16 was
#: fastest at 2
_STATS_BLOCKS_PER_SM_WIDE = 4
#: blocks of the elementwise kernels per multiprocessor: few, each thread walking many rows DM_EW_ROWS at a
#: time (benchmarks/probes/bn_small_batch.py: 4 blocks and 4 rows beat 32 blocks and 1 row at batches 64,
#: 256 and 1024 on an H200: GoogLeNet's BatchNorm passes 5.67 -> 4.62 ms at 256 with the sums' tree)
_EW_BLOCKS_PER_SM = 4
#: a finalize kernel's block: channels, and threads adding up one channel's partial rows (the kernels'
#: DM_FIN_X and DM_FIN_Y)
_FIN_X, _FIN_Y = 32, 32


def _ctype(dtype):
    return _TYPES[np.dtype(dtype).name]


#: gamma dtypes, per data dtype, of the kernels that recompute a relu's mask from x (MASK 2): the models'
#: own; other pairs recompute it with array code (norm.py)
_MASK_GAMMA = {"float16": ("float16", "float32"), "float32": ("float32",), "float64": ("float64",)}


def _names():
    out = []
    for name in _TYPES:
        t = _TYPES[name]
        for v in (1, _VEC[name]):
            out += [f"dm_bn_sums<{t}, {v}, 3, 0, {t}>", f"dm_bn_sums<{t}, {v}, 2, 0, {t}>",
                    f"dm_bn_sums<{t}, {v}, 2, 1, {t}>"]
            out += [f"dm_bn_normalize<{t}, {v}, {relu}, {res}>" for relu in ("false", "true")
                    for res in ("false", "true")]
            out += [f"dm_bn_dx<{t}, {v}, {mask}, {dr}, {t}>" for mask in (0, 1) for dr in ("false", "true")]
            for g in _MASK_GAMMA[name]:
                out += [f"dm_bn_sums<{t}, {v}, 2, 2, {_TYPES[g]}>", f"dm_bn_dx<{t}, {v}, 2, false, {_TYPES[g]}>"]
    for g, r, s, a in sorted(_FINAL):
        out += [f"dm_bn_finalize_fwd<{_TYPES[g]}, {_TYPES[r]}, {_TYPES[s]}, {_TYPES[a]}>",
                f"dm_bn_finalize_bwd<{_TYPES[g]}, {_TYPES[s]}, {_TYPES[a]}>"]
    return out


def recomputes_mask(dtype, gamma_dtype):
    """Whether the GPU kernels recompute a fused relu's mask from x for this data and gamma dtype."""
    return np.dtype(gamma_dtype).name in _MASK_GAMMA[np.dtype(dtype).name]


def _fn(expression):
    return launcher.function(SOURCE, expression, _names())


#: None until the module is first compiled; then whether it compiled (else the array kernels run)
_COMPILED = None
_SMS = None


def usable(x2):
    """Whether the GPU kernels take this local batch: a C-contiguous device array, and the module
    compiled here (a compiler that refuses it leaves BatchNorm to norm.py's array kernels, with a
    warning, rather than failing a training step)."""
    global _COMPILED
    if not (backend.current().is_gpu and x2.flags.c_contiguous):
        return False
    if _COMPILED is None:
        try:
            _fn("dm_bn_sums<float, 1, 3, 0, float>")
            _COMPILED = True
        except Exception as exc:        # noqa: BLE001 - any compiler failure: the array kernels still work
            warnings.warn(f"dmath: the BatchNorm GPU kernels did not compile ({exc}); using the array kernels")
            _COMPILED = False
    return _COMPILED


def _sms():
    global _SMS
    if _SMS is None:
        _SMS = backend.current().xp.cuda.Device().attributes["MultiProcessorCount"]
    return _SMS


def acc_dtype(dtype):
    """The dtype of the elementwise kernels' per-channel constants (float; double for double data)."""
    return np.dtype(np.float64) if np.dtype(dtype) == np.float64 else np.dtype(np.float32)


def _width(C, *arrays, ld=None, off=0):
    """V: 16 bytes of the element type per thread when C, a window's row length ld and offset, and
    every array's address allow, else 1."""
    v = _VEC[np.dtype(arrays[0].dtype).name]
    if C % v == 0 and (ld or C) % v == 0 and off % v == 0 and \
            all(a.data.ptr % 16 == 0 for a in arrays if a is not None):
        return v
    return 1


def _shape(C, v, M, per_sm):
    """(grid, block) of a kernel with V = v over an (M, C) batch."""
    cv = C // v
    tx = min(32, 1 << max(0, (cv - 1).bit_length()))
    ty = 256 // tx
    gx = -(-cv // tx)
    gy = max(1, min(-(-M // ty), 65535, -(-per_sm * _sms() // gx)))
    return (gx, gy), (tx, ty)


def _mask_args(x2, y2, relu_from):
    """(MASK, G, the kernels' stats, gamma, beta arguments) of a relu's mask: none (0), Y > 0 (1), or
    recomputed from x (2) with relu_from = (stats, gamma, beta) of the forward."""
    t = _ctype(x2.dtype)
    if relu_from is None:
        return (1 if y2 is not None else 0), t, (x2, x2, x2)
    stats, gamma, beta = relu_from
    return 2, _ctype(gamma.dtype), (stats, gamma, beta)


def channel_sums(mode, x2, mean, dy2=None, y2=None, off=0, relu_from=None, also=None, reduce=True):
    """Per-channel sums (double, shape (2, C)) of the (M, C) batch x2 (see the module docstring);
    reduce=False: the kernel's partial sums, (parts, 2, C), that the finalize kernels add up
    themselves (a launch fewer where no all-reduce comes between).
    mode 3: [sum (x - mean), sum (x - mean)^2] around a shift given as `mean` (one pass for both
    statistics); mode 2: [sum g, sum g (x - mean)], g = dy2 (masked by y2 > 0 when y2 is given, or
    where the forward's relu cut when relu_from = (stats, gamma, beta) is: recomputed from x2, with
    stats = [mean; 1/std] of acc_dtype and gamma, beta of C values; recomputes_mask must hold).
    mean: C values in acc_dtype(x2.dtype). dy2 and y2 may be wider (M, L) arrays whose channels
    off .. off + C are read. also: None, or an array like dy2 that dy2 is the sum of (added as read,
    rounded as dmath.add rounds)."""
    xp = backend.current().xp
    M, C = x2.shape
    if M == 0 or C == 0:
        return xp.zeros((2, C) if reduce else (1, 2, C), dtype=np.float64)
    ld = dy2.shape[1] if dy2 is not None else C
    v = _width(C, x2, dy2, y2, also, ld=ld, off=off)
    per_sm = _STATS_BLOCKS_PER_SM_WIDE if mode == 3 and x2.dtype.itemsize >= 4 else _SUM_BLOCKS_PER_SM
    grid, block = _shape(C, v, M, per_sm)
    partial = memory.empty((grid[1], 2, C), np.float64)
    mask, g, extra = _mask_args(x2, y2, relu_from)
    fn = _fn(f"dm_bn_sums<{_ctype(x2.dtype)}, {v}, {mode}, {mask}, {g}>")
    fn(grid, block, (x2, dy2 if dy2 is not None else x2, y2 if y2 is not None else x2,
                     mean.astype(acc_dtype(x2.dtype), copy=False), *extra, partial, np.int64(M), np.int32(C),
                     np.int64(ld), np.int32(off), *_second(dy2, also)))
    if not reduce:
        return partial
    return partial.sum(axis=0) if grid[1] > 1 else partial[0]


def finalizes(gamma, running, stats, acc):
    """Whether the finalize kernels are built for these dtypes (else norm.py computes with arrays)."""
    return (np.dtype(gamma).name, np.dtype(running).name, np.dtype(stats).name, np.dtype(acc).name) in _FINAL


def finalize_forward(sums, shift, gamma, beta, rm, rv, stats, acc, count, momentum, unbias, eps, into=None,
                     share=1.0):
    """From the all-reduced sums around `shift` (rm's values; (2, C), or channel_sums' partial sums
    (parts, 2, C)): the running statistics rm, rv updated in place, stats = [mean; 1/sqrt(var + eps)],
    and (mean, scale, shift) of `normalize` in `acc`. into: (tm, tv), arrays like rm and rv that get
    the updated statistics times `share` instead (a worker's Partial terms of them: rm and rv are
    read only; one rounding, where an update then a scaling would round twice)."""
    xp = backend.current().xp
    C, parts = sums.shape[-1], _parts(sums)
    consts = xp.empty((3, C), dtype=acc)
    tm, tv = (rm, rv) if into is None else into
    fn = _fn(f"dm_bn_finalize_fwd<{_ctype(gamma.dtype)}, {_ctype(rm.dtype)}, {_ctype(stats.dtype)}, {_ctype(acc)}>")
    fn(*_finalize_grid(C), (sums, shift, rv, gamma, beta, tm, tv, stats, consts[0], consts[1], consts[2],
                            np.float64(1.0 / count), np.float64(momentum), np.float64(unbias),
                            np.float64(eps), np.float64(share), np.int32(C), np.int32(parts)))
    return consts


def _parts(sums):
    """The partial rows of a (2, C) or (parts, 2, C) array of sums (contiguous, as the kernels read it)."""
    if not sums.flags.c_contiguous or sums.shape[-2] != 2:
        raise ValueError(f"the finalize kernels read contiguous (parts, 2, C) sums, got {sums.shape}")
    return 1 if sums.ndim == 2 else sums.shape[0]


def _finalize_grid(C):
    """(grid, block) of a finalize kernel: _FIN_X channels a block, _FIN_Y threads adding each one's rows."""
    return (-(-C // _FIN_X),), (_FIN_X, _FIN_Y)


def finalize_backward(sums, stats, gamma, dgamma, dbeta, acc, count, training):
    """dgamma, dbeta (written) and (mean, a, b, c0) of `input_gradient` in `acc` from the all-reduced
    sums [sum g; sum g (x - mean)] ((2, C), or channel_sums' partial sums (parts, 2, C)) and
    stats = [mean; 1/sqrt(var + eps)]."""
    xp = backend.current().xp
    C, parts = sums.shape[-1], _parts(sums)
    consts = xp.empty((4, C), dtype=acc)
    fn = _fn(f"dm_bn_finalize_bwd<{_ctype(gamma.dtype)}, {_ctype(stats.dtype)}, {_ctype(acc)}>")
    fn(*_finalize_grid(C), (sums, stats, gamma, dgamma, dbeta, consts[0], consts[1], consts[2], consts[3],
                            np.float64(1.0 / count), np.int32(bool(training)), np.int32(C), np.int32(parts)))
    return consts


def normalize(x2, out2, mean, scale, shift, relu, res2=None, off=0):
    """out2 = (x2 - mean) * scale + shift (+ res2) per channel (relu: then max(., 0)); the
    per-channel arrays in acc_dtype(x2.dtype); res2: None or an (M, C) array like x2; out2 may be
    a wider (M, L) array, written in its channels off .. off + C only."""
    M, C = x2.shape
    if x2.size == 0:
        return
    acc = acc_dtype(x2.dtype)
    args = [a.astype(acc, copy=False) for a in (mean, scale, shift)]
    ld = out2.shape[1]
    v = _width(C, x2, out2, res2, ld=ld, off=off)
    grid, block = _shape(C, v, M, _EW_BLOCKS_PER_SM)
    fn = _fn(f"dm_bn_normalize<{_ctype(x2.dtype)}, {v}, {'true' if relu else 'false'}, "
             f"{'true' if res2 is not None else 'false'}>")
    fn(grid, block, (x2, res2 if res2 is not None else x2, out2, *args, np.int64(M), np.int32(C), np.int64(ld),
                     np.int32(off)))


def _second(dy2, also):
    """The kernels' (dy2, two) arguments of a gradient given as one array or as the sum of two."""
    return (dy2, np.int32(0)) if also is None else (also, np.int32(1))


def input_gradient(dy2, x2, y2, dx2, mean, a, b, c0, dr2=None, off=0, relu_from=None, also=None):
    """dx2 = a * g + b * (x2 - mean) + c0 per channel, g = dy2 masked by y2 > 0 when y2 is given (or
    where the forward's relu cut, recomputed from x2, when relu_from = (stats, gamma, beta) is: see
    channel_sums); dr2: None, or an (M, C) array that receives g (a residual's gradient) in the same
    pass. dy2 and y2 may be wider (M, L) arrays whose channels off .. off + C are read. also: see
    channel_sums."""
    M, C = x2.shape
    if x2.size == 0:
        return
    acc = acc_dtype(x2.dtype)
    args = [v.astype(acc, copy=False) for v in (mean, a, b, c0)]
    ld = dy2.shape[1]
    v = _width(C, dy2, x2, y2, dx2, dr2, also, ld=ld, off=off)
    grid, block = _shape(C, v, M, _EW_BLOCKS_PER_SM)
    mask, g, extra = _mask_args(x2, y2, relu_from)
    fn = _fn(f"dm_bn_dx<{_ctype(x2.dtype)}, {v}, {mask}, {'true' if dr2 is not None else 'false'}, {g}>")
    fn(grid, block, (dy2, x2, y2 if y2 is not None else x2, dx2, dr2 if dr2 is not None else dx2, *args, *extra,
                     np.int64(M), np.int32(C), np.int64(ld), np.int32(off), *_second(dy2, also)))
