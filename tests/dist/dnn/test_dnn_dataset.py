"""dnn.data.Dataset: samples placed on the workers once, batches taken, shuffled and augmented there.

The master sends no sample bytes during an epoch (its traffic is exactly the
gradient all-reduce), every placement trains to the same weights, resumed
epochs equal uninterrupted ones, and bad data raises before anything runs.
"""
import gzip

import numpy as np
import pytest

import dmath
import dnn
from dmath.ops.buckets import offsets
from dnn import layers as L

P = dmath.num_workers()


def _blobs(n=120, features=6, seed=0):
    x, y = dnn.data.synthetic_classification(n, features, classes=3, seed=seed, noise=0.7)
    return x.astype(np.float64), y


def _model(dropout=0.25, features=6, seed=0):
    dmath.random.seed(5)
    return dnn.Sequential([L.Input(features), L.Dense(16), L.Activation("tanh"), L.Dropout(dropout),
                           L.Dense(3), L.Output("softmax")], dtype="float64", seed=seed,
                          optimizer=dnn.optim.Adam(lr=0.01, weight_decay=1e-3))


def _allreduce_bytes(n, itemsize, rank):
    """What dmath's all-reduce of n values sends from `rank` (reduce-scatter + all-gather)."""
    if P == 1:
        return 0
    mine = n // P + (1 if rank < n % P else 0)
    return itemsize * (n + (P - 2) * mine)


class _Traffic(dnn.callbacks.Callback):
    """Each worker's bytes sent during the second epoch, read after its last step."""

    def on_epoch_begin(self, epoch, logs=None):
        if epoch == 1:
            dmath.reset_stats()

    def on_batch_end(self, batch, logs=None):
        if self.model.epochs_trained == 1:          # inside the second epoch
            self.sent = [s["data_bytes_sent"] for s in dmath.stats()]


def test_an_epoch_moves_no_sample_bytes():
    """Per step each worker sends exactly its share of the gradient and loss all-reduces: no batch
    travels from the master (before, every step scattered its samples from rank 0)."""
    x, y = _blobs(n=120, features=40)
    model = _model(features=40)
    probe = _Traffic()
    ds = dnn.data.Dataset(x, y)           # held: its feed keeps the recorded step read below
    model.fit(ds, batch_size=24, epochs=2, verbose=0, callbacks=[probe])
    # the gradients' all-reduces, each bucket's one buffer (dnn.training.buckets), and the loss's
    params = [p.value.size for p in model.params]
    buckets = model._last_program().buckets
    alone = set(range(len(params))) - {k for b in buckets for k in b}
    sizes = [offsets([params[k] for k in b], 8)[1] if len(b) > 1 else params[b[0]] for b in buckets]
    sizes += [params[k] for k in sorted(alone)] + [1]
    steps = 120 // 24
    for rank in range(P):
        want = steps * sum(_allreduce_bytes(n, 8, rank) for n in sizes)
        assert probe.sent[rank] == want, (rank, probe.sent, want)


def test_placements_train_to_the_same_weights(tmp_path):
    """device, host and a mapped .npy file (the fallback when the set does not fit) are the same run."""
    x, y = _blobs()
    np.save(tmp_path / "x.npy", x)
    runs = {}
    for name, data in (("device", dnn.data.Dataset(x, y, placement="device")),
                       ("host", dnn.data.Dataset(x, y, placement="host")),
                       ("mapped", dnn.data.Dataset.from_npy(str(tmp_path / "x.npy"), y, placement="mapped"))):
        assert data.placement == name
        model = _model()
        hist = model.fit(data, batch_size=32, epochs=2, verbose=0)
        runs[name] = (model.get_weights(), hist["loss"])
    for name in ("host", "mapped"):
        for a, b in zip(runs[name][0], runs["device"][0]):
            np.testing.assert_array_equal(a, b)
        assert runs[name][1] == runs["device"][1]


