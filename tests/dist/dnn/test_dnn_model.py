"""Sequential end to end: training on real digits, float16 against float32, recorded against eager
steps, data- against model-parallel Dense, save/load and corrupt files, summary, callbacks, errors."""
import os

import numpy as np
import pytest

import dmath
import dnn
from dnn import layers as L


P = dmath.num_workers()


@pytest.fixture(scope="module")
def digits(mnist_5k):
    """2,000 training and 1,000 held-out real MNIST digits (the 5k subset), shuffled."""
    x, y = mnist_5k
    return (x[:2000], y[:2000]), (x[4000:], y[4000:])


def mlp(dtype="float32", hidden=64):
    layers = [L.Input((1, 28, 28)), L.Flatten(), L.Dense(hidden), L.Activation("relu"), L.Dense(10),
              L.Output("softmax")]
    return dnn.Sequential(layers, loss="cross_entropy", dtype=dtype, optimizer=dnn.optim.SGD(lr=0.1, momentum=0.9))


def test_mlp_learns_real_digits_and_float16_keeps_float32_accuracy(digits):
    (x, y), (xt, yt) = digits
    acc = {}
    for dtype in ("float32", "float16"):
        dmath.random.seed(1)
        model = mlp(dtype)
        hist = model.fit(x, y, batch_size=100, epochs=3, validation_data=(xt, yt), verbose=0)
        losses = hist["loss"]
        assert losses[0] > losses[1] > losses[2], losses
        assert hist["accuracy"][-1] > 0.9
        acc[dtype] = model.evaluate(xt, yt)["accuracy"]
        assert acc[dtype] == pytest.approx(hist["val_accuracy"][-1])
        # the accuracy counted on the workers is the argmax accuracy of the predictions
        assert acc[dtype] == pytest.approx(np.mean(model.predict(xt).argmax(axis=1) == yt))
        assert set(hist.history) == {"loss", "accuracy", "val_loss", "val_accuracy", "samples_per_s"}
    assert acc["float32"] >= 0.87, acc            # 2,000 digits, 3 epochs of a 784-64-10 MLP
    assert abs(acc["float16"] - acc["float32"]) <= 0.01, acc


def test_cnn_with_batchnorm_and_dropout_trains(digits):
    (x, y), (xt, yt) = digits
    dmath.random.seed(2)
    model = dnn.Sequential([
        L.Input((1, 28, 28)), L.Conv2D(4, 5, stride=2, padding=2), L.BatchNorm(), L.Activation("relu"),
        L.Pool2D(2), L.Flatten(), L.Dropout(0.2), L.Dense(10), L.Output("softmax")],
        optimizer=dnn.optim.Adam(lr=0.01))
    hist = model.fit(x[:1000], y[:1000], batch_size=50, epochs=2, verbose=0)
    assert hist["loss"][1] < hist["loss"][0]
    assert model.evaluate(xt, yt)["accuracy"] > 0.75


def _blobs(n=256, features=6, seed=0):
    x, y = dnn.data.synthetic_classification(n, features, classes=3, seed=seed, noise=0.7)
    return x.astype(np.float64), y


def _small(record=True, parallel="data", dtype="float64", optimizer=None, dropout=0.0):
    dmath.random.seed(5)
    drop = [L.Dropout(dropout)] if dropout else []
    return dnn.Sequential([L.Input(6), L.Dense(16, parallel=parallel), L.Activation("tanh")] + drop
                          + [L.Dense(3, parallel=parallel), L.Output("softmax")], dtype=dtype, record=record,
                          optimizer=optimizer or dnn.optim.Adam(lr=0.01))


def test_categorical_accuracy_is_argmax_accuracy():
    """A sample counts when its label is the first of its row's largest outputs (argmax): equal outputs
    count for the first class only, a NaN row for none."""
    from dnn.losses import class_ranks, correct_count
    pred = np.array([[1, 3, 3, 0], [1, 3, 3, 0], [2, 2, 2, 2], [2, 2, 2, 2], [np.nan, 1, 0, 0],
                     [0, 1, 0, 5], [0, 1, 0, 5], [-1, -2, -3, -4]])
    labels = np.array([1, 2, 0, 3, 0, 3, 1, 0])
    want = float(np.sum(pred.argmax(axis=1) == labels) - 1)        # (argmax of the NaN row: 0, a miss)
    target = np.eye(4)[labels]
    for dtype in ("float16", "float32", "float64"):
        got = correct_count(dmath.from_numpy(pred, dmath.RowBlock(), dtype=dtype),
                            dmath.from_numpy(target, dmath.RowBlock(), dtype=dtype), "categorical",
                            class_ranks(4, dtype))
        assert got.shape == (1, 1) and got.to_numpy()[0, 0] == want == 4.0, dtype
    # a collapsed network (every output row equal) scores its first class's share, not 100%
    x, y = _blobs(120, seed=3)
    dmath.random.seed(0)
    m = dnn.Sequential([L.Input(6), L.Dense(8, activation="relu", bias_init=-100.0), L.Dense(3),
                        L.Output("softmax")], dtype="float64")
    assert m.evaluate(x, y)["accuracy"] == pytest.approx(np.mean(y == 0))
    trained = _small()
    trained.fit(x, y, batch_size=32, epochs=2, verbose=0)
    assert trained.evaluate(x, y)["accuracy"] == pytest.approx(
        np.mean(trained.predict(x).argmax(axis=1) == y))


def test_recorded_steps_equal_eager_steps():
    """Dropout included: each replay must multiply by a new mask, as each eager step does."""
    x, y = _blobs()
    data = dnn.data.Dataset(x, y)
    rec, eager = _small(record=True, dropout=0.3), _small(record=False, dropout=0.3)
    for m in (rec, eager):
        m.fit(data, batch_size=60, epochs=2, shuffle=True, verbose=0)    # 60 does not divide 256: two plans
    prog = rec._feed(data).programs[("train", 60)]
    assert prog.plan is not None and eager._feed(data).programs[("train", 60)].plan is None
    for a, b in zip(rec.get_weights(), eager.get_weights()):
        np.testing.assert_array_equal(a, b)
    drop = next(n.fn for n in prog.order if isinstance(n.fn, dnn.ops.Dropout))
    assert drop.mask is None            # dropped once the step's backward read it: nothing held between steps
    plan, before = prog.plan, drop.counter.get((0, 0))
    for m in (rec, eager):
        m.fit(data, batch_size=60, epochs=1, verbose=0)
    # the replays advanced the mask's counter (a new mask per step) and still match the eager steps
    assert prog.plan is plan and drop.counter.get((0, 0)) > before
    for a, b in zip(rec.get_weights(), eager.get_weights()):
        np.testing.assert_array_equal(a, b)


