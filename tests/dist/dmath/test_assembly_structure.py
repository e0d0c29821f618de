"""triu, tril, trace, diag and take_rows against NumPy on every layout; take_rows' traffic."""
import numpy as np
import pytest

import dmath
from dmath.layout import distribution

from _cases import case_names, layout, make, tol, values

P = dmath.num_workers()
NAMES = case_names(P)
DTYPES = ["float16", "float32", "float64"]
SHAPE = (9, 7)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", NAMES)
def test_triangles(name, dtype):
    xv = values(SHAPE, 1)
    xv[2, 5], xv[6, 1] = np.inf, np.nan          # zeroed like NumPy's, not multiplied by 0
    m = make(xv, layout(name, SHAPE, P), dtype) if name not in ("partial", "partial_g") else \
        make(np.nan_to_num(xv, nan=0.5, posinf=2.0), layout(name, SHAPE, P), dtype)
    x = m.to_numpy()
    for k in (-3, -1, 0, 2, 8):
        u, lo = dmath.triu(m, k), dmath.tril(m, k)
        assert u.layout == m.layout and u.dtype == dtype
        np.testing.assert_array_equal(u.to_numpy(), np.triu(x, k))
        np.testing.assert_array_equal(lo.to_numpy(), np.tril(x, k))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", NAMES)
def test_trace_and_diagonal(name, dtype):
    for shape in (SHAPE, SHAPE[::-1]):
        xv = values(shape, 2)
        m = make(xv, layout(name, shape, P), dtype)
        x = xv.astype(dtype).astype("f8")
        np.testing.assert_allclose(dmath.trace(m), np.trace(x), rtol=1e-2 if dtype == "float16" else 1e-6)
        for k in (-9, -4, 0, 3, 6, 7):
            d = dmath.diag(m, k)
            assert d.shape == (len(np.diag(x, k)), 1) and d.dtype == dtype
            np.testing.assert_allclose(d.to_numpy()[:, 0], np.diag(x, k), **tol(dtype))
            np.testing.assert_allclose(dmath.trace(m, k), np.trace(x, k), rtol=1e-2 if dtype == "float16" else 1e-6,
                                       atol=1e-2 if dtype == "float16" else 1e-12)


@pytest.mark.parametrize("name", NAMES)
def test_diag_of_vectors(name):
    v = values((1, 6), 3)
    for vec in (v, v.T):
        m = make(vec, layout(name, vec.shape, P), "float32")
        for k in (-2, 0, 1):
            out = dmath.diag(m, k)
            np.testing.assert_allclose(out.to_numpy(), np.diag(v[0].astype("float32"), k), **tol("float32"))
    one = make(np.array([[4.0]]), layout(name, (1, 1), P), "float64")
    np.testing.assert_array_equal(dmath.diag(one).to_numpy(), [[4.0]])


def test_diag_layouts():
    xv = values((6, 6), 4)
    m = make(xv, dmath.BlockCyclic((2, 2)), "float64")
    assert dmath.diag(m).layout == dmath.RowBlock().resolved(P)
    r = make(xv, dmath.Replicated(), "float64")
    assert dmath.diag(r).layout == dmath.Replicated().resolved(P)
    d = dmath.diag(m, layout=dmath.Replicated())
    np.testing.assert_array_equal(d.to_numpy()[:, 0], np.diag(xv))
    big = dmath.diag(d, layout=dmath.BlockCyclic((2, 3)))
    assert big.layout == dmath.BlockCyclic((2, 3)).resolved(P)
    np.testing.assert_array_equal(big.to_numpy(), np.diag(np.diag(xv)))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("k", range(len(NAMES)))