def test_auto_placement_falls_back_to_the_file_under_a_memory_limit(tmp_path):
    # 4.8 MB of samples: large beside what kernels keep per signature (device index arrays, remap
    # buffers), which the limit counts and the master's ledger does not
    x, y = _blobs(n=400, features=1500)
    np.save(tmp_path / "x.npy", x)
    held = max(s["matrices"] for s in dmath.memory.stats())
    dmath.memory.set_limit(held + 3 * x.nbytes // 2)     # room for the samples once, not for twice them
    try:
        data = dnn.data.Dataset.from_npy(str(tmp_path / "x.npy"), y)
        assert data.placement == "mapped"
        model = _model(features=1500)
        hist = model.fit(data, batch_size=50, epochs=2, verbose=0)
        assert hist["loss"][1] < hist["loss"][0]
    finally:
        dmath.memory.set_limit(None)
    small = dnn.data.Dataset.from_npy(str(tmp_path / "x.npy"), y)
    assert small.placement == "device"
    reference = _model(features=1500)
    reference.fit(small, batch_size=50, epochs=2, verbose=0)
    for a, b in zip(model.get_weights(), reference.get_weights()):
        # (a GPU's GEMM may split k of the host-read and the resident batch differently: last bits)
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-15)


def test_resumed_epochs_equal_an_uninterrupted_run():
    """fit(epochs=2) == fit(epochs=1) then fit(epochs=2, initial_epoch=1): the order and the draws
    of an epoch depend on its number only (dropout and Adam state continue in place)."""
    x, y = _blobs()
    data = dnn.data.Dataset(x, y)
    once, twice = _model(), _model()
    h = once.fit(data, batch_size=25, epochs=2, verbose=0)
    twice.fit(data, batch_size=25, epochs=1, verbose=0)
    h2 = twice.fit(data, batch_size=25, epochs=2, initial_epoch=1, verbose=0)
    for a, b in zip(once.get_weights(), twice.get_weights()):
        np.testing.assert_array_equal(a, b)
    assert h2["loss"] == h["loss"][1:]
    with pytest.raises(dnn.ConfigError, match="initial_epoch"):
        once.fit(data, epochs=2, initial_epoch=2, verbose=0)


def test_validation_split_holds_out_the_last_samples():
    x, y = _blobs()
    model = _model(dropout=0.0)
    hist = model.fit(x, y, batch_size=20, epochs=1, validation_split=0.25, shuffle=False, verbose=0)
    held = model.evaluate(x[90:], y[90:])
    assert hist["val_loss"][0] == pytest.approx(held["loss"], rel=1e-12)
    assert hist["val_accuracy"][0] == pytest.approx(held["accuracy"])
    # the training part was x[:90]: the same run on those samples alone gives the same weights
    alone = _model(dropout=0.0)
    alone.fit(x[:90], y[:90], batch_size=20, epochs=1, shuffle=False, verbose=0)
    for a, b in zip(model.get_weights(), alone.get_weights()):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-14)
    with pytest.raises(dnn.ConfigError, match="not both"):
        model.fit(x, y, validation_split=0.2, validation_data=(x, y), verbose=0)
    with pytest.raises(dnn.ConfigError, match="validation_split"):
        model.fit(x, y, validation_split=1.5, verbose=0)


def test_augmented_images_train_and_evaluate_unaugmented():
    x, y = dnn.data.synthetic_classification(96, (1, 8, 8), classes=3, seed=2, noise=0.3, dtype="float64")
    data = dnn.data.Dataset(x, y, augment=dnn.data.Augment(shift=1), mean=0.1, std=2.0)
    dmath.random.seed(3)
    model = dnn.Sequential([L.Input((1, 8, 8)), L.Conv2D(4, 3, padding="same"), L.Activation("relu"),
                            L.Pool2D(2), L.Flatten(), L.Dense(3), L.Output("softmax")], dtype="float64",
                           optimizer=dnn.optim.Adam(lr=0.02))
    hist = model.fit(data, batch_size=16, epochs=3, verbose=0)
    assert hist["loss"][-1] < hist["loss"][0]
    # evaluation normalises without augmenting: the same as normalised arrays
    plain = model.evaluate(dnn.data.Dataset(x, y, mean=0.1, std=2.0))
    assert plain == pytest.approx(model.evaluate((x - 0.1) / 2.0, y), rel=1e-12)
    preds = model.predict(dnn.data.Dataset(x, mean=0.1, std=2.0))
    np.testing.assert_allclose(preds, model.predict((x - 0.1) / 2.0), rtol=1e-12)


