"""dmath.nn.one_hot and argmax_rows in every layout."""
import numpy as np
import pytest

import dmath
import _nn_ref as ref
from _cases import case_names, layout, make, values

P = dmath.num_workers()
N, CLASSES = 11, 4


@pytest.mark.parametrize("name", case_names(P))
def test_one_hot_in_every_layout(name):
    y = np.random.default_rng(1).integers(0, CLASSES, N)
    lay = layout(name, (N, CLASSES), P)
    m = dmath.nn.one_hot(y, CLASSES, "float32", lay)
    assert m.shape == (N, CLASSES) and m.dtype == "float32"
    assert m.layout == lay.resolved(P)
    np.testing.assert_array_equal(m.to_numpy(), np.eye(CLASSES, dtype=np.float32)[y])


@pytest.mark.parametrize("name", list(ref.batch_layouts(P)))
def test_argmax_rows(name):
    x = values((N, CLASSES), 2)
    got = dmath.nn.argmax_rows(make(x, ref.batch_layouts(P)[name](N), "float64"))
    assert got.dtype == np.int64
    np.testing.assert_array_equal(got, x.argmax(axis=1))


def test_argmax_rows_of_other_layouts_and_ties():
    x = np.array([[1.0, 3.0, 3.0], [2.0, 2.0, 2.0], [0.0, -1.0, 5.0]])
    for lay in (dmath.Block2D(), dmath.Partial(), dmath.BlockCyclic((1, 1))):
        np.testing.assert_array_equal(dmath.nn.argmax_rows(make(x, lay, "float32")), [1, 0, 2])


def test_one_hot_round_trips_through_argmax():
    y = np.arange(N) % CLASSES
    np.testing.assert_array_equal(dmath.nn.argmax_rows(dmath.nn.one_hot(y, CLASSES, "float16")), y)


@pytest.mark.parametrize("bad", [
    (np.array([0, 4]), 4),            # out of range
    (np.array([-1, 0]), 4),
    (np.array([0.0, 1.0]), 4),        # not integers
    (np.array([[0, 1]]), 4),          # not 1-D
    (np.array([0, 1]), 0),            # no classes
])
def test_one_hot_errors(bad):
    labels, classes = bad
    with pytest.raises(dmath.DMathError):
        dmath.nn.one_hot(labels, classes)
    with pytest.raises(dmath.DTypeError):
        dmath.nn.one_hot([0, 1], 2, dtype="int32")
    with pytest.raises(dmath.ShapeError):
        dmath.nn.argmax_rows(dmath.zeros((3, 0)))
    np.testing.assert_array_equal(dmath.nn.one_hot([1, 0], 2).to_numpy(), [[0, 1], [1, 0]])
