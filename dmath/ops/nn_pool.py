"""2-D pooling kernels (max and average) over each worker's samples; no communication.

Max pooling also returns, per output pixel, the position of the maximum
inside its window (i * kw + j, the first maximum on ties) as a matrix of
the output's shape: small integers, exact in the index dtype the master
chose, and an ordinary matrix, so that a recorded training step replays it
like any other. Average pooling divides by kh*kw, padding included
(PyTorch's count_include_pad=True). Padding of a max pool is -inf.
"""
import numpy as np

from .. import backend, memory
from ..runtime import kernel
from . import nn_rows as rows
from .nn_windows import images, padded, tap, windows


@kernel("nn_pool2d")
def _pool2d(call):
    """static = (Geometry, mode); input X; outputs Y[, argmax] (n, C*Ho*Wo)."""
    g, mode = call.entry.static
    x = rows.local(call.inputs[0])
    if x is None:
        return rows.nothing_here(call)
    n = x.shape[0]
    (out,) = rows.new_output(call, 0)
    y = out.reshape(n, g.channels, g.out_h, g.out_w)
    if mode == "average":
        cdt = rows.compute_dtype(x.dtype)
        v = windows(padded(images(x, g), g, 0, cdt), g)
        y[...] = v.sum(axis=(2, 3)) * (1.0 / g.taps)
        return [rows.shard(call, 0, [out])]
    # the max is exact in the data's own dtype: no widening needed
    v = windows(padded(images(x, g), g, -np.inf, x.dtype), g)
    flat = v.transpose(0, 1, 4, 5, 2, 3).reshape(n, g.channels, g.out_h, g.out_w, g.taps)
    (am,) = rows.new_output(call, 1)
    arg = flat.argmax(axis=-1)
    am.reshape(y.shape)[...] = arg
    y[...] = flat.max(axis=-1)
    return [rows.shard(call, 0, [out]), rows.shard(call, 1, [am])]


@kernel("nn_pool2d_backward")
def _pool2d_backward(call):
    """static = (Geometry, mode); inputs dY[, argmax]; output dX (n, C*H*W).

    One pass per kernel tap: each adds its (n, C, Ho, Wo) slab of gradient
    (masked by argmax for max pooling) into the padded input gradient.
    """
    g, mode = call.entry.static
    dy = rows.local(call.inputs[0])
    if dy is None:
        return rows.nothing_here(call)
    n = dy.shape[0]
    cdt = rows.compute_dtype(dy.dtype)
    dy4 = dy.reshape(n, g.channels, g.out_h, g.out_w).astype(cdt, copy=False)
    xp = backend.current().xp
    dpad = memory.zeros((n, g.channels, g.height + 2 * g.ph, g.width + 2 * g.pw), cdt)
    if mode == "average":
        scaled = dy4 * (1.0 / g.taps)
        for i in range(g.kh):
            for j in range(g.kw):
                slab = tap(dpad, g, i, j)
                slab += scaled
    else:
        am = rows.local(call.inputs[1]).reshape(dy4.shape)
        for i in range(g.kh):
            for j in range(g.kw):
                slab = tap(dpad, g, i, j)
                slab += xp.where(am == i * g.kw + j, dy4, 0)
    (dx,) = rows.new_output(call, 0)
    dx.reshape(n, g.channels, g.height, g.width)[...] = \
        dpad[:, :, g.ph:g.ph + g.height, g.pw:g.pw + g.width]
    return [rows.shard(call, 0, [dx])]