def test_mnist_idx_files_read_by_the_workers(tmp_path):
    rng = np.random.default_rng(4)
    images = rng.integers(0, 256, (30, 28, 28)).astype(np.uint8)
    labels = rng.integers(0, 10, 30).astype(np.uint8)
    for folder, opener in (("plain", open), ("gz", gzip.open)):
        d = tmp_path / folder
        d.mkdir()
        suffix = ".gz" if folder == "gz" else ""
        for name, arr in (("t10k-images-idx3-ubyte", images), ("t10k-labels-idx1-ubyte", labels)):
            tmp = tmp_path / "tmp.idx"
            dnn.data.write_idx(str(tmp), arr)
            with opener(str(d / (name + suffix)), "wb") as f:
                f.write(tmp.read_bytes())
        data = dnn.data.Dataset.from_mnist(str(d), split="test")
        assert len(data) == 30 and data.sample_shape == (1, 28, 28) and data.y_kind == "labels"
        assert data.x.dtype == "float16"          # pixel values 0..255 are exact in float16
        dmath.random.seed(1)
        model = dnn.Sequential([L.Input((1, 28, 28)), L.Flatten(), L.Dense(10), L.Output("softmax")])
        probs = model.predict(data)
        np.testing.assert_allclose(probs, model.predict(images[:, None] / 255.0), rtol=2e-5, atol=1e-6)
    (tmp_path / "plain" / "t10k-images-idx3-ubyte").write_bytes(b"\0\0\x08\x03" + b"\0" * 20)
    with pytest.raises(dnn.data.DataError):
        dnn.data.Dataset.from_mnist(str(tmp_path / "plain"), split="test")
    # gzipped files are checked as plain ones are: 3-D uint8 images (a flat or float file was taken)
    for wrong in (images.reshape(30, 784), images.astype(np.float64), images.reshape(30, 14, 56)):
        tmp = tmp_path / "tmp.idx"
        dnn.data.write_idx(str(tmp), wrong)
        with gzip.open(str(tmp_path / "gz" / "t10k-images-idx3-ubyte.gz"), "wb") as f:
            f.write(tmp.read_bytes())
        with pytest.raises(dnn.data.DataError, match="uint8 images of 28x28"):
            dnn.data.Dataset.from_mnist(str(tmp_path / "gz"), split="test")
    # the images' size is checked too (14x56 images were taken, then refused by a 28x28 model in fit)
    dnn.data.write_idx(str(tmp_path / "plain" / "t10k-images-idx3-ubyte"), images.reshape(30, 14, 56))
    with pytest.raises(dnn.data.DataError, match="images of 28x28, the header says"):
        dnn.data.Dataset.from_mnist(str(tmp_path / "plain"), split="test")


