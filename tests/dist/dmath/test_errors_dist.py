"""User errors raise on the master, before anything is sent, and leave the runtime usable."""
import numpy as np
import pytest

import dmath

from _cases import layout, make, values

P = dmath.num_workers()
X = values((7, 5), 60)
Y = values((5, 7), 61)


@pytest.fixture()
def mats():
    return make(X, dmath.RowBlock(), "float64"), make(Y, dmath.ColBlock(), "float64")


def _still_works(a):
    """The next operations run normally and give NumPy's values."""
    np.testing.assert_allclose((a * 2.0 + a).to_numpy(), 3 * X)
    np.testing.assert_allclose(a.remap(dmath.Block2D()).sum(axis=0).to_numpy(), X.sum(axis=0, keepdims=True))


SHAPE_ERRORS = {
    "add_mismatch": lambda a, b: a + b,
    "maximum_mismatch": lambda a, b: dmath.maximum(a, b),
    "where_mismatch": lambda a, b: dmath.where(a, a, b),
    "inplace_mismatch": lambda a, b: a.__iadd__(b),
    "inplace_broadcast_target": lambda a, b: dmath.ones((1, 5)).__iadd__(a),
    "get_out_of_bounds": lambda a, b: a.get((7, 0)),
    "get_negative_oob": lambda a, b: a.get((0, -6)),
    "get_bad_index": lambda a, b: a.get((1,)),
    "set_out_of_bounds": lambda a, b: a.set((0, 5), 1.0),
    "item_out_of_bounds": lambda a, b: a[9, 0],
    "slice_step": lambda a, b: a[::2, :],
    "three_indices": lambda a, b: a[0, 0, 0],
    "from_numpy_3d": lambda a, b: dmath.from_numpy(np.zeros((2, 2, 2))),
    "reduce_bad_axis": lambda a, b: a.sum(axis=2),
}


@pytest.mark.parametrize("case", SHAPE_ERRORS)
def test_shape_errors(mats, case):
    a, b = mats
    with pytest.raises(dmath.ShapeError):
        SHAPE_ERRORS[case](a, b)
    _still_works(a)
    np.testing.assert_array_equal(b.to_numpy(), Y)


def _bad_layouts():
    return {
        "sizes_sum": lambda: dmath.RowBlock(sizes=(1,) * P + (0,) if P > 1 else (3,)),
        "sizes_count": lambda: dmath.ColBlock(sizes=(5,) + (0,) * P),
        "sizes_negative": lambda: dmath.RowBlock(sizes=(8, -1) + (0,) * (P - 2) if P > 1 else (-1,)),
        "group_out_of_range": lambda: dmath.RowBlock(group=[P]),
        "group_repeated": lambda: dmath.Replicated(group=[0, 0]),
        "group_empty": lambda: dmath.Partial(group=[]),
        "group_negative": lambda: dmath.ColBlock(group=[-1]),
        "group_sizes_mismatch": lambda: dmath.RowBlock(group=[0], sizes=(3, 4)),
        "grid_mismatch": lambda: dmath.Block2D(grid=(P + 1, 1)),
        "grid_zero": lambda: dmath.Block2D(grid=(0, P)),
        "bc_grid_mismatch": lambda: dmath.BlockCyclic((2, 2), grid=(2, P)),
        "bc_block_zero": lambda: dmath.BlockCyclic((0, 4)),
        "tiles_wrong_extent": lambda: dmath.Tiles((0, 3, 6), (0, 5), [[0], [0]]),
        "tiles_owner_out_of_range": lambda: dmath.Tiles((0, 7), (0, 5), [[P]]),
        "tiles_owner_grid": lambda: dmath.Tiles((0, 3, 7), (0, 5), [[0]]),
        "tiles_decreasing": lambda: dmath.Tiles((0, 5, 3, 7), (0, 5), [[0], [0], [0]]),
        "not_a_layout": lambda: "RowBlock",
    }


@pytest.mark.parametrize("case", sorted(_bad_layouts()))
def test_layout_errors(mats, case):
    a, _ = mats
    x = values((7, 5), 62)
    with pytest.raises(dmath.LayoutError):
        lay = _bad_layouts()[case]()     # may raise here (construction) ...
        dmath.from_numpy(x, lay)         # ... or when it meets a shape and P
    with pytest.raises(dmath.LayoutError):
        a.remap(_bad_layouts()[case]())
    with pytest.raises(dmath.LayoutError):
        dmath.zeros((7, 5), layout=_bad_layouts()[case]())
    _still_works(a)


