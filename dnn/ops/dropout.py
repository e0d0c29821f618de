"""Inverted dropout: kept values are scaled by 1 / (1 - p), through dmath.nn.dropout's masks.

The mask is a hash of (seed, step, global element index), so a program draws
the same masks at any worker count. Every step needs a new mask, but a
recorded step replays its commands with the scalars it recorded; so the
step is a (1, 1) counter matrix on the workers that the step itself
advances in place (`counter += 1`) before drawing: a replay draws the next
mask with no message from the master, and a recorded step is one replay.
The counter belongs to the layer: every graph of the layer (one per batch
size and mode) continues the same sequence of steps.
"""
import dmath

from ..errors import ConfigError
from ..graph.function import Function


def new_counter():
    """A dropout step counter: a (1, 1) float64 zero, Replicated (exact up to 2**53 steps)."""
    return dmath.zeros((1, 1), dtype="float64", layout=dmath.Replicated())


class Dropout(Function):
    """y = x * mask in training; the identity when p == 0.

    counter: the (1, 1) step counter matrix shared by the layer's graphs
    (None: a counter of this function's own).
    """
    name = "dropout"
    saves_inputs = saves_output = False             # backward reads the mask only

    def __init__(self, p, seed=0, counter=None):
        if not 0.0 <= p < 1.0:
            raise ConfigError(f"dropout: p must be in [0, 1), got {p!r}")
        self.p, self.seed = float(p), int(seed)
        self.counter = counter
        self.mask = None

    def infer(self, x):
        return x.shape, x.dtype, x.sample_shape

    def forward(self, x):
        if self.p == 0.0:
            return x
        if self.counter is None:
            self.counter = new_counter()
        self.counter += 1.0
        y, self.mask = dmath.nn.dropout(x, self.p, self.seed, self.counter)
        return y

    def backward(self, xs, y, gy, needs):
        return (gy if self.p == 0.0 else gy * self.mask,)

    def drop_saved(self):
        self.mask = None


def dropout(x, p, seed=0):
    """A node: x with each value zeroed with probability p and the rest scaled by 1 / (1 - p); the
    mask depends on `seed` and the step only (the same at any worker count)."""
    return Dropout(p, seed).apply(x)
