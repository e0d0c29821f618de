"""dnn under hostile use (issue 35, items 2, 3, 10 and 11), at every worker count: checkpoints that
must not be clobbered or replace what is not a regular file, typed errors instead of raw ones,
and samples or weights that fit by their count of values only."""
import math
import os
import pickle
import stat
import struct
import zlib

import numpy as np
import pytest

import dnn
from dnn import layers as L
from dnn.callbacks import ModelCheckpoint
from dnn.layers.base import overwrite


def _small(seed=0):
    return dnn.Sequential([L.Input(4), L.Dense(3), L.Output("softmax")], optimizer=dnn.optim.SGD(lr=0.1),
                          seed=seed)


def _images():
    return dnn.Sequential([L.Input((3, 4, 4)), L.Conv2D(2, kernel=3, padding="same"), L.Flatten(), L.Dense(3),
                           L.Output("softmax")])


# ---- 2: save_best_only and NaN -------------------------------------------------------------------
def test_save_best_only_never_overwrites_the_best_file_with_a_nan_epoch(tmp_path):
    model = _small()
    path = str(tmp_path / "best.dnn")
    cb = ModelCheckpoint(path, monitor="val_loss", save_best_only=True)
    cb.model = model
    cb.on_epoch_end(0, {"loss": 1.0, "val_loss": 0.5})
    good = model.get_weights()
    for w in (w for layer in model.layers for w in layer.weights):      # a diverged model's weights (set_weights
        overwrite(w.value, np.full(w.value.shape, np.nan))                 # refuses NaN: written into the matrices)
    for epoch, value in enumerate([math.nan, math.inf, math.nan], start=1):
        cb.on_epoch_end(epoch, {"loss": value, "val_loss": value})    # before: every NaN epoch saved
    for w, g in zip(dnn.load(path).get_weights(), good):
        np.testing.assert_array_equal(w, g)
    model.set_weights(good)
    cb.on_epoch_end(4, {"loss": 0.1, "val_loss": 0.25})             # a real improvement is saved
    assert cb.best == 0.25
    acc = ModelCheckpoint(str(tmp_path / "acc.dnn"), monitor="val_accuracy", save_best_only=True)
    acc.model = model
    acc.on_epoch_end(0, {"val_accuracy": math.nan})
    assert not os.path.exists(tmp_path / "acc.dnn")
    acc.on_epoch_end(1, {"val_accuracy": 0.5})
    assert os.path.exists(tmp_path / "acc.dnn")


# ---- 3: saving writes through to regular files only ------------------------------------------------
def test_save_refuses_a_fifo_and_leaves_it_in_place(tmp_path):
    fifo = str(tmp_path / "pipe")
    os.mkfifo(fifo)
    with pytest.raises(dnn.ModelFileError, match="not a regular file"):
        _small().save(fifo)                  # before: replaced by a regular file
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    with pytest.raises(dnn.ModelFileError, match="not a regular file"):
        dnn.load(fifo)                       # before: blocked for a writer
    with pytest.raises(dnn.ModelFileError, match="not a regular file"):
        _small().save(str(tmp_path))         # a directory


def test_paths_with_a_trailing_separator_or_a_nul_are_refused_in_words(tmp_path):
    """save("d/ck.dnn/") wrote the file d/ck.dnn (realpath drops the slash), which no load of that path
    opened; a path with NUL raised a bare ValueError from open() in save, load, read_csv and read_idx."""
    with pytest.raises(dnn.ModelFileError, match="ends with a path separator"):
        _small().save(str(tmp_path / "ck.dnn") + os.sep)
    assert not os.path.exists(tmp_path / "ck.dnn")
    for call in (lambda p: _small().save(p), dnn.load, dnn.data.read_csv, dnn.data.read_idx):
        with pytest.raises(dnn.ConfigError, match="without NUL characters"):
            call(str(tmp_path / "a\0b"))
        with pytest.raises(dnn.ConfigError, match="non-empty"):
            call("")


def test_a_model_name_that_is_not_text_is_refused():
    """A lone surrogate as the model's name (valid JSON in a file) loaded, then summary() raised
    UnicodeEncodeError; refused where the model is made, so a file holding one does not load."""
    with pytest.raises(dnn.ConfigError, match="UTF-8"):
        dnn.Sequential([L.Input(3), L.Dense(2), L.Output("softmax")], name="\ud800")


def test_save_refuses_a_symlink_to_a_device_and_keeps_both(tmp_path):
    link = tmp_path / "null.dnn"
    os.symlink("/dev/null", link)
    with pytest.raises(dnn.ModelFileError, match=r"-> /dev/null\) is not a regular file"):
        _small().save(str(link))
    assert os.path.islink(link) and stat.S_ISCHR(os.stat("/dev/null").st_mode)