def test_evaluating_the_training_set_inside_an_epoch_leaves_the_epoch_alone():
    """A callback that evaluates or predicts on the training Dataset between steps: evaluation has
    a cursor of its own, so the epoch goes on in its shuffled order from where it was (it once
    rewound the shared cursor to the stored order, then read past the end of it)."""
    x, y = _blobs(n=60)
    data = dnn.data.Dataset(x, y)
    seen = []

    class Peek(dnn.callbacks.Callback):
        def on_batch_end(self, batch, logs=None):
            seen.append((self.model.evaluate(data, batch_size=16)["loss"], self.model.predict(data).shape))

    runs = {}
    for name, callbacks in (("plain", []), ("peeking", [Peek()])):
        for record in (True, False):
            model = _small(record=record, dropout=0.2)
            hist = model.fit(data, batch_size=8, epochs=2, shuffle=True, verbose=0, callbacks=callbacks)
            runs[name, record] = (hist["loss"], model.get_weights())
    assert len(seen) == 2 * 2 * 8 and all(np.isfinite(l) and shape == (60, 3) for l, shape in seen)
    for record in (True, False):
        (loss, weights), (loss2, weights2) = runs["plain", record], runs["peeking", record]
        assert loss == loss2
        for a, b in zip(weights, weights2):
            np.testing.assert_array_equal(a, b)


def test_model_parallel_dense_trains_like_data_parallel():
    x, y = _blobs()
    data, model = _small(parallel="data"), _small(parallel="model")
    assert type(model.layers[1].kernel.value.layout) is dmath.ColBlock
    for m in (data, model):
        m.fit(x, y, batch_size=64, epochs=2, verbose=0)
    for a, b in zip(data.get_weights(), model.get_weights()):
        np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(data.predict(x[:10]), model.predict(x[:10]), rtol=1e-9)


def test_binary_cross_entropy_and_mse_models_train():
    rng = np.random.default_rng(3)
    x = rng.normal(size=(200, 4))
    yb = (x[:, 0] + x[:, 1] > 0).astype(np.float64)
    dmath.random.seed(3)
    m = dnn.Sequential([L.Input(4), L.Dense(8), L.Activation("tanh"), L.Dense(1), L.Output("sigmoid")],
                       loss="binary_cross_entropy", dtype="float64", optimizer=dnn.optim.SGD(lr=0.5))
    h = m.fit(x, yb, batch_size=40, epochs=5, verbose=0)
    assert h["loss"][-1] < h["loss"][0] and h["accuracy"][-1] > 0.9
    p = m.predict(x[:5])
    assert p.shape == (5, 1) and np.all((p > 0) & (p < 1))
    yr = x @ np.array([[1.0, -2.0], [0.5, 0.0], [0.0, 1.0], [0.0, 0.0]])
    r = dnn.Sequential([L.Input(4), L.Dense(2), L.Output("linear")], loss="mse", dtype="float64",
                       optimizer=dnn.optim.SGD(lr=0.1))
    h = r.fit(x, yr, batch_size=50, epochs=20, verbose=0)
    assert h["loss"][-1] < 1e-3 * h["loss"][0] and "accuracy" not in h


def test_save_load_round_trip_continues_training_identically(tmp_path):
    x, y = _blobs()
    a = _small(optimizer=dnn.optim.SGD(lr=0.05, momentum=0.9))
    a.fit(x, y, batch_size=64, epochs=1, verbose=0)
    path = tmp_path / "model.dnn"
    a.save(path)
    b = dnn.load(path)
    assert [type(layer) for layer in b.layers] == [type(layer) for layer in a.layers]
    for wa, wb in zip(a.get_weights(), b.get_weights()):
        np.testing.assert_array_equal(wa, wb)
    np.testing.assert_array_equal(a.predict(x[:7]), b.predict(x[:7]))
    for m in (a, b):   # the momentum buffers came back too: the next epoch is the same
        m.fit(x, y, batch_size=64, epochs=1, shuffle=False, verbose=0)
    for wa, wb in zip(a.get_weights(), b.get_weights()):
        np.testing.assert_array_equal(wa, wb)
    assert not [f for f in os.listdir(tmp_path) if f != "model.dnn"], "no temporary file left behind"


def test_auto_parallel_model_reloads_and_continues(tmp_path, monkeypatch):
    """'auto' is decided at the first program; a reloaded model decides again and its optimizer
    state follows the weights into the chosen layout (the cost model's choice: timing off)."""
    monkeypatch.setattr(dmath.tuning, "mode", lambda: "off")
    rng = np.random.default_rng(4)
    x, y = rng.normal(size=(64, 48)), rng.integers(0, 3, 64)

    def make():
        dmath.random.seed(6)
        return dnn.Sequential([L.Input(48), L.Dense(48, parallel="auto"), L.Activation("relu"), L.Dense(3),
                               L.Output("softmax")], dtype="float64",
                              optimizer=dnn.optim.SGD(lr=0.05, momentum=0.9))
    a = make()
    a.fit(x, y, batch_size=8, epochs=1, verbose=0)
    expect = "model" if P > 1 else "data"
    assert a.layers[1].strategy == expect
    a.save(tmp_path / "auto.dnn")
    b = dnn.load(tmp_path / "auto.dnn")
    assert b.layers[1].strategy is None
    for m in (a, b):
        m.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0)
    assert b.layers[1].strategy == expect
    kernel = b.layers[1].kernel.var
    assert all(s.layout == kernel.value.layout for s in b.optimizer._state[kernel].values())
    for wa, wb in zip(a.get_weights(), b.get_weights()):
        np.testing.assert_allclose(wa, wb, rtol=1e-12, atol=1e-14)