def test_bad_data_raises_before_anything_is_sent():
    x, y = _blobs()
    bad = x.copy()
    bad[17, 2] = np.nan
    with pytest.raises(dnn.data.DataError, match="index 17"):
        dnn.data.Dataset(bad, y)
    with pytest.raises(dnn.data.DataError, match="at least one sample"):
        dnn.data.Dataset(np.zeros((0, 6)), np.zeros(0))
    with pytest.raises(dnn.ShapeError, match="targets for"):
        dnn.data.Dataset(x, y[:5])
    with pytest.raises(dnn.ConfigError, match="placement"):
        dnn.data.Dataset(x, y, placement="mapped")
    with pytest.raises(dnn.ConfigError, match="image samples"):
        dnn.data.Dataset(x, y, augment=dnn.data.Augment(flip=True))
    with pytest.raises(dnn.ConfigError, match="shift"):
        dnn.data.Augment(shift=-1)
    with pytest.raises(dnn.ConfigError, match="flip"):
        dnn.data.Augment(flip="no")          # (a string was true)
    with pytest.raises(dnn.ConfigError, match="seed"):
        dnn.Sequential([L.Input(6), L.Dense(3)], seed=2 ** 53)    # (failed inside fit, data placed)
    model = _model()
    data = dnn.data.Dataset(x, y)
    with pytest.raises(dnn.ConfigError, match="carries its own targets"):
        model.fit(data, y, verbose=0)
    with pytest.raises(dnn.ConfigError, match="targets are needed"):
        model.fit(dnn.data.Dataset(x), verbose=0)
    with pytest.raises(dnn.ShapeError, match="labels must be in"):
        model.fit(x, y + 5, verbose=0)
    with pytest.raises(dnn.ShapeError, match="labels must be in"):
        model.fit(dnn.data.Dataset(x, y - 1), verbose=0)    # (a Dataset keeps whole negative targets)
    dmath.reset_stats()
    with pytest.raises(dnn.ShapeError, match="samples must have shape"):
        model.fit(np.zeros((120, 7)), y, verbose=0)
    assert all(s["data_bytes_sent"] == 0 for s in dmath.stats())      # refused before placing anything
    assert model.fit(data, batch_size=40, epochs=1, verbose=0)["loss"]   # still usable


def test_a_npy_file_of_no_samples_is_refused(tmp_path):
    np.save(tmp_path / "empty.npy", np.zeros((0, 4), np.float32))
    with pytest.raises(dnn.data.DataError, match="no samples"):
        dnn.data.Dataset.from_npy(tmp_path / "empty.npy", np.zeros(0, np.int64))


def test_whole_number_regression_targets_with_negative_values():
    """Targets of whole numbers (+-1, negative integers) are regression values to mse: a 1-D array of
    them trains as its (N, 1) rows do (they were refused as negative class labels)."""
    x, _ = _blobs(n=48)
    for y in (np.where(x[:, 0] > 0, 1.0, -1.0), np.round(3 * x[:, 0]).astype(np.int64)):
        losses = []
        for targets in (y, y[:, None].astype(np.float64)):
            dmath.random.seed(3)
            model = dnn.Sequential([L.Input(6), L.Dense(1)], loss="mse", dtype="float64")
            losses.append(model.fit(x, targets, batch_size=12, epochs=2, verbose=0)["loss"])
        assert losses[0] == losses[1] and losses[0][1] < losses[0][0], losses


