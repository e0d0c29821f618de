"""Antialiased bilinear resizing of a batch of packed uint8 images of different sizes, with the flip,
the normalisation, the transposition to NCHW and the cast fused in: the device half of an image batch
whose crop and resize run on the device (host_batches, place 'device_resize').

Pillow's filter and arithmetic (Resample.c, 8-bit images), so the pixels equal
Pillow's `Image.resize(size, BILINEAR)`: for an input of `n` pixels resampled
to `full` outputs, scale = n / full and the filter widens to support =
max(scale, 1); output pixel x (of the full grid) has center (x + 0.5) *
scale and reads the inputs int(center - support + 0.5) .. int(center +
support + 0.5) - 1 (clipped to the image), weighted by the triangle 1 -
|(i - center + 0.5) / max(scale, 1)|, normalised to sum 1 and rounded to
22-bit fixed point; the rows are resampled first and rounded to whole
pixel values, then the columns.

A batch travels as one packed uint8 buffer (image b's (h, w, 3) pixels at
byte offset[b]) and an int64 (B, GEOM) table: offset, h, w, the full output
size (full_h, full_w) the image is resampled to, the output's first pixel in
that grid (off_y, off_x; a center crop of an evaluation resize), and
whether the sample is mirrored. Each sample's output is (H, W) of the full
grid. `resize_batch` runs on the array module's arrays: NumPy computes it
image by image (the reference, and the CPU backend's 'device'); on a GPU
one CUDA kernel computes every output value of the batch.
"""
import numpy as np

from ..gpu import launcher as cuda

#: the columns of a batch's geometry table
GEOM = ("offset", "h", "w", "full_h", "full_w", "off_y", "off_x", "mirrored")


#: Pillow's fixed-point weights for 8-bit images: 32 - 8 - 2 bits
PRECISION_BITS = 22
_HALF = 1 << (PRECISION_BITS - 1)


def weights(n, full, first, count):
    """(count, n) int64 matrix of Pillow's fixed-point bilinear weights of outputs first .. first +
    count - 1 of an n -> full resample (each row sums to about 2**PRECISION_BITS)."""
    scale = n / full
    fs = max(scale, 1.0)
    inv = 1.0 / fs
    center = (np.arange(first, first + count, dtype=np.float64) + 0.5) * scale
    lo = np.maximum(np.trunc(center - fs + 0.5), 0).astype(np.int64)
    hi = np.minimum(np.trunc(center + fs + 0.5), n).astype(np.int64)
    i = np.arange(n, dtype=np.float64)[None, :]
    w = np.clip(1.0 - np.abs((i - center[:, None] + 0.5) * inv), 0.0, None)
    w[(i < lo[:, None]) | (i >= hi[:, None])] = 0.0
    # summed from the first tap on, as Pillow sums (a pairwise sum may differ in the last bit)
    total = np.zeros(count)
    rows_ = np.arange(count)
    for t in range(int((hi - lo).max(initial=0))):
        cols = lo + t
        ok = cols < hi
        total[ok] += w[rows_[ok], cols[ok]]
    w = np.divide(w, total[:, None], out=np.zeros_like(w), where=total[:, None] != 0)
    scaled = w * (1 << PRECISION_BITS)
    return np.where(w < 0, np.trunc(scaled - 0.5), np.trunc(scaled + 0.5)).astype(np.int64)


def _clip8(acc):
    return np.clip(acc >> PRECISION_BITS, 0, 255)


def resize_one(pixels, full_h, full_w, off_y, off_x, out_h, out_w, mirrored):
    """The (out_h, out_w, 3) int64 pixel values of one image (see the module docstring)."""
    ky = weights(pixels.shape[0], full_h, off_y, out_h)
    kx = weights(pixels.shape[1], full_w, off_x, out_w)
    rows_ = _clip8(_HALF + np.einsum("hwc,xw->hxc", pixels.astype(np.int64), kx))
    v = _clip8(_HALF + np.einsum("yh,hxc->yxc", ky, rows_))
    return v[:, ::-1] if mirrored else v


def resize_batch(xp, packed, geom, out, mean, inv_std):
    """out (B, C, H, W) = ((resized pixel) - mean) * inv_std for every image of the packed batch.

    packed: uint8 (bytes,) array; geom: int64 (B, len(GEOM)) array (both of
    the array module `xp`; geom also as a host copy for NumPy); mean,
    inv_std: (1, C, 1, 1) arrays of the compute dtype.
    """
    b, c, h, w = out.shape
    if not b:
        return out
    if xp is np:
        for k in range(b):
            o, ih, iw, fh, fw, oy, ox, mir = (int(v) for v in geom[k])
            pix = packed[o:o + ih * iw * 3].reshape(ih, iw, 3)
            v = resize_one(pix, fh, fw, oy, ox, h, w, mir).transpose(2, 0, 1).astype(mean.dtype)
            out[k] = (v - mean[0]) * inv_std[0]
        return out
    fn = cuda.function(_SOURCE, f"dm_resize_batch<{cuda.C_TYPES[str(out.dtype)]}>", _INSTANCES)
    # (exactly the compute dtype's values, as float64: the kernel computes in that dtype again)
    stats = xp.concatenate([mean.reshape(-1), inv_std.reshape(-1)]).astype(xp.float64)
    cuda.launch(fn, b * h * w, (packed, geom, stats, out, np.int32(b), np.int32(h), np.int32(w)))
    return out


