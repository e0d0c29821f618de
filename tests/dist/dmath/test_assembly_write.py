"""M[a:b, c:d] = X: writes into a window, in place, against NumPy, for every layout of M and X."""
import numpy as np
import pytest

import dmath
from dmath.layout import distribution

from _cases import case_names, layout, make, shard_state, tol, values

P = dmath.num_workers()
SHAPE = (9, 7)
NAMES = case_names(P)
DTYPES = ["float16", "float32", "float64"]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("k", range(len(NAMES)))
def test_write_matrix_every_layout(k, dtype):
    """M in every layout and dtype; X in another layout and dtype (rotating); written in place."""
    xv, yv = values(SHAPE, k), values((4, 3), 50 + k)
    x_name, x_dtype = NAMES[(k + 3) % len(NAMES)], DTYPES[(k + DTYPES.index(dtype) + 1) % 3]
    m = make(xv, layout(NAMES[k], SHAPE, P), dtype)
    x = make(yv, layout(x_name, (4, 3), P), x_dtype)
    handle, (version, pieces) = m._handle, shard_state(m)
    m[2:6, 1:4] = x
    expected = xv.astype(dtype).astype("f8")
    expected[2:6, 1:4] = yv.astype(x_dtype).astype(dtype)
    np.testing.assert_allclose(m.to_numpy(), expected, **tol(dtype, x_dtype))
    new_version, new_pieces = shard_state(m)
    assert m._handle == handle and new_version > version
    assert all(a is b for a, b in zip(pieces, new_pieces))          # the same buffers, written
    np.testing.assert_allclose(x.to_numpy(), yv.astype(x_dtype), **tol(x_dtype))     # X unchanged


@pytest.mark.parametrize("name", NAMES)
def test_write_index_forms(name):
    """NumPy's index forms: negative bounds, integer rows and columns, whole axes, empty windows,
    numpy arrays (2-D and 1-D for a row or column), scalars, a single element."""
    lay = layout(name, SHAPE, P)
    xv = values(SHAPE, 1)
    m, e = make(xv, lay, "float64"), xv.copy()
    rv, cv = values((1, 7), 2), values((9, 1), 3)
    m[-1, :] = make(rv, dmath.ColBlock())
    e[-1, :] = rv[0]
    m[:, 2] = make(cv, dmath.Replicated())
    e[:, 2] = cv[:, 0]
    m[-4:-1, -3:] = 2.5
    e[-4:-1, -3:] = 2.5
    m[1:3, 0:2] = np.array([[1, 2], [3, 4]])
    e[1:3, 0:2] = [[1, 2], [3, 4]]
    m[0, 1:6] = np.arange(5.0)
    e[0, 1:6] = np.arange(5.0)
    m[4, 4] = -7
    e[4, 4] = -7
    m[5:5, :] = 9.0                          # empty window: nothing written
    m[3:100, 6:] = 0.5                       # bounds clipped as NumPy's slices
    e[3:100, 6:] = 0.5
    m[:] = m                                 # itself, whole
    m[..., 5] = 1.25                         # an ellipsis: as many full slices as the indices leave
    e[..., 5] = 1.25
    m[2, ...] = -3.0
    e[2, ...] = -3.0
    m[1, ..., 0] = 8.0
    e[1, ..., 0] = 8.0
    np.testing.assert_allclose(m[..., 1:3].to_numpy(), e[..., 1:3], rtol=1e-12)
    assert m[3, ..., 4] == e[3, 4]
    m[...] = m + 0.0
    np.testing.assert_allclose(m.to_numpy(), e, rtol=1e-12)
    with pytest.raises(dmath.DMathError, match="one ellipsis"):
        m[..., ...] = 1.0