def test_npy_files_of_other_dtypes_one_dimension_and_bad_sample_shapes(tmp_path, monkeypatch):
    """uint8 and big-endian files cannot be mapped as the samples' dtype: 'mapped' says so before
    anything is sent, 'auto' falls back to host memory when the set does not fit the device. A 1-D
    file is N samples of one value, as a 1-D array is. sample_shape must be positive integers."""
    rng = np.random.default_rng(2)
    pixels = rng.integers(0, 256, (400, 12)).astype(np.uint8)
    y = rng.integers(0, 3, 400)
    np.save(tmp_path / "u8.npy", pixels)
    np.save(tmp_path / "be.npy", pixels.astype(">f4"))
    for name in ("u8.npy", "be.npy"):
        with pytest.raises(dnn.ConfigError, match="placement='host'"):
            dnn.data.Dataset.from_npy(str(tmp_path / name), y, placement="mapped")
    reference = dnn.data.Dataset(pixels.astype(np.float32), y)
    # the set "does not fit the device" (as the memory-limit test above makes it, decided here alone)
    monkeypatch.setattr(dnn.data.dataset, "_fits", lambda nbytes: False)
    auto = dnn.data.Dataset.from_npy(str(tmp_path / "u8.npy"), y)
    monkeypatch.undo()
    assert auto.placement == "host" and auto.x.dtype == "float32"
    np.testing.assert_array_equal(auto.x.to_numpy(), reference.x.to_numpy())
    big_endian = dnn.data.Dataset.from_npy(str(tmp_path / "be.npy"), y, dtype="float32", placement="host")
    np.testing.assert_array_equal(big_endian.x.to_numpy(), reference.x.to_numpy())

    v = rng.standard_normal(10)
    np.save(tmp_path / "v.npy", v)
    labels = rng.integers(0, 3, 10)
    from_file = dnn.data.Dataset.from_npy(str(tmp_path / "v.npy"), labels)
    from_array = dnn.data.Dataset(v, labels)
    assert len(from_file) == len(from_array) == 10 and from_file.sample_shape == from_array.sample_shape == (1,)
    np.testing.assert_array_equal(from_file.x.to_numpy(), from_array.x.to_numpy())

    x, yb = _blobs(n=8, features=4)
    for bad in ((2.5, 1.6), (-1, -4), (1, -2, -2), (4, 0), "ab", 4):
        with pytest.raises(dnn.ConfigError, match="sample_shape"):
            dnn.data.Dataset(x, yb, sample_shape=bad)
    with pytest.raises(dnn.ShapeError, match="sample_shape"):
        dnn.data.Dataset(x, yb, sample_shape=(3, 2))
    assert dnn.data.Dataset(x, yb, sample_shape=(np.int64(2), 2)).sample_shape == (2, 2)
    with pytest.raises(dnn.data.DataError, match="float16's range"):
        dnn.data.Dataset(np.full((3, 2), 7e4), dtype="float16")


def test_npy_values_beyond_the_samples_dtype_are_refused(tmp_path):
    """A long double file needs dtype= (the float32 default turned 1e300 into inf with only NumPy's
    warning); a finite value beyond the range of the dtype given is refused (by dmath.from_file as the
    workers read), not read as inf, and values that fit are read."""
    y = np.array([0, 1])
    np.save(tmp_path / "ld.npy", np.array([[1e300, 1.0], [2.0, 3.0]], dtype=np.longdouble))
    with pytest.raises(dnn.data.DataError, match=r"long double.*pass dtype="):
        dnn.data.Dataset.from_npy(tmp_path / "ld.npy", y)
    for name, a, dtype in (("ld.npy", None, "float32"), ("f8.npy", [[1.0, 2.0], [3.0, -1e39]], "float32"),
                           ("u16.npy", np.array([[1, 65535], [3, 4]], np.uint16), "float16")):
        if a is not None:
            np.save(tmp_path / name, a)
        with pytest.raises(dnn.data.DataError, match="beyond the range"):
            dnn.data.Dataset.from_npy(tmp_path / name, y, dtype=dtype, placement="host")
    wide = dnn.data.Dataset.from_npy(tmp_path / "ld.npy", y, dtype="float64", placement="host")
    np.testing.assert_array_equal(wide.x.to_numpy(), [[1e300, 1.0], [2.0, 3.0]])
    np.save(tmp_path / "f8.npy", np.array([[1.0, 2.0], [3.0, -1e38]]))
    narrow = dnn.data.Dataset.from_npy(tmp_path / "f8.npy", y, dtype="float32", placement="host")
    np.testing.assert_array_equal(narrow.x.to_numpy(), np.array([[1.0, 2.0], [3.0, -1e38]], np.float32))


def test_mnist_header_sizes_are_python_ints(tmp_path):
    """(4, 2**31, 2**31) bytes: an int64 product wraps to 0, which a 16-byte file of only a header matched."""
    import struct
    from dnn.data.dataset import _idx_header
    path = tmp_path / "train-images-idx3-ubyte"
    path.write_bytes(bytes([0, 0, 8, 3]) + struct.pack(">III", 4, 2 ** 31, 2 ** 31))
    with pytest.raises(dnn.data.DataError, match="16 bytes, the IDX header announces 18,446,744,073,709,551,632"):
        _idx_header(str(path), np.dtype(">u1"))


