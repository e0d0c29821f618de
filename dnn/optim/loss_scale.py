"""Dynamic loss scaling for float16 training, decided on the workers (no master-side branch).

The backward pass starts from `scale` instead of 1, so small float16
gradients do not flush to zero; `check` computes `ok`, a (1, 1) matrix that
is 1 when every gradient is finite (dmath.nn.all_finite: one reading pass per
gradient). The optimizer divides the gradients by `scale` and applies the
step gated by `ok` (a skipped step changes nothing; fused rules do both in
their one pass); `update(ok)` then halves the scale after an overflow and
doubles it after `growth_interval` finite steps in a row (PyTorch's
GradScaler policy). All of it runs on the workers, so it records and replays
with the rest of the step.
"""
import math
import numbers

import numpy as np

import dmath

from ..checked import Checked
from ..errors import ConfigError

#: the float32 range a scale is held in: the smallest normal value up to the largest finite one (a
#: value past it was inf in the scale matrix, one below underflowed to 0 or lost its precision)
_F32 = np.finfo(np.float32)
#: the float32 step counter counts whole steps exactly up to 2**24
_MAX_INTERVAL = 2 ** 24


def _init_scale(value):
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value) \
            or not float(_F32.tiny) <= value <= float(_F32.max):
        raise ConfigError(f"init_scale must be a finite positive number a float32 holds (from "
                          f"{float(_F32.tiny):g} to {float(_F32.max):g}), got {value!r}")
    return float(value)


def _growth_factor(value):
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value) \
            or not value > 1:
        raise ConfigError(f"growth_factor must be a finite number > 1, got {value!r}")
    return float(value)


def _backoff_factor(value):
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not 0 < value < 1:
        raise ConfigError(f"backoff_factor must be a number in (0, 1), got {value!r}")
    return float(value)


def _growth_interval(value):
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or not 1 <= value <= _MAX_INTERVAL:
        raise ConfigError(f"growth_interval must be a whole number of steps from 1 to 2**24 (the float32 "
                          f"step counter's exact range), got {value!r}")
    return int(value)


class DynamicLossScale:
    """The loss scale and its update rule; `scale` and `good_steps` are (1, 1) float32 matrices.

    Args: init_scale=2**15 (a positive float32: 1.2e-38 to 3.4e38), growth_factor=2.0 (> 1),
    backoff_factor=0.5 (in (0, 1)), growth_interval=2000 (1 to 2**24 steps). Each may be assigned
    later, checked alike; a change takes effect at the next training step (init_scale: only
    before the scaler's first use, when its scale is made).
    """

    init_scale = Checked(_init_scale)
    growth_factor = Checked(_growth_factor)
    backoff_factor = Checked(_backoff_factor)
    growth_interval = Checked(_growth_interval)

    def __init__(self, init_scale=2.0 ** 15, growth_factor=2.0, backoff_factor=0.5, growth_interval=2000):
        # every argument checked before any is stored: a refused call leaves nothing half made
        checked = (_init_scale(init_scale), _growth_factor(growth_factor), _backoff_factor(backoff_factor),
                   _growth_interval(growth_interval))
        self.init_scale, self.growth_factor, self.backoff_factor, self.growth_interval = checked
        self.scale = None
        self.good_steps = None
        self.skipped = None     # steps skipped in a row (not saved: a resumed run counts afresh)

    def get_config(self):
        return {"init_scale": self.init_scale, "growth_factor": self.growth_factor,
                "backoff_factor": self.backoff_factor, "growth_interval": self.growth_interval}

    def setup(self):
        """Create the (1, 1) matrices (master side, before the first step)."""
        if self.scale is None:
            rep = dmath.Replicated()
            self.scale = dmath.full((1, 1), self.init_scale, dtype="float32", layout=rep)
            self.good_steps = dmath.zeros((1, 1), dtype="float32", layout=rep)
            self.skipped = dmath.zeros((1, 1), dtype="float32", layout=rep)

    def check(self, grads):
        """ok: a (1, 1) float32 matrix, 1 when every gradient (None: none) is finite, else 0 (on the workers)."""
        grads = [g for g in grads if g is not None]
        if not grads:
            return dmath.ones((1, 1), dtype="float32", layout=dmath.Replicated())
        return dmath.nn.all_finite(grads)

    def update(self, ok):
        """Adjust the scale after a step whose gradients were finite (ok = 1) or not (ok = 0)."""
        good = self.good_steps
        good += 1.0
        good *= ok                                        # an overflow restarts the count
        # 1 when the count is reached; >= rather than ==: a growth_interval lowered between fits below
        # the count already made (1000 -> 1 after 4 good steps) would never be met again
        grow = dmath.greater_equal(good, float(self.growth_interval))
        factor = ok * (grow * (self.growth_factor - 1.0) + 1.0) + (1.0 - ok) * self.backoff_factor
        self.scale *= factor
        good *= 1.0 - grow
        skipped = self.skipped
        skipped += 1.0
        skipped *= 1.0 - ok                               # a good step ends the run of skips

    def skipped_in_a_row(self):
        """How many of the latest steps were skipped one after another (a master-side read)."""
        return int(self.skipped.get((0, 0)))

    def value(self):
        """The current scale (a master-side read: one gather)."""
        return self.scale.get((0, 0))
