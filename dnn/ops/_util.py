"""Helpers shared by the differentiable ops."""
import numpy as np

import dmath

from ..errors import ShapeError
from ..graph.execute import plain_layout  # noqa: F401  (the ops use it from here)


def broadcast_shape(name, *shapes):
    """The result shape of an elementwise op, with dmath's row/column-vector broadcasting."""
    try:
        return tuple(np.broadcast_shapes(*shapes))
    except ValueError as exc:
        raise ShapeError(f"{name}: shapes {list(shapes)} do not broadcast (operands must be equal, "
                         f"or (1, n) rows, (m, 1) columns or (1, 1))") from exc


def result_dtype(*nodes):
    return np.result_type(*[n.dtype for n in nodes]).name


def sample_shape_of(shape, *nodes):
    """The sample shape of an elementwise result: that of the first operand of the result's shape."""
    for n in nodes:
        if n.shape == shape:
            return n.sample_shape
    return None


def unbroadcast(g, shape):
    """Sum the gradient `g` of a broadcast result down to an operand of `shape`."""
    if tuple(g.shape) == tuple(shape):
        return g
    if shape[0] == 1 and g.shape[0] != 1:
        g = g.sum(axis=0)
    if shape[1] == 1 and g.shape[1] != 1:
        g = g.sum(axis=1)
    return g


def expand(g, like, dtype=None):
    """The (1, 1), (1, n) or (m, 1) gradient `g` broadcast to the shape of the matrix `like`."""
    ones = dmath.ones(like.shape, dtype=dtype or g.dtype, layout=plain_layout(like))
    return ones * g