@pytest.mark.parametrize("bad", [None, 3, b"x.npy"])
def test_dataset_paths_that_are_not_paths_raise_config_errors(bad):
    with pytest.raises(dnn.ConfigError, match="must be a str or os.PathLike"):
        dnn.data.Dataset.from_npy(bad, np.zeros(2, np.int64))
    with pytest.raises(dnn.ConfigError, match="must be a str or os.PathLike"):
        dnn.data.Dataset.from_mnist(bad)


def _identity(dtype="float64"):
    """Predicts its flat (1, 3, 3) samples as they come in (after the Dataset's transform)."""
    m = dnn.Sequential([L.Input((1, 3, 3)), L.Flatten(), L.Dense(9, use_bias=False), L.Output("linear")],
                       loss="mse", optimizer=dnn.optim.SGD(lr=0.1), dtype=dtype)
    m.set_weights([np.eye(9)])
    return m


def test_dataset_settings_changed_after_a_model_used_it_take_effect():
    """A hostile-use probe: after ds.scale = 2 (or augment, mean, std) a model that had used ds kept
    predicting and training with the old values (its Feed copied them, its recorded steps baked them
    in), while a new model took the new ones. Every change now gives what a new Dataset with those
    settings gives, bit for bit."""
    x = np.arange(36, dtype=np.float64).reshape(4, 1, 3, 3) + 1
    ds = dnn.data.Dataset(x, x.reshape(4, 9))
    m = _identity()
    np.testing.assert_array_equal(m.predict(ds), x.reshape(4, 9))
    m.evaluate(ds)
    ds.scale = 2.0
    np.testing.assert_array_equal(m.predict(ds), 2 * x.reshape(4, 9))
    ds.mean, ds.std = 1.0, 4.0
    np.testing.assert_array_equal(m.predict(ds), (2 * x.reshape(4, 9) - 1) / 4)
    fresh = dnn.data.Dataset(x, x.reshape(4, 9), scale=2.0, mean=1.0, std=4.0)
    assert m.evaluate(ds) == _identity().evaluate(fresh)
    # augmentation switched on after a first fit: the next fit augments as a new model on a new
    # Dataset does at the same epoch (the draws depend on the seed and the epoch)
    ds = dnn.data.Dataset(x, np.ones((4, 1)))

    def lin():
        return dnn.Sequential([L.Input((1, 3, 3)), L.Flatten(), L.Dense(1, use_bias=False, kernel_init="zeros"),
                               L.Output("linear")], loss="mse", optimizer=dnn.optim.SGD(lr=0.01), dtype="float64")
    used = lin()
    used.fit(ds, batch_size=2, epochs=1, verbose=0)
    ds.augment = dnn.data.Augment(shift=1, flip=True)
    used.set_weights([np.zeros((9, 1))])
    used.fit(ds, batch_size=2, epochs=1, verbose=0)
    new = lin()
    new.fit(dnn.data.Dataset(x, np.ones((4, 1)), augment=dnn.data.Augment(shift=1, flip=True)), batch_size=2,
            epochs=2, initial_epoch=1, verbose=0)
    np.testing.assert_array_equal(used.get_weights()[0], new.get_weights()[0])
    redo = lin()
    redo.fit(dnn.data.Dataset(x, np.ones((4, 1))), batch_size=2, epochs=2, initial_epoch=1, verbose=0)
    assert not np.array_equal(used.get_weights()[0], redo.get_weights()[0])      # (it did augment)
    ds.augment.flip = False                                   # an Augment changed in place counts too
    used.set_weights([np.zeros((9, 1))])
    used.fit(ds, batch_size=2, epochs=1, verbose=0)
    new = lin()
    new.fit(dnn.data.Dataset(x, np.ones((4, 1)), augment=dnn.data.Augment(shift=1)), batch_size=2, epochs=3,
            initial_epoch=2, verbose=0)
    np.testing.assert_array_equal(used.get_weights()[0], new.get_weights()[0])
    # the settings are checked as the constructor checks them
    for name, value, match in (("scale", "2", "scale must be a finite number"), ("std", 0.0, "std must be positive"),
                               ("mean", (1.0, 2.0), "2 values for 1 channels"),
                               ("augment", dnn.data.Augment(shift=3), "does not fit 3x3"),
                               ("augment", 2, "must be a dnn.data.Augment")):
        with pytest.raises(dnn.ConfigError, match=match):
            setattr(ds, name, value)
    flat = dnn.data.Dataset(x.reshape(4, 9))
    with pytest.raises(dnn.ConfigError, match="image samples"):
        flat.augment = dnn.data.Augment(flip=True)


