"""Learning-rate schedules: the learning rate of each optimizer step, computed on the master.

A schedule is called as `schedule(step, base_lr)` with the number of steps
taken so far; the optimizer writes the value into its (1, 1) learning-rate
matrix before the step, only when it changed (one tiny command outside the
recorded step).

    SGD(lr=0.1, schedule=Warmup(500, then=CosineAnnealing(10_000)))
"""
import math
import numbers

from ..errors import ConfigError


class Schedule:
    """Base: `__call__(step, base_lr) -> lr`; `get_config()` is JSON-able and `get` rebuilds it."""

    def __call__(self, step, base_lr):
        raise NotImplementedError

    def get_config(self):
        return {"name": type(self).__name__, **{k: (v.get_config() if isinstance(v, Schedule) else v)
                                                for k, v in self.__dict__.items()}}

    def __repr__(self):
        return f"{type(self).__name__}({', '.join(f'{k}={v!r}' for k, v in self.__dict__.items())})"


class Constant(Schedule):
    """The base learning rate at every step."""

    def __call__(self, step, base_lr):
        return base_lr


class StepDecay(Schedule):
    """base_lr * gamma ** (step // step_size) (PyTorch's StepLR, counted in steps)."""

    def __init__(self, step_size, gamma=0.1):
        self.step_size = _count(step_size, "step_size")
        self.gamma = _factor(gamma, "gamma")

    def __call__(self, step, base_lr):
        return base_lr * self.gamma ** (step // self.step_size)


class ExponentialDecay(Schedule):
    """base_lr * gamma ** step."""

    def __init__(self, gamma):
        self.gamma = _factor(gamma, "gamma")

    def __call__(self, step, base_lr):
        return base_lr * self.gamma ** step


class CosineAnnealing(Schedule):
    """From base_lr down to min_lr along half a cosine over total_steps, then min_lr."""

    def __init__(self, total_steps, min_lr=0.0):
        self.total_steps = _count(total_steps, "total_steps")
        # `not min_lr >= 0` also refuses NaN (NaN < 0 is False); an infinite floor gives inf or NaN rates
        if isinstance(min_lr, bool) or not isinstance(min_lr, numbers.Real) or not min_lr >= 0 \
                or not math.isfinite(min_lr):
            raise ConfigError(f"min_lr must be a finite non-negative number, got {min_lr!r}")
        self.min_lr = float(min_lr)

    def __call__(self, step, base_lr):
        t = min(step, self.total_steps) / self.total_steps
        return self.min_lr + (base_lr - self.min_lr) * 0.5 * (1.0 + math.cos(math.pi * t))


class Warmup(Schedule):
    """A linear warm-up over `steps` steps, then the schedule `then` (its clock starting after the warm-up).

    Step t < steps runs at base_lr * (start_factor + (1 - start_factor) * (t + 1) / steps):
    the last warm-up step reaches base_lr.
    """

    def __init__(self, steps, start_factor=0.0, then=None):
        self.steps = _count(steps, "warm-up steps")
        if isinstance(start_factor, bool) or not isinstance(start_factor, numbers.Real) \
                or not 0 <= start_factor <= 1:
            raise ConfigError(f"start_factor must be in [0, 1], got {start_factor!r}")
        self.start_factor = float(start_factor)
        if then is not None and not isinstance(then, Schedule):
            raise ConfigError(f"then must be a schedule, got {then!r}")
        self.then = then

    def __call__(self, step, base_lr):
        if step < self.steps:
            return base_lr * (self.start_factor + (1.0 - self.start_factor) * (step + 1) / self.steps)
        return self.then(step - self.steps, base_lr) if self.then is not None else base_lr


_KINDS = {c.__name__: c for c in (Constant, StepDecay, ExponentialDecay, CosineAnnealing, Warmup)}


def get(config):
    """A schedule from its `get_config()` dict (or None)."""
    if config is None or isinstance(config, Schedule):
        return config
    if not isinstance(config, dict) or config.get("name") not in _KINDS:
        raise ConfigError(f"unknown schedule {config!r}; expected one of {sorted(_KINDS)}")
    args = {k: v for k, v in config.items() if k != "name"}
    if isinstance(args.get("then"), dict):
        args["then"] = get(args["then"])
    try:
        return _KINDS[config["name"]](**args)
    except TypeError as exc:        # a missing or unknown argument
        raise ConfigError(f"schedule {config['name']}: bad arguments in {config!r}: {exc}") from exc


def _count(v, what):
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise ConfigError(f"{what} must be a positive integer, got {v!r}")
    return v


def _factor(v, what):
    if isinstance(v, bool) or not isinstance(v, numbers.Real) or not 0 < v <= 1:
        raise ConfigError(f"{what} must be in (0, 1], got {v!r}")
    return float(v)
