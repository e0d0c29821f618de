"""Regressions of a report-only hostile-use probe of dnn's functional Model, at every worker count.

Oracles: NumPy in float64 (a single output's weighted MSE, a shared BatchNorm's running statistics
updated call by call in PyTorch's order, each worker's own statistics over its row block), the
model with loss weight 1, the values an evaluation gave before its layer's weights moved, and the
state a refused call found.
"""
import numpy as np
import pytest

import dmath
import dnn
from dmath import tuning
from dnn import layers as L
from dnn.data.errors import DataError
from dnn.initializers import FromArray
from dnn.training import strategy

P = dmath.num_workers()


# ---- a single output's loss weight ----------------------------------------------------------------
def test_a_single_outputs_loss_weight_scales_its_loss_and_its_step():
    """loss_weights=[w] on a one-output model was ignored ([0] and [3] trained as [1]); it scales the
    loss and the step as each of several outputs' weights does, also when assigned later."""
    rng = np.random.default_rng(0)
    xs, ys = rng.normal(size=(8, 4)), rng.normal(size=(8, 2))
    got = {}
    for w in (1.0, 3.0, 0.0):
        dmath.random.seed(0)
        x = dnn.Input(4)
        m = dnn.Model(x, L.Dense(2)(x), loss="mse", dtype="float64", loss_weights=[w],
                      optimizer=dnn.optim.SGD(lr=0.1))
        k0, b0 = m.get_weights()
        ev = m.evaluate(xs, ys)["loss"]
        fit = m.fit(xs, ys, batch_size=8, epochs=1, shuffle=False, verbose=0)["loss"][0]
        got[w] = (k0, ev, fit, m.get_weights()[0] - k0)
    k0, ev, fit, step = got[1.0]
    np.testing.assert_allclose(ev, np.mean((xs @ k0 - ys) ** 2), rtol=1e-12)    # bias 0 at the start
    assert fit == pytest.approx(ev, rel=1e-12)
    assert np.abs(step).max() > 1e-3
    for w in (3.0, 0.0):
        np.testing.assert_array_equal(got[w][0], k0)                            # the same start
        assert got[w][1] == pytest.approx(w * ev, rel=1e-12, abs=1e-300)
        assert got[w][2] == pytest.approx(w * ev, rel=1e-12, abs=1e-300)
        np.testing.assert_allclose(got[w][3], w * step, rtol=1e-10, atol=1e-15)
    # assigned after evaluate and fit recorded their steps: the next calls use it
    dmath.random.seed(0)
    x = dnn.Input(4)
    m = dnn.Model(x, L.Dense(2)(x), loss="mse", dtype="float64", optimizer=dnn.optim.SGD(lr=0.1))
    assert m.evaluate(xs, ys)["loss"] == pytest.approx(ev, rel=1e-12)
    m.loss_weights = [3.0]
    assert m.evaluate(xs, ys)["loss"] == pytest.approx(3 * ev, rel=1e-12)
    m.fit(xs, ys, batch_size=8, epochs=1, shuffle=False, verbose=0)
    np.testing.assert_allclose(m.get_weights()[0] - k0, 3 * step, rtol=1e-10)


# ---- a BatchNorm called twice: running statistics in call order ------------------------------------
def _stats(a, axes):
    """(mean, unbiased variance) per channel over `axes`."""
    n = np.prod([a.shape[i] for i in axes])
    return a.mean(axis=axes), a.var(axis=axes) * n / (n - 1)


def _torch_order(calls, m=0.1, mean0=0.0, var0=1.0):
    """The running statistics after the calls' (mean, unbiased variance), one after the other."""
    rm, rv = mean0, var0
    for mean, var in calls:
        rm, rv = (1 - m) * rm + m * mean, (1 - m) * rv + m * var
    return rm, rv


