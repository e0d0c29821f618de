"""Search spaces: the configurations of a grid, and random draws from lists and ranges (pure).

    grid:    {'lr': [0.1, 0.01], 'units': [32, 64]}     -> 4 configurations, in
             itertools.product order (the first name varies slowest)
    random:  {'lr': ('log', 1e-4, 1e-1),                 log-uniform in [low, high]
              'dropout': (0.0, 0.5),                     uniform in [low, high)
              'units': (16, 128),                        ints: both bounds ints -> an integer in [low, high]
              'layers': ('log', 1, 8),                   ints: log-uniform integer in [low, high]
              'act': ['relu', 'tanh']}                   one of the list, equally likely

A range whose bounds are both integers (not bools) draws integers with both
ends included; any float bound makes it a float range. Draws come from a
NumPy generator seeded with the search's seed, trial by trial and name by
name in the space's order, so a seed always gives the same trials.
"""
import itertools
import math
import numbers
from collections.abc import Mapping

import numpy as np

from ..errors import ConfigError


def _names(space, fn):
    if not isinstance(space, Mapping):
        raise ConfigError(f"dnn.search.{fn}: space must be a dict of hyperparameter names to their values, "
                          f"got {type(space).__name__}")
    if not space:
        raise ConfigError(f"dnn.search.{fn}: space is empty; give at least one hyperparameter, "
                          f"e.g. {{'lr': [0.1, 0.01]}}")
    for name in space:
        if not isinstance(name, str):
            raise ConfigError(f"dnn.search.{fn}: hyperparameter names must be strings, got {name!r}")
    return list(space)


def _choices(name, values, fn):
    values = list(values)
    if not values:
        raise ConfigError(f"dnn.search.{fn}: space[{name!r}] is an empty list; give at least one value")
    return values


def grid_configs(space):
    """Every combination of the lists in `space`, as dicts, the first name varying slowest."""
    names = _names(space, "grid")
    lists = []
    for name in names:
        values = space[name]
        if not isinstance(values, list):
            raise ConfigError(f"dnn.search.grid: space[{name!r}] must be a list of values, got {values!r} "
                              f"(ranges such as (low, high) or ('log', low, high) are for dnn.search.random)")
        lists.append(_choices(name, values, "grid"))
    return [dict(zip(names, combo)) for combo in itertools.product(*lists)]


def _bound(name, v):
    if isinstance(v, bool) or not isinstance(v, numbers.Real) or not math.isfinite(v):
        raise ConfigError(f"dnn.search.random: the bounds of space[{name!r}] must be finite numbers, got {v!r}")
    return v


def _is_int(v):
    return isinstance(v, numbers.Integral) and not isinstance(v, bool)


class _Dimension:
    """One hyperparameter of a random space: a list to choose from or a (log) range to draw from."""

    def __init__(self, name, spec):
        self.name, self.values, self.log = name, None, False
        if isinstance(spec, list):
            self.values = _choices(name, spec, "random")
            return
        if not isinstance(spec, tuple):
            raise ConfigError(f"dnn.search.random: space[{name!r}] must be a list of values, a range (low, high) "
                              f"or ('log', low, high), got {spec!r}")
        if len(spec) == 3 and spec[0] == "log":
            self.log, bounds = True, spec[1:]
        elif len(spec) == 2 and not isinstance(spec[0], str):
            bounds = spec
        else:
            raise ConfigError(f"dnn.search.random: space[{name!r}] = {spec!r} is not a range: write (low, high) "
                              f"or ('log', low, high)")
        low, high = (_bound(name, v) for v in bounds)
        if not low < high:
            raise ConfigError(f"dnn.search.random: space[{name!r}] needs low < high, got {spec!r} "
                              f"(a fixed value is a one-element list)")
        if self.log and low <= 0:
            raise ConfigError(f"dnn.search.random: the log range space[{name!r}] needs low > 0, got {spec!r}")
        self.integer = _is_int(low) and _is_int(high)
        self.low, self.high = (int(low), int(high)) if self.integer else (float(low), float(high))

    def draw(self, rng):
        if self.values is not None:
            return self.values[int(rng.integers(len(self.values)))]
        if not self.log:
            if self.integer:
                return int(rng.integers(self.low, self.high + 1))
            return float(rng.uniform(self.low, self.high))
        if self.integer:
            # log-uniform over [low, high + 1), floored: every integer of [low, high] can come out, and
            # each decade of the range is about equally likely
            v = math.exp(rng.uniform(math.log(self.low), math.log(self.high + 1)))
            return min(int(v), self.high)
        return float(math.exp(rng.uniform(math.log(self.low), math.log(self.high))))


def random_configs(space, trials, seed):
    """`trials` configurations drawn from `space` (see the module docstring) with NumPy's PCG64 at `seed`."""
    dims = [_Dimension(name, space[name]) for name in _names(space, "random")]
    rng = np.random.default_rng(seed)
    return [{d.name: d.draw(rng) for d in dims} for _ in range(trials)]
