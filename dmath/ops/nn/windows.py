"""Sliding windows over NCHW image batches: im2col and its adjoint (col2im).

An image batch is stored as (n, C*H*W) rows. A window view of the padded
batch is built with `as_strided` (no copy, no loop over pixels); im2col
copies it once into GEMM-ready rows. The adjoint loops over the kh*kw kernel
taps only: each tap adds one strided (n, C, Ho, Wo) slab, so overlapping
windows accumulate correctly and no scatter with index arrays is needed.
`g` is always a `planning.conv.Geometry`, the operation's checked window.
"""
from ... import backend, memory


def images(x, g):
    """The (n, C*H*W) row block `x` as an (n, C, H, W) batch (a view)."""
    return x.reshape(x.shape[0], g.channels, g.height, g.width)


def padded(x4, g, fill, dtype):
    """`x4` with g.ph / g.pw rows and columns of `fill` around every image (and g.eh / g.ew more at
    the bottom and right: a ceil-mode pool's), in `dtype`."""
    if not (g.ph or g.pw or g.eh or g.ew):
        return x4.astype(dtype, copy=False)
    n, c, h, w = x4.shape
    buf = memory.empty((n, c, h + 2 * g.ph + g.eh, w + 2 * g.pw + g.ew), dtype)
    buf.fill(fill)
    buf[:, :, g.ph:g.ph + h, g.pw:g.pw + w] = x4
    return buf


def windows(xpad, g):
    """The (n, C, kh, kw, Ho, Wo) window view of a padded batch: element [.., i, j, y, x] is
    xpad[.., y * sh + i * dh, x * sw + j * dw]. A view: never write through it."""
    xp = backend.current().xp
    n, c = xpad.shape[:2]
    s_n, s_c, s_y, s_x = xpad.strides
    return xp.lib.stride_tricks.as_strided(
        xpad, shape=(n, c, g.kh, g.kw, g.out_h, g.out_w),
        strides=(s_n, s_c, s_y * g.dh, s_x * g.dw, s_y * g.sh, s_x * g.sw))


def tap(a, g, i, j):
    """The (n, C, Ho, Wo) strided slab of the padded batch `a` that kernel tap (i, j) reads (a view)."""
    y0, x0 = i * g.dh, j * g.dw
    return a[:, :, y0:y0 + g.sh * (g.out_h - 1) + 1:g.sh, x0:x0 + g.sw * (g.out_w - 1) + 1:g.sw]


def im2col(x, g, dtype):
    """Patches of the (n, C*H*W) block `x` as a (C*kh*kw, n*Ho*Wo) matrix in `dtype`.

    Column (s, y, x) holds the receptive field of output pixel (y, x) of
    sample s, ordered (c, i, j) like a flattened (K, C, kh, kw) kernel, so
    that the convolution is the one GEMM W @ cols. Channel-major rows (as
    Caffe's) make the copy read and write along image rows.
    """
    n = x.shape[0]
    v = windows(padded(images(x, g), g, 0, dtype), g)
    cols = memory.empty((g.channels, g.kh, g.kw, n, g.out_h, g.out_w), dtype)
    cols[...] = v.transpose(1, 2, 3, 0, 4, 5)
    return cols.reshape(g.channels * g.taps, n * g.out_h * g.out_w)


def col2im(dcols, n, g, dtype):
    """The adjoint of im2col: sums (C*kh*kw, n*Ho*Wo) patch gradients back into an
    (n, C, H, W) batch (a view into a padded buffer)."""
    d6 = dcols.reshape(g.channels, g.kh, g.kw, n, g.out_h, g.out_w)
    dpad = memory.zeros((n, g.channels, g.height + 2 * g.ph, g.width + 2 * g.pw), dtype)
    for i in range(g.kh):
        for j in range(g.kw):
            slab = tap(dpad, g, i, j)
            slab += d6[:, i, j].transpose(1, 0, 2, 3)
    return dpad[:, :, g.ph:g.ph + g.height, g.pw:g.pw + g.width]


# ---- channels-last rows ------------------------------------------------------------------------
# A channels-last batch stores each sample's pixels (y, x) one after another, each with its C
# channels together: (n, H*W*C) rows, the NHWC order that cuDNN's fastest kernels read without
# converting. The generic (CPU) kernels convert at their edges and compute in NCHW order.
def channels_first_into(out, a, c, h, w):
    """out (n, C*H*W) = the channels-last rows `a` (n, H*W*C) in NCHW order; returns out."""
    n = a.shape[0]
    out.reshape(n, c, h, w)[...] = a.reshape(n, h, w, c).transpose(0, 3, 1, 2)
    return out


def channels_first(a, c, h, w):
    """The channels-last rows `a` (n, H*W*C) as new C-contiguous NCHW rows (n, C*H*W)."""
    return channels_first_into(memory.empty(a.shape, a.dtype), a, c, h, w)


def channels_last_into(out, a, c, h, w):
    """out (n, H*W*C) = the NCHW rows `a` (n, C*H*W) in channels-last order; returns out."""
    n = a.shape[0]
    out.reshape(n, h, w, c)[...] = a.reshape(n, c, h, w).transpose(0, 2, 3, 1)
    return out