def test_inplace_nonlinear_on_partial_is_a_layout_error():
    p = make(X, dmath.Partial(), "float64")
    with pytest.raises(dmath.LayoutError):
        p *= p
    np.testing.assert_allclose(p.to_numpy(), X)
    _still_works(make(X, layout("b2d", X.shape, P), "float64"))


DTYPE_ERRORS = {
    "zeros_int": lambda a: dmath.zeros((2, 2), dtype="int32"),
    "ones_complex": lambda a: dmath.ones((2, 2), dtype=np.complex64),
    "random_bad": lambda a: dmath.random.rand((2, 2), dtype="float128"),
    "from_numpy_int8": lambda a: dmath.from_numpy(np.zeros((2, 2)), dtype="int8"),
    "from_numpy_unknown": lambda a: dmath.from_numpy(np.zeros((2, 2)), dtype="float33"),
    "astype_int": lambda a: a.astype("int64"),
    "remap_bool": lambda a: a.remap(dmath.ColBlock(), dtype=bool),
}


@pytest.mark.parametrize("case", DTYPE_ERRORS)
def test_dtype_errors(mats, case):
    a, _ = mats
    with pytest.raises(dmath.DTypeError):
        DTYPE_ERRORS[case](a)
    _still_works(a)


def test_error_hierarchy():
    assert issubclass(dmath.ShapeError, (dmath.DMathError, ValueError))
    assert issubclass(dmath.LayoutError, (dmath.DMathError, ValueError))
    assert issubclass(dmath.DTypeError, dmath.DMathError)
    assert issubclass(dmath.WorkerError, (dmath.DMathError, RuntimeError))
    e = dmath.WorkerError(2, "Traceback ...\nValueError: boom\n")
    assert e.rank == 2 and "boom" in str(e) and e.traceback.endswith("boom\n")


def test_other_user_errors(mats):
    a, _ = mats
    with pytest.raises(dmath.DMathError):
        a + np.ones((7, 5))          # numpy arrays must be made matrices first
    with pytest.raises(dmath.DMathError):
        a * "2"
    with pytest.raises(dmath.DMathError):
        a.set((0, 0), None)
    with pytest.raises(dmath.DMathError):
        dmath.from_numpy(np.array([["a", "b"]]))
    _still_works(a)


def test_many_errors_in_a_row_then_work(mats):
    a, b = mats
    for _ in range(20):
        with pytest.raises(dmath.ShapeError):
            a - b
        with pytest.raises(dmath.LayoutError):
            a.remap(dmath.RowBlock(group=[P + 3]))
    _still_works(a)


# ---- 7. typed dmath errors, raised before anything is sent -------------------------------------
def test_bare_python_errors_are_dmath_errors():
    M = dmath.from_numpy(np.arange(12.0).reshape(3, 4))
    with pytest.raises(dmath.DMathError, match="float64's range"):
        dmath.full((2, 2), 10 ** 400)
    with pytest.raises(dmath.ShapeError, match="rectangular"):
        dmath.from_numpy([[1, 2], [3]])
    for key in [slice("a", "b"), slice(0.5, 2), slice(0, 2, 1.0), (slice(None), slice(True, 2))]:
        with pytest.raises(dmath.DMathError, match="slice .* must be an integer"):
            M[key]
    with pytest.raises(dmath.ShapeError, match="step must be 1"):
        M[::0]
    for axis in [1.0, True, np.float64(0), "1", 2, -1]:
        with pytest.raises(dmath.ShapeError, match="axis must be None, 0 or 1"):
            M.sum(axis=axis)
    with pytest.raises(dmath.LayoutError, match="owners must be a grid of worker ranks"):
        dmath.Tiles((0, 3), (0, 4), ((0.5,),))
    # what still works
    np.testing.assert_array_equal(M[0:2:1, np.int64(1):].to_numpy(), np.arange(12.0).reshape(3, 4)[0:2, 1:])
    np.testing.assert_array_equal(M.sum(axis=np.int64(1)).to_numpy(), np.arange(12.0).reshape(3, 4).sum(1, keepdims=True))
