"""read_csv never converts silently: overflowing labels and values, and a typo in the first row, are refused."""
import numpy as np
import pytest

from dnn.data import DataError
from dnn.data.csv_reader import parse_csv, read_csv


@pytest.mark.parametrize("label", ["1e20", "9223372036854775808", "-1", "2.5", "9007199254740994"])
def test_labels_that_are_not_class_indices_are_refused(label):
    text = f"0.5,1.5,3\n0.1,0.2,{label}\n"
    with pytest.raises(DataError, match=r"line 2: label .* not a non-negative integer up to 2\*\*53"):
        parse_csv(text, label_column=-1)


def test_labels_up_to_2_53_are_read_exactly():
    x, y = parse_csv("1,2,9007199254740992\n3,4,7\n", label_column=2)
    assert y.dtype == np.int64 and y.tolist() == [2 ** 53, 7]
    np.testing.assert_array_equal(x, [[1, 2], [3, 4]])


@pytest.mark.parametrize("first", ["1,2x,3", "1,,3", "a,2,3"])
def test_auto_header_refuses_a_first_row_mixing_numbers_and_text(tmp_path, first):
    path = tmp_path / "d.csv"
    path.write_text(f"{first}\n4,5,6\n7,8,9\n")
    with pytest.raises(DataError, match="line 1 mixes numbers and text"):
        read_csv(path)
    x, _ = read_csv(path, header=True)        # said explicitly, it is a header
    assert x.shape == (2, 3)


def test_auto_header_still_finds_headers_and_data():
    x, y = parse_csv("f1,f2,label\n1,2,0\n3,4,1\n", label_column="label")
    assert x.shape == (2, 2) and y.tolist() == [0, 1]
    x, _ = parse_csv("1,2,0\n3,4,1\n")
    assert x.shape == (2, 3)


def test_values_beyond_the_dtype_are_refused():
    with pytest.raises(DataError, match=r"line 2, column 1: 70000 exceeds float16's range"):
        parse_csv("1,2\n3,70000\n", dtype="float16")
    x, _ = parse_csv("1,2\n3,70000\n", dtype="float32")
    assert x[1, 1] == 70000