def test_save_through_a_symlink_writes_its_target_and_keeps_the_link(tmp_path):
    (tmp_path / "real").mkdir()
    target = tmp_path / "real" / "model.dnn"
    link = tmp_path / "latest.dnn"
    os.symlink(target, link)                 # dangling first: the target is made
    model = _small(seed=1)
    model.save(str(link))
    assert os.path.islink(link) and target.is_file()
    model.set_weights([w + 1 for w in model.get_weights()])
    model.save(str(link))                    # an existing target is replaced, the link stays
    assert os.path.islink(link)
    for w, v in zip(dnn.load(str(target)).get_weights(), model.get_weights()):
        np.testing.assert_array_equal(w, v)


@pytest.mark.parametrize("path", [None, b"model.dnn", 3, ["a"]])
def test_save_and_load_refuse_paths_that_are_not_str(path):
    with pytest.raises(dnn.ConfigError, match="path must be a str"):
        _small().save(path)                  # before: TypeError from os.fspath or the rename
    with pytest.raises(dnn.ConfigError, match="path must be a str"):
        dnn.load(path)


# ---- 10: typed errors instead of raw ones ----------------------------------------------------------
def test_a_checkpoint_header_nested_too_deep_is_a_model_file_error(tmp_path):
    from dnn.serialization import _PREFIX, MAGIC, VERSION
    head = b"[" * 100_000 + b"]" * 100_000
    path = tmp_path / "deep.dnn"
    path.write_bytes(_PREFIX.pack(MAGIC, VERSION, len(head), zlib.crc32(head)) + head)
    with pytest.raises(dnn.ModelFileError, match="nests deeper"):
        dnn.load(str(path))                  # before: RecursionError
    assert struct.calcsize("<8sIII") == _PREFIX.size


def test_pickling_a_model_says_how_to_save_it():
    with pytest.raises(dnn.NotSupportedError, match=r"model\.save\(path\).*dnn\.load"):
        pickle.dumps(_small())               # before: AttributeError about a local object
    with pytest.raises(TypeError):
        pickle.dumps([_small()])


# ---- 11: samples, weights, labels, names -----------------------------------------------------------
def test_channels_last_images_for_an_nchw_input_are_refused():
    model = _images()
    x = np.random.default_rng(0).normal(size=(6, 4, 4, 3)).astype(np.float32)
    y = np.arange(6) % 3
    with pytest.raises(dnn.ShapeError, match=r"channels-last .*x\.transpose\(0, 3, 1, 2\)"):
        model.fit(x, y, epochs=1, batch_size=3, verbose=0)
    with pytest.raises(dnn.ShapeError, match="samples must have shape"):
        model.predict(x.reshape(6, 4, 3, 4))
    # NCHW and flat rows are the model's own orders
    nchw = x.transpose(0, 3, 1, 2).copy()
    np.testing.assert_allclose(model.predict(nchw), model.predict(nchw.reshape(6, -1)), rtol=1e-6)
    with pytest.raises(dnn.ShapeError, match="channels-last"):
        model.evaluate(dnn.data.Dataset(x, y))


def test_set_weights_is_atomic():
    model = _images()
    before = model.get_weights()
    bad = [w + 1 for w in before]
    bad[-1] = np.zeros(before[-1].size + 1, dtype=before[-1].dtype)   # the last one does not fit
    with pytest.raises(dnn.ShapeError, match="expected shape"):
        model.set_weights(bad)
    for w, b in zip(model.get_weights(), before):                   # before: the first ones overwritten
        np.testing.assert_array_equal(w, b)
    strings = [w.astype(str) for w in before]
    with pytest.raises(dnn.ConfigError, match="real numbers"):
        model.set_weights(strings)
    model.set_weights(bad[:-1] + [before[-1] + 1])
    np.testing.assert_array_equal(model.get_weights()[0], before[0] + 1)


def test_non_integer_labels_get_a_message_about_labels():
    model = _small()
    x = np.ones((4, 4), dtype=np.float32)
    with pytest.raises(dnn.ShapeError, match=r"class label, a whole number in \[0, 3\).*values 0\.5\.\.2"):
        model.fit(x, np.array([0.5, 1.0, 2.0, 1.5]), epochs=1, verbose=0)
    model.fit(x, np.array([0.0, 1.0, 2.0, 1.0]), epochs=1, verbose=0)      # whole floats are labels


