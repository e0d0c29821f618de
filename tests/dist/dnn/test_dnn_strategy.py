"""parallel='auto' decided by timing the candidates at fit's first steps (dnn.training.strategy).

Oracles: the same training with the strategy fixed (the candidates compute the same values, float64),
the cost model's choice where timing is off, and the cache's entry read back by a second model.
"""
import json
import os

import numpy as np
import pytest

import dmath
import dnn
from dmath import tuning
from dnn import layers as L
from dnn.training import strategy

P = dmath.num_workers()


@pytest.fixture()
def cache(tmp_path, monkeypatch):
    """A private tuning cache in 'fast' mode (the master's: the trial runs there)."""
    own = tuning.TuneCache(str(tmp_path / "tune.json"))
    monkeypatch.setattr(tuning, "shared", lambda: own)
    monkeypatch.setattr(tuning, "mode", lambda: "fast")
    return own


def _data():
    rng = np.random.default_rng(5)
    return rng.standard_normal((160, 48)), rng.integers(0, 3, 160)


def _model(parallel="auto"):
    dmath.random.seed(9)
    return dnn.Sequential([L.Input(48), L.Dense(64, activation="relu", parallel=parallel),
                           L.Dense(48, activation="tanh", parallel=parallel), L.Dense(3), L.Output("softmax")],
                          dtype="float64", optimizer=dnn.optim.SGD(lr=0.05, momentum=0.9))


def test_candidates_and_the_fastest():
    a, b = L.Dense(512, parallel="auto"), L.Dense(10, parallel="auto")
    a.build((512,), "float32")
    b.build((512,), "float32")
    got = strategy.candidates([a, b], 32, 4)
    assert list(got.values()) == [("data", "data"), ("model", "data")]
    assert "dense: model" in list(got)[1]
    assert strategy.candidates([b], 32, 4) == {"data": ("data",)}
    assert strategy.fastest({"x": 2.0, "y": 1.0, "z": 1.0}) == "y"
    # a typical step: the median, which one step that paid a one-time cost (a capture) does not move
    assert strategy.typical([0.0040, 0.0300, 0.0041, 0.0042, 0.0040]) == pytest.approx(4.1)
    assert strategy.typical([0.001, 0.003]) == pytest.approx(2.0)
    assert "no layer" in strategy.explain({})


def test_the_candidates_are_timed_and_the_fastest_kept(cache):
    x, y = _data()
    m = _model()
    m.fit(x, y, batch_size=8, epochs=2, verbose=0)
    report = m.parallel_report[8]
    assert report["layers"] == ["dense_1", "dense_2"] or len(report["layers"]) == 2
    if P == 1:
        assert report["chosen"] == "data" and report["how"] == "only candidate"
        return
    assert report["how"] == "measured"
    assert set(report["ms_per_step"]) == set(report["candidates"]) and len(report["candidates"]) == 2
    assert report["chosen"] == strategy.fastest(report["ms_per_step"])
    for name, steps in report["step_ms"].items():      # each candidate's TIMED steps, timed one by one
        assert len(steps) == strategy.TIMED
        assert report["ms_per_step"][name] == pytest.approx(float(np.median(steps)), rel=1e-3, abs=1e-3)
    chosen = report["candidates"][report["chosen"]]
    assert tuple(layer.strategy for layer in m.layers[1:3]) == tuple(chosen)
    text = m.explain_parallel()
    assert "measured" in text and "ms per step" in text and f"median of {strategy.TIMED} steps" in text
    # the same values as the training with the chosen strategies fixed from the start
    fixed = _model()
    for layer, s in zip(fixed.layers[1:3], chosen):
        layer.parallel = s
        layer.adopt(s)
    fixed.fit(x, y, batch_size=8, epochs=2, verbose=0)
    for a, b in zip(m.get_weights(), fixed.get_weights()):
        np.testing.assert_allclose(a, b, rtol=1e-11, atol=1e-12)
    # a second model of the same layers reads the choice from the cache: nothing timed again
    again = _model()
    again.fit(x, y, batch_size=8, epochs=1, verbose=0)
    r2 = again.parallel_report[8]
    assert r2["how"] == "tuning cache" and r2["chosen"] == report["chosen"]
    assert r2["ms_per_step"] == pytest.approx(report["ms_per_step"])