def test_dataset_values_beyond_the_models_dtype_are_refused(tmp_path):
    """A hostile-use probe: numpy samples beyond float16's range were refused for a float16 model,
    the same values in a Dataset gave NaN predictions and losses (a float32 model with float64
    samples of 1e39 likewise). A Dataset's values are checked too: those placed from arrays as they
    were placed, a file's on the device once; only the rows of the dataset (a split view) count."""
    x = np.array([[1.0, 2.0], [3.0, -4.0], [0.5, -7e4]], dtype=np.float32)
    y = np.array([0, 1, 1])

    def model(dtype):
        return dnn.Sequential([L.Input((2,)), L.Dense(2), L.Output("softmax")], loss="cross_entropy",
                              optimizer=dnn.optim.SGD(lr=0.1), dtype=dtype)
    m = model("float16")
    before = m.get_weights()
    ds = dnn.data.Dataset(x, y)
    for call in (lambda: m.predict(ds), lambda: m.evaluate(ds), lambda: m.fit(ds, verbose=0),
                 lambda: m.fit(x[:2], y[:2], validation_data=ds, verbose=0)):
        with pytest.raises(dnn.ConfigError, match=r"float16 model needs inputs within \+-65504; the largest "
                                                  r"magnitude here is 70000"):
            call()
    for a, b in zip(before, m.get_weights()):
        np.testing.assert_array_equal(a, b)
    first, last = ds.split(1 / 3)
    assert np.isfinite(m.predict(first)).all()                # its rows hold no such value
    with pytest.raises(dnn.ConfigError, match="float16 model"):
        m.predict(last)
    assert np.isfinite(model("float32").predict(ds)).all()
    big = np.array([[1e39, 1.0], [2.0, 3.0]])
    with pytest.raises(dnn.ConfigError, match=r"float32 model needs inputs within .*use dtype='float64'"):
        model("float32").predict(dnn.data.Dataset(big))
    assert np.isfinite(model("float64").predict(dnn.data.Dataset(big))).all()
    # a file the workers read into device memory: reduced there once
    np.save(tmp_path / "x.npy", x)
    on_device = dnn.data.Dataset.from_npy(tmp_path / "x.npy", y, placement="device")
    with pytest.raises(dnn.ConfigError, match="the largest magnitude here is 70000"):
        m.evaluate(on_device)
    np.save(tmp_path / "small.npy", x[:2])
    assert np.isfinite(m.predict(dnn.data.Dataset.from_npy(tmp_path / "small.npy", placement="device"))).all()


def test_big_endian_float64_targets_stay_float64():
    """A hostile-use probe: '>f8' target rows were stored as float32 (`rows.dtype == np.float64` is
    False for them), so a float64 model trained against rounded targets."""
    x, t = np.zeros((3, 1)), np.array([[1 + 2 ** -30], [np.pi], [1e-3 + 1e-12]])
    ds = dnn.data.Dataset(x, t.astype(">f8"))
    assert ds.y.dtype == "float64"
    np.testing.assert_array_equal(ds.y.to_numpy(), t)
    m = dnn.Sequential([L.Input((1,)), L.Dense(1, use_bias=False, kernel_init="zeros"), L.Output("linear")],
                       loss="mse", optimizer=dnn.optim.SGD(lr=0.1), dtype="float64")
    assert m.evaluate(x, t.astype(">f8"))["loss"] == m.evaluate(x, t)["loss"]


