"""dnn.search's pure parts, without workers: grid expansion, random draws from lists and ranges,
the worker groups and the progress line."""
import math

import numpy as np
import pytest

from dnn.errors import ConfigError
from dnn.search import engine, grid_configs, random_configs


def test_grid_is_the_product_in_the_space_order():
    configs = grid_configs({"lr": [0.1, 0.01], "units": [32, 64, 128], "act": ["relu"]})
    assert len(configs) == 6
    assert configs[0] == {"lr": 0.1, "units": 32, "act": "relu"}
    assert configs[1] == {"lr": 0.1, "units": 64, "act": "relu"}        # the first name varies slowest
    assert configs[3] == {"lr": 0.01, "units": 32, "act": "relu"}
    assert len({tuple(c.items()) for c in configs}) == 6


@pytest.mark.parametrize("space, match", [
    ({}, "space is empty"),
    ([("lr", [0.1])], "must be a dict"),
    ({"lr": []}, r"space\['lr'\] is an empty list"),
    ({"lr": (0.1, 0.01)}, "ranges .* are for dnn.search.random"),
    ({"lr": 0.1}, "must be a list of values"),
    ({1: [0.1]}, "names must be strings"),
])
def test_grid_refuses_what_is_not_a_grid(space, match):
    with pytest.raises(ConfigError, match=match):
        grid_configs(space)


SPACE = {"lr": ("log", 1e-4, 1e-1), "drop": (0.0, 0.5), "units": (16, 128), "depth": ("log", 1, 100),
         "act": ["relu", "tanh", "sigmoid"]}


def test_random_draws_depend_on_the_seed_only():
    a, b = random_configs(SPACE, 20, seed=7), random_configs(SPACE, 20, seed=7)
    assert a == b
    assert random_configs(SPACE, 20, seed=8) != a
    # a trial's draws do not depend on how many trials follow
    assert random_configs(SPACE, 5, seed=7) == a[:5]


def test_random_draws_stay_in_their_ranges_with_the_right_types():
    configs = random_configs(SPACE, 2000, seed=0)
    lr = np.array([c["lr"] for c in configs])
    drop = np.array([c["drop"] for c in configs])
    units = [c["units"] for c in configs]
    depth = [c["depth"] for c in configs]
    assert all(isinstance(c["lr"], float) and isinstance(c["drop"], float) for c in configs)
    assert all(type(u) is int and type(d) is int for u, d in zip(units, depth))
    assert lr.min() >= 1e-4 and lr.max() <= 1e-1
    assert drop.min() >= 0.0 and drop.max() < 0.5
    assert abs(drop.mean() - 0.25) < 0.02                         # uniform
    # log-uniform: the median is near the geometric mean, each decade about equally likely
    assert abs(math.log10(np.median(lr)) - (-2.5)) < 0.1
    decades = np.histogram(np.log10(lr), bins=[-4, -3, -2, -1])[0]
    assert decades.min() > 0.28 * len(lr)
    # integer ranges include both ends
    assert min(units) == 16 and max(units) == 128
    assert min(depth) == 1 and max(depth) == 100
    # log-uniform integers: floor of a log-uniform draw in [1, 101), so P(depth < 10) = log(10) / log(101)
    assert abs(np.mean(np.array(depth) < 10) - math.log(10) / math.log(101)) < 0.04
    assert {c["act"] for c in configs} == {"relu", "tanh", "sigmoid"}


@pytest.mark.parametrize("spec, match", [
    ((1, 1), "needs low < high"),
    ((0.5, 0.1), "needs low < high"),
    (("log", 0, 1), "needs low > 0"),
    (("log", -1.0, 1.0), "needs low > 0"),
    (("lin", 1, 2), "is not a range"),
    ((1, 2, 3), "is not a range"),
    ((1, "a"), "must be finite numbers"),
    ((float("nan"), 1.0), "must be finite numbers"),
    ((0.0, float("inf")), "must be finite numbers"),
    ((True, 3), "must be finite numbers"),
    ({1, 2}, "must be a list of values, a range"),
    ([], "is an empty list"),
])
def test_random_refuses_bad_ranges(spec, match):
    with pytest.raises(ConfigError, match=match):
        random_configs({"p": spec}, 3, seed=0)


def test_worker_groups_are_consecutive_and_equal():
    assert engine.worker_groups((0, 1, 2, 3), 2) == [(0, 1), (2, 3)]
    assert engine.worker_groups((0, 1, 2), 1) == [(0,), (1,), (2,)]
    assert engine.worker_groups((2, 3), 2) == [(2, 3)]
    with pytest.raises(ConfigError, match="must divide the number of workers"):
        engine.worker_groups((0, 1, 2, 3), 3)
    with pytest.raises(ConfigError, match="exceeds the 2 worker"):
        engine.worker_groups((0, 1), 4)
    for bad in (0, -1, True, 1.0, "2"):
        with pytest.raises(ConfigError, match="workers_per_trial must be a positive integer"):
            engine.worker_groups((0, 1), bad)


def test_progress_line_names_the_trial_the_workers_and_the_metrics():
    r = {"params": {"lr": 0.012345678, "act": "relu"}, "loss": 0.5, "accuracy": 0.9, "val_loss": 0.25,
         "val_accuracy": 0.95, "seconds": 1.25, "trial": 2, "workers": (2, 3)}
    line = engine.progress_line(r, 8)
    assert line == ("trial 3/8 on workers 2-3 (1.2 s): lr=0.01235, act='relu' - loss 0.5000 - accuracy 0.9000 "
                    "- val_loss 0.2500 - val_accuracy 0.9500")
    r.update(workers=(1,), accuracy=None, val_accuracy=None)
    assert engine.progress_line(r, 8).endswith("on worker 1 (1.2 s): lr=0.01235, act='relu' - loss 0.5000 "
                                               "- val_loss 0.2500")
