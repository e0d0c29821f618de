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
from ..registry import register_into


class Schedule:
    """Base: `__call__(step, base_lr) -> lr`; `get_config()` is JSON-able and `get` rebuilds it.

    `_checks` maps a setting's name to the function that checks it (returning the value to store):
    every assignment runs it, the constructor's and a later one's alike, so `gamma = 5` set after
    construction is refused as `StepDecay(10, gamma=5)` is (it trained with a growing rate)."""

    #: {attribute name: check(value) -> the value stored}, run at every assignment
    _checks = {}

    def __setattr__(self, name, value):
        check = self._checks.get(name)
        super().__setattr__(name, check(value) if check is not None else value)

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

    _checks = {"step_size": lambda v: _count(v, "step_size"), "gamma": lambda v: _factor(v, "gamma")}

    def __init__(self, step_size, gamma=0.1):
        self.step_size = step_size
        self.gamma = gamma

    def __call__(self, step, base_lr):
        return base_lr * self.gamma ** (step // self.step_size)


class ExponentialDecay(Schedule):
    """base_lr * gamma ** step."""

    _checks = {"gamma": lambda v: _factor(v, "gamma")}

    def __init__(self, gamma):
        self.gamma = gamma

    def __call__(self, step, base_lr):
        return base_lr * self.gamma ** step


class CosineAnnealing(Schedule):
    """From base_lr down to min_lr along half a cosine over total_steps, then min_lr."""

    _checks = {"total_steps": lambda v: _count(v, "total_steps"), "min_lr": lambda v: _min_lr(v)}

    def __init__(self, total_steps, min_lr=0.0):
        self.total_steps = total_steps
        self.min_lr = min_lr

    def __call__(self, step, base_lr):
        t = min(step, self.total_steps) / self.total_steps
        return self.min_lr + (base_lr - self.min_lr) * 0.5 * (1.0 + math.cos(math.pi * t))


class Warmup(Schedule):
    """A linear warm-up over `steps` steps, then the schedule `then` (its clock starting after the warm-up).

    Step t < steps runs at base_lr * (start_factor + (1 - start_factor) * (t + 1) / steps):
    the last warm-up step reaches base_lr.
    """

    _checks = {"steps": lambda v: _count(v, "warm-up steps"), "start_factor": lambda v: _start_factor(v),
               "then": lambda v: _then(v)}

    def __init__(self, steps, start_factor=0.0, then=None):
        self.steps = steps
        self.start_factor = start_factor
        self.then = then

    def __call__(self, step, base_lr):
        if step < self.steps:
            return base_lr * (self.start_factor + (1.0 - self.start_factor) * (step + 1) / self.steps)
        return self.then(step - self.steps, base_lr) if self.then is not None else base_lr


#: the library's schedule classes by name (model files name them); `register` adds the user's own
BUILT_IN = {c.__name__: c for c in (Constant, StepDecay, ExponentialDecay, CosineAnnealing, Warmup)}
_KINDS = dict(BUILT_IN)


def register(cls):
    """Make a Schedule subclass of your own loadable, as `dnn.layers.register` does for layers:
    dnn.load rebuilds it by its class name from get_config() (its arguments by name; a decorator:
    `@dnn.optim.schedules.register`; returns the class). Model files hold settings, never code, so the
    loading program registers the class too. Saving a model whose schedule is not registered is
    refused (`check_saveable`): the file could not be loaded. A name of the library's schedules cannot
    be taken; registering another class under a name registered before replaces it."""
    return register_into(_KINDS, BUILT_IN, Schedule, "dnn.optim.schedules.Schedule", "schedule", cls)


def check_saveable(schedule):
    """Raise ConfigError unless `get` can rebuild `schedule` (None, or one whose class, and every
    schedule it holds (Warmup's `then`), is the library's or registered under its name): save checks
    before it writes, so that no file is written that dnn.load refuses."""
    if schedule is None:
        return
    cls = type(schedule)
    if _KINDS.get(cls.__name__) is not cls:
        raise ConfigError(f"the schedule class {cls.__name__} is not registered, so a saved model could not be "
                          f"loaded: decorate it with @dnn.optim.schedules.register (in the loading program too)")
    for value in vars(schedule).values():
        if isinstance(value, Schedule):
            check_saveable(value)


def get(config):
    """A schedule from its `get_config()` dict (or None)."""
    if config is None or isinstance(config, Schedule):
        return config
    if not isinstance(config, dict) or config.get("name") not in _KINDS:
        raise ConfigError(f"unknown schedule {config!r}; expected one of {sorted(_KINDS)} (a schedule of your "
                          f"own: dnn.optim.schedules.register(YourSchedule) before loading)")
    # a schedule inside (Warmup's `then`, or a registered one's) is rebuilt from its own config
    args = {k: get(v) if isinstance(v, dict) and v.get("name") in _KINDS else v
            for k, v in config.items() if k != "name"}
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


def _min_lr(v):
    # `not v >= 0` also refuses NaN (NaN < 0 is False); an infinite floor gives inf or NaN rates
    if isinstance(v, bool) or not isinstance(v, numbers.Real) or not v >= 0 or not math.isfinite(v):
        raise ConfigError(f"min_lr must be a finite non-negative number, got {v!r}")
    return float(v)


def _start_factor(v):
    if isinstance(v, bool) or not isinstance(v, numbers.Real) or not 0 <= v <= 1:
        raise ConfigError(f"start_factor must be in [0, 1], got {v!r}")
    return float(v)


def _then(v):
    if v is not None and not isinstance(v, Schedule):
        raise ConfigError(f"then must be a schedule, got {v!r}")
    return v