def test_timing_off_takes_the_cost_models_choice(cache, monkeypatch):
    monkeypatch.setattr(tuning, "mode", lambda: "off")
    x, y = _data()
    m = _model()
    m.fit(x, y, batch_size=8, epochs=1, verbose=0)
    report = m.parallel_report[8]
    if P > 1:
        assert report["how"].startswith("cost model") and report["ms_per_step"] == {}
        assert m.layers[1].strategy == m.layers[1].proposal(8, P)
    assert cache.get(strategy.KIND, strategy.machine(), strategy.model_key(m, 8, list(report["candidates"]))) is None


def test_a_trial_continues_across_epochs_of_few_steps(cache):
    """Two steps per epoch: each candidate's timing restarts after the epoch's end."""
    x, y = _data()
    m = _model()
    for _ in range(8):
        m.fit(x[:16], y[:16], batch_size=8, epochs=1, verbose=0)
    report = m.parallel_report[8]
    if P > 1:
        assert report.get("how") == "measured", m.explain_parallel()


def test_a_batch_size_above_the_samples_is_decided_at_the_samples(cache):
    """batch_size larger than the data: every step holds all 16 samples, and those steps are timed."""
    x, y = _data()
    m = _model()
    m.fit(x[:16], y[:16], batch_size=64, epochs=2 * (strategy.WARM + strategy.TIMED), verbose=0)
    assert 64 not in m.parallel_report
    if P > 1:
        assert m.parallel_report[16]["how"] == "measured", m.explain_parallel()


def test_an_unfinished_trial_gives_way_to_the_next_batch_size(cache):
    """A fit that ends before its batch size's timing does, then fits of another size: those decide,
    and the first size's report says it was not decided (never 'timing under way' for ever)."""
    x, y = _data()
    m = _model()
    m.fit(x[:16], y[:16], batch_size=8, epochs=1, verbose=0)       # two steps: still warming up
    if P > 1:
        assert "timing under way; meanwhile the layers run 'data'" in m.explain_parallel()
    m.fit(x, y, batch_size=4, epochs=1, verbose=0)                 # 40 steps of 4
    if P == 1:
        return
    assert m.parallel_report[4]["how"] == "measured", m.explain_parallel()
    assert m.parallel_report[8]["chosen"] is None
    assert "not decided" in m.parallel_report[8]["how"] and "not decided" in m.explain_parallel()
    chosen = m.parallel_report[4]["candidates"][m.parallel_report[4]["chosen"]]
    assert tuple(layer.strategy for layer in m.layers[1:3]) == tuple(chosen)


@pytest.mark.parametrize("how", ["off", "fast"])
def test_a_decided_step_is_recorded_once(cache, monkeypatch, how):
    """A choice made without timing (DMATH_TUNE=off, or one read from the cache) or at the first program
    build is part of the program's key from the start: the next epoch and the next fit replay the same
    recorded step instead of recording it again."""
    data = dnn.data.Dataset(*_data())       # (a model keeps its programs per dataset)
    if how == "fast":       # a first model times and caches the choice; the second reads it
        _model().fit(data, batch_size=8, epochs=1, verbose=0)
    else:
        monkeypatch.setattr(tuning, "mode", lambda: "off")
    m = _model()
    m.fit(data, batch_size=8, epochs=1, verbose=0)
    first = m._last_program()
    m.fit(data, batch_size=8, epochs=2, verbose=0)
    assert m._last_program() is first
    # so too a step whose layers a program built before fit decided (evaluate's, by the cost model)
    m2 = _model()
    m2.evaluate(data, batch_size=8)
    m2.fit(data, batch_size=8, epochs=1, verbose=0)
    train = m2._last_program()
    m2.fit(data, batch_size=8, epochs=1, verbose=0)
    assert m2._last_program() is train