def test_a_layer_without_a_name_reports_its_kind():
    d = L.Dense(3)
    assert d.name == "dense" and repr(d) == "<Dense dense>" and not d.named
    with pytest.raises(dnn.ConfigError, match=r"^dense \(Dense\) is called"):      # before: "None is not built"
        d(None, None)
    model = dnn.Sequential([L.Input(4), d, L.Dense(2, name="head"), L.Output("softmax")])
    assert [x.name for x in model.layers[1:3]] == ["dense_1", "head"]
    with pytest.raises(dnn.ConfigError, match="name must be a string"):
        L.Dense(3, name=5)


def _dense(units, **kwargs):
    import dmath
    dmath.random.seed(4)
    inp = dnn.Input(4)
    return dnn.Model(inp, L.Dense(units, **kwargs)(inp), dtype="float64", optimizer=dnn.optim.SGD(lr=0.1))


def test_labels_as_one_column_train_as_labels():
    # (N, 1) whole numbers are class labels as (N,) are (Keras' sparse labels); they were refused
    # as "not all whole"
    rng = np.random.default_rng(1)
    x, y = rng.standard_normal((6, 4)), np.array([0, 1, 2, 0, 1, 2])
    a, b = _dense(3, activation="softmax"), _dense(3, activation="softmax")
    a.fit(x, y, batch_size=3, shuffle=False, verbose=0)
    b.fit(x, y[:, None], batch_size=3, shuffle=False, verbose=0)
    for u, v in zip(a.get_weights(), b.get_weights()):
        np.testing.assert_array_equal(u, v)


def test_whole_float_targets_past_two_to_the_53_stay_values():
    # 3e19 is a whole float, but no exact integer: as int64 it wrapped and MSE read another value
    y = np.array([1e19, -1e19, 3e19, 5.0])
    inp = dnn.Input(2)
    model = dnn.Model(inp, L.Dense(1, kernel_init="zeros")(inp), loss="mse", dtype="float64")
    got = model.evaluate(np.random.default_rng(2).standard_normal((4, 2)), y)["loss"]
    assert got == pytest.approx(np.mean(y ** 2), rel=1e-12)


def test_a_dropout_seed_past_two_to_the_53_is_refused_at_construction():
    # the seed travels as a float64 scalar: it failed only at fit, after the model was built
    with pytest.raises(dnn.ConfigError, match=r"seed must be an integer in \[0, 2\*\*53\)"):
        L.Dropout(0.5, seed=2 ** 53)
    assert L.Dropout(0.5, seed=2 ** 53 - 1).seed == 2 ** 53 - 1


# ---- model files with NaN or infinite weights (a hostile-use probe of session 34) -------------------
@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_a_model_file_holding_nan_or_inf_weights_is_refused_and_changes_nothing(tmp_path, bad):
    model = _small()
    good = model.get_weights()
    broken = [w.copy() for w in good]
    broken[-1].flat[-1] = bad                  # the last weight's last value
    last = model.layers[-2].weights[-1]
    assert np.array_equal(last.numpy(), good[-1])
    # written into the matrix, as a diverged step would (set_weights refuses them, as load_state_dict)
    overwrite(last.value, broken[-1].reshape(last.value.shape))
    path = str(tmp_path / "diverged.dnn")
    model.save(path)
    with pytest.raises(dnn.ModelFileError, match="holds NaN or infinity"):
        dnn.load(path)
    other = _small()
    before = other.get_weights()
    with pytest.raises(dnn.ModelFileError, match="holds NaN or infinity"):
        other.load_weights(path)
    for w, b in zip(other.get_weights(), before):
        np.testing.assert_array_equal(w, b)


def test_use_bias_takes_booleans_only():
    for layer in (lambda v: L.Dense(3, use_bias=v), lambda v: L.Conv2D(2, 3, use_bias=v)):
        for v in ("yes", "False", 1, None):
            with pytest.raises(dnn.ConfigError, match="use_bias must be True or False"):
                layer(v)
        assert layer(False).use_bias is False


@pytest.mark.parametrize("damage,words", [
    (lambda m: m.pop("dtype"), "lacks the field 'dtype'"),
    (lambda m: m["layers"].__setitem__(1, 7), "the model described in the file is malformed"),
    (lambda m: m["layers"][1].__setitem__("use_bias", "yes"), "use_bias must be True or False"),
])
def test_a_damaged_model_description_is_refused_in_words(tmp_path, damage, words):
    from dnn import serialization
    path = str(tmp_path / "m.dnn")
    _small().save(path)
    header, arrays = serialization.read_file(path)
    damage(header["model"])
    serialization.write_file(path, header, list(arrays.items()))
    with pytest.raises(dnn.ModelFileError, match=words):
        dnn.load(path)
