"""Inverted dropout: kept values are scaled by 1 / (1 - p), through dmath.nn.dropout's masks.

The mask is a hash of (seed, step, global element index), so a program draws
the same masks at any worker count. Every step needs a new mask, but a
recorded step replays its commands with the scalars it recorded; so the
mask lives in a persistent matrix that `before_step` refreshes on the master
before each step, outside the recorded plan (dmath.nn.dropout of a matrix of
ones at the next step of the counter, assigned in place: two commands), and
the recorded step only multiplies by it. Evaluated outside a Program (the
graph API), each forward draws the next mask itself.
"""
import dmath

from ..errors import ConfigError
from ..graph.function import Function


class Dropout(Function):
    """y = x * mask in training; the identity when p == 0.

    counter: a one-element list holding the last step drawn (shared by the
    graphs of one layer, so every graph continues the same sequence).
    """
    name = "dropout"

    def __init__(self, p, seed=0, counter=None):
        if not 0.0 <= p < 1.0:
            raise ConfigError(f"dropout: p must be in [0, 1), got {p!r}")
        self.p, self.seed = float(p), int(seed)
        self.counter = counter if counter is not None else [0]
        self.managed = False        # True when a Program calls before_step
        self.mask = None
        self._ones = None

    def infer(self, x):
        self.shape, self.dtype = x.shape, x.dtype
        return x.shape, x.dtype, x.sample_shape

    def before_step(self):
        """Draw the next mask into the persistent mask matrix (master side, outside a recorded step)."""
        self.managed = True
        self._draw()

    def _draw(self):
        if self.p == 0.0:
            return
        self.counter[0] += 1
        if self._ones is None:
            self._ones = dmath.ones(self.shape, dtype=self.dtype, layout=dmath.RowBlock())
        _, mask = dmath.nn.dropout(self._ones, self.p, self.seed, self.counter[0])
        if self.mask is None:
            self.mask = mask
        else:
            self.mask.assign(mask)

    def forward(self, x):
        if not self.managed:
            self._draw()
        return x if self.p == 0.0 else x * self.mask

    def backward(self, xs, y, gy, needs):
        return (gy if self.p == 0.0 else gy * self.mask,)


def dropout(x, p, seed=0):
    return Dropout(p, seed).apply(x)