def test_float16_model_saves_master_weights_and_loss_scale(tmp_path):
    x, y = _blobs()
    m = _small(dtype="float16")
    m.fit(x.astype(np.float32), y, batch_size=64, epochs=1, verbose=0)
    assert all(w.dtype == np.float32 for w in m.get_weights())
    m.save(tmp_path / "h.dnn")
    n = dnn.load(tmp_path / "h.dnn")
    assert n.dtype == "float16" and n.loss_scale.value() == m.loss_scale.value()


def test_float16_overflowing_steps_are_skipped_and_the_scale_backs_off():
    x, y = _blobs(64)
    m = _small(dtype="float16")
    m.loss_scale = dnn.optim.DynamicLossScale(init_scale=2.0 ** 40)     # gradients * 2**40 overflow float16
    m.loss_scale.setup()
    before = m.get_weights()
    m.fit(x.astype(np.float32), y, batch_size=64, epochs=1, shuffle=False, verbose=0)   # one step
    for a, b in zip(before, m.get_weights()):
        np.testing.assert_array_equal(a, b)
    assert m.loss_scale.value() == 2.0 ** 39
    m.fit(x.astype(np.float32), y, batch_size=16, epochs=10, verbose=0)
    assert m.loss_scale.value() < 2.0 ** 20
    assert any(not np.array_equal(a, b) for a, b in zip(before, m.get_weights()))
    assert all(np.isfinite(w).all() for w in m.get_weights())


def test_corrupt_truncated_and_mismatched_files_raise(tmp_path):
    x, y = _blobs()
    m = _small()
    path = tmp_path / "m.dnn"
    m.save(path)
    blob = path.read_bytes()
    cases = {
        "truncated": blob[:-10],
        "short": blob[:12],
        "magic": b"NOTAMODL" + blob[8:],
        "header": blob[:30] + bytes([blob[30] ^ 0xFF]) + blob[31:],
        "data": blob[:-5] + bytes([blob[-5] ^ 0x01]) + blob[-4:],
        "longer": blob + b"\0",
    }
    for name, data in cases.items():
        bad = tmp_path / f"{name}.dnn"
        bad.write_bytes(data)
        with pytest.raises(dnn.ModelFileError):
            dnn.load(bad)
    with pytest.raises(dnn.ModelFileError, match="cannot read"):
        dnn.load(tmp_path / "missing.dnn")
    other = dnn.Sequential([L.Input(6), L.Dense(17), L.Activation("tanh"), L.Dense(3), L.Output("softmax")])
    with pytest.raises(dnn.ModelFileError, match="shape"):
        other.load_weights(path)
    before = [w.copy() for w in other.get_weights()]
    assert all(np.array_equal(a, b) for a, b in zip(before, other.get_weights()))


def test_file_describing_an_impossible_model_raises_before_allocating(tmp_path):
    """Valid checksums, but the architecture says units=10**10: the weights it would need are compared
    with the file's before anything is built."""
    from dnn import serialization
    m = _small()
    path = tmp_path / "m.dnn"
    m.save(path)
    header, arrays = serialization.read_file(path)
    assert header["version"] == 2 and header["training"]["epochs_trained"] == 0
    header["model"]["layers"][1]["units"] = 10 ** 10
    bad = tmp_path / "huge.dnn"
    serialization.write_file(bad, {k: v for k, v in header.items() if k not in ("arrays", "data_bytes")},
                             list(arrays.items()))
    with pytest.raises(dnn.ModelFileError, match="needs weights"):
        dnn.load(bad)
    header["training"]["position"] = {"epoch": 0, "batch": 1, "batch_size": 8}     # no metrics arrays
    header["model"]["layers"][1]["units"] = m.layers[1].units
    serialization.write_file(bad, {k: v for k, v in header.items() if k not in ("arrays", "data_bytes")},
                             list(arrays.items()))
    with pytest.raises(dnn.ModelFileError, match="metrics"):
        dnn.load(bad)


@pytest.mark.parametrize("count", [2 ** 53, 10 ** 30])
def test_a_training_count_past_the_data_orders_keys_is_refused_at_load(tmp_path, count):
    """epochs_trained = 10**30 loaded, then fit failed deep inside dmath (the data order's keys are
    integers below 2**53): refused by the loader, naming the field."""
    m = _small()
    m.save(tmp_path / "m.dnn")

    def edit(header):
        header["training"]["epochs_trained"] = count
    bad = _crafted(tmp_path / "m.dnn", tmp_path / "bad.dnn", {}, edit)
    with pytest.raises(dnn.ModelFileError, match=r"'epochs_trained' must be an integer in \[0, 2\*\*53\)"):
        dnn.load(bad)


def test_step_checkpoint_resumes_inside_the_epoch(tmp_path):
    x, y = _blobs(96)
    ref = _small(dropout=0.2)
    ckpt = dnn.callbacks.ModelCheckpoint(tmp_path / "s{step}.dnn", unit="step", every=2)
    hist = ref.fit(x, y, batch_size=32, epochs=1, verbose=0, callbacks=[ckpt])      # 3 steps: saved at 2
    m = dnn.load(tmp_path / "s2.dnn")
    assert m.resume["batch"] == 2 and m.epochs_trained == 0
    with pytest.raises(dnn.ConfigError, match="batch_size=32"):
        m.fit(x, y, batch_size=16, epochs=1, verbose=0)
    # another data set of as many batches (90 samples: 3 of 32) resumed the epoch on other samples
    with pytest.raises(dnn.ConfigError, match="over data of 96 samples; this data has 90"):
        m.fit(x[:90], y[:90], batch_size=32, epochs=1, verbose=0)
    h = m.fit(x, y, batch_size=32, epochs=1, verbose=0)
    for a, b in zip(ref.get_weights(), m.get_weights()):
        np.testing.assert_allclose(b, a, rtol=0, atol=1e-12)
    np.testing.assert_allclose(h["loss"], hist["loss"], rtol=1e-12)


