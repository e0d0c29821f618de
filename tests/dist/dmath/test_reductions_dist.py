"""sum / mean / max / min over everything and along each axis, and norm, in every layout."""
import gc

import numpy as np
import pytest

import dmath
from dmath.runtime.registry import collectives_in_graphs

from _cases import case_names, layout, make, tol, values
from _harness import Failures

P = dmath.num_workers()
NAMES = case_names(P)

OPS = {"sum": np.sum, "mean": np.mean, "max": np.max, "min": np.min}


def _check_reductions(m, x, dtype):
    # float16 data accumulates in float32 (and the scalar results are float64)
    t = tol("float32") if dtype == "float16" else tol(dtype)
    acc = x.astype(dtype).astype(np.float64)
    failures = Failures()
    for op, g in OPS.items():
        with failures.case(op):
            v = getattr(m, op)()
            assert isinstance(v, float), type(v)
            rt = dict(rtol=1e-3, atol=1e-2) if dtype == "float16" and op in ("sum", "mean") else t
            np.testing.assert_allclose(v, g(acc), **rt)
            for axis in (0, 1):
                r = getattr(m, op)(axis=axis)
                want = g(acc, axis=axis, keepdims=True)
                assert isinstance(r, dmath.Matrix)
                assert r.shape == want.shape and r.dtype == dtype, (r.shape, r.dtype)
                np.testing.assert_allclose(r.to_numpy().astype(np.float64), want.astype(dtype),
                                           **tol(dtype), err_msg=f"{op} axis={axis}")
    with failures.case("norm"):
        np.testing.assert_allclose(m.norm(), np.linalg.norm(acc), **t)
    failures.check()


@pytest.mark.parametrize("shape", [(7, 5), (2, 9)], ids=["7x5", "2x9"])
@pytest.mark.parametrize("name", NAMES)
def test_reductions(name, shape):
    x = values(shape, 30, -2.0, 2.0)
    m = make(x, layout(name, shape, P), "float64")
    _check_reductions(m, x, "float64")


@pytest.mark.parametrize("dtype", ["float16", "float32"])
@pytest.mark.parametrize("name", ["row", "b2d", "bc23", "partial", "tiles"])
def test_reductions_low_precision(name, dtype):
    shape = (9, 6)
    x = values(shape, 31, -2.0, 2.0)
    _check_reductions(make(x, layout(name, shape, P), dtype), x, dtype)


@pytest.mark.parametrize("shape", [(1, 8), (8, 1)], ids=["row", "col"])
def test_reductions_of_vectors(shape):
    x = values(shape, 32)
    for name in ("row", "col", "rep", "b2d_g_rev"):
        _check_reductions(make(x, layout(name, shape, P), "float64"), x, "float64")


def test_reduction_results_compose():
    """An axis reduction (possibly Partial) feeds further operations correctly."""
    x = values((7, 5), 33)
    for name in NAMES:
        m = make(x, layout(name, (7, 5), P), "float64")
        centred = m - m.mean(axis=0)
        np.testing.assert_allclose(centred.to_numpy(), x - x.mean(axis=0), **tol("float64"), err_msg=name)
        np.testing.assert_allclose(m.sum(axis=1).sum(), x.sum(), **tol("float64"), err_msg=name)
        np.testing.assert_allclose((m / m.max(axis=1)).to_numpy(), x / x.max(axis=1, keepdims=True),
                                   **tol("float64"), err_msg=name)


@pytest.mark.parametrize("name", ["rep", "partial", "row", "b2d"])
def test_max_and_min_of_everything_propagate_nan(name):
    """NaN wins in max() and min() over everything, as in NumPy (and in their axis forms), wherever it
    lies; inf is an ordinary value."""
    x = values((5, 4), 34)
    x[0, 0] = np.inf
    m = make(x, layout(name, (5, 4), P), "float64")
    assert m.max() == np.inf and m.min() == x.min()
    for r, c in ((4, 3), (0, 1)):
        y = x.copy()
        y[r, c] = np.nan
        m = make(y, layout(name, (5, 4), P), "float64")
        assert np.isnan(m.max()) and np.isnan(m.min()), (r, c)


def test_empty_matrix_reductions():
    m = dmath.zeros((0, 4), dtype="float64")
    assert m.sum() == 0.0
    np.testing.assert_array_equal(m.sum(axis=0).to_numpy(), np.zeros((1, 4)))
    with pytest.raises(dmath.ShapeError):
        m.max()
    # still usable afterwards
    assert dmath.ones((2, 2)).sum() == 4.0