@pytest.mark.parametrize("join", ["add", "add_reversed", "concat_reversed"])
@pytest.mark.parametrize("fuse", [True, "relu", False])
def test_a_batchnorm_called_twice_updates_its_running_statistics_in_call_order(fuse, join):
    """Folded into the Add it fed (a residual tail) or the Concatenate (in place), the first call ran
    at the join, after the second; unfolded, the walk from the loss ran first the call the join read
    first. Either way the running mean was off by 1e-3 from PyTorch's. Every call now runs in the order
    written, and a BatchNorm called more than once is never folded into a join."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(8, 2, 3, 3))
    y = rng.integers(0, 3, 8)
    inp = dnn.Input((2, 3, 3))
    bn = L.BatchNorm()
    a = bn(inp)                                                                 # call 1
    b = bn(L.Conv2D(2, 1, kernel_init="ones", use_bias=False)(inp))            # call 2
    joined = {"add": lambda: L.Add()([a, b]), "add_reversed": lambda: L.Add()([b, a]),
              "concat_reversed": lambda: L.Concatenate()([b, a])}[join]()
    out = L.Dense(3, activation="softmax")(L.Flatten()(joined))
    m = dnn.Model(inp, out, dtype="float64", fuse=fuse)
    m.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0)
    t2 = np.repeat(x.sum(axis=1, keepdims=True), 2, axis=1)     # the ones 1x1 convolution's output
    rm, rv = _torch_order([_stats(x, (0, 2, 3)), _stats(t2, (0, 2, 3))])
    np.testing.assert_allclose(bn.get_weights()[2], rm, rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(bn.get_weights()[3], rv, rtol=1e-12)
    assert bn.batches_tracked == 1


def test_a_batchnorm_of_each_workers_statistics_called_twice_trains_at_every_worker_count():
    """BatchNorm(synchronized=False) called twice summed its running statistics' terms into one matrix
    twice (a DMathError from sum_partials at 2 or more workers, then the job ended). The calls update
    them in call order, each by the average of the workers' own statistics (PyTorch under DDP)."""
    rng = np.random.default_rng(0)
    xs, ys = rng.normal(size=(12, 4)), rng.integers(0, 3, 12)     # 12 rows: even row blocks at P = 1..4
    dmath.random.seed(1)
    x = dnn.Input(4)
    bn = L.BatchNorm(synchronized=False)
    dense = L.Dense(4)
    h = bn(dense(bn(x)))
    m = dnn.Model(x, L.Dense(3, activation="softmax")(h), dtype="float64")
    k, bias = dense.get_weights()
    m.fit(xs, ys, batch_size=12, epochs=1, shuffle=False, verbose=0)
    calls = [[], []]
    for rows in np.split(xs, P):                  # each worker's own rows, statistics and normalisation
        mean, var = _stats(rows, (0,))
        calls[0].append((mean, var))
        biased = rows.var(axis=0)
        h = (rows - mean) / np.sqrt(biased + 1e-5) @ k + bias
        calls[1].append(_stats(h, (0,)))
    averaged = [tuple(np.mean([s[i] for s in per_worker], axis=0) for i in range(2)) for per_worker in calls]
    rm, rv = _torch_order(averaged)
    np.testing.assert_allclose(bn.get_weights()[2], rm, rtol=1e-10, atol=1e-13)
    np.testing.assert_allclose(bn.get_weights()[3], rv, rtol=1e-10)
    # the layer called once beside it still takes its sums straight into its statistics
    assert np.isfinite(m.evaluate(xs, ys)["loss"])


# ---- a recorded evaluation outlives its layer's weights -------------------------------------------
def _auto_model(parallel="auto", dense=None):
    inp = dnn.Input(64)
    dense = dense or L.Dense(64, activation="tanh", parallel=parallel)
    return dnn.Model(inp, L.Dense(4, activation="softmax")(dense(inp)), dtype="float64"), dense


def _sets():
    rng = np.random.default_rng(0)
    return (dnn.data.Dataset(rng.normal(size=(8, 64)), rng.integers(0, 4, 8)),
            dnn.data.Dataset(rng.normal(size=(16, 64)), rng.integers(0, 4, 16)))


def test_steps_recorded_before_a_layers_weights_moved_are_recorded_again():
    """A strategy change data -> model -> data (parallel='auto' timing) moved the weights to new
    matrices and back to the strategy the key held: evaluate and predict on a Dataset replayed their
    recording, which read the freed matrices (PlanError). The key counts the moves; also for a model
    that shares the layer (its recorded predict outlived the other model's move)."""
    _, val = _sets()
    dmath.random.seed(2)
    m, dense = _auto_model(parallel="data")
    other, _ = _auto_model(dense=dense)
    ev, pred, shared = m.evaluate(val), m.predict(val), other.predict(val)
    moves = dense.moves
    kernel = dense.kernel.value
    dense.adopt("model")
    dense.adopt("data")
    assert dense.kernel.value is not kernel and dense.moves == moves + 2
    assert m.evaluate(val) == pytest.approx(ev, rel=1e-12)
    np.testing.assert_allclose(m.predict(val), pred, rtol=1e-12)
    np.testing.assert_allclose(other.predict(val), shared, rtol=1e-12)


@pytest.fixture()
def timing_ends_on_data(tmp_path, monkeypatch):
    """A private tuning cache (nothing cached: every candidate is timed) and a timing whose choice is
    'data', the candidate it started from, so the weights go data -> model -> data."""
    own = tuning.TuneCache(str(tmp_path / "tune.json"))
    monkeypatch.setattr(tuning, "shared", lambda: own)
    monkeypatch.setattr(tuning, "mode", lambda: "fast")
    monkeypatch.setattr(strategy, "fastest", lambda ms: "data")


