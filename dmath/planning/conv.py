"""Window geometry of convolution and pooling: the one place that normalises and checks it.

Pure functions of the arguments, no runtime: the master halves of
`dmath.nn.conv2d` and `pool2d` (dmath/ops/nn/conv.py, pool.py) and dnn's
Conv2D and Pool2D (ops and layers) call them, so a mistake is found by one
rule and raised as one class, `ShapeError`, wherever it is made. The
`Geometry` they return is the static argument of the convolution and pooling
operations, which the kernels read.
"""
import math
import numbers
from typing import NamedTuple

import numpy as np

from ..errors import ShapeError


#: the largest stride: the kernels index with C longs, and a stride of 10**18 passed the checks and
#: overflowed im2col's strided view on a worker (a hostile-use probe); any stride past the padded
#: image gives the same single window
MAX_STRIDE = 2 ** 31 - 1


def integer(value, what, low, high=None):
    """`value` as an int, which must be at least `low` (and at most `high`; bool is not an integer
    here)."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (numbers.Integral, np.integer)):
        raise ShapeError(f"{what} must be an integer, got {value!r}")
    if value < low:
        raise ShapeError(f"{what} must be at least {low}, got {value}")
    if high is not None and value > high:
        raise ShapeError(f"{what} must be at most {high}, got {value}")
    return int(value)


def pair(value, what, low, high=None):
    """An int or a pair of ints, each at least `low` (and at most `high`), as an (h, w) pair."""
    if isinstance(value, (numbers.Integral, np.integer)) and not isinstance(value, (bool, np.bool_)):
        value = (value, value)
    try:
        a, b = value
    except (TypeError, ValueError) as exc:
        raise ShapeError(f"{what} must be an integer or a pair of integers, got {value!r}") from exc
    return (integer(a, what, low, high), integer(b, what, low, high))


def image(image_shape, features, what):
    """A validated (C, H, W) whose product is the batch's number of columns (unless features is None)."""
    try:
        c, h, w = image_shape
    except (TypeError, ValueError) as exc:
        raise ShapeError(f"{what}: image_shape must be (C, H, W), got {image_shape!r}") from exc
    shape = tuple(integer(v, f"{what}: image_shape entry", 1) for v in (c, h, w))
    if features is not None and shape[0] * shape[1] * shape[2] != features:
        raise ShapeError(f"{what}: image_shape {shape} has {shape[0] * shape[1] * shape[2]} values per "
                         f"sample, the batch has {features} columns")
    return shape


def output_length(size, k, stride, pad, dilation):
    """Output length of a sliding window along one axis (floor mode, as PyTorch):
    (size + 2 pad - dilation (k - 1) - 1) // stride + 1."""
    return (size + 2 * pad - dilation * (k - 1) - 1) // stride + 1


class Geometry(NamedTuple):
    """Image size, kernel, stride, padding and dilation of a convolution or pooling window."""
    channels: int
    height: int
    width: int
    kh: int
    kw: int
    sh: int
    sw: int
    ph: int
    pw: int
    dh: int
    dw: int
    eh: int = 0      # rows of padding past ph at the bottom: a ceil-mode pool's last windows (see ceil_extra)
    ew: int = 0      # columns past pw at the right

    @property
    def out_h(self):
        return output_length(self.height + self.eh, self.kh, self.sh, self.ph, self.dh)

    @property
    def out_w(self):
        return output_length(self.width + self.ew, self.kw, self.sw, self.pw, self.dw)

    @property
    def in_features(self):
        return self.channels * self.height * self.width

    @property
    def taps(self):
        return self.kh * self.kw


def geometry(image_shape, kernel_hw, stride, padding, dilation, what):
    """The Geometry of a window over (C, H, W) images: each of kernel_hw, stride, padding and
    dilation an int or an (h, w) pair; ShapeError unless the (dilated) kernel fits the padded image
    (an output of at least 1x1, see output_length)."""
    c, h, w = image(image_shape, None, what)
    (kh, kw), (sh, sw) = pair(kernel_hw, f"{what}: kernel", 1), pair(stride, f"{what}: stride", 1, MAX_STRIDE)
    (ph, pw), (dh, dw) = pair(padding, f"{what}: padding", 0), pair(dilation, f"{what}: dilation", 1)
    g = Geometry(c, h, w, kh, kw, sh, sw, ph, pw, dh, dw)
    if g.out_h < 1 or g.out_w < 1:
        raise ShapeError(f"{what}: a {kh}x{kw} kernel (dilation {dh}x{dw}) does not fit a "
                         f"{h}x{w} image padded by {ph}x{pw}")
    return g