@pytest.mark.parametrize("dtype", DTYPES)
def test_write_blockcyclic_uneven_window(dtype):
    """A window that cuts BlockCyclic blocks, from an uneven RowBlock matrix."""
    shape = (13, 11)
    xv, yv = values(shape, 4), values((7, 6), 5)
    m = make(xv, dmath.BlockCyclic((2, 3)), dtype)
    sizes = (7,) if P == 1 else (0,) * (P - 1) + (7,)
    m[3:10, 2:8] = make(yv, dmath.RowBlock(sizes=sizes), "float64")
    e = xv.astype(dtype).astype("f8")
    e[3:10, 2:8] = yv.astype(dtype)
    np.testing.assert_allclose(m.to_numpy(), e, **tol(dtype))


def _expected_recv(target, src, offset):
    """Elements each worker must receive: window elements it stores whose X element it does not hold."""
    h, w = src.shape
    r0, c0 = offset
    out = []
    for r in range(P):
        mine = target.owner_mask(r)[r0:r0 + h, c0:c0 + w]
        held = src.owner_mask(r)
        out.append(int((mine & ~held).sum()))
    return out


@pytest.mark.parametrize("pair", [("row", "col"), ("bc23", "row"), ("b2d", "tiles"), ("col_uneven", "bc_grid"),
                                  ("row", "row")])
def test_write_moves_only_what_changes_owner(pair):
    """Each worker receives exactly the elements of X that land in its own pieces and that it does
    not hold already; a worker whose pieces miss the window receives nothing."""
    shape, win, off = (12, 10), (5, 4), (6, 3)
    m = dmath.zeros(shape, "float64", layout(pair[0], shape, P))
    x = make(values(win, 6), layout(pair[1], win, P), "float64")
    expected = _expected_recv(distribution(m.layout, shape, P), distribution(x.layout, win, P), off)
    dmath.reset_stats()
    m[off[0]:off[0] + win[0], off[1]:off[1] + win[1]] = x
    recv = [s["data_bytes_recv"] for s in dmath.stats()]
    assert recv == [8 * e for e in expected]


def test_write_partial_target():
    """Into a Partial matrix: the window's value is the written one (first member's addend, zeros
    in the others); from a Partial source over the same members, addend by addend, no traffic."""
    xv, yv = values(SHAPE, 7), values((3, 4), 8)
    m = make(xv, dmath.Partial(), "float64")
    m[1:4, 2:6] = make(yv, dmath.BlockCyclic((1, 2)), "float32")
    e = xv.copy()
    e[1:4, 2:6] = yv.astype("float32")
    np.testing.assert_allclose(m.to_numpy(), e, rtol=1e-6)
    zv = values((3, 4), 9)
    z = make(zv, dmath.Partial(), "float64")
    dmath.reset_stats()
    m[5:8, 0:4] = z
    assert sum(s["data_bytes_recv"] for s in dmath.stats()) == 0
    e[5:8, 0:4] = zv
    np.testing.assert_allclose(m.to_numpy(), e, rtol=1e-12)
    m[0, :] = 3.0
    e[0, :] = 3.0
    np.testing.assert_allclose(m.to_numpy(), e, rtol=1e-12)


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_write_partial_into_a_narrower_partial_sums_first(dtype):
    """Addends converted one by one to a narrower dtype round (1e8 + 1 in float32) or overflow (7e4 in
    float16) before they are summed: the source is summed first, then written (as remap does)."""
    if P < 2:
        return
    pieces = np.zeros((P, 2))
    pieces[0], pieces[1] = [1e8 + 1, 7e4], [-1e8, -6e4]
    s = dmath.gemm(dmath.from_numpy(np.ones((1, P)), layout=dmath.ColBlock()),
                   dmath.from_numpy(pieces, layout=dmath.RowBlock()), layout=dmath.Partial())
    t = dmath.zeros((1, 2), dtype=dtype, layout=dmath.Partial())
    t[:, :] = s
    np.testing.assert_array_equal(t.to_numpy(), [[1, 1e4]])
    np.testing.assert_array_equal(dmath.vstack([s, s], dtype=dtype).to_numpy(), [[1, 1e4], [1, 1e4]])