def test_an_evaluation_recorded_while_fit_times_the_strategies_replays_after_the_timing(timing_ends_on_data):
    train, val = _sets()
    dmath.random.seed(3)
    m, dense = _auto_model()
    other, _ = _auto_model(dense=dense)     # a second model on the same layer, its predict recorded meanwhile
    m.fit(train, batch_size=8, epochs=1, verbose=0)
    during, shared = m.evaluate(val), other.predict(val)
    m.fit(train, batch_size=8, epochs=2 * (strategy.WARM + strategy.TIMED) + 2, verbose=0)
    report = m.parallel_report[8]
    assert report["chosen"] == "data" and dense.strategy == "data"
    if P > 1:
        assert report["how"] == "measured" and dense.moves >= 2
    after = m.evaluate(val)                 # (a PlanError: the replay read the freed matrices)
    assert after != during                  # trained since
    copies = []
    for model in (m, other):                # the oracle: new models given the trained weights
        fresh, _ = _auto_model(parallel="data")
        fresh.set_weights(model.get_weights())
        copies.append(fresh)
    assert after == pytest.approx(copies[0].evaluate(val), rel=1e-12)
    np.testing.assert_allclose(other.predict(val), copies[1].predict(val), rtol=1e-12)
    assert not np.allclose(other.predict(val), shared)     # the shared layer trained since


# ---- a refused constructor changes nothing ------------------------------------------------------------
def _untouched(*layers):
    return all(not layer.built and not layer.named and layer.param_dtype is None for layer in layers)


def test_a_refused_model_names_and_builds_nothing():
    """Output widths, a shared layer's input shape and a failing build were found after the layers were
    named and built in the refused model's dtype; the next, correct model was then refused ('has float64
    weights'). Every check now runs first, and what a failing build did is undone."""
    x = dnn.Input(4)
    d = L.Dense(3)
    h = d(x)
    o2 = L.Dense(5)(h)
    with pytest.raises(dnn.ConfigError, match=r"same number of values; got outputs of shapes \[\(3,\), \(5,\)\]"):
        dnn.Model(x, [h, o2], loss="mse", dtype="float64")
    assert _untouched(d, o2.layer, x.layer)
    m = dnn.Model(x, h, loss="mse", dtype="float32")
    assert d.name == "dense_1" and d.param_dtype == "float32"
    # a layer built for (4,) now given samples of (3,)
    z = dnn.Input(3)
    fresh = L.Dense(3)
    with pytest.raises(dnn.ShapeError, match=r"dense_1 was built for samples of shape \(4,\), now given \(3,\)"):
        dnn.Model(z, L.Add()([fresh(z), d(z)]), loss="mse", dtype="float32")
    assert _untouched(fresh, z.layer)
    # a new layer called on two shapes
    twice = L.Dense(3)
    with pytest.raises(dnn.ShapeError, match=r"called on samples of shape \(4,\) and of shape \(3,\)"):
        dnn.Model(x, L.Add()([twice(x), twice(L.Dense(3)(x))]), loss="mse", dtype="float64")
    assert _untouched(twice)
    # a build that fails (initial values of the wrong shape) after others were built: undone
    first, bad = L.Dense(3), L.Dense(2, kernel_init=FromArray(np.ones((5, 2))))
    with pytest.raises(dnn.ShapeError, match="expected shape"):
        dnn.Model(x, bad(first(x)), loss="mse", dtype="float64")
    assert _untouched(first, bad)
    assert dnn.Model(x, L.Dense(2)(first(x)), loss="mse", dtype="float32").layers[1] is first
    assert first.name == "dense_1" and first.param_dtype == "float32"
    assert m.predict(np.zeros((2, 4), np.float32)).shape == (2, 3)


# ---- several inputs given no samples ---------------------------------------------------------------
def test_a_model_of_several_inputs_predicts_no_samples_as_one_input_does():
    """A list of empty arrays raised NumPy's 'cannot reshape array of size 0' from joining them."""
    a, b = dnn.Input(4), dnn.Input(3)
    m = dnn.Model([a, b], L.Dense(2)(L.Concatenate()([a, b])), loss="mse")
    got = m.predict([np.zeros((0, 4)), np.zeros((0, 3))])
    assert got.shape == (0, 2) and got.dtype == np.float32
    c = dnn.Input(7)
    one = dnn.Model(c, L.Dense(2)(c), loss="mse")
    assert one.predict(np.zeros((0, 7))).shape == (0, 2)
    with pytest.raises(DataError, match="at least one sample") as single:
        one.evaluate(np.zeros((0, 7)), np.zeros((0, 2)))
    with pytest.raises(type(single.value), match="at least one sample"):
        m.evaluate([np.zeros((0, 4)), np.zeros((0, 3))], np.zeros((0, 2)))
    with pytest.raises(dnn.ShapeError, match="same number of samples"):
        m.predict([np.zeros((0, 4)), np.zeros((1, 3))])


