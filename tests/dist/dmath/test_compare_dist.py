"""Comparison and logic functions against NumPy: 0/1 results in the operands' dtype, every layout,
scalars on either side, row/column-vector broadcasting, Partial operands, inf and NaN."""
import numpy as np
import pytest

import dmath

from _cases import case_names, layout, make, values
from _harness import check_cases

P = dmath.num_workers()
NAMES = case_names(P)
SHAPE = (7, 5)
ROW, COL = (1, SHAPE[1]), (SHAPE[0], 1)

BINARY = {"equal": np.equal, "not_equal": np.not_equal, "greater": np.greater,
          "greater_equal": np.greater_equal, "less": np.less, "less_equal": np.less_equal,
          "logical_and": np.logical_and, "logical_or": np.logical_or}
UNARY = {"isfinite": np.isfinite, "isnan": np.isnan, "logical_not": np.logical_not}


def _ties(shape, seed):
    """Values from a small set (with zeros) so that equality and the logical functions see both answers."""
    return np.random.default_rng(seed).integers(-2, 3, size=shape).astype("float64") * 0.5


def _check(cases, dtype):
    """The cases' 0/1 results, exactly, in `dtype` and never Partial (a 0/1 result is never a sum of addends)."""
    def zero_one(r):
        assert r.dtype == dtype, (r.dtype, dtype)
        assert not r.layout.partial, r.layout
    check_cases(cases, dtype, exact=True, check=zero_one)


@pytest.mark.parametrize("dtype", ["float32", "float64", "float16"])
@pytest.mark.parametrize("i", range(len(NAMES)), ids=lambda i: NAMES[i])
def test_binary_mixed_layouts(i, dtype):
    la, lb = NAMES[i], NAMES[(i * 7 + 3) % len(NAMES)]
    x, y = _ties(SHAPE, 1), _ties(SHAPE, 2)
    a, b = make(x, layout(la, SHAPE, P), dtype), make(y, layout(lb, SHAPE, P), dtype)
    cases = [(name, (lambda n=name: getattr(dmath, n)(a, b)), f(x, y)) for name, f in BINARY.items()]
    cases += [(name + "_self", (lambda n=name: getattr(dmath, n)(a, a)), f(x, x)) for name, f in BINARY.items()]
    _check(cases, dtype)


@pytest.mark.parametrize("i", range(len(NAMES)), ids=lambda i: NAMES[i])
def test_scalars_on_either_side(i):
    x = _ties(SHAPE, 3)
    a = make(x, layout(NAMES[i], SHAPE, P), "float32")
    cases = []
    for name, f in BINARY.items():
        g = getattr(dmath, name)
        cases += [(name + "_ms", (lambda g=g: g(a, 0.5)), f(x, 0.5)),
                  (name + "_sm", (lambda g=g: g(0.0, a)), f(0.0, x)),
                  (name + "_np", (lambda g=g: g(a, np.float64(-0.5))), f(x, -0.5))]
    _check(cases, "float32")


@pytest.mark.parametrize("i", range(len(NAMES)), ids=lambda i: NAMES[i])
def test_vector_broadcasting(i):
    """(1, n) rows, (m, 1) columns and (1, 1) in layouts other than the matrix's; outer broadcasts."""
    lm, lr, lc = NAMES[i], NAMES[(i * 5 + 1) % len(NAMES)], NAMES[(i * 3 + 2) % len(NAMES)]
    x, r, c = _ties(SHAPE, 4), _ties(ROW, 5), _ties(COL, 6)
    one = np.array([[0.5]])
    m = make(x, layout(lm, SHAPE, P), "float64")
    mr, mc = make(r, layout(lr, ROW, P), "float64"), make(c, layout(lc, COL, P), "float64")
    m1 = make(one, layout(lr, (1, 1), P), "float64")
    cases = []
    for name, f in BINARY.items():
        g = getattr(dmath, name)
        cases += [(name + "_mr", (lambda g=g: g(m, mr)), f(x, r)), (name + "_cm", (lambda g=g: g(mc, m)), f(c, x)),
                  (name + "_m1", (lambda g=g: g(m, m1)), f(x, one)), (name + "_rc", (lambda g=g: g(mr, mc)), f(r, c))]
    _check(cases, "float64")


@pytest.mark.parametrize("name", ["partial", "partial_g"] if P > 1 else ["partial"])
def test_partial_operands_are_summed_first(name):
    """A comparison is not linear in the addends: Partial operands are reduced, the result is plain."""
    lay = layout(name, SHAPE, P)
    x, y = _ties(SHAPE, 7), _ties(SHAPE, 8)
    a, b = make(x, lay, "float64"), make(y, lay, "float64")
    plain = make(y, layout("row", SHAPE, P), "float64")
    assert a.layout.partial
    cases = []
    for n, f in BINARY.items():
        g = getattr(dmath, n)
        cases += [(n, (lambda g=g: g(a, b)), f(x, y)), (n + "_plain", (lambda g=g: g(plain, a)), f(y, x)),
                  (n + "_s", (lambda g=g: g(a, 0.0)), f(x, 0.0))]
    cases += [(n, (lambda n=n: getattr(dmath, n)(a)), f(x)) for n, f in UNARY.items()]
    _check(cases, "float64")
    # the Partial operands are unchanged
    np.testing.assert_array_equal(a.to_numpy(), x)


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
@pytest.mark.parametrize("i", range(len(NAMES)), ids=lambda i: NAMES[i])
def test_unary_with_inf_and_nan(i, dtype):
    x = values(SHAPE, 9)
    x[0, 0], x[1, 2], x[3, 1], x[6, 4], x[2, 2] = np.nan, np.inf, -np.inf, 0.0, np.nan
    a = make(x, layout(NAMES[i], SHAPE, P), dtype)
    _check([(n, (lambda n=n: getattr(dmath, n)(a)), f(x)) for n, f in UNARY.items()], dtype)


def test_mixed_dtypes_promote_like_numpy():
    x, y = _ties(SHAPE, 10), _ties(SHAPE, 11)
    a, b = make(x, dmath.RowBlock(), "float16"), make(y, dmath.ColBlock(), "float32")
    r = dmath.less(a, b)
    assert r.dtype == "float32"
    np.testing.assert_array_equal(r.to_numpy(), np.less(x, y).astype("float32"))


def test_errors_are_raised_on_the_master():
    a = dmath.zeros(SHAPE)
    with pytest.raises(dmath.ShapeError):
        dmath.equal(a, dmath.zeros((3, 3)))
    with pytest.raises(dmath.DMathError):
        dmath.greater(1.0, 2.0)                 # no matrix operand
    with pytest.raises(dmath.DMathError):
        dmath.isnan(np.zeros(SHAPE))            # numpy arrays are made matrices first
    with pytest.raises(TypeError):
        dmath.logical_not(a, a)
    # the runtime is still usable
    np.testing.assert_array_equal(dmath.equal(a, 0.0).to_numpy(), np.ones(SHAPE, "float32"))