def test_model_checkpoint_arguments_are_checked(tmp_path):
    for kw in ({"unit": "batch"}, {"every": 0}, {"keep": 0}, {"save_best_only": True, "unit": "step"}):
        with pytest.raises(dnn.ConfigError, match="ModelCheckpoint"):
            dnn.callbacks.ModelCheckpoint(tmp_path / "m.dnn", **kw)
    # a field a step checkpoint cannot fill, or a positional one, is refused before training, not at
    # the first save
    for path, kw in (("s{val_loss}.dnn", {"unit": "step"}), ("s{}.dnn", {}), ("s{0}.dnn", {}), ("s{step", {})):
        with pytest.raises(dnn.ConfigError, match="ModelCheckpoint"):
            dnn.callbacks.ModelCheckpoint(str(tmp_path / path), **kw)
    dnn.callbacks.ModelCheckpoint(str(tmp_path / "e{epoch:03d}-{val_loss:.3f}.dnn"))     # epoch logs: fine


def test_model_checkpoint_makes_its_directory(tmp_path):
    """The checkpoint's folder is made at its first save (model.save itself says which folder is
    missing); `keep` leaves the newest files."""
    x, y = _blobs(96)
    m = _small()
    ckpt = dnn.callbacks.ModelCheckpoint(str(tmp_path / "run" / "ckpt" / "s{step:04d}.dnn"), unit="step",
                                         every=1, keep=2)
    m.fit(x, y, batch_size=32, epochs=2, verbose=0, callbacks=[ckpt])
    assert sorted(p.name for p in (tmp_path / "run" / "ckpt").iterdir()) == ["s0005.dnn", "s0006.dnn"]
    assert dnn.load(tmp_path / "run" / "ckpt" / "s0006.dnn").optimizer.iterations == 6
    with pytest.raises(dnn.ModelFileError, match="does not exist"):
        m.save(tmp_path / "missing" / "m.dnn")
    assert not (tmp_path / "missing").exists()


def test_summary_lists_layers_parameters_strategies_and_layouts():
    m = dnn.Sequential([L.Input((1, 8, 8)), L.Conv2D(2, 3, padding="same"), L.Activation("relu"), L.Flatten(),
                        L.Dense(5, parallel="model"), L.Dense(3), L.Output("softmax")])
    text = m.summary(print_fn=None)
    for expect in ("conv2d_1 (Conv2D)", "(2, 8, 8)", "20", "dense_1 (Dense)", "model", "ColBlock", "Replicated",
                   f"Total params: {20 + 128 * 5 + 5 + 18:,}", f"{P} worker"):
        assert expect in text, (expect, text)
    # after a training step the Activations column comes from the layouts the step's outputs had,
    # although the step dropped the values themselves: one per layer output
    rng = np.random.default_rng(0)
    m.fit(rng.normal(size=(16, 64)), rng.integers(0, 3, 16), batch_size=8, epochs=1, verbose=0)
    prog = m._last_program()
    assert all(n.value is None for n in prog.layer_nodes if n.fn is not None)
    acts = m._activation_layouts()
    computed = {n.id for n in prog.order}
    assert sorted(acts) == [i for i, n in enumerate(prog.layer_nodes) if n.id in computed]
    assert set(acts.values()) <= {"RowBlock", "ColBlock", "Replicated"}


def test_callbacks_and_early_stopping():
    x, y = _blobs()
    seen = []
    stop = dnn.callbacks.EarlyStopping(monitor="loss", patience=0, min_delta=10.0)
    cb = dnn.callbacks.LambdaCallback(on_epoch_end=lambda e, logs: seen.append((e, round(logs["loss"], 6))))
    hist = _small().fit(x, y, batch_size=128, epochs=5, callbacks=[cb, stop], verbose=0)
    assert len(hist["loss"]) == 2 and stop.stopped_epoch == 1 and [e for e, _ in seen] == [0, 1]


def test_progress_output(capsys):
    x, y = _blobs(64)
    _small().fit(x, y, batch_size=32, epochs=2, verbose=2)
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 2 and out[1].startswith("epoch 2/2") and "loss" in out[1] and "samples/s" in out[1]


def test_user_errors_raise_before_anything_runs():
    x, y = _blobs(32)
    m = _small()
    with pytest.raises(dnn.ShapeError, match="samples must have shape"):
        m.fit(np.zeros((32, 5)), y, verbose=0)
    with pytest.raises(dnn.ShapeError, match="labels must be in"):
        m.fit(x, y + 3, verbose=0)
    with pytest.raises(dnn.ShapeError, match="targets for"):
        m.fit(x, y[:10], verbose=0)
    with pytest.raises(dnn.ConfigError, match="batch_size"):
        m.fit(x, y, batch_size=0, verbose=0)
    with pytest.raises(dnn.ConfigError, match="first layer"):
        dnn.Sequential([L.Dense(3)])
    with pytest.raises(dnn.ConfigError, match="unknown loss"):
        dnn.Sequential([L.Input(3), L.Dense(2)], loss="hinge")
    with pytest.raises(dnn.ConfigError, match="float16"):
        dnn.Sequential([L.Input(3), L.Dense(2)], loss_scale=dnn.optim.DynamicLossScale())
    m.fit(x, y, batch_size=16, epochs=1, verbose=0)     # still usable


def test_a_corrupt_training_state_raises_model_file_error(tmp_path):
    """Checksummed but wrong training state (a loss scale missing, not one value, or not positive; a
    negative step count) is a ModelFileError, never a KeyError or a negative learning rate."""
    from dnn import serialization
    x, y = _blobs(64)
    m = _small(dtype="float16")
    m.fit(x.astype(np.float32), y, batch_size=32, epochs=1, verbose=0)
    m.save(tmp_path / "h.dnn")
    header, arrays = serialization.read_file(tmp_path / "h.dnn")
    header = {k: v for k, v in header.items() if k not in ("arrays", "data_bytes")}
    m.fit(x.astype(np.float32), y, batch_size=16, epochs=1, verbose=0)     # the model moves on from the file
    changes = {"no good steps": {"loss_scale/good_steps": None}, "scale of 3": {"loss_scale/scale": np.ones(3)},
               "nan scale": {"loss_scale/scale": np.array(np.nan)}, "zero scale": {"loss_scale/scale": np.array(0.0)},
               "negative steps": {"optimizer/iterations": np.array(-5)}}
    for name, change in changes.items():
        bad = dict(arrays)
        for k, v in change.items():
            if v is None:
                del bad[k]
            else:
                bad[k] = v
        path = tmp_path / f"{name}.dnn"
        serialization.write_file(path, header, list(bad.items()))
        with pytest.raises(dnn.ModelFileError):
            dnn.load(path)
        before = _model_state(m), m.loss_scale.value()      # the loss scale is checked before any write too
        with pytest.raises(dnn.ModelFileError):
            m.load_weights(path)
        _assert_same_state(_model_state(m), before[0])
        assert m.loss_scale.value() == before[1]


