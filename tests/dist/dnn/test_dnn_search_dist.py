"""dnn.search on real digits at every worker count: a grid finds its best configuration, a trial equals
the same configuration fitted alone on a group of its size, random search is deterministic, and
mistakes raise dnn errors before anything trains."""
import math

import numpy as np
import pytest

import dmath
import dnn
from dnn import layers as L
from dnn.errors import ConfigError, ShapeError

from _cases import shuffled_digits

P = dmath.num_workers()
#: the group sizes a search can use at this worker count
SIZES = [n for n in (1, 2, 4) if n <= P and P % n == 0]


@pytest.fixture(scope="module")
def digits():
    """600 training and 300 held-out real MNIST digits (the 5k subset), shuffled."""
    x, y = shuffled_digits()
    return (x[:600], y[:600]), (x[4000:4300], y[4000:4300])


def build(p, dtype="float32"):
    return dnn.Sequential([L.Input((1, 28, 28)), L.Flatten(), L.Dense(p.get("units", 32)), L.Activation("relu"),
                           L.Dropout(p.get("dropout", 0.0)), L.Dense(10), L.Output("softmax")],
                          optimizer=dnn.optim.SGD(lr=p["lr"], momentum=0.9), dtype=dtype)


def test_grid_finds_the_best_of_a_small_grid_on_real_digits(digits, capsys):
    (x, y), val = digits
    space = {"lr": [0.1, 0.0003], "units": [8, 48]}
    results = dnn.search.grid(build, space, x, y, epochs=2, batch_size=30, validation_data=val)
    assert len(results) == 4
    assert sorted(tuple(r["params"].items()) for r in results) == \
        sorted(tuple(c.items()) for c in dnn.search.grid_configs(space))
    val_losses = [r["val_loss"] for r in results]
    assert val_losses == sorted(val_losses)
    # the large learning rate with the wider layer wins; the tiny rate has barely moved from chance
    assert results[0]["params"] == {"lr": 0.1, "units": 48}
    assert results[0]["val_accuracy"] > 0.8 and results[0]["accuracy"] > 0.7     # the 2nd epoch's running mean
    assert all(r["val_accuracy"] < 0.5 for r in results if r["params"]["lr"] == 0.0003)
    for r in results:
        assert set(r) >= {"params", "loss", "accuracy", "val_loss", "val_accuracy", "seconds"}
        assert r["seconds"] > 0 and 0 <= r["val_accuracy"] <= 1
    # one group per worker: the four trials were spread over min(P, 4) groups
    assert {r["workers"] for r in results} == {(k,) for k in range(min(P, 4))}
    lines = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("trial ")]
    assert len(lines) == 4 and all("val_loss" in ln for ln in lines)


@pytest.mark.parametrize("size", SIZES)
def test_a_trial_equals_the_configuration_fitted_alone_on_a_group_of_its_size(digits, size):
    (x, y), (xv, yv) = digits
    space = {"lr": ("log", 0.01, 0.1), "dropout": (0.1, 0.3)}
    results = dnn.search.random(lambda p: build(p, "float64"), space, x[:300], y[:300], trials=2, epochs=2,
                                batch_size=25, validation_data=(xv, yv), workers_per_trial=size, seed=5,
                                verbose=0)
    groups = [tuple(range(k, k + size)) for k in range(0, P, size)]
    for r in results:
        # alone: on another group of the same size when there is one (the data must not matter where)
        alone = groups[(groups.index(r["workers"]) + 1) % len(groups)]
        with dmath.on_group(alone):
            dmath.random.seed(5)
            model = build(r["params"], "float64")
            hist = model.fit(x[:300], y[:300], batch_size=25, epochs=2, validation_data=(xv, yv), verbose=0)
        for key in ("loss", "accuracy", "val_loss", "val_accuracy"):
            assert math.isclose(r[key], hist.history[key][-1], rel_tol=1e-12, abs_tol=1e-12), (key, r, size)


