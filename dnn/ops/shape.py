"""Reshape and flatten: a new view of each sample (row); no data moves.

A batch is always an (N, features) matrix; an image batch's rows are the
samples in NCHW order, so reshaping (C, H, W) <-> (C*H*W,) only changes the
sample shape the graph records.
"""
import math

from ..errors import ShapeError
from ..graph.function import Function


class Reshape(Function):
    """The same rows seen as samples of `sample_shape` (its product must be the row length)."""
    name = "reshape"
    saves_inputs = saves_output = False

    def __init__(self, sample_shape):
        self.sample_shape = tuple(int(d) for d in sample_shape)

    def infer(self, x):
        if math.prod(self.sample_shape) != x.shape[1]:
            raise ShapeError(f"reshape: a sample of {x.sample_shape} ({x.shape[1]} values) cannot be seen "
                             f"as {self.sample_shape}")
        return x.shape, x.dtype, self.sample_shape

    def forward(self, x):
        return x

    def backward(self, xs, y, gy, needs):
        return (gy,)


def reshape(x, sample_shape):
    """A node: x with each sample seen as `sample_shape` (the same number of values; no data moves)."""
    return Reshape(sample_shape).apply(x)


def flatten(x):
    """Samples as flat vectors: (N, C*H*W) with sample shape (C*H*W,)."""
    return Reshape((x.shape[1],)).apply(x)