NAMES = ["data", "cost model (dense_1: model)"]


@pytest.mark.parametrize("value, why", [
    ({"choice": "data", "ms": {"data": 1.5, NAMES[1]: 2}}, None),
    ({"choice": NAMES[1], "ms": {"data": 0, NAMES[1]: 0.25}}, None),
    ([1, 2], "not a dict"),
    ({"ms": {"data": 1.0, NAMES[1]: 2.0}}, "choice"),
    ({"choice": ["data"], "ms": {"data": 1.0, NAMES[1]: 2.0}}, "choice"),
    ({"choice": "model", "ms": {"data": 1.0, NAMES[1]: 2.0}}, "choice"),
    ({"choice": "data", "ms": "garbage"}, "ms"),
    ({"choice": "data", "ms": [1, 2]}, "ms"),
    ({"choice": "data"}, "ms"),
    ({"choice": "data", "ms": {"data": "fast", NAMES[1]: 2.0}}, "ms"),
    ({"choice": "data", "ms": {"data": True, NAMES[1]: 2.0}}, "ms"),
    ({"choice": "data", "ms": {"data": -1.0, NAMES[1]: 2.0}}, "ms"),
    ({"choice": "data", "ms": {"data": float("nan"), NAMES[1]: 2.0}}, "ms"),
    ({"choice": "data", "ms": {"data": 10 ** 400, NAMES[1]: 2.0}}, "ms"),      # float() overflows
    ({"choice": "data", "ms": {"data": float("inf"), NAMES[1]: 2.0}}, "ms"),
    ({"choice": "data", "ms": {"data": {"x": 1}, NAMES[1]: 2.0}}, "ms"),
    ({"choice": "data", "ms": {"data": 1.0}}, "ms"),
    ({"choice": "data", "ms": {"data": 1.0, NAMES[1]: 2.0, "other": 3.0}}, "ms"),
], ids=lambda v: repr(v)[:40])
def test_a_cached_value_is_checked_before_it_is_adopted(value, why):
    """The cache's digest names an entry by its kind, machine and key, not its value: the value read
    back must be what a Trial stores ({'choice': a candidate, 'ms': {each candidate: milliseconds}})."""
    got = strategy.invalid_cached(value, NAMES)
    assert got is None if why is None else why in got


@pytest.mark.parametrize("value", [{"choice": "data", "ms": "garbage"}, {"choice": "data", "ms": {"data": "fast"}},
                                   {"choice": ["data"], "ms": {}}, {"choice": "data", "ms": [1, 2]}],
                         ids=["ms-str", "ms-value-str", "choice-list", "ms-list"])
def test_a_cached_value_of_the_wrong_shape_is_timed_again(cache, value, monkeypatch):
    """A cache entry whose value was edited (its digest still matches: it does not cover the value) is
    a miss with a TuneCacheWarning: the candidates are timed again and the entry rewritten. It killed
    the fit with an AttributeError, ValueError or TypeError."""
    if P == 1:
        return                          # one candidate: the cache is not read
    x, y = _data()
    _model().fit(x, y, batch_size=8, epochs=1, verbose=0)
    with open(cache.path) as f:
        doc = json.load(f)
    (entry,) = doc["entries"].values()
    entry["value"] = value
    with open(cache.path + ".new", "w") as f:
        json.dump(doc, f)
    os.replace(cache.path + ".new", cache.path)
    fresh = tuning.TuneCache(cache.path)     # a new process (this one keeps the choice it made)
    monkeypatch.setattr(tuning, "shared", lambda: fresh)
    m = _model()
    with pytest.warns(tuning.TuneCacheWarning, match="dnn_parallel.*ignored"):
        m.fit(x, y, batch_size=8, epochs=1, verbose=0)
    report = m.parallel_report[8]
    assert report["how"] == "measured" and report["chosen"] == strategy.fastest(report["ms_per_step"])
    with open(cache.path) as f:
        (entry,) = json.load(f)["entries"].values()
    assert strategy.invalid_cached(entry["value"], list(report["candidates"])) is None