def test_random_search_draws_its_trials_from_the_seed(digits):
    (x, y), val = digits
    space = {"lr": ("log", 0.001, 0.3), "units": (4, 16)}
    runs = [dnn.search.random(build, space, x[:120], y[:120], trials=3, epochs=1, batch_size=40,
                              validation_data=val, seed=s, verbose=0) for s in (3, 3, 4)]
    params = [sorted((r["trial"], tuple(r["params"].items())) for r in run) for run in runs]
    assert params[0] == params[1] != params[2]
    expected = dnn.search.random_configs(space, 3, 3)
    assert [dict(p) for _, p in params[0]] == expected
    for r in runs[0]:
        assert 0.001 <= r["params"]["lr"] <= 0.3 and type(r["params"]["units"]) is int
        assert 4 <= r["params"]["units"] <= 16
    # the same seed gives the same models, hence the same results
    assert [r["val_loss"] for r in runs[0]] == [r["val_loss"] for r in runs[1]]


def _search(digits, **kw):
    (x, y), val = digits
    args = dict(build=build, space={"lr": [0.1]}, x=x[:60], y=y[:60], epochs=1, batch_size=30, validation_data=val,
                verbose=0)
    args.update(kw)
    fn = dnn.search.random if "trials" in kw else dnn.search.grid
    return fn(args.pop("build"), args.pop("space"), args.pop("x"), args.pop("y"), **args)


@pytest.mark.parametrize("kw, match", [
    (dict(space={}), "space is empty"),
    (dict(space={"lr": []}), "empty list"),
    (dict(space={"lr": (0.1, 0.2)}), "are for dnn.search.random"),
    (dict(space={"lr": (0.2, 0.1)}, trials=2), "needs low < high"),
    (dict(space={"lr": ("log", 0.0, 0.1)}, trials=2), "needs low > 0"),
    (dict(space=[0.1]), "must be a dict"),
    (dict(trials=0), "trials must be a positive integer"),
    (dict(workers_per_trial=P + 1), "exceeds the"),
    (dict(workers_per_trial=0), "workers_per_trial must be a positive integer"),
    (dict(workers_per_trial=2.0), "workers_per_trial must be a positive integer"),
    (dict(epochs=0), "epochs must be a positive integer"),
    (dict(batch_size="32"), "batch_size must be a positive integer"),
    (dict(seed=-1), "seed must be an integer"),
    (dict(verbose=2), "verbose must be 0"),
    (dict(build="model"), "build must be a function"),
    (dict(validation_data=None), "validation_data is required"),
    (dict(validation_data=(1, 2, 3)), "validation_data must be a pair"),
    (dict(build=lambda p: "not a model"), "must return a dnn.Sequential"),
])
def test_mistakes_raise_config_errors_and_leave_the_runtime_usable(digits, kw, match):
    with pytest.raises(ConfigError, match=match):
        _search(digits, **kw)
    assert dmath.current_group() == tuple(range(P))
    np.testing.assert_array_equal((dmath.ones((3, 2)) * 2).to_numpy(), np.full((3, 2), 2.0))


@pytest.mark.skipif(P < 3 or P % 2 == 0, reason="needs a worker count above 2 that 2 does not divide")
def test_a_group_size_that_does_not_divide_the_workers_is_refused(digits):
    with pytest.raises(ConfigError, match=f"must divide the number of workers \\({P}\\)"):
        _search(digits, workers_per_trial=2)


def test_a_model_that_does_not_fit_the_data_raises_shape_error(digits):
    def wrong(p):
        return dnn.Sequential([L.Input(100), L.Dense(10), L.Output("softmax")], optimizer=dnn.optim.SGD(lr=0.1))
    with pytest.raises(ShapeError, match="samples must have shape"):
        _search(digits, build=wrong)
    assert dmath.current_group() == tuple(range(P))


def test_a_build_that_returns_one_model_for_every_trial_is_refused(digits):
    """A model built once and returned for every params: at P > 1 its steps on another trial's group
    ended the runtime (a worker's IndexError); at P = 1 the trials went on from each other's weights."""
    made = []

    def once(p):
        if not made:
            made.append(build(p))
        return made[0]
    with pytest.raises(ConfigError, match="must make a new model for each call"):
        _search(digits, build=once, space={"lr": [0.1, 0.05, 0.02]})
    assert dmath.current_group() == tuple(range(P))
    np.testing.assert_array_equal((dmath.ones((3, 2)) * 2).to_numpy(), np.full((3, 2), 2.0))
    with dmath.on_group((0,)):
        outside = build({"lr": 0.1})
    if P > 1:                       # a model on other workers than the trial's
        with pytest.raises(ConfigError, match="on workers \\(0,\\), not the trial's \\(0, 1"):
            _search(digits, build=lambda p: outside, workers_per_trial=P)
