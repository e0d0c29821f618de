"""The fit loop (dnn/training): optimizer and learning-rate changes between fits, callbacks, resuming
a saved run; NumPy and a fresh run of the same model as the oracles."""
import os

import numpy as np
import pytest

import dmath
import dnn
from dnn import layers as L

P = dmath.num_workers()


def _data(n=48, features=4, classes=3, seed=0):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((n, features)), rng.integers(0, classes, n)


def _same_weights(a, b, rtol=0.0):
    for p, q in zip(a.get_weights(), b.get_weights()):
        np.testing.assert_allclose(p, q, rtol=rtol, atol=0)


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


# ---- 2b. layer and model settings changed between calls on one Dataset ------------------------------
def _settings_model():
    a = dnn.Input((4,))
    h = L.Dense(5, activation="tanh", name="h")(a)
    o1 = L.Dense(3, activation="softmax", name="o1")(L.Dropout(0.5, name="dr")(L.BatchNorm(name="bn")(h)))
    o2 = L.Dense(3, activation="softmax", name="o2")(h)
    m = dnn.Model(a, [o1, o2], optimizer=dnn.optim.SGD(lr=0.1), dtype="float64", seed=1)
    rng = np.random.default_rng(3)
    m.set_weights([rng.standard_normal(w.shape) * 0.5 if w.ndim > 1 else np.ones_like(w) for w in m.get_weights()])
    return m


def _layer(m, name):
    return next(layer for layer in m.layers if layer.name == name)


SETTINGS = {
    "loss_weights": lambda m: setattr(m, "loss_weights", (1.0, 0.25)),
    "batchnorm_eps": lambda m: setattr(_layer(m, "bn"), "eps", 1.0),
    "batchnorm_momentum": lambda m: setattr(_layer(m, "bn"), "momentum", 0.9),
    "dropout_p": lambda m: setattr(_layer(m, "dr"), "p", 0.0),
    "dropout_seed": lambda m: setattr(_layer(m, "dr"), "seed", 12345),
    "dense_activation": lambda m: setattr(_layer(m, "h"), "activation", "relu"),
}


def _calls_after(change, same_dataset):
    """fit, evaluate and predict on Datasets, `change` applied, then fit, evaluate and predict again on
    the same Datasets or new ones: (the second round's loss, evaluation, predictions, weights)."""
    x, y = _data(16)
    ds, xs = dnn.data.Dataset(x, y), dnn.data.Dataset(x)
    m = _settings_model()
    m.fit(ds, batch_size=8, epochs=1, shuffle=False, verbose=0)
    m.evaluate(ds)
    m.predict(xs)
    change(m)
    if not same_dataset:
        ds, xs = dnn.data.Dataset(x, y), dnn.data.Dataset(x)
    loss = m.fit(ds, batch_size=8, epochs=1, shuffle=False, verbose=0).history["loss"]
    return loss, m.evaluate(ds), m.predict(xs), m.get_weights()


@pytest.mark.parametrize("setting", sorted(SETTINGS))
def test_settings_changed_between_calls_on_one_dataset_take_effect(setting):
    """A layer's setting or the loss weights changed after a fit were ignored by fit, evaluate and
    predict on the same Dataset (the steps recorded with the old values replayed), and honoured on a
    new one (a hostile-use probe): every layer's configuration is part of the recorded steps' key."""
    same, fresh = _calls_after(SETTINGS[setting], True), _calls_after(SETTINGS[setting], False)
    assert same[0] == fresh[0] and same[1] == fresh[1]
    for a, b in zip(same[2] + same[3], fresh[2] + fresh[3]):
        np.testing.assert_array_equal(a, b)
    unchanged = _calls_after(lambda m: None, True)
    assert same[:2] != unchanged[:2]    # (the change alters the second fit's loss or the evaluation)