def test_write_from_partial_source_into_distributed():
    xv, yv = values(SHAPE, 10), values((2, 7), 11)
    m = make(xv, dmath.Block2D(), "float64")
    m[3:5, :] = make(yv, dmath.Partial(), "float64")
    e = xv.copy()
    e[3:5, :] = yv
    np.testing.assert_allclose(m.to_numpy(), e, rtol=1e-12)


@pytest.mark.parametrize("name", ["row", "bc23", "rep", "partial", "tiles"])
def test_write_recorded_plan_replays(name):
    """A write inside dmath.record() replays with the source's new values (the window and the
    scalar are part of the plan), in place into the same matrix."""
    lay = layout(name, SHAPE, P)
    xv, yv = values(SHAPE, 12), values((2, 5), 13)
    m = make(xv, lay, "float64")
    x = make(yv, dmath.ColBlock(), "float64")
    with dmath.record() as plan:
        m[6:8, 1:6] = x
        m[0, :] = 4.0
        m *= 2.0
    e = xv.copy()
    e[6:8, 1:6], e[0, :] = yv, 4.0
    np.testing.assert_allclose(m.to_numpy(), 2 * e, rtol=1e-12)
    y2 = values((2, 5), 14)
    x.assign(y2)
    plan.replay()
    e = 2 * e
    e[6:8, 1:6], e[0, :] = y2, 4.0
    np.testing.assert_allclose(m.to_numpy(), 2 * e, rtol=1e-12)