def test_arrays_the_file_does_not_account_for_raise_model_file_error(tmp_path):
    """Every array of a model file is one the model reads (its weights, its optimizer's state, a
    float16 model's loss scale, its layers' counters, a mid-epoch checkpoint's metric sums); any
    other was ignored on load, silently. Files as older versions wrote them (no layer counters, no
    training state, no optimizer_params) still load."""
    from dnn import serialization
    x, y = _blobs(64)
    m = dnn.Sequential([L.Input(6), L.Dense(5), L.Dropout(0.2), L.BatchNorm(), L.Dense(3), L.Output("softmax")],
                       dtype="float64", optimizer=dnn.optim.SGD(lr=0.05, momentum=0.9))
    m.fit(x, y, batch_size=32, epochs=1, verbose=0)
    m.save(tmp_path / "m.dnn")
    header, arrays = serialization.read_file(tmp_path / "m.dnn")
    header = {k: v for k, v in header.items() if k not in ("arrays", "data_bytes")}
    assert {"state/dropout_1/counter", "state/batchnorm_1/num_batches_tracked"} <= set(arrays)
    extras = {"extra/blob": np.zeros(3), "state/ghost_1/counter": np.array(2.0),
              "state/dense_1/counter": np.array(2.0), "state/dropout_1/steps": np.array(1.0),
              "metrics/loss": np.array(0.5), "loss_scale/scale": np.array(8.0), "weights": np.zeros(2)}
    for name, value in extras.items():
        path = tmp_path / "extra.dnn"
        serialization.write_file(path, header, list(arrays.items()) + [(name, value)])
        with pytest.raises(dnn.ModelFileError, match=rf"arrays its header does not account for: \['{name}'\]"):
            dnn.load(path)
        before = m.get_weights()
        with pytest.raises(dnn.ModelFileError, match=name):
            m.load_weights(path)
        for a, b in zip(m.get_weights(), before):     # refused before anything was written
            np.testing.assert_array_equal(a, b)
    # as older versions wrote it: version 1 (no training state, no layer counters) and version 2
    # before optimizer_params
    old = {k: v for k, v in header.items() if k not in ("training", "optimizer_params")}
    serialization.write_file(tmp_path / "v1.dnn", old, [(k, v) for k, v in arrays.items()
                                                          if not k.startswith("state/")])
    serialization.write_file(tmp_path / "v2.dnn", {k: v for k, v in header.items() if k != "optimizer_params"},
                             list(arrays.items()))
    for name in ("v1.dnn", "v2.dnn", "m.dnn"):
        for a, b in zip(dnn.load(tmp_path / name).get_weights(), m.get_weights()):
            np.testing.assert_array_equal(a, b)


def _crafted(source, path, change, header_edit=None):
    """Write `path`: the model file `source` with `change` applied ({array name: new value, or None to
    drop it}) and `header_edit(header)` run, its checksums recomputed (a crafted file, not a damaged one)."""
    from dnn import serialization
    header, arrays = serialization.read_file(source)
    header = {k: v for k, v in header.items() if k not in ("arrays", "data_bytes")}
    if header_edit is not None:
        header_edit(header)
    arrays = dict(arrays)
    for k, v in change.items():
        if v is None:
            del arrays[k]
        else:
            arrays[k] = np.asarray(v)
    serialization.write_file(path, header, list(arrays.items()))
    return path


def _model_state(m):
    """Everything a load writes into `m`: weights, optimizer state and clock, layer counters, epoch, resume point."""
    params = [w.var for layer in m.layers for w in layer.weights if w.trainable and m.optimizer.has_state(w.var)]
    resume = None if m.resume is None else {k: (v if k != "metrics" else {n: float(a) for n, a in v.items()})
                                            for k, v in m.resume.items()}
    return (m.get_weights(), m.optimizer.get_state(params), [layer.get_state() for layer in m.layers],
            m.epochs_trained, resume)


def _assert_same_state(a, b):
    (wa, oa, la, ea, ra), (wb, ob, lb, eb, rb) = a, b
    for x, y in zip(wa, wb):
        np.testing.assert_array_equal(x, y)
    assert sorted(oa) == sorted(ob) and la.__repr__() == lb.__repr__() and (ea, ra) == (eb, rb)
    for k in oa:
        np.testing.assert_array_equal(oa[k], ob[k])


def test_a_model_file_naming_an_array_twice_is_refused(tmp_path):
    """A second, checksummed entry under a weight's name replaced the real weight on load, silently."""
    m = _small()
    m.save(tmp_path / "m.dnn")
    from dnn import serialization
    header, arrays = serialization.read_file(tmp_path / "m.dnn")
    header = {k: v for k, v in header.items() if k not in ("arrays", "data_bytes")}
    kernel = arrays["weights/dense_2/kernel"]
    serialization.write_file(tmp_path / "dup.dnn", header,
                             list(arrays.items()) + [("weights/dense_2/kernel", np.full_like(kernel, 7.0))])
    with pytest.raises(dnn.ModelFileError, match="two arrays named 'weights/dense_2/kernel'"):
        dnn.load(tmp_path / "dup.dnn")
    before = _model_state(m)
    with pytest.raises(dnn.ModelFileError, match="two arrays named"):
        m.load_weights(tmp_path / "dup.dnn")
    _assert_same_state(_model_state(m), before)