# ---- 4b. every hook gets logs -------------------------------------------------------------------------
@pytest.mark.parametrize("asynchronous", [False, True])
def test_callbacks_get_logs_at_every_hook_and_may_leave_them_out(asynchronous):
    """LambdaCallback(on_batch_end=lambda batch, logs: ...) and on_train_begin=lambda logs: ...
    (Keras' signatures, the docstring's) raised a bare TypeError (a hostile-use probe): fit passed no
    logs to on_train_begin, on_epoch_begin, on_batch_end and on_train_end. Every hook gets a dict (the
    epoch's logs at its end and the last epoch's at the train's end, else empty), and a hook written
    without logs is called without them."""
    x, y = _data(32)
    seen, short = [], []
    keras = dnn.callbacks.LambdaCallback(
        on_train_begin=lambda logs: seen.append(("train_begin", logs)),
        on_epoch_begin=lambda epoch, logs: seen.append(("epoch_begin", epoch, logs)),
        on_batch_end=lambda batch, logs: seen.append(("batch_end", batch, logs)),
        on_epoch_end=lambda epoch, logs: seen.append(("epoch_end", epoch, logs)),
        on_train_end=lambda logs: seen.append(("train_end", logs)))
    brief = dnn.callbacks.LambdaCallback(on_train_begin=lambda: short.append("train_begin"),
                                         on_batch_end=lambda batch: short.append(batch),
                                         on_epoch_end=lambda epoch: short.append(("epoch_end", epoch)))

    class Old(dnn.callbacks.Callback):
        def on_epoch_begin(self, epoch):
            short.append(("epoch_begin", epoch))

        def on_train_end(self, logs=None):
            short.append(("train_end", sorted(logs)))

    m = dnn.Sequential([L.Input(4), L.Dense(3), L.Output("softmax")], dtype="float64")
    hist = m.fit(x, y, batch_size=16, epochs=2, verbose=0, callbacks=[keras, brief, Old()],
                 asynchronous=asynchronous)
    epoch_logs = [{k: v[e] for k, v in hist.history.items()} for e in range(2)]
    assert seen == [("train_begin", {}),
                    ("epoch_begin", 0, {}), ("batch_end", 0, {}), ("batch_end", 1, {}), ("epoch_end", 0, epoch_logs[0]),
                    ("epoch_begin", 1, {}), ("batch_end", 0, {}), ("batch_end", 1, {}), ("epoch_end", 1, epoch_logs[1]),
                    ("train_end", epoch_logs[1])]
    assert short == ["train_begin", ("epoch_begin", 0), 0, 1, ("epoch_end", 0), ("epoch_begin", 1), 0, 1,
                     ("epoch_end", 1), ("train_end", sorted(epoch_logs[1]))]


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


# ---- callback arguments, checked at construction ----------------------------------------------------
@pytest.mark.parametrize("args,what", [
    (dict(patience="abc"), "patience"), (dict(patience=None), "patience"), (dict(patience=-1), "patience"),
    (dict(patience=2.7), "patience"), (dict(patience=True), "patience"),
    (dict(min_delta=float("nan")), "min_delta"), (dict(min_delta=float("inf")), "min_delta"),
    (dict(min_delta=-0.1), "min_delta"), (dict(min_delta="0.1"), "min_delta"),
    (dict(monitor=None), "monitor"), (dict(monitor=5), "monitor")])
def test_early_stopping_refuses_bad_arguments(args, what):
    """No silent coercion: int(2.7) would be 2, abs(-0.1) a positive delta, and a NaN min_delta stopped
    training after one epoch (nothing compares below NaN)."""
    with pytest.raises(dnn.ConfigError, match=f"EarlyStopping: {what}"):
        dnn.callbacks.EarlyStopping(**args)


@pytest.mark.parametrize("path", ["m{epoch:q}.dnn", "m{epoch[0]}.dnn", "m{epoch!z}.dnn", "m{epoch.real.x}.dnn",
                                  "m{loss:d}.dnn"])
def test_model_checkpoint_refuses_a_path_it_cannot_format_at_construction(tmp_path, path):
    """A format spec the fields cannot take surfaced as a raw ValueError or TypeError at the first save,
    after an epoch of training."""
    with pytest.raises(dnn.ConfigError, match="ModelCheckpoint: path"):
        dnn.callbacks.ModelCheckpoint(str(tmp_path / path))
    with pytest.raises(dnn.ConfigError, match="ModelCheckpoint: monitor"):
        dnn.callbacks.ModelCheckpoint(str(tmp_path / "m.dnn"), monitor=None)


def test_a_checkpoint_or_plot_directory_that_cannot_be_made_names_the_path(tmp_path):
    (tmp_path / "file").write_text("not a directory")
    x, y = _data(32)
    dmath.random.seed(1)
    m = dnn.Sequential([L.Input(4), L.Dense(3), L.Output("softmax")], dtype="float64")
    bad = str(tmp_path / "file" / "sub" / "m{epoch}.dnn")
    with pytest.raises(dnn.errors.ModelFileError, match="file/sub"):
        m.fit(x, y, batch_size=16, epochs=1, verbose=0, callbacks=[dnn.callbacks.ModelCheckpoint(bad)])
    hist = m.fit(x, y, batch_size=16, epochs=1, verbose=0)
    plot = str(tmp_path / "file" / "curves.png")
    with pytest.raises(dnn.errors.DNNError, match="curves.png"):
        m.fit(x, y, batch_size=16, epochs=1, verbose=0, callbacks=[dnn.callbacks.PlotHistory(plot)])
    with pytest.raises(dnn.errors.DNNError, match="curves.png"):
        hist.plot(plot)


@pytest.mark.parametrize("spec", [["mse"], {"name": "mse"}, None, 3])
def test_an_unhashable_or_unknown_loss_is_a_config_error(spec):
    """A list is no loss name: `spec in _KINDS` raised a raw 'unhashable type' TypeError."""
    with pytest.raises(dnn.ConfigError, match="loss"):
        dnn.losses.get(spec)
    with pytest.raises(dnn.ConfigError, match="loss"):
        dnn.Sequential([L.Input(4), L.Dense(3)], loss=spec)
