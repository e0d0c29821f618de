"""Adaptive average pooling (PyTorch's AdaptiveAvgPool2d) of image batches, and its adjoint.

Output pixel (i, j) of an (oh, ow) output averages the input window rows
[floor(i H / oh), ceil((i + 1) H / oh)) and columns [floor(j W / ow),
ceil((j + 1) W / ow)): windows that may differ in size and overlap when the
output does not divide the input (torchvision's GoogLeNet auxiliary heads
pool 14x14 to 4x4). The kernels loop over the oh * ow windows (a few dozen),
each a slice mean on every worker's own samples: no communication. Where the
output divides the input, dnn uses ordinary average pooling instead.
"""
import math
from typing import NamedTuple

from ...planning import conv as window
from ...runtime import define
from . import args, rows
from ..base import dispatch, new_meta


class AdaptiveArgs(NamedTuple):
    """Static arguments of `nn_adaptive_avg_pool`."""
    image: tuple         # (C, H, W) of an input sample
    out_hw: tuple        # (oh, ow)
    channels_last: bool  # the rows are channels-last
    backward: bool       # the adjoint: the output's gradient spread back over the windows


ADAPTIVE = define("nn_adaptive_avg_pool", AdaptiveArgs)


def adaptive_windows(size, out):
    """[(start, end)] of the `out` windows along an axis of `size` (PyTorch's rule)."""
    return [((i * size) // out, -(-((i + 1) * size) // out)) for i in range(out)]


def _static(image_shape, out_hw, channels_last, backward, features, what):
    image = window.image(image_shape, features, what)
    oh, ow = window.pair(out_hw, f"{what}: output size", 1)
    last = args.flag(channels_last, f"{what}: channels_last")
    return ADAPTIVE.static(image=image, out_hw=(oh, ow), channels_last=last, backward=backward)


def adaptive_avg_pool(x, image_shape, out_hw, channels_last=False):
    """The image batch x (N, C*H*W) average-pooled to (N, C*oh*ow) in adaptive windows (see the
    module), in x's row layout; channels_last: x and the result are channels-last rows."""
    x = args.rows(x, "adaptive_avg_pool: x")
    st = _static(image_shape, out_hw, channels_last, False, x.shape[1], "adaptive_avg_pool")
    out = new_meta(x.layout, (x.shape[0], st.image[0] * st.out_hw[0] * st.out_hw[1]), x.dtype)
    return dispatch("nn_adaptive_avg_pool", [x], [out], static=st)[0][0]


def adaptive_avg_pool_backward(dy, image_shape, out_hw, channels_last=False):
    """d loss / d x of adaptive_avg_pool: dX (N, C*H*W) from dY (N, C*oh*ow), in dy's row layout."""
    dy = args.rows(dy, "adaptive_avg_pool_backward: dy")
    st = _static(image_shape, out_hw, channels_last, True, None, "adaptive_avg_pool_backward")
    args.expect_shape(dy, (dy.shape[0], st.image[0] * st.out_hw[0] * st.out_hw[1]), "adaptive_avg_pool_backward: dy")
    out = new_meta(dy.layout, (dy.shape[0], math.prod(st.image)), dy.dtype)
    return dispatch("nn_adaptive_avg_pool", [dy], [out], static=st)[0][0]


def _cells(a, c, h, w, last):
    """(n, H, W, C) or (n, C, H, W) view, and a function giving the window slice of it."""
    if last:
        return a.reshape(a.shape[0], h, w, c), (lambda r, s: (slice(None), r, s, slice(None)))
    return a.reshape(a.shape[0], c, h, w), (lambda r, s: (slice(None), slice(None), r, s))


@ADAPTIVE.kernel(capturable=True)
def _adaptive(call):
    st = call.entry.static
    a = rows.local(call.inputs[0])
    if a is None:
        return rows.nothing_here(call)
    (out,) = rows.new_output(call, 0)
    c, h, w = st.image
    oh, ow = st.out_hw
    axes = (1, 2) if st.channels_last else (2, 3)
    cdt = rows.compute_dtype(a.dtype)
    big, at_big = _cells(out if st.backward else a, c, h, w, st.channels_last)
    small, at_small = _cells(a if st.backward else out, c, oh, ow, st.channels_last)
    if st.backward:
        big.fill(0)
    for i, (r0, r1) in enumerate(adaptive_windows(h, oh)):
        for j, (c0, c1) in enumerate(adaptive_windows(w, ow)):
            win, cell = at_big(slice(r0, r1), slice(c0, c1)), at_small(i, j)
            if st.backward:
                g = small[cell].astype(cdt) * (1.0 / ((r1 - r0) * (c1 - c0)))
                big[win] += g.reshape(g.shape[:1] + (1, 1) + g.shape[1:] if st.channels_last
                                      else g.shape + (1, 1)).astype(big.dtype)
            else:
                small[cell] = big[win].mean(axis=axes, dtype=cdt)
    return [rows.shard(call, 0, [out])]
