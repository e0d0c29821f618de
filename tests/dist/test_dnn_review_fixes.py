"""Regression tests of the training-stack review (findings 1 to 9), each failing before its fix:

1. a last layer's own activation (Dense(n, activation='softmax'), Conv2D(..., activation=...)) is
   fused with the loss like a final Output layer, not applied twice;
2. replacing the optimizer, or changing its hyper-parameters, between fits on one Dataset;
3. log_softmax as the output activation with cross_entropy (the NLL of its log-probabilities);
4. categorical accuracy of soft (label-smoothed) target rows;
5. EarlyStopping's patience (Keras's meaning);
6. load_weights of a file saved with another optimizer;
7. samples_per_s of an epoch resumed after its ragged last batch;
8. ModelCheckpoint path fields the epoch logs will not hold, refused before training;
9. pool2d's mode='avg'.

NumPy (and PyTorch where installed) are the oracles of values.
"""
import os

import numpy as np
import pytest

import dmath
import dnn
from dnn import graph as G
from dnn import layers as L


P = dmath.num_workers()


def _data(n=48, features=4, classes=3, seed=0):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((n, features)), rng.integers(0, classes, n)


def _softmax(z):
    e = np.exp(z - z.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def _sigmoid(z):
    return 1.0 / (1.0 + np.exp(-z))


def _same_weights(a, b, rtol=0.0):
    for p, q in zip(a.get_weights(), b.get_weights()):
        np.testing.assert_allclose(p, q, rtol=rtol, atol=0)


# ---- 1. a last layer's own activation ----------------------------------------------------------------
@pytest.mark.parametrize("parallel", ["data", "model"] if P > 1 else ["data"])
@pytest.mark.parametrize("loss,act,units", [("cross_entropy", "softmax", 3),
                                            ("binary_cross_entropy", "sigmoid", 1)])
def test_dense_with_its_own_output_activation_trains_like_an_output_layer(loss, act, units, parallel):
    """Keras's Dense(n, activation='softmax') last: the loss fuses that activation (it saw the
    probabilities as logits, a double softmax or sigmoid, and binary accuracy thresholded the
    sigmoid's output at the logit threshold 0). Both spellings take identical steps."""
    x, labels = _data()
    y = labels if units == 3 else (labels > 0).astype(np.float64)

    def make(spelling):
        dmath.random.seed(1)
        tail = [L.Dense(units, activation=act, parallel=parallel)] if spelling == "own" else \
            [L.Dense(units, parallel=parallel), L.Output(act)]
        return dnn.Sequential([L.Input(4)] + tail, loss=loss, dtype="float64",
                              optimizer=dnn.optim.SGD(lr=0.5, momentum=0.9))
    own, out = make("own"), make("output")
    out.set_weights(own.get_weights())
    w, b = own.get_weights()
    z = x @ w + b
    p = _softmax(z) if units == 3 else _sigmoid(z)
    # the loss of the model's outputs (Keras's, PyTorch's cross_entropy on the logits)
    if units == 3:
        want = -np.mean(np.log(p[np.arange(len(y)), y]))
        want_acc = np.mean(p.argmax(axis=1) == y)
    else:
        want = -np.mean(y * np.log(p[:, 0]) + (1 - y) * np.log(1 - p[:, 0]))
        want_acc = np.mean((p[:, 0] > 0.5) == y)
    got = own.evaluate(x, y)
    assert got["loss"] == pytest.approx(want, rel=1e-12)
    assert got["accuracy"] == pytest.approx(want_acc)
    np.testing.assert_allclose(own.predict(x), p, rtol=1e-12)
    h_own = own.fit(x, y, batch_size=16, epochs=3, verbose=0)
    h_out = out.fit(x, y, batch_size=16, epochs=3, verbose=0)
    assert h_own["loss"] == h_out["loss"] and h_own["accuracy"] == h_out["accuracy"]
    _same_weights(own, out)
    np.testing.assert_array_equal(own.predict(x), out.predict(x))


def test_own_output_activation_in_asynchronous_training_and_summary():
    """Asynchronous steps (dnn.asgd builds its per-group steps from the same Program) take the same
    head; summary lists the last layer once, with its layout."""
    x, y = _data()

    def make(spelling):
        dmath.random.seed(7)
        tail = [L.Dense(3, activation="softmax")] if spelling == "own" else [L.Dense(3), L.Output("softmax")]
        return dnn.Sequential([L.Input(4), L.Dense(5), L.Activation("tanh")] + tail, dtype="float64",
                              optimizer=dnn.optim.SGD(lr=0.3))
    own, out = make("own"), make("output")
    out.set_weights(own.get_weights())
    h_own = own.fit(x, y, batch_size=8, epochs=2, verbose=0, asynchronous=True, max_staleness=0)
    h_out = out.fit(x, y, batch_size=8, epochs=2, verbose=0, asynchronous=True, max_staleness=0)
    assert h_own["loss"] == h_out["loss"]
    _same_weights(own, out)
    own.fit(x, y, batch_size=8, epochs=1, verbose=0)
    rows = own.summary(print_fn=None).splitlines()
    assert sum(r.startswith("dense_2 (Dense)") for r in rows) == 1


@pytest.mark.parametrize("channels_last", [False, True])
def test_conv2d_with_its_own_output_activation_trains_like_an_output_layer(channels_last):
    """The same for a last Conv2D: its activation runs on the NCHW rows after the channels-last
    convolution is converted back (a softmax over the whole (C, H, W) sample)."""
    rng = np.random.default_rng(2)
    x = rng.standard_normal((24, 1 * 5 * 5))
    y = rng.integers(0, 8, 24)                 # Conv2D(2, 4) on (1, 5, 5): (2, 2, 2) = 8 outputs

    def make(spelling):
        dmath.random.seed(3)
        tail = [L.Conv2D(2, 4, activation="softmax")] if spelling == "own" else \
            [L.Conv2D(2, 4), L.Output("softmax")]
        return dnn.Sequential([L.Input((1, 5, 5))] + tail, dtype="float64", channels_last=channels_last,
                              optimizer=dnn.optim.Adam(lr=0.05))
    own, out = make("own"), make("output")
    out.set_weights(own.get_weights())
    p = out.predict(x).reshape(24, 8)
    assert own.evaluate(x, y)["loss"] == pytest.approx(-np.mean(np.log(p[np.arange(24), y])), rel=1e-12)
    np.testing.assert_allclose(own.predict(x).reshape(24, 8), p, rtol=1e-12)
    # on a GPU the two models' convolutions may run different cuDNN algorithms (each model's plans
    # are chosen on their own), whose sums round differently in the last bit: equal to 1e-10 there
    rtol = 1e-10 if dmath.device() == "gpu" else 0.0
    assert own.fit(x, y, batch_size=8, epochs=2, verbose=0)["loss"] == \
        pytest.approx(out.fit(x, y, batch_size=8, epochs=2, verbose=0)["loss"], rel=rtol, abs=0)
    _same_weights(own, out, rtol)


def test_a_last_dense_relu_with_mse_is_unchanged():
    """An own activation that is not fused (relu with mse) is applied by the head: same values."""
    x, _ = _data()
    t = np.abs(x[:, :2])
    dmath.random.seed(4)
    m = dnn.Sequential([L.Input(4), L.Dense(2, activation="relu")], loss="mse", dtype="float64")
    w, b = m.get_weights()
    want = np.mean((np.maximum(x @ w + b, 0) - t) ** 2)
    assert m.evaluate(x, t)["loss"] == pytest.approx(want, rel=1e-12)


# ---- 2. the optimizer changed between fits on one Dataset -----------------------------------------------
def _fit_twice(switch, same_dataset):
    x, y = _data(32)
    ds = dnn.data.Dataset(x, y)
    dmath.random.seed(1)
    m = dnn.Sequential([L.Input(4), L.Dense(3), L.Output("softmax")], dtype="float64",
                       optimizer=dnn.optim.SGD(lr=0.1))
    m.fit(ds, batch_size=16, epochs=1, shuffle=False, verbose=0)
    switch(m)
    m.fit(ds if same_dataset else dnn.data.Dataset(x, y), batch_size=16, epochs=1, shuffle=False, verbose=0)
    return m


def _to_adam(m):
    m.optimizer = dnn.optim.Adam(lr=0.05)


def _decay(m):
    m.optimizer.weight_decay = 0.5


@pytest.mark.parametrize("switch", [_to_adam, _decay])
def test_optimizer_changes_between_fits_on_one_dataset_take_effect(switch):
    """A new optimizer crashed (its predecessor's step matrices were freed under the recorded step)
    and a new weight decay was ignored: the step is recorded anew, as on a new Dataset."""
    same, fresh = _fit_twice(switch, True), _fit_twice(switch, False)
    _same_weights(same, fresh)
    unchanged = _fit_twice(lambda m: None, True)
    assert any(np.abs(a - b).max() > 1e-6 for a, b in zip(same.get_weights(), unchanged.get_weights()))


def test_learning_rate_changes_keep_the_recorded_step():
    """lr lives in a (1, 1) matrix written before each step: changing it re-records nothing."""
    x, y = _data(32)
    ds = dnn.data.Dataset(x, y)
    dmath.random.seed(1)
    m = dnn.Sequential([L.Input(4), L.Dense(3), L.Output("softmax")], dtype="float64",
                       optimizer=dnn.optim.SGD(lr=0.1, momentum=0.5))
    m.fit(ds, batch_size=16, epochs=1, shuffle=False, verbose=0)
    prog = m._last_program()
    m.optimizer.lr = 0.3
    m.fit(ds, batch_size=16, epochs=1, shuffle=False, verbose=0)
    assert m._last_program() is prog and prog.plan is not None
    dmath.random.seed(1)
    ref = dnn.Sequential([L.Input(4), L.Dense(3), L.Output("softmax")], dtype="float64",
                         optimizer=dnn.optim.SGD(lr=0.1, momentum=0.5))
    ref.fit(ds, batch_size=16, epochs=1, shuffle=False, verbose=0)
    ref.optimizer.lr = 0.3
    ref.fit(dnn.data.Dataset(x, y), batch_size=16, epochs=1, shuffle=False, verbose=0)
    _same_weights(m, ref)


def test_optimizer_assignment_takes_names_and_refuses_others():
    m = dnn.Sequential([L.Input(4), L.Dense(3), L.Output("softmax")], dtype="float64")
    m.optimizer = "adam"
    assert isinstance(m.optimizer, dnn.optim.Adam)
    with pytest.raises(dnn.ConfigError, match="optimizer"):
        m.optimizer = 3


# ---- 3. log_softmax with cross_entropy ----------------------------------------------------------------
@pytest.mark.parametrize("spelling", ["layer", "own"])
def test_log_softmax_output_with_cross_entropy_is_the_nll_of_its_log_probabilities(spelling):
    """log_softmax last (PyTorch's log_softmax + NLLLoss) gave a NaN loss: cross_entropy took the log
    of the log-probabilities. It is the fused softmax cross-entropy of the pre-activation."""
    x, y = _data()

    def make(act):
        dmath.random.seed(6)
        tail = [L.Dense(3, activation=act)] if spelling == "own" else [L.Dense(3), L.Output(act)]
        return dnn.Sequential([L.Input(4)] + tail, dtype="float64", optimizer=dnn.optim.SGD(lr=0.2))
    logp, soft = make("log_softmax"), make("softmax")
    soft.set_weights(logp.get_weights())
    w, b = logp.get_weights()
    want_logp = np.log(_softmax(x @ w + b))
    np.testing.assert_allclose(logp.predict(x), want_logp, rtol=1e-12, atol=1e-14)
    got = logp.evaluate(x, y)
    assert got["loss"] == pytest.approx(-np.mean(want_logp[np.arange(len(y)), y]), rel=1e-12)
    assert got["accuracy"] == pytest.approx(np.mean(want_logp.argmax(axis=1) == y))
    assert logp.fit(x, y, batch_size=16, epochs=2, verbose=0)["loss"] == \
        soft.fit(x, y, batch_size=16, epochs=2, verbose=0)["loss"]
    _same_weights(logp, soft)


# ---- 4. categorical accuracy of soft targets -------------------------------------------------------
def test_categorical_accuracy_compares_the_argmax_of_soft_target_rows():
    """Label-smoothed rows scored 0: a hit needed a target weight of exactly 1 on the predicted
    class. Now argmax(target) == argmax(prediction), as Keras's categorical_accuracy (the first of
    equal maxima of either row, and no hit for a NaN output row)."""
    from dnn.losses import class_ranks, correct_count
    pred = np.array([[1, 3, 3, 0], [1, 3, 3, 0], [2, 2, 2, 2], [2, 2, 2, 2], [np.nan, 1, 0, 0],
                     [0, 1, 0, 5], [0, 1, 0, 5], [-1, -2, -3, -4]])
    target = np.array([[0.1, 0.7, 0.1, 0.1], [0.1, 0.1, 0.7, 0.1], [0.4, 0.2, 0.2, 0.2],
                       [0.2, 0.2, 0.2, 0.4], [0.7, 0.1, 0.1, 0.1], [0.0, 0.3, 0.3, 0.4],
                       [0.25, 0.25, 0.25, 0.25], [0.5, 0.5, 0.0, 0.0]])
    want = float(np.sum(pred.argmax(axis=1) == target.argmax(axis=1)) - 1)    # less the NaN row
    assert want == 4.0
    for dtype in ("float16", "float32", "float64"):
        got = correct_count(dmath.from_numpy(pred, dmath.RowBlock(), dtype=dtype),
                            dmath.from_numpy(target, dmath.RowBlock(), dtype=dtype), "categorical",
                            class_ranks(4, dtype))
        assert got.to_numpy()[0, 0] == want, dtype


def test_evaluate_counts_label_smoothed_targets_by_their_class():
    x, labels = _data(40, seed=1)
    dmath.random.seed(2)
    m = dnn.Sequential([L.Input(4), L.Dense(3), L.Output("softmax")], dtype="float64")
    hard = np.eye(3)[labels]
    smoothed = hard * 0.9 + 0.1 / 3          # Keras's / PyTorch's label_smoothing=0.1
    want = np.mean(m.predict(x).argmax(axis=1) == labels)
    assert m.evaluate(x, labels)["accuracy"] == pytest.approx(want)
    assert m.evaluate(x, smoothed)["accuracy"] == pytest.approx(want)


# ---- 5. EarlyStopping's patience -------------------------------------------------------------------
@pytest.mark.parametrize("patience", [0, 1, 2])
def test_early_stopping_stops_after_patience_epochs_without_improvement(patience):
    """Keras: `patience` epochs in a row without improvement stop training (dnn waited one more).
    min_delta=10 makes every epoch after the first a non-improving one."""
    x, y = _data()
    dmath.random.seed(0)
    m = dnn.Sequential([L.Input(4), L.Dense(3), L.Output("softmax")], dtype="float64")
    stop = dnn.callbacks.EarlyStopping(monitor="loss", patience=patience, min_delta=10.0)
    hist = m.fit(x, y, batch_size=16, epochs=6, callbacks=[stop], verbose=0)
    last = max(patience, 1)                   # the epoch after `patience` non-improving ones (0: the first)
    assert stop.stopped_epoch == last and len(hist["loss"]) == last + 1


# ---- 6. load_weights of another optimizer's file -----------------------------------------------------
def _trained(optimizer, path):
    x, y = _data(16)
    dmath.random.seed(1)
    m = dnn.Sequential([L.Input(4), L.Dense(3), L.Output("softmax")], dtype="float64", optimizer=optimizer)
    m.fit(x, y, batch_size=4, epochs=2, verbose=0)
    m.save(path)
    return m


@pytest.mark.parametrize("saved,loading,match", [
    (lambda: dnn.optim.Adam(lr=0.01), lambda: dnn.optim.SGD(lr=0.01, momentum=0.9), "Adam.*SGD"),
    (lambda: dnn.optim.SGD(lr=0.01, momentum=0.9), lambda: dnn.optim.SGD(lr=0.01), "momentum_buffer"),
    (lambda: dnn.optim.SGD(lr=0.01), lambda: dnn.optim.SGD(lr=0.01, momentum=0.9), "lacks.*momentum_buffer")])
def test_load_weights_refuses_another_optimizers_state(tmp_path, saved, loading, match):
    """The file's step count was taken and its other state silently dropped (or left at zero)."""
    path = tmp_path / "m.dnn"
    _trained(saved(), path)
    dmath.random.seed(2)
    other = dnn.Sequential([L.Input(4), L.Dense(3), L.Output("softmax")], dtype="float64", optimizer=loading())
    with pytest.raises(dnn.ModelFileError, match=match):
        other.load_weights(path)


def test_load_weights_of_the_same_optimizer_still_continues(tmp_path):
    path = tmp_path / "m.dnn"
    a = _trained(dnn.optim.Adam(lr=0.01), path)
    dmath.random.seed(2)
    b = dnn.Sequential([L.Input(4), L.Dense(3), L.Output("softmax")], dtype="float64",
                       optimizer=dnn.optim.Adam(lr=0.01))
    b.load_weights(path)
    assert b.optimizer.iterations == a.optimizer.iterations == 8
    _same_weights(a, b)


# ---- 7. samples_per_s of an epoch resumed after its ragged last batch ---------------------------------
def test_resuming_after_the_ragged_last_batch_reports_no_negative_throughput(tmp_path):
    """50 samples in batches of 8: the 7th and last batch holds 2, so 7 * 8 > 50 samples were counted
    as done, and the epoch's samples_per_s came out negative."""
    x, y = _data(50)
    dmath.random.seed(1)
    m = dnn.Sequential([L.Input(4), L.Dense(3), L.Output("softmax")], dtype="float64")
    ckpt = dnn.callbacks.ModelCheckpoint(str(tmp_path / "s{step}.dnn"), unit="step", every=7)
    whole = m.fit(x, y, batch_size=8, epochs=1, verbose=0, callbacks=[ckpt])
    b = dnn.load(tmp_path / "s7.dnn")
    assert (b.resume["epoch"], b.resume["batch"]) == (0, 7)
    h = b.fit(x, y, batch_size=8, epochs=1, initial_epoch=0, verbose=0)
    assert h["samples_per_s"][0] >= 0.0
    assert h["loss"] == pytest.approx(whole["loss"], rel=1e-12)


# ---- 8. ModelCheckpoint fields the logs will not hold ------------------------------------------------
def test_model_checkpoint_refuses_a_field_the_logs_will_not_hold_before_training(tmp_path):
    x, y = _data(32)
    dmath.random.seed(1)
    m = dnn.Sequential([L.Input(4), L.Dense(3), L.Output("softmax")], dtype="float64")
    ckpt = dnn.callbacks.ModelCheckpoint(str(tmp_path / "m-{epoch}-{val_loss:.3f}.dnn"))
    with pytest.raises(dnn.ConfigError, match=r"\{val_loss\}.*validation"):
        m.fit(x, y, batch_size=16, epochs=2, verbose=0, callbacks=[ckpt])
    assert m.optimizer.iterations == 0 and not os.listdir(tmp_path)
    best = dnn.callbacks.ModelCheckpoint(str(tmp_path / "best.dnn"), save_best_only=True)
    with pytest.raises(dnn.ConfigError, match="val_loss"):
        m.fit(x, y, batch_size=16, epochs=2, verbose=0, callbacks=[best])
    with pytest.raises(dnn.ConfigError, match=r"\{val_accuracy\}"):
        mse = dnn.Sequential([L.Input(4), L.Dense(3)], loss="mse", dtype="float64")
        mse.fit(x, np.eye(3)[y], batch_size=16, verbose=0, callbacks=[dnn.callbacks.ModelCheckpoint(
            str(tmp_path / "{val_accuracy}.dnn"))], validation_data=(x, np.eye(3)[y]))
    # with validation data the same path is filled at each epoch's end
    hist = m.fit(x, y, batch_size=16, epochs=2, verbose=0, callbacks=[ckpt], validation_data=(x, y))
    assert sorted(os.listdir(tmp_path)) == sorted(f"m-{e + 1}-{v:.3f}.dnn" for e, v in enumerate(hist["val_loss"]))


# ---- 9. pool2d mode='avg' ----------------------------------------------------------------------------
def test_pool2d_accepts_avg_as_average():
    rng = np.random.default_rng(0)
    a = rng.standard_normal((2, 1, 4, 4))
    x = G.constant(a.reshape(2, 16), dtype="float64")
    x.sample_shape = (1, 4, 4)
    got = G.pool2d(x, 2, mode="avg").eval().to_numpy()
    want = a.reshape(2, 1, 2, 2, 2, 2).mean(axis=(3, 5)).reshape(2, 4)
    np.testing.assert_allclose(got, want, rtol=1e-14)
    np.testing.assert_array_equal(got, G.pool2d(x, 2, mode="average").eval().to_numpy())
    assert L.Pool2D(2, mode="avg").get_config()["mode"] == "average"
    with pytest.raises(dnn.ConfigError, match="'avg'"):
        G.pool2d(x, 2, mode="mean")
