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
import dmath

from ..errors import ConfigError
from .base import _positive


class DynamicLossScale:
    """The loss scale and its update rule; `scale` and `good_steps` are (1, 1) float32 matrices."""

    def __init__(self, init_scale=2.0 ** 15, growth_factor=2.0, backoff_factor=0.5, growth_interval=2000):
        init_scale, growth_factor, backoff_factor = (_positive(v, what) for v, what in (
            (init_scale, "init_scale"), (growth_factor, "growth_factor"), (backoff_factor, "backoff_factor")))
        if not init_scale > 0 or not growth_factor > 1 or not 0 < backoff_factor < 1:
            raise ConfigError("loss scaling needs init_scale > 0, growth_factor > 1 and 0 < backoff_factor < 1")
        if isinstance(growth_interval, bool) or not isinstance(growth_interval, int) or growth_interval < 1:
            raise ConfigError(f"growth_interval must be a positive integer, got {growth_interval!r}")
        self.init_scale, self.growth_factor = float(init_scale), float(growth_factor)
        self.backoff_factor, self.growth_interval = float(backoff_factor), growth_interval
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
        grow = dmath.equal(good, float(self.growth_interval))   # 1 when the count is reached
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