def pool_window(kernel, stride, padding, what):
    """(kernel, stride, padding) of a pooling window as checked pairs; stride None means the kernel
    (non-overlapping windows)."""
    kernel = pair(kernel, f"{what}: kernel", 1)
    stride = pair(kernel if stride is None else stride, f"{what}: stride", 1, MAX_STRIDE)
    padding = pair(padding, f"{what}: padding", 0)
    if 2 * padding[0] > kernel[0] or 2 * padding[1] > kernel[1]:
        # as PyTorch: a window that reads only padding has no value to pool
        raise ShapeError(f"{what}: padding {padding} must be at most half the kernel {kernel}")
    return kernel, stride, padding


def pool_geometry(image_shape, kernel, stride, padding, what, ceil_mode=False):
    """The Geometry of a pooling window over (C, H, W) images (see pool_window); ceil_mode:
    PyTorch's, the output length rounded up (the Geometry's eh, ew: see ceil_extra)."""
    kernel, stride, padding = pool_window(kernel, stride, padding, what)
    if not ceil_mode:
        return geometry(image_shape, kernel, stride, padding, 1, what)
    # a ceil-mode window may be larger than the padded image (its rows past the end read nothing), as
    # PyTorch's: the output is checked after the extra rows, not before
    c, h, w = image(image_shape, None, what)
    (kh, kw), (sh, sw), (ph, pw) = kernel, stride, padding
    g = Geometry(c, h, w, kh, kw, sh, sw, ph, pw, 1, 1, ceil_extra(h, kh, sh, ph), ceil_extra(w, kw, sw, pw))
    if g.out_h < 1 or g.out_w < 1:
        raise ShapeError(f"{what}: a {kh}x{kw} window with stride {sh}x{sw} has no ceil-mode output on a "
                         f"{h}x{w} image padded by {ph}x{pw}")
    return g


def ceil_extra(size, k, s, p):
    """The rows past the padded image that PyTorch's ceil mode adds along one axis (0 or more): its
    output is ceil((size + 2p - k) / s) + 1, less one where that last window would start at or past
    size + p (entirely in the padding). Those windows read only the image's rows they reach."""
    out = -(-(size + 2 * p - k) // s) + 1
    if (out - 1) * s >= size + p:
        out -= 1
    return max((out - 1) * s + k - (size + 2 * p), 0)


def groups(value, channels, kernels, what):
    """The number of channel groups, which must divide the input channels and the kernels."""
    value = integer(value, f"{what}: groups", 1)
    if channels % value or kernels % value:
        raise ShapeError(f"{what}: groups={value} must divide the input channels ({channels}) and the "
                         f"kernels ({kernels})")
    return value


def kernel_from_weights(w_cols, channels, kernel_hw, what):
    """(kh, kw) of a kernel matrix of `w_cols` columns over `channels` (C/groups) channels:
    kernel_hw when given (it must match), else the square kernel the columns hold."""
    if w_cols % channels:
        raise ShapeError(f"{what}: W has {w_cols} columns, not a multiple of C/groups={channels} "
                         f"(W is (K, C/groups*kh*kw))")
    taps = w_cols // channels
    if kernel_hw is None:
        side = math.isqrt(taps)
        if side * side != taps:
            raise ShapeError(f"{what}: W holds {taps} taps per channel, not a square kernel; "
                             f"pass kernel_hw=(kh, kw)")
        return (side, side)
    kh, kw = pair(kernel_hw, f"{what}: kernel_hw", 1)
    if kh * kw != taps:
        raise ShapeError(f"{what}: kernel_hw {(kh, kw)} has {kh * kw} taps, W holds {taps} per channel")
    return (kh, kw)
