"""Matrix.assign: new values written in place (same handle, same buffers, a new version)."""
import numpy as np
import pytest

import dmath

from _cases import case_names, layout, make, shard_state, tol, values

P = dmath.num_workers()
SHAPE = (9, 7)
NAMES = case_names(P)
DTYPES = ["float16", "float32", "float64"]


def _check_in_place(m, before, handle):
    version, pieces = shard_state(m)
    assert m._handle == handle
    assert version > before[0]
    assert len(pieces) == len(before[1]) and all(a is b for a, b in zip(pieces, before[1]))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", NAMES)
def test_assign_numpy(name, dtype):
    lay = layout(name, SHAPE, P)
    m = dmath.full(SHAPE, 7.0, dtype, lay)
    before, handle = shard_state(m), m._handle
    xv = values(SHAPE, 1)
    assert m.assign(xv) is m
    _check_in_place(m, before, handle)
    np.testing.assert_allclose(m.to_numpy(), xv.astype(dtype), **tol(dtype))
    # a later operation sees the new values
    np.testing.assert_allclose(m.sum(), xv.astype(dtype).astype("f8").sum(), rtol=1e-2 if dtype == "float16" else 1e-5)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("k", range(len(NAMES)))
def test_assign_matrix(k, dtype):
    """Every target layout and dtype, from a source in another layout and dtype (rotating)."""
    dst_lay = layout(NAMES[k], SHAPE, P)
    src_name = NAMES[(k + 5) % len(NAMES)]
    src_dtype = DTYPES[(k + DTYPES.index(dtype) + 1) % 3]
    xv = values(SHAPE, 2 + k)
    src = make(xv, layout(src_name, SHAPE, P), src_dtype)
    m = dmath.zeros(SHAPE, dtype, dst_lay)
    before, handle = shard_state(m), m._handle
    assert m.assign(src) is m
    _check_in_place(m, before, handle)
    assert m.dtype == dtype and m.layout == dst_lay.resolved(P)
    np.testing.assert_allclose(m.to_numpy(), xv.astype(src_dtype).astype(dtype), **tol(dtype, src_dtype))
    np.testing.assert_allclose(src.to_numpy(), xv.astype(src_dtype), **tol(src_dtype))  # the source is unchanged


@pytest.mark.parametrize("name", ["partial", "rep", "tiles", "bc23"])
def test_assign_same_layout_and_from_itself(name):
    lay = layout(name, SHAPE, P)
    xv, yv = values(SHAPE, 30), values(SHAPE, 31)
    a, b = make(xv, lay, "float64"), make(yv, lay, "float64")
    a.assign(b)
    np.testing.assert_allclose(a.to_numpy(), yv, rtol=1e-12)
    a *= 2.0                       # the buffers are a's own, not b's
    np.testing.assert_allclose(b.to_numpy(), yv, rtol=1e-12)
    a.assign(a)
    np.testing.assert_allclose(a.to_numpy(), 2 * yv, rtol=1e-12)


def test_assign_converts_integer_arrays_and_does_not_alias():
    m = dmath.zeros((4, 3), "float32", dmath.RowBlock())
    src = np.arange(12, dtype=np.int64).reshape(4, 3)
    m.assign(src)
    src[:] = -1
    np.testing.assert_array_equal(m.to_numpy(), np.arange(12, dtype="f4").reshape(4, 3))


BAD = {
    "shape_numpy": (lambda m: m.assign(np.zeros((4, 4))), dmath.ShapeError),
    "shape_1d": (lambda m: m.assign(np.zeros(12)), dmath.ShapeError),
    "shape_matrix": (lambda m: m.assign(dmath.zeros((3, 4))), dmath.ShapeError),
    "list": (lambda m: m.assign([[0.0] * 3] * 4), dmath.DMathError),
    "scalar": (lambda m: m.assign(1.0), dmath.DMathError),
    "complex": (lambda m: m.assign(np.zeros((4, 3), complex)), dmath.DTypeError),
    "bool": (lambda m: m.assign(np.zeros((4, 3), bool)), dmath.DTypeError),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_assign_errors_raise_on_the_master(case):
    fn, error = BAD[case]
    xv = values((4, 3), 40)
    m = make(xv, dmath.ColBlock(), "float64")
    dmath.stats()
    s0 = dmath.stats()
    with pytest.raises(error):
        fn(m)
    s1 = dmath.stats()
    if case != "shape_matrix":           # that one creates its source first
        assert s1[0]["control_msgs"] - s0[0]["control_msgs"] == 1
    np.testing.assert_allclose(m.to_numpy(), xv, rtol=1e-12)
    np.testing.assert_allclose((m + 1.0).to_numpy(), xv + 1.0, rtol=1e-12)
