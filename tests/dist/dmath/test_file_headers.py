"""from_file against headers that lie: sizes whose product wraps around in int64, negative sizes,
and shape= arguments that are not (rows, cols). Each raises a dmath error on the master; nothing
is read."""
import numpy as np
import pytest

import dmath


def _npy(path, shape, payload):
    """A .npy file whose header announces `shape` (float32, C order) over `payload` bytes."""
    with open(path, "wb") as f:
        np.lib.format.write_array_header_1_0(f, {"descr": "<f4", "fortran_order": False, "shape": shape})
        f.write(payload)
    return str(path)


@pytest.mark.parametrize("shape", [(2, 2 ** 62 + 1, 4), (2 ** 33, 2 ** 31), (4, 2 ** 64 + 2)],
                         ids=["rest-wraps", "rows-times-cols-wraps", "past-int64"])
def test_a_header_whose_size_wraps_is_refused(tmp_path, shape):
    # the int64 products of these shapes wrap to a few elements, which 32 bytes would have held
    path = _npy(tmp_path / "wrap.npy", shape, np.arange(8, dtype="<f4").tobytes())
    with pytest.raises(dmath.DMathError, match="too short|truncated"):
        dmath.from_file(path)


def test_a_negative_size_is_refused(tmp_path):
    path = _npy(tmp_path / "neg.npy", (2, -4), b"")
    with pytest.raises(dmath.DMathError, match="negative|not a readable"):
        dmath.from_file(path)


@pytest.mark.parametrize("shape", [(1, 2, 3), (6,), 6, "abc"])
def test_shape_must_be_a_pair(tmp_path, shape):
    path = str(tmp_path / "a.npy")
    np.save(path, np.arange(6, dtype=np.float32).reshape(2, 3))
    with pytest.raises(dmath.ShapeError, match=r"shape must be \(rows, cols\)"):
        dmath.from_file(path, shape=shape)
    raw = str(tmp_path / "a.bin")
    np.arange(6, dtype=np.float32).tofile(raw)
    with pytest.raises(dmath.ShapeError, match=r"shape must be \(rows, cols\)"):
        dmath.from_file(raw, shape=shape, file_dtype="float32")
    np.testing.assert_array_equal(dmath.from_file(path, shape=(3, 2)).to_numpy(),
                                  np.arange(6, dtype=np.float32).reshape(3, 2))    # still usable


def test_a_path_that_is_not_a_readable_file_is_refused_on_the_master(tmp_path):
    # a directory has a size: the workers used to find out, and their failure ended the runtime
    (tmp_path / "folder.npy").mkdir()
    with pytest.raises(dmath.DMathError, match="cannot be read|not a readable"):
        dmath.from_file(str(tmp_path / "folder.npy"))
    with pytest.raises(dmath.DMathError, match="cannot be read"):
        dmath.from_file(str(tmp_path), shape=(1, 1), file_dtype="float32")
    raw = tmp_path / "ok.bin"
    np.arange(4, dtype=np.float32).tofile(raw)
    np.testing.assert_array_equal(dmath.from_file(str(raw), shape=(2, 2), file_dtype="float32").to_numpy(),
                                  np.arange(4, dtype=np.float32).reshape(2, 2))     # still usable


@pytest.mark.parametrize("file_dtype", [
    {"names": ["a"], "formats": ["f4"], "offsets": [-5]},       # NumPy: ValueError, offset cannot be negative
    ("f4", -1),                                                 # ValueError: a negative sub-array dimension
    {"names": ["a", "b"], "formats": ["f4"]},                   # ValueError: entries of unequal lengths
    {"names": ["a"], "formats": ["f4"], "offsets": ["x"]},      # TypeError
    "f99",                                                      # TypeError: not understood
], ids=["negative-offset", "negative-dim", "unequal-lengths", "offset-str", "unknown-name"])
def test_a_file_dtype_numpy_refuses_is_a_dmath_error(tmp_path, file_dtype):
    """Whatever NumPy raises for a dtype spec it refuses (ValueError as well as TypeError), from_file
    raises DMathError on the master; nothing is read."""
    raw = tmp_path / "r.bin"
    raw.write_bytes(bytes(64))
    with pytest.raises(dmath.DMathError, match="file_dtype"):
        dmath.from_file(str(raw), shape=(2, 4), file_dtype=file_dtype)
    np.testing.assert_array_equal(dmath.from_file(str(raw), shape=(2, 4), file_dtype="float32").to_numpy(),
                                  np.zeros((2, 4), np.float32))      # still usable