BAD = {
    "step": (lambda m: m.__setitem__((slice(0, 4, 2), slice(None)), 1.0), dmath.ShapeError),
    "shape": (lambda m: m.__setitem__((slice(0, 2), slice(0, 2)), dmath.zeros((3, 2))), dmath.ShapeError),
    "array_shape": (lambda m: m.__setitem__((slice(0, 2), slice(0, 2)), np.zeros((2, 3))), dmath.ShapeError),
    "complex": (lambda m: m.__setitem__((0, 0), np.zeros((1, 1), complex)), dmath.DTypeError),
    "bool": (lambda m: m.__setitem__((0, 0), True), dmath.DMathError),
    "string": (lambda m: m.__setitem__((0, 0), "1"), dmath.DMathError),
    "list": (lambda m: m.__setitem__((0, slice(0, 2)), [1.0, 2.0]), dmath.DMathError),
    "out_of_bounds": (lambda m: m.__setitem__((9, 0), 1.0), dmath.ShapeError),
    "float_index": (lambda m: m.__setitem__((0.5, 0), 1.0), dmath.DMathError),
    "three_indices": (lambda m: m.__setitem__((0, 0, 0), 1.0), dmath.ShapeError),
    "derived": (lambda m: m.T.__setitem__((0, 0), 1.0), dmath.NotSupportedError),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_write_errors_raise_on_the_master(case):
    fn, error = BAD[case]
    xv = values(SHAPE, 15)
    m = make(xv, dmath.RowBlock(), "float64")
    s0 = dmath.stats()
    with pytest.raises(error):
        fn(m)
    s1 = dmath.stats()
    if case not in ("shape", "derived"):           # those create a matrix first
        assert s1[0]["control_msgs"] - s0[0]["control_msgs"] == 1
    np.testing.assert_allclose(m.to_numpy(), xv, rtol=1e-12)


def test_write_zero_dimensional_array_is_a_scalar():
    m = dmath.zeros((3, 4), "float32", dmath.BlockCyclic((1, 2)))
    m[1:, 2:] = np.array(1.5)
    e = np.zeros((3, 4), "float32")
    e[1:, 2:] = 1.5
    np.testing.assert_array_equal(m.to_numpy(), e)


@pytest.mark.parametrize("dtype, exact, rounded", [("float16", 2048, 2049), ("float32", 2 ** 24, 2 ** 24 + 1),
                                                   ("float64", 2 ** 53, 2 ** 53 + 1)])
def test_an_integer_scalar_the_dtype_cannot_hold_is_refused_as_an_array_is(dtype, exact, rounded):
    """M[0:1, 0:1] = np.array([[2049]]) was refused on a float16 M while M[0, 0] = 2049 stored 2048:
    an integer scalar is checked as an integer array's values are; floats round as NumPy's."""
    m = dmath.zeros((3, 3), dtype=dtype)
    with pytest.raises(dmath.DTypeError, match=f"integer {rounded} is not exact in {dtype}"):
        m[0, 0] = rounded
    with pytest.raises(dmath.DTypeError, match=f"not exact in {dtype}"):
        m[0:1, 0:1] = np.array([[rounded]])
    with pytest.raises(dmath.DTypeError, match=f"integer {-rounded} is not exact"):
        m[1, :] = np.int64(-rounded)
    m[0, 0], m[1, 1], m[2, 2] = exact, float(rounded), np.int64(-exact)
    got = m.to_numpy()
    assert got[0, 0] == exact and got[2, 2] == -exact
    assert got[1, 1] == np.array(float(rounded)).astype(dtype)           # a float rounds
    assert (got[[0, 1, 2], [1, 2, 0]] == 0).all()


@pytest.mark.parametrize("group", [None, "last"])
def test_a_partial_matrix_keeps_the_sign_of_zero(group):
    """A Partial matrix's value is the sum of its members' addends; the members that do not hold the
    value hold -0.0 (x + -0.0 is x for every x), so -0.0 survives from_numpy, a window fill and
    to_numpy at any worker count (+0.0 addends, and a gather that started from +0.0, made it +0.0)."""
    lay = dmath.Partial() if group is None else dmath.Partial(group=(P - 1,))
    x = values((4, 5), 42)
    x[0, :] = -0.0
    x[1, 1] = 0.0
    m = dmath.from_numpy(x, layout=lay)
    got = m.to_numpy()
    np.testing.assert_array_equal(got, x)
    np.testing.assert_array_equal(np.signbit(got), np.signbit(x))
    for target in (dmath.RowBlock(), dmath.Replicated(), dmath.BlockCyclic((1, 2))):   # summed by a remap
        np.testing.assert_array_equal(np.signbit(m.remap(target).to_numpy()), np.signbit(x), err_msg=str(target))
    m[2, 2] = -0.0
    m[3, 0:2] = 0.0
    x[2, 2], x[3, 0:2] = -0.0, 0.0
    got = m.to_numpy()
    np.testing.assert_array_equal(np.signbit(got), np.signbit(x))
    np.testing.assert_array_equal(got, x)


@pytest.mark.parametrize("name", ["partial", "row", "rep"])
@pytest.mark.parametrize("dtype", ["float16", "float64"])
def test_a_negative_zero_fill_keeps_its_sign(name, dtype):
    """dmath.full(-0.0) and a whole-row fill of -0.0 give -0.0 in every layout. On GPUs CuPy fills a
    contiguous array with a zero by a memset, which wrote +0.0 (pad's -0.0 rows and a Partial matrix's
    -0.0 addends came out +0.0 on 2 H200s); and full() gave a Partial matrix's other members +0.0
    addends, so -0.0 + 0.0 read back +0.0 from 2 workers on."""
    lay = {"partial": dmath.Partial(), "row": dmath.RowBlock(), "rep": dmath.Replicated()}[name]
    m = dmath.full((5, 4), -0.0, dtype=dtype, layout=lay)
    got = m.to_numpy()
    assert got.dtype == np.dtype(dtype) and np.all(got == 0) and np.all(np.signbit(got))
    m[...] = 1.5
    m[1:3, :] = -0.0
    want = np.full((5, 4), 1.5, dtype)
    want[1:3] = -0.0
    got = m.to_numpy()
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(np.signbit(got), np.signbit(want))