def test_take_rows_every_layout(k, dtype):
    """A permutation with repeats and negative indices, from every layout into another (rotating)."""
    xv = values(SHAPE, 5 + k)
    m = make(xv, layout(NAMES[k], SHAPE, P), dtype)
    rows = np.concatenate([np.random.default_rng(k).permutation(SHAPE[0]), [-1, 0, 3, 3]])
    out = dmath.take_rows(m, rows)
    assert out.shape == (len(rows), SHAPE[1]) and out.dtype == dtype
    x = xv.astype(dtype)
    np.testing.assert_allclose(out.to_numpy(), x[rows], **tol(dtype))
    target = layout(NAMES[(k + 4) % len(NAMES)], (len(rows), SHAPE[1]), P)
    if not target.partial:
        out = dmath.take_rows(m, list(rows), layout=target)
        np.testing.assert_allclose(out.to_numpy(), x[rows], **tol(dtype))
    np.testing.assert_array_equal(dmath.take_rows(m, []).to_numpy(), x[:0])


@pytest.mark.parametrize("name", ["row", "bc23", "b2d", "col"])
def test_take_rows_moves_only_rows_that_change_owner(name):
    """A row permutation in place of the layout: each worker receives exactly the elements of its
    result pieces that it does not hold in the source (never the whole source)."""
    shape = (4 * P + 3, 6)
    xv = values(shape, 9)
    lay = layout(name, shape, P)
    m = make(xv, lay, "float64")
    perm = np.random.default_rng(1).permutation(shape[0])
    dist = distribution(m.layout, shape, P)
    dmath.reset_stats()
    out = dmath.take_rows(m, perm)
    st = dmath.stats()
    for r in range(P):
        mine = dist.owner_mask(r)
        expected = int((mine & ~mine[perm]).sum())
        assert st[r]["data_bytes_recv"] == 8 * expected
    np.testing.assert_array_equal(out.to_numpy(), xv[perm])


def test_take_rows_in_recorded_plan():
    xv = values(SHAPE, 11)
    m = make(xv, dmath.BlockCyclic((2, 2)), "float64")
    perm = np.arange(SHAPE[0])[::-1]
    with dmath.record() as plan:
        out = dmath.take_rows(m, perm) * 2.0
    yv = values(SHAPE, 12)
    m.assign(yv)
    plan.replay()
    np.testing.assert_allclose(out.to_numpy(), 2 * yv[perm], rtol=1e-12)


BAD = {
    "triu_k": (lambda m: dmath.triu(m, 0.5), dmath.DMathError),
    "tril_matrix": (lambda m: dmath.tril(np.zeros((2, 2))), dmath.DMathError),
    "trace_offset": (lambda m: dmath.trace(m, "1"), dmath.DMathError),
    "diag_k": (lambda m: dmath.diag(m, None), dmath.DMathError),
    "diag_layout": (lambda m: dmath.diag(m, layout="row"), dmath.LayoutError),
    "take_2d": (lambda m: dmath.take_rows(m, [[0, 1]]), dmath.ShapeError),
    "take_float": (lambda m: dmath.take_rows(m, [0.5]), dmath.ShapeError),
    "take_bounds": (lambda m: dmath.take_rows(m, [0, 9]), dmath.ShapeError),
    "take_negative_bounds": (lambda m: dmath.take_rows(m, [-10]), dmath.ShapeError),
    "take_partial": (lambda m: dmath.take_rows(m, [0], layout=dmath.Partial()), dmath.LayoutError),
    "take_matrix": (lambda m: dmath.take_rows(m.to_numpy(), [0]), dmath.DMathError),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_structure_errors_raise_on_the_master(case):
    fn, error = BAD[case]
    xv = values(SHAPE, 13)
    m = make(xv, dmath.RowBlock(), "float64")
    s0 = dmath.stats()
    with pytest.raises(error):
        fn(m)
    if case != "take_matrix":
        assert dmath.stats()[0]["control_msgs"] - s0[0]["control_msgs"] == 1
    np.testing.assert_array_equal(m.to_numpy(), xv)


def test_trace_offset_of_a_single_row_is_a_matrix_trace():
    """trace treats every matrix as a matrix (diag alone reads one row or column as a vector)."""
    xv = values((1, 5), 14)
    m = make(xv, dmath.ColBlock(), "float64")
    for k in (-1, 0, 2, 7):
        np.testing.assert_allclose(dmath.trace(m, k), np.trace(xv, k), rtol=1e-12)