# ---- layers of two models combined ----------------------------------------------------------------------
def test_layers_named_by_two_models_combined_are_refused_naming_them_and_the_cure():
    a = dnn.Input(4)
    m1 = dnn.Model(a, L.Dense(3)(a), loss="mse")
    b = dnn.Input(4)
    m2 = dnn.Model(b, L.Dense(3)(b), loss="mse")
    x = dnn.Input(4)
    with pytest.raises(dnn.ConfigError, match=r"'dense_1' names 2 layers \(Dense, Dense\)\. Layers named "
                                              r"automatically by separate models .*name="):
        dnn.Model(x, L.Add()([m1.layers[1](x), m2.layers[1](x)]), loss="mse")
    assert not x.layer.named and m1.layers[1].name == m2.layers[1].name == "dense_1"
    with pytest.raises(dnn.ConfigError, match=r"'twin' names 2 layers \(Dense, Dense\)\. Give the layers names"):
        dnn.Model(x, L.Add()([L.Dense(3, name="twin")(x), L.Dense(3, name="twin")(x)]), loss="mse")
    left, right = L.Dense(3, name="left"), L.Dense(3, name="right")
    m3 = dnn.Model(a, left(a), loss="mse")
    m4 = dnn.Model(b, right(b), loss="mse")
    both = dnn.Model(x, L.Add()([left(x), right(x)]), loss="mse")
    v = np.random.default_rng(0).normal(size=(3, 4)).astype(np.float32)
    np.testing.assert_allclose(both.predict(v), m3.predict(v) + m4.predict(v), rtol=1e-5, atol=1e-6)


# ---- the minor findings -----------------------------------------------------------------------------
def test_set_weights_refuses_nan_and_infinity_and_changes_nothing():
    x = dnn.Input(4)
    m = dnn.Model(x, L.Dense(2)(L.Dense(3)(x)), loss="mse", dtype="float64")
    before = m.get_weights()
    for bad in (np.nan, np.inf, -np.inf):
        arrays = [w + 1.0 for w in before]
        arrays[-1] = arrays[-1].copy()
        arrays[-1][0] = bad                         # the last one: the first ones pass their checks
        with pytest.raises(dnn.ShapeError, match="dense_2/bias holds NaN or infinity"):
            m.set_weights(arrays)
        with pytest.raises(dnn.ShapeError, match="dense_2/bias holds NaN or infinity"):
            m.layers[2].set_weights(arrays[2:])
        for w, b in zip(m.get_weights(), before):
            np.testing.assert_array_equal(w, b)
    m.set_weights([w + 1.0 for w in before])
    np.testing.assert_array_equal(m.get_weights()[0], before[0] + 1.0)


def test_num_batches_tracked_must_be_a_scalar_as_pytorchs():
    x = dnn.Input(3)
    bn = L.BatchNorm(name="bn1")
    m = dnn.Model(x, L.Dense(2)(bn(x)), loss="mse", dtype="float64")
    sd = m.state_dict()
    for bad in (np.array([[5]]), np.array([5])):
        with pytest.raises(dnn.ShapeError, match=r"bn1.num_batches_tracked must be one non-negative integer of "
                                                 r"shape \(\)"):
            m.load_state_dict(dict(sd, **{"bn1.num_batches_tracked": bad}))
        assert bn.batches_tracked == 0
    m.load_state_dict(dict(sd, **{"bn1.num_batches_tracked": np.array(5)}))
    assert bn.batches_tracked == 5


def test_targets_given_one_array_per_output_are_refused_in_words():
    x = dnn.Input(4)
    h = L.Dense(3)(x)
    m = dnn.Model(x, [L.Dense(2)(h), L.Dense(2)(h)], loss="mse")
    xs = np.zeros((3, 4))
    for count in (2, 3):            # as many as the outputs, and (as many as the samples) a third
        with pytest.raises(dnn.ConfigError, match=rf"y is a list of {count} arrays of 3 targets each .*2 outputs "
                                                  rf"are all trained against the same targets: pass one array"):
            m.fit(xs, [np.zeros((3, 2))] * count, verbose=0)
    with pytest.raises(dnn.ShapeError, match=r"y holds 2 targets for 3 samples; expected one target per sample"):
        dnn.Model(x, h, loss="mse").fit(xs, np.zeros((2, 3)), verbose=0)
    assert np.isfinite(m.fit(xs, np.zeros((3, 2)), verbose=0)["loss"][0])