_SOURCE = r"""
// One thread per output pixel (b, y, x): Pillow's resample (module docstring), rows then columns in
// 22-bit fixed point with a rounding to a whole pixel value after each, normalised per channel,
// written to out[b, c, y, x] in out's type. The weights are computed as NumPy's `weights` does, in
// the same order (no a * b + c a compiler could fuse, other than by a power of two).
#define DM_BITS 22
__device__ void dm_span(double center, double fs, long long n, long long* lo, long long* hi) {
    double a = trunc(center - fs + 0.5), z = trunc(center + fs + 0.5);
    *lo = a < 0 ? 0 : (long long)a;
    *hi = z > (double)n ? n : (long long)z;
}
__device__ double dm_tri(long long i, double center, double inv) {
    double u = 1.0 - fabs(((double)i - center + 0.5) * inv);
    return u > 0.0 ? u : 0.0;
}
__device__ long long dm_fixed(double w) {
    double s = w * (double)(1 << DM_BITS);
    return (long long)(w < 0 ? trunc(s - 0.5) : trunc(s + 0.5));
}
__device__ long long dm_clip8(long long acc) {
    long long v = acc >> DM_BITS;
    return v < 0 ? 0 : (v > 255 ? 255 : v);
}
template <typename T>
__global__ void dm_resize_batch(const unsigned char* packed, const long long* geom, const double* stats, T* out,
                                int B, int H, int W) {
    long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= (long long)B * H * W) return;
    int x = (int)(t % W), y = (int)((t / W) % H), b = (int)(t / ((long long)W * H));
    const long long* g = geom + 8LL * b;
    const long long ih = g[1], iw = g[2];
    const unsigned char* img = packed + g[0];
    const double sy = (double)ih / (double)g[3], sx = (double)iw / (double)g[4];
    const double fy = sy > 1.0 ? sy : 1.0, fx = sx > 1.0 ? sx : 1.0;
    const double iy = 1.0 / fy, ix = 1.0 / fx;
    const int xs = g[7] ? W - 1 - x : x;          // mirrored: output column x shows column W - 1 - x
    const double cy = ((double)(g[5] + y) + 0.5) * sy, cx = ((double)(g[6] + xs) + 0.5) * sx;
    long long y0, y1, x0, x1;
    dm_span(cy, fy, ih, &y0, &y1);
    dm_span(cx, fx, iw, &x0, &x1);
    double wy_sum = 0.0, wx_sum = 0.0;
    for (long long i = y0; i < y1; ++i) wy_sum += dm_tri(i, cy, iy);
    for (long long j = x0; j < x1; ++j) wx_sum += dm_tri(j, cx, ix);
    long long acc[3] = {1LL << (DM_BITS - 1), 1LL << (DM_BITS - 1), 1LL << (DM_BITS - 1)};
    for (long long i = y0; i < y1; ++i) {
        long long ky = wy_sum != 0.0 ? dm_fixed(dm_tri(i, cy, iy) / wy_sum) : 0;
        const unsigned char* row = img + i * iw * 3;
        long long r[3] = {1LL << (DM_BITS - 1), 1LL << (DM_BITS - 1), 1LL << (DM_BITS - 1)};
        for (long long j = x0; j < x1; ++j) {
            long long kx = wx_sum != 0.0 ? dm_fixed(dm_tri(j, cx, ix) / wx_sum) : 0;
            r[0] += kx * row[3 * j]; r[1] += kx * row[3 * j + 1]; r[2] += kx * row[3 * j + 2];
        }
        for (int c = 0; c < 3; ++c) acc[c] += ky * dm_clip8(r[c]);
    }
    typedef typename Acc<T>::type A;      // the compute dtype of the NumPy normalisation
    for (int c = 0; c < 3; ++c) {
        A v = ((A)dm_clip8(acc[c]) - (A)stats[c]) * (A)stats[3 + c];
        out[(((long long)b * 3 + c) * H + y) * W + x] = dm_cast<T>((double)v);
    }
}
"""
_INSTANCES = [f"dm_resize_batch<{t}>" for t in cuda.C_TYPES.values()]