def test_long_double_arrays_are_refused_as_from_npy_refuses_them():
    """A hostile-use probe: long double samples and target rows given as arrays were stored as
    float32, silently (even for a float64 model), where Dataset.from_npy refuses the same values."""
    if np.finfo(np.longdouble).nmant <= np.finfo(np.float64).nmant:
        pytest.skip("long double is float64 on this platform")
    x = np.array([[1 + 2 ** -30], [3.0000001]], dtype=np.longdouble)
    m = dnn.Sequential([L.Input((1,)), L.Dense(1, use_bias=False), L.Output("linear")], loss="mse",
                       optimizer=dnn.optim.SGD(lr=0.1), dtype="float64")
    m.set_weights([np.ones((1, 1))])
    for call in (lambda: dnn.data.Dataset(x), lambda: m.predict(x), lambda: m.fit(x, np.ones((2, 1)), verbose=0)):
        with pytest.raises(dnn.data.DataError, match=r"samples are float\d+ \(long double\).*pass dtype="):
            call()
    wide = dnn.data.Dataset(x, dtype="float64")               # asked for: rounded to float64, not float32
    np.testing.assert_array_equal(m.predict(wide), x.astype(np.float64))
    t = np.array([[1 + 2 ** -30], [np.pi]], dtype=np.longdouble)
    for call in (lambda: dnn.data.Dataset(np.zeros((2, 1)), t), lambda: m.evaluate(x.astype(np.float64), t)):
        with pytest.raises(dnn.data.DataError, match=r"targets are float\d+ \(long double\).*astype\(np.float64\)"):
            call()
    labels = dnn.data.Dataset(np.zeros((2, 1)), np.array([0, 1], dtype=np.longdouble))   # whole numbers: exact
    assert labels.y_kind == "labels"


@pytest.mark.parametrize("n, fraction", [(10, 0.25), (6, 0.25), (14, 0.25), (5, 0.1), (1000, 0.0005), (10, 0.3),
                                         (7, 0.5), (3, 0.34), (100, 0.07), (2, 0.5)])
def test_split_holds_out_what_keras_validation_split_does(n, fraction):
    """A hostile-use probe: "as Keras" held out round(n * fraction) (banker's rounding: 0 of 5 at 0.1,
    where Keras holds out 1); Keras's fit keeps split_at = int(n * (1.0 - validation_split)) samples."""
    import math
    split_at = int(math.floor(n * (1.0 - fraction)))
    ds = dnn.data.Dataset(np.arange(2 * n, dtype=np.float64).reshape(n, 2), np.arange(n) % 2)
    first, last = ds.split(fraction)
    assert (len(first), len(last)) == (split_at, n - split_at)
    np.testing.assert_array_equal(_identity_rows(last), np.arange(2 * n).reshape(n, 2)[split_at:])


def _identity_rows(ds):
    m = dnn.Sequential([L.Input((2,)), L.Dense(2, use_bias=False), L.Output("linear")], loss="mse",
                       optimizer=dnn.optim.SGD(lr=0.1), dtype="float64")
    m.set_weights([np.eye(2)])
    return m.predict(ds)


def test_validation_split_refuses_an_empty_side_as_keras():
    x, y = np.arange(10.0).reshape(5, 2), np.array([0, 1, 0, 1, 1])
    for n, fraction in ((1, 0.5), (3, 0.9), (4, 1e-17)):        # split_at 0, 0 and 4 == n (1 - 1e-17 == 1.0)
        with pytest.raises(dnn.ConfigError, match="leaves no samples"):
            dnn.data.Dataset(np.zeros((n, 2)), np.zeros(n, dtype=int)).split(fraction)
    model = _model(features=2)
    hist = model.fit(x, y, batch_size=4, epochs=1, validation_split=0.1, shuffle=False, verbose=0).history
    assert hist["val_loss"][0] == model.evaluate(x[4:], y[4:])["loss"]