def test_axis_reductions_in_a_replayed_plan():
    """Axis reductions whose result slots are index arrays (block-cyclic pieces, at every P) inside a
    replayed plan: the device index arrays are made at the first command and reused, so the values
    follow the input; on a GPU the plan is captured at its second replay and launched after."""
    gc.collect()
    dmath.stats()                               # earlier tests' plans are dropped before the count
    shape = (9, 8)
    x = make(values(shape, 40), dmath.BlockCyclic((2, 2), grid=(1, P)), "float64")
    ops = [(op, axis) for op in ("sum", "max", "min") for axis in (0, 1)]
    with dmath.record() as plan:
        outs = [getattr(x, op)(axis=axis) for op, axis in ops]
    graphs = dmath.stats()[0]["plan_graphs"]
    for k in range(4):
        xv = values(shape, 41 + k)
        x.assign(xv)
        plan.replay()
        for (op, axis), r in zip(ops, outs):
            np.testing.assert_allclose(r.to_numpy(), OPS[op](xv, axis=axis, keepdims=True),
                                       **tol("float64"), err_msg=f"{op} axis={axis} replay {k}")
        if dmath.device() == "gpu" and collectives_in_graphs():
            assert dmath.stats()[0]["plan_graphs"] == graphs + (1 if k >= 1 else 0)


# ---- 6. max/min along an axis of a matrix empty only in the other dimension -------------------
@pytest.mark.parametrize("kind", ["row", "col", "rep", "partial", "b2d"])
@pytest.mark.parametrize("op", ["max", "min"])
def test_max_min_along_a_present_axis_of_an_empty_matrix(kind, op):
    make = {"row": dmath.RowBlock, "col": dmath.ColBlock, "rep": dmath.Replicated,
            "partial": dmath.Partial, "b2d": dmath.Block2D}[kind]
    for shape, axis in [((3, 0), 0), ((0, 4), 1)]:
        M = dmath.zeros(shape, layout=make())
        R = getattr(M, op)(axis=axis)
        expected = getattr(np.zeros(shape), op)(axis=axis, keepdims=True)
        assert R.shape == expected.shape
        np.testing.assert_array_equal(R.to_numpy(), expected)
    # along the empty axis there is still no value (NumPy raises too)
    for shape, axis in [((3, 0), 1), ((0, 4), 0), ((0, 0), 0), ((0, 0), None)]:
        with pytest.raises(dmath.ShapeError, match="no value"):
            getattr(dmath.zeros(shape, layout=make()), op)(axis=axis)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_sum_of_everything_has_no_overflow_its_value_lacks(dtype):
    """sum() and mean() are the value's at every worker count: a Partial product whose addends are huge
    and cancel (its value is 0; each worker's float64 sum of its addend overflowed, so 2+ workers gave
    NaN, found by a hostile-use probe), and terms whose running sum overflows where the total does not.
    An overflowing total is inf and an inf in the data gives the IEEE answer, as before."""
    big = 2e38 if dtype == "float32" else 1e308
    A = dmath.from_numpy(np.array([[big, -big]], dtype), layout=dmath.ColBlock())
    C = A @ dmath.from_numpy(np.ones((2, 3), dtype), layout=dmath.RowBlock())
    assert C.layout.partial == (P > 1)
    np.testing.assert_array_equal(C.to_numpy(), np.zeros((1, 3), dtype))
    assert C.sum() == 0.0 and C.mean() == 0.0
    if dtype == "float64":
        X = dmath.from_numpy(np.array([[1e308, 1e308, -1e308, 2.0]]), layout=dmath.ColBlock())
        assert X.sum() == 1e308 and X.mean() == 0.25e308
        assert dmath.from_numpy(np.array([[1e308, 1e308]]), layout=dmath.ColBlock()).sum() == np.inf
        assert dmath.from_numpy(np.array([[-1e308, -1e308, 5.0]]), layout=dmath.RowBlock()).sum() == -np.inf
        assert np.isnan(dmath.from_numpy(np.array([[np.inf, -np.inf, 1e308, 1e308]]),
                                         layout=dmath.ColBlock()).sum())
        assert dmath.from_numpy(np.array([[1.0, 2.0], [3.0, 4.0]]), layout=dmath.BlockCyclic((1, 1))).sum() == 10.0