def test_a_weight_beyond_the_models_dtype_is_refused(tmp_path):
    """A float64 file's 1e300 loaded into a float32 model became inf without a word."""
    m = _small()
    m.save(tmp_path / "m.dnn")
    from dnn import serialization
    header, arrays = serialization.read_file(tmp_path / "m.dnn")
    header = {k: v for k, v in header.items() if k not in ("arrays", "data_bytes")}
    kernel = arrays["weights/dense_2/kernel"].copy()
    kernel.flat[3] = 1e300
    serialization.write_file(tmp_path / "big.dnn", header,
                             [(k, kernel if k == "weights/dense_2/kernel" else v) for k, v in arrays.items()])
    narrow = _small(dtype="float32")
    before = _model_state(narrow)
    with pytest.raises(dnn.ModelFileError, match="past the largest float32"):
        narrow.load_weights(tmp_path / "big.dnn")
    _assert_same_state(_model_state(narrow), before)
    with pytest.raises(dnn.ConfigError, match="past the largest float32"):     # the shared check: set_weights too
        narrow.set_weights([kernel if w.shape == kernel.shape else w for w in narrow.get_weights()])
    _assert_same_state(_model_state(narrow), before)
    m.load_weights(tmp_path / "big.dnn")            # float64 holds it: loaded as it is
    assert any(float(np.abs(w).max()) == 1e300 for w in m.get_weights())


@pytest.mark.parametrize("bad_value", [-0.5, np.nan])
def test_a_negative_running_variance_is_refused_by_every_loader(tmp_path, bad_value):
    """A BatchNorm's running variance below 0 (or NaN, which passed the check: NaN < 0 is false)
    loaded from a file (or a state dict) made every prediction NaN ((var + eps) ** -0.5); refused,
    and nothing of the model changes."""
    def bn_model():
        dmath.random.seed(3)
        return dnn.Sequential([L.Input(6), L.Dense(8), L.BatchNorm(), L.Activation("relu"), L.Dense(3),
                               L.Output("softmax")], dtype="float64")
    m = bn_model()
    x, y = _blobs(64)
    m.fit(x, y, batch_size=32, epochs=1, verbose=0)
    m.save(tmp_path / "m.dnn")
    bn = next(layer for layer in m.layers if isinstance(layer, L.BatchNorm))
    var = bn.running_var.numpy().copy()
    var[2] = bad_value
    bad = _crafted(tmp_path / "m.dnn", tmp_path / "bad.dnn", {f"weights/{bn.running_var.name}": var})
    other = bn_model()
    before = _model_state(other)
    # (NaN: refused as any weight's NaN is, naming the running variance)
    with pytest.raises(dnn.ModelFileError, match="running_var: values must be at least 0|running_var' holds NaN"):
        other.load_weights(bad)
    with pytest.raises(dnn.ModelFileError, match="at least 0|running_var' holds NaN"):
        dnn.load(bad)
    _assert_same_state(_model_state(other), before)
    sd = m.state_dict()
    key = next(k for k in sd if k.endswith("running_var"))
    sd[key] = var
    with pytest.raises((dnn.ConfigError, dnn.ShapeError), match="at least 0|holds NaN"):
        other.load_state_dict(sd)
    _assert_same_state(_model_state(other), before)
    with pytest.raises(dnn.ConfigError, match="at least 0"):
        bn.set_weights([w.numpy() if w is not bn.running_var else var for w in bn.weights])
    var[2] = 0.0                                    # a variance of 0 is a variance
    sd[key] = var
    other.load_state_dict(sd)


def test_integer_weights_the_dtype_cannot_hold_are_refused():
    """An integer array is taken as weights only where each value is exact in the weight's dtype (as
    dmath.from_numpy's rule): 2**24 + 1 into a float32 model was rounded silently."""
    dmath.random.seed(4)
    m = dnn.Sequential([L.Input(3), L.Dense(2), L.Output("softmax")], dtype="float32")
    before = _model_state(m)
    sd = m.state_dict()
    key = next(k for k in sd if k.endswith("weight"))
    sd[key] = np.full(sd[key].shape, 2 ** 24 + 1, dtype=np.int64)
    with pytest.raises(dnn.ConfigError, match=r"not exact in float32 \(the first: 16777217"):
        m.load_state_dict(sd)
    _assert_same_state(_model_state(m), before)
    sd[key] = np.full(sd[key].shape, 2 ** 24, dtype=np.int64)       # exact: taken
    m.load_state_dict(sd)
    assert (m.state_dict()[key] == 2.0 ** 24).all()


def test_a_refused_file_changes_nothing_in_the_model(tmp_path):
    """load_weights wrote the file's weights before it checked the optimizer state, the layers'
    counters and the training position: a file refused by one of those left the model half loaded.
    Every check now runs before the first write, as load_state_dict's."""
    x, y = _blobs(96)
    ref = _small(dropout=0.2)
    ref.fit(x, y, batch_size=32, epochs=1, verbose=0,
            callbacks=[dnn.callbacks.ModelCheckpoint(tmp_path / "s{step}.dnn", unit="step", every=2)])
    good = tmp_path / "s2.dnn"
    other = _small(dropout=0.2)
    other.fit(x[::-1].copy(), y[::-1].copy(), batch_size=16, epochs=2, verbose=0)
    before = _model_state(other)
    drop = next(layer.name for layer in other.layers if isinstance(layer, L.Dropout))
    for name, change in {"dropout counter NaN": {f"state/{drop}/counter": np.nan},
                         "beta1 power NaN": {"optimizer/scalars/float64/beta1_power": [[np.nan]]},
                         "moments transposed": {"optimizer/param0/exp_avg": np.zeros((16, 6))},
                         "correct past samples": {"metrics/correct": 1e6},
                         "samples NaN": {"metrics/samples": np.nan}}.items():
        bad = _crafted(good, tmp_path / "bad.dnn", change)
        with pytest.raises(dnn.ModelFileError):
            other.load_weights(bad)
        _assert_same_state(_model_state(other), before)
    other.load_weights(good)                       # the file itself loads, and then everything changed
    after = _model_state(other)
    assert after[3] == 0 and after[4]["batch"] == 2 and after[1]["iterations"] == 2
    for a, b in zip(after[0], ref.get_weights()):
        assert a.shape == b.shape


