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


def test_recorded_steps_equal_eager_steps():
    """Dropout included: each replay must multiply by a new mask, as each eager step does."""
    x, y = _blobs()
    data = dnn.data.Dataset(x, y)
    rec, eager = _small(record=True, dropout=0.3), _small(record=False, dropout=0.3)
    for m in (rec, eager):
        m.fit(data, batch_size=60, epochs=2, shuffle=True, verbose=0)    # 60 does not divide 256: two plans
    prog = rec._feeds[data].programs[("train", 60)]
    assert prog.plan is not None and eager._feeds[data].programs[("train", 60)].plan is None
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


def test_auto_parallel_model_reloads_and_continues(tmp_path):
    """'auto' is decided at the first program; a reloaded model decides again and its optimizer
    state follows the weights into the chosen layout."""
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
    assert all(s.layout == kernel.value.layout for s in b.optimizer._state[id(kernel)].values())
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


def test_step_checkpoint_resumes_inside_the_epoch(tmp_path):
    x, y = _blobs(96)
    ref = _small(dropout=0.2)
    ckpt = dnn.callbacks.ModelCheckpoint(tmp_path / "s{step}.dnn", unit="step", every=2)
    hist = ref.fit(x, y, batch_size=32, epochs=1, verbose=0, callbacks=[ckpt])      # 3 steps: saved at 2
    m = dnn.load(tmp_path / "s2.dnn")
    assert m.resume["batch"] == 2 and m.epochs_trained == 0
    with pytest.raises(dnn.ConfigError, match="batch_size=32"):
        m.fit(x, y, batch_size=16, epochs=1, verbose=0)
    h = m.fit(x, y, batch_size=32, epochs=1, verbose=0)
    for a, b in zip(ref.get_weights(), m.get_weights()):
        np.testing.assert_allclose(b, a, rtol=0, atol=1e-12)
    np.testing.assert_allclose(h["loss"], hist["loss"], rtol=1e-12)


def test_model_checkpoint_arguments_are_checked(tmp_path):
    for kw in ({"unit": "batch"}, {"every": 0}, {"keep": 0}, {"save_best_only": True, "unit": "step"}):
        with pytest.raises(dnn.ConfigError, match="ModelCheckpoint"):
            dnn.callbacks.ModelCheckpoint(tmp_path / "m.dnn", **kw)


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
