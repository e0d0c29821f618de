"""Inverted dropout through dmath.nn.dropout: kept values are scaled by 1 / (1 - p).

The mask is a hash of (seed, step, global element index), so a program draws
the same masks at any worker count. Each evaluation takes the next step of
the counter (a one-element list, shared by the graphs of one layer).
"""
import dmath

from ..errors import ConfigError
from ..graph.function import Function


class Dropout(Function):
    """y = x * mask in training; the identity when p == 0."""
    name = "dropout"
    # the mask's step is a scalar chosen by the master at each forward; a
    # recorded replay would reuse the recorded one, i.e. the same mask
    replayable = False

    def __init__(self, p, seed=0, counter=None):
        if not 0.0 <= p < 1.0:
            raise ConfigError(f"dropout: p must be in [0, 1), got {p!r}")
        self.p, self.seed = float(p), int(seed)
        self.counter = counter if counter is not None else [0]

    def forward(self, x):
        self.counter[0] += 1
        if self.p == 0.0:
            self.mask = None
            return x
        y, self.mask = dmath.nn.dropout(x, self.p, self.seed, self.counter[0])
        return y

    def backward(self, xs, y, gy, needs):
        return (gy if self.mask is None else gy * self.mask,)


def dropout(x, p, seed=0):
    return Dropout(p, seed).apply(x)