def test_a_mid_epoch_checkpoints_metric_sums_are_checked(tmp_path):
    """The loss and correct sums of a checkpoint saved inside an epoch were checked for size only:
    correct = 1e6 resumed an epoch at an accuracy of 31250, samples = NaN failed at fit with a raw
    ValueError. The correct count lies in [0, samples], samples is what the position's batches hold,
    the loss sum is finite."""
    x, y = _blobs(80)           # batches of 32, 32, 16: the ragged last one ends the epoch at sample 80
    ref = _small(dropout=0.2)
    ref.fit(x, y, batch_size=32, epochs=1, verbose=0,
            callbacks=[dnn.callbacks.ModelCheckpoint(tmp_path / "s{step}.dnn", unit="step", every=1)])
    for step, samples in ((2, 64), (3, 80)):
        m = dnn.load(tmp_path / f"s{step}.dnn")
        assert m.resume["batch"] == step and float(m.resume["metrics"]["samples"]) == samples
    good = tmp_path / "s2.dnn"
    bad_values = {"correct": (1e6, 64.5, 2.5, -1.0, np.nan, np.inf),
                  # (after 2 batches of 32: 33 to 64, the second batch ragged at 1 to 32 samples)
                  "samples": (np.nan, np.inf, -64.0, 0.0, 32.0, 65.0, 63.5, 1e300),
                  "loss": (np.nan, np.inf, -np.inf)}
    for key, values in bad_values.items():
        for value in values:
            bad = _crafted(good, tmp_path / "bad.dnn", {f"metrics/{key}": value})
            with pytest.raises(dnn.ModelFileError, match=f"metrics/{key}"):
                dnn.load(bad)
    # after a ragged last batch (80 after 3 batches of 32) that batch held at least one sample
    bad = _crafted(tmp_path / "s3.dnn", tmp_path / "bad.dnn", {"metrics/samples": 64})
    with pytest.raises(dnn.ModelFileError, match="metrics/samples"):
        dnn.load(bad)
    m = dnn.load(_crafted(good, tmp_path / "ok.dnn", {"metrics/correct": 64.0}))     # all right: a bound
    h = m.fit(x, y, batch_size=32, epochs=1, verbose=0)
    assert 0 <= h["accuracy"][0] <= 1


def test_optimizer_state_in_a_file_is_checked(tmp_path):
    """Optimizer state was restored without a look at its values: Adam's beta powers of NaN, past 1
    or with several values (the first was used), a moment saved transposed (silently reshaped), a
    step count of 2.7 (truncated to 2) all loaded."""
    x, y = _blobs(64)
    m = _small()
    m.fit(x, y, batch_size=32, epochs=1, verbose=0)
    m.save(tmp_path / "m.dnn")
    beta = "optimizer/scalars/float64/beta1_power"
    bad = {"beta1 power NaN": {beta: [[np.nan]]}, "beta1 power inf": {beta: [[np.inf]]},
           "beta1 power past 1": {beta: [[1.5]]}, "beta1 power negative": {beta: [[-0.5]]},
           "beta1 power two values": {beta: [[0.81, 5.0]]},
           "beta2 power none": {"optimizer/scalars/float64/beta2_power": np.zeros((1, 0))},
           "moments transposed": {"optimizer/param0/exp_avg": np.zeros((16, 6))},
           "moments flat": {"optimizer/param0/exp_avg": np.zeros(96)},
           "moments infinite": {"optimizer/param0/exp_avg": np.full((6, 16), np.inf)},
           "squares negative": {"optimizer/param0/exp_avg_sq": -np.ones((6, 16))},
           "squares NaN": {"optimizer/param1/exp_avg_sq": np.full((1, 16), np.nan)},
           "steps 2.7": {"optimizer/iterations": 2.7}, "steps NaN": {"optimizer/iterations": np.nan},
           "steps inf": {"optimizer/iterations": np.inf}, "steps two values": {"optimizer/iterations": [2, 3]},
           "steps past int64": {"optimizer/iterations": 2.0 ** 63}}
    for name, change in bad.items():
        path = _crafted(tmp_path / "m.dnn", tmp_path / "bad.dnn", change)
        with pytest.raises(dnn.ModelFileError, match="optimizer"):
            dnn.load(path)
        with pytest.raises(dnn.ModelFileError, match="optimizer"):
            m.load_weights(path)
    # 1 before the first step (and after steps a float16 model skipped); 0 once b**t underflows, or b = 0
    for value in (1.0, 0.0):
        assert dnn.load(_crafted(tmp_path / "m.dnn", tmp_path / "ok.dnn", {beta: [[value]]})).optimizer.iterations == 2
    assert dnn.load(_crafted(tmp_path / "m.dnn", tmp_path / "ok.dnn",
                             {"optimizer/iterations": 2.0})).optimizer.iterations == 2


def test_layer_counters_in_a_file_are_checked(tmp_path):
    """A dropout counter or a BatchNorm's num_batches_tracked of +inf raised a raw OverflowError
    (int(inf)); several values were read as the first. Each is one whole number >= 0, below 2**53
    (a dropout counter is a float64 that stops counting there) or 2**63 (an int64)."""
    x, y = _blobs(64)
    m = dnn.Sequential([L.Input(6), L.Dense(5), L.Dropout(0.2), L.BatchNorm(), L.Dense(3), L.Output("softmax")],
                       dtype="float64", optimizer=dnn.optim.SGD(lr=0.05, momentum=0.9))
    m.fit(x, y, batch_size=32, epochs=1, verbose=0)
    m.save(tmp_path / "m.dnn")
    counter, tracked = "state/dropout_1/counter", "state/batchnorm_1/num_batches_tracked"
    bad = [(counter, v) for v in (np.inf, -np.inf, np.nan, -1.0, 2.5, 2.0 ** 53, [1.0, 2.0], np.zeros(0))]
    bad += [(tracked, v) for v in (np.inf, np.nan, -1, 2.5, 2.0 ** 63, np.array([1, 2]))]
    before = _model_state(m)
    for key, value in bad:
        path = _crafted(tmp_path / "m.dnn", tmp_path / "bad.dnn", {key: value})
        with pytest.raises(dnn.ModelFileError, match=key.split("/")[-1]):
            dnn.load(path)
        with pytest.raises(dnn.ModelFileError, match=key.split("/")[-1]):
            m.load_weights(path)
        _assert_same_state(_model_state(m), before)
    loaded = dnn.load(_crafted(tmp_path / "m.dnn", tmp_path / "ok.dnn", {counter: 7.0, tracked: 9}))
    layers = {layer.name: layer for layer in loaded.layers}
    assert layers["dropout_1"].get_state()["counter"] == 7.0 and layers["batchnorm_1"].batches_tracked == 9


