"""Regression tests of a hostile-use probe of dnn.data (probe 35c): each test names what was wrong."""
import numpy as np
import pytest

import dmath
import dnn
from dnn.data import DataError


def test_csv_byte_order_mark_is_not_part_of_the_first_field(tmp_path):
    """A UTF-8 BOM (as spreadsheet programs write) made a first data row 'mixed' (DataError) and the
    first header name unfindable by label_column."""
    p = tmp_path / "bom.csv"
    p.write_bytes("\ufeffa,b,c\n4,5,6\n".encode("utf-8"))
    x, y = dnn.data.read_csv(str(p), label_column="a")
    assert y.tolist() == [4] and x.tolist() == [[5.0, 6.0]]
    p.write_bytes("\ufeff1,2\n3,4\n".encode("utf-8"))
    x, _ = dnn.data.read_csv(str(p))
    assert x.tolist() == [[1.0, 2.0], [3.0, 4.0]]


def test_csv_names_the_token_that_overflows_and_underscored_digits(tmp_path):
    p = tmp_path / "big.csv"
    p.write_text("1e400,2\n3,4\n")
    with pytest.raises(DataError, match=r"line 1, column 0: non-finite value '1e400' \(beyond float64"):
        dnn.data.read_csv(str(p), dtype="float64")
    p.write_text("1,2\n3_000,4\n")        # Python's float() takes it, NumPy's reader does not
    with pytest.raises(DataError, match=r"line 2, column 0: '3_000' is not a number"):
        dnn.data.read_csv(str(p))


def test_labels_beyond_2_53_are_refused_not_wrapped():
    """uint64 labels past 2**63 became negative int64 labels without a word (2**64 - 1 -> -1)."""
    x = np.zeros((2, 3))
    with pytest.raises(DataError, match="beyond 2\\*\\*53"):
        dnn.data.Dataset(x, np.array([2 ** 64 - 1, 1], dtype=np.uint64))
    with pytest.raises(DataError, match="beyond 2\\*\\*53"):
        dnn.data.Dataset(x, np.array([2 ** 60 + 1, 1], dtype=np.int64))
    ds = dnn.data.Dataset(x, np.array([2 ** 53, 1], dtype=np.uint64))
    assert ds.label_range == (1, 2 ** 53)


def test_bool_samples_are_zeros_and_ones():
    """Binary features were refused as 'not real numbers' (torch and Keras read them as 0 and 1)."""
    x = np.array([[True, False], [False, True], [True, True]])
    ds = dnn.data.Dataset(x, np.array([0, 1, 1]))
    assert ds.x.to_numpy().tolist() == x.astype(float).tolist()


def complex_result(x, streams, xp):
    """A batch_transform returning complex values (its imaginary part was dropped with only NumPy's
    ComplexWarning)."""
    return x.astype(xp.complex128) * 1j


def _source(tmp_path, transform=None):
    import json
    from PIL import Image
    from dnn.data import decode
    for name in ("a/1.png", "b/1.png"):
        (tmp_path / name).parent.mkdir(exist_ok=True)
        Image.fromarray(np.full((5, 5, 3), 7, np.uint8)).save(tmp_path / name)
    d = {"root": str(tmp_path), "files": ["a/1.png", "b/1.png"], "labels": [0, 1], "image_size": [4, 4],
         "resize_size": 5, "crop_scale": [0.08, 1.0], "crop_ratio": [0.75, 1.33], "flip": True, "on_error": "skip",
         "batch_transform": transform, "decoder": "auto"}
    return decode.FolderSource(json.dumps(d).encode())


def test_batch_transform_returning_complex_values_is_refused(tmp_path):
    src = _source(tmp_path, f"{__name__}:complex_result")
    x = np.ones((2, 3, 4, 4))
    with pytest.raises(DataError, match="dtype complex128; it must return real numbers"):
        src.finish(x, np.arange(2), np)
    assert (x == 1).all()


def test_a_class_with_no_readable_file_is_named_with_its_files(tmp_path):
    """'no file of class 0 can be decoded (1 tried)' named neither the files nor why."""
    src = _source(tmp_path)
    (tmp_path / "a/1.png").unlink()
    with pytest.warns(RuntimeWarning), pytest.raises(DataError, match=r"class 0 .*'a/1.png'.*FileNotFoundError"):
        src._decoded(0)


@pytest.mark.parametrize("x, dtype", [(np.full((2, 2), 1e6), "float16"), (np.full((2, 2), 300), "int8"),
                                      (np.full((2, 2), np.nan), "int32"), (np.full((2, 2), 1e300), "float32")])
def test_data_loader_refuses_conversions_that_change_values(x, dtype):
    """DataLoader(dtype=) turned 1e6 into inf as float16 and wrapped 300 to 44 as int8 (NumPy's warning only)."""
    for prefetch in (0, 2):
        with pytest.raises(DataError, match="would change them silently"):
            list(dnn.data.DataLoader(x, batch_size=2, dtype=dtype, prefetch=prefetch))
    ok = list(dnn.data.DataLoader(np.full((2, 2), 3.0), batch_size=2, dtype=dtype))
    assert ok[0][0].dtype == np.dtype(dtype) and (ok[0][0] == 3).all()