def test_model_files_take_the_umask_and_array_initializers_save(tmp_path):
    """A saved model is readable as any new file is (0o666 less the umask, not mkstemp's 0o600); a model
    whose kernel started from a numpy array saves and loads (its config keeps the array's shape)."""
    umask = os.umask(0o022)
    os.umask(umask)
    x, y = _blobs(64)
    m = dnn.Sequential([L.Input(6), L.Dense(3, kernel_init=np.full((6, 3), 0.1)), L.Output("softmax")],
                       dtype="float64")
    m.fit(x, y, batch_size=32, epochs=1, verbose=0)
    m.save(tmp_path / "a.dnn")
    assert (os.stat(tmp_path / "a.dnn").st_mode & 0o777) == 0o666 & ~umask
    n = dnn.load(tmp_path / "a.dnn")
    for a, b in zip(m.get_weights(), n.get_weights()):
        np.testing.assert_array_equal(a, b)
    assert n.layers[1].get_config()["kernel_init"] == {"name": "array", "shape": [6, 3]}


def test_saving_over_a_read_only_model_file_keeps_it_read_only(tmp_path):
    """A save replaces the file by a rename (allowed over a read-only file in a writable directory):
    the new file keeps the old one's permission bits, as `cp` over it would (it came out 0o644)."""
    x, y = _blobs(64)
    m = _small()
    path = tmp_path / "ro.dnn"
    m.save(path)
    os.chmod(path, 0o444)
    m.fit(x, y, batch_size=32, epochs=1, verbose=0)
    m.save(path)
    assert (os.stat(path).st_mode & 0o7777) == 0o444
    for a, b in zip(dnn.load(path).get_weights(), m.get_weights()):
        np.testing.assert_array_equal(a, b)
    assert os.listdir(tmp_path) == ["ro.dnn"]


def test_targets_batch_sizes_and_inputs_are_checked_before_any_step():
    x, y = _blobs(65)
    bce = dnn.Sequential([L.Input(6), L.Dense(1), L.Output("sigmoid")], loss="binary_cross_entropy")
    with pytest.raises(dnn.ShapeError, match=r"targets must be in \[0, 1\]"):
        bce.fit(x, y, epochs=1, verbose=0)                 # class labels 0..2
    with pytest.raises(dnn.ShapeError, match=r"targets must be in \[0, 1\]"):
        bce.fit(x, np.full((65, 1), 1.5), epochs=1, verbose=0)
    bce.fit(x, (y == 1).astype(np.float64), epochs=1, verbose=0)
    m = _small()
    for bad in (0, False, 0.0, -1):
        with pytest.raises(dnn.ConfigError, match="batch_size"):
            m.evaluate(x, y, batch_size=bad)
        with pytest.raises(dnn.ConfigError, match="batch_size"):
            m.predict(x, batch_size=bad)
    with pytest.raises(dnn.ConfigError, match="None"):
        m.predict(None)
    with pytest.raises(dnn.ShapeError, match="empty array"):
        m.predict(np.zeros((0, 5)))
    assert m.predict(np.zeros((0, 6))).shape == (0, 3)
    # a last training batch of one sample cannot be batch-normalised: refused before the first step
    dmath.random.seed(1)
    bn = dnn.Sequential([L.Input(6), L.Dense(4), L.BatchNorm(), L.Dense(3), L.Output("softmax")])
    before = bn.get_weights()
    with pytest.raises(dnn.ShapeError, match="one value per channel"):
        bn.fit(x, y, batch_size=32, epochs=1, verbose=0)             # 65 = 2 * 32 + 1
    assert bn.optimizer.iterations == 0
    for a, b in zip(before, bn.get_weights()):
        np.testing.assert_array_equal(a, b)
    bn.fit(x, y, batch_size=13, epochs=1, verbose=0)


def test_model_and_loss_scale_arguments_are_checked():
    layers = lambda: [L.Input(6), L.Dense(3), L.Output("softmax")]       # noqa: E731
    for kw in ({"record": "no"}, {"name": 7}):
        with pytest.raises(dnn.ConfigError):
            dnn.Sequential(layers(), **kw)
    for kw in ({"init_scale": "a"}, {"init_scale": float("inf")}, {"growth_factor": float("nan")},
               {"backoff_factor": True}):
        with pytest.raises(dnn.ConfigError):
            dnn.optim.DynamicLossScale(**kw)
    x, y = _blobs(32)
    for verbose in (3, -1, 0.5, "1"):
        with pytest.raises(dnn.ConfigError, match="verbose"):
            dnn.Sequential(layers()).fit(x, y, verbose=verbose)


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
    """Asynchronous steps (dnn.training.asgd builds its per-group steps from the same Program) take the same
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


def test_a_fit_called_from_inside_fit_is_refused():
    """A callback calling model.fit reset the outer fit's metric sums and added its own: the outer
    epoch reported an accuracy of 1.25. Refused; evaluate and predict from a callback still work,
    and fit works again once the outer one has ended."""
    x, y = _blobs(96)
    m = _small()
    seen = []

    class Inner(dnn.callbacks.Callback):
        def on_batch_end(self, batch):
            if batch == 1 and not seen:
                seen.append(self.model.evaluate(x, y)["loss"])
                self.model.fit(x, y, batch_size=16, epochs=1, verbose=0)

    with pytest.raises(dnn.ConfigError, match="while this model's fit is running"):
        m.fit(x, y, batch_size=32, epochs=1, verbose=0, callbacks=[Inner()])
    assert seen and np.isfinite(seen[0])
    hist = m.fit(x, y, batch_size=32, epochs=2, verbose=0)
    assert all(0 <= a <= 1 for a in hist.history["accuracy"])
    with pytest.raises(dnn.ConfigError, match="terminate_on_nan must be True or False"):
        m.fit(x, y, verbose=0, terminate_on_nan="no")
