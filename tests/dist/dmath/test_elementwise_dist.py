"""Elementwise operations against NumPy, with operands in different layouts and broadcasting."""
import numpy as np
import pytest

import dmath

from _cases import case_names, layout, make, tol, values
from _harness import Failures, check_cases

P = dmath.num_workers()
NAMES = case_names(P)
SHAPE = (7, 5)
ROW, COL = (1, SHAPE[1]), (SHAPE[0], 1)


def _sigmoid(a):
    return 1.0 / (1.0 + np.exp(-a))


BINARY = {
    "add": (lambda a, b: a + b, lambda a, b: a + b),
    "sub": (lambda a, b: a - b, lambda a, b: a - b),
    "mul": (lambda a, b: a * b, lambda a, b: a * b),
    "div": (lambda a, b: a / b, lambda a, b: a / b),
    "pow_op": (lambda a, b: a ** b, lambda a, b: a ** b),
    "pow_fn": (lambda a, b: dmath.pow(a, b), lambda a, b: np.power(a, b)),
    "maximum": (dmath.maximum, np.maximum),
    "minimum": (dmath.minimum, np.minimum),
}

UNARY = {
    "neg": (lambda a: -a, lambda a: -a),
    "pos": (lambda a: +a, lambda a: +a),
    "exp": (dmath.exp, np.exp),
    "log": (lambda a: dmath.log(dmath.abs(a) + 0.5), lambda a: np.log(np.abs(a) + 0.5)),
    "sqrt": (lambda a: dmath.sqrt(abs(a)), lambda a: np.sqrt(np.abs(a))),
    "abs": (dmath.abs, np.abs),
    "tanh": (dmath.tanh, np.tanh),
    "sigmoid": (dmath.sigmoid, _sigmoid),
    "relu": (dmath.relu, lambda a: np.maximum(a, 0)),
}


def _pair(i, stride=7, shift=3):
    return NAMES[i], NAMES[(i * stride + shift) % len(NAMES)]


@pytest.mark.parametrize("i", range(len(NAMES)), ids=lambda i: "-".join(_pair(i)))
def test_binary_ops_mixed_layouts(i):
    la, lb = _pair(i)
    x = values(SHAPE, 10, 0.5, 1.5).astype("float32")
    y = values(SHAPE, 11, 0.5, 1.5).astype("float32")
    a, b = make(x, layout(la, SHAPE, P)), make(y, layout(lb, SHAPE, P))
    cases = [(name, (lambda f=f: f(a, b)), g(x, y)) for name, (f, g) in BINARY.items()]
    cond = (values(SHAPE, 12) > 0).astype("float32")
    c = make(cond, layout(NAMES[(i + 1) % len(NAMES)], SHAPE, P))
    cases += [("where", lambda: dmath.where(c, a, b), np.where(cond != 0, x, y)),
              ("where_scalar", lambda: dmath.where(c, a, -1.0), np.where(cond != 0, x, -1.0)),
              ("chain", lambda: (a - b) * (a + b) / b, (x - y) * (x + y) / y)]
    check_cases(cases)
    # the operands are unchanged and the result takes the first full operand's layout
    np.testing.assert_array_equal(a.to_numpy(), x)
    np.testing.assert_array_equal(b.to_numpy(), y)


@pytest.mark.parametrize("name", NAMES)
def test_unary_ops(name):
    x = values(SHAPE, 13, -2.0, 2.0).astype("float32")
    a = make(x, layout(name, SHAPE, P))
    check_cases([(op, (lambda f=f: f(a)), g(x)) for op, (f, g) in UNARY.items()])


@pytest.mark.parametrize("name", NAMES)
def test_scalar_operands_both_sides(name):
    x = values(SHAPE, 14, 0.5, 1.5).astype("float32")
    a = make(x, layout(name, SHAPE, P))
    check_cases([
        ("m+s", lambda: a + 2.0, x + 2.0), ("s+m", lambda: 2 + a, 2 + x),
        ("m-s", lambda: a - 2.0, x - 2.0), ("s-m", lambda: 2.0 - a, 2.0 - x),
        ("m*s", lambda: a * 3.0, x * 3.0), ("s*m", lambda: 3 * a, 3 * x),
        ("m/s", lambda: a / 4.0, x / 4.0), ("s/m", lambda: 4.0 / a, 4.0 / x),
        ("m**s", lambda: a ** 2, x ** 2), ("pow", lambda: dmath.pow(a, 0.5), np.power(x, 0.5)),
        ("max_s", lambda: dmath.maximum(a, 1.0), np.maximum(x, 1.0)),
        ("min_s", lambda: dmath.minimum(1.0, a), np.minimum(1.0, x)),
        ("where_ss", lambda: dmath.where(a - 1.0, 1.0, -1.0), np.where(x - 1.0 != 0, 1.0, -1.0)),
        ("np_scalar", lambda: a * np.float64(1.5) + np.int64(2), x * 1.5 + 2),
        # a numpy scalar on the left must not try to convert the Matrix
        ("np_left", lambda: np.float32(2.0) * a - np.float64(1.0), 2 * x - 1),
        ("np_left_div", lambda: np.float64(4.0) / a, 4.0 / x),
    ])


@pytest.mark.parametrize("i", range(len(NAMES)), ids=lambda i: NAMES[i])
def test_vector_broadcasting_mixed_layouts(i):
    """(1, n) rows and (m, 1) columns in layouts other than the matrix's."""
    lm, lr = _pair(i, 5, 1)
    lc = NAMES[(i * 3 + 2) % len(NAMES)]
    x = values(SHAPE, 15, 0.5, 1.5).astype("float32")
    r = values(ROW, 16, 0.5, 1.5).astype("float32")
    c = values(COL, 17, 0.5, 1.5).astype("float32")
    one = np.array([[1.25]], dtype="float32")
    m = make(x, layout(lm, SHAPE, P))
    mr = make(r, layout(lr, ROW, P))
    mc = make(c, layout(lc, COL, P))
    m1 = make(one, layout(lr, (1, 1), P))
    check_cases([
        ("m+r", lambda: m + mr, x + r), ("r+m", lambda: mr + m, r + x),
        ("m-c", lambda: m - mc, x - c), ("c-m", lambda: mc - m, c - x),
        ("m*r", lambda: m * mr, x * r), ("c*m", lambda: mc * m, c * x),
        ("m/r", lambda: m / mr, x / r), ("r/m", lambda: mr / m, r / x),
        ("m/c", lambda: m / mc, x / c), ("m**c", lambda: m ** mc, x ** c),
        ("max_mr", lambda: dmath.maximum(m, mr), np.maximum(x, r)),
        ("min_cm", lambda: dmath.minimum(mc, m), np.minimum(c, x)),
        ("where_rc", lambda: dmath.where(m - 1.0, mr, mc), np.where(x - 1.0 != 0, r, c)),
        ("m+1x1", lambda: m + m1, x + one), ("1x1*m", lambda: m1 * m, one * x),
        ("r+r", lambda: mr + mr, r + r), ("c*2", lambda: mc * 2.0, c * 2.0),
        ("m-r-c", lambda: m - mr - mc, x - r - c),
        # outer broadcasts: no operand has the result's shape
        ("r+c", lambda: mr + mc, r + c), ("c*r", lambda: mc * mr, c * r),
        ("max_rc", lambda: dmath.maximum(mr, mc), np.maximum(r, c)),
        ("1x1+r", lambda: m1 + mr, one + r),
    ])


def _sent():
    return sum(s["data_bytes_sent"] for s in dmath.stats())


# (matrix layout, vector layout, vector shape): every worker already holds the vector's part that
# its result pieces need, so the vector is not replicated first
HELD = [
    ("RowBlock column", lambda: dmath.RowBlock(), lambda: dmath.RowBlock(), COL),
    ("ColBlock row", lambda: dmath.ColBlock(), lambda: dmath.ColBlock(), ROW),
    ("uneven RowBlock column", lambda: dmath.RowBlock(sizes=(0,) * (P - 1) + (SHAPE[0],)),
     lambda: dmath.RowBlock(sizes=(0,) * (P - 1) + (SHAPE[0],)), COL),
    ("Block2D (P, 1) grid, RowBlock column", lambda: dmath.Block2D(grid=(P, 1)), lambda: dmath.RowBlock(), COL),
    ("cyclic rows, cyclic column", lambda: dmath.BlockCyclic((2, SHAPE[1]), grid=(P, 1)),
     lambda: dmath.BlockCyclic((2, 1), grid=(P, 1)),
     COL),
    ("group RowBlock column", lambda: dmath.RowBlock(group=[P - 1]), lambda: dmath.RowBlock(group=[P - 1]), COL),
]


@pytest.mark.parametrize("case", HELD, ids=[c[0] for c in HELD])
def test_a_vector_split_as_the_result_is_used_in_place(case):
    """A vector whose pieces already lie beside the result's moves no data, new or in place."""
    _, mat_layout, vec_layout, vshape = case
    x = values(SHAPE, 22, 0.5, 1.5).astype("float32")
    v = values(vshape, 23, 0.5, 1.5).astype("float32")
    m, mv = make(x, mat_layout()), make(v, vec_layout())
    before = _sent()
    got = [dmath.where(mv - 1.0, m * mv, mv / m), mv - m, dmath.maximum(m, mv)]
    target = m.copy()
    target *= mv
    assert _sent() == before
    for r, want in zip(got + [target], [np.where(v - 1.0 != 0, x * v, v / x), v - x, np.maximum(x, v), x * v]):
        assert r.layout == m.layout
        np.testing.assert_allclose(r.to_numpy(), want, **tol("float32"))


def test_a_vector_split_otherwise_is_replicated_first():
    """The counter-check: a RowBlock column beside a ColBlock matrix is gathered (at P > 1)."""
    x = values(SHAPE, 24, 0.5, 1.5).astype("float32")
    c = values(COL, 25, 0.5, 1.5).astype("float32")
    m, mc = make(x, dmath.ColBlock()), make(c, dmath.RowBlock())
    before = _sent()
    np.testing.assert_allclose((m + mc).to_numpy(), x + c, **tol("float32"))
    assert (_sent() > before) == (P > 1)


@pytest.mark.parametrize("i", range(len(NAMES)), ids=lambda i: NAMES[i])
def test_inplace_ops(i):
    lm, ln = _pair(i, 3, 2)
    if dmath.Partial in (type(layout(lm, SHAPE, P)),):
        lm = "row"  # in-place non-linear ops on Partial are refused (tested in test_errors)
    x = values(SHAPE, 18, 0.5, 1.5)
    y = values(SHAPE, 19, 0.5, 1.5)
    r = values(ROW, 20, 0.5, 1.5)
    c = values(COL, 21, 0.5, 1.5)
    m = make(x, layout(lm, SHAPE, P), "float64")
    keep = m.copy()
    lay = m.layout
    n = make(y, layout(ln, SHAPE, P), "float64")
    mr = make(r, layout(NAMES[(i + 4) % len(NAMES)], ROW, P), "float64")
    mc = make(c, layout(NAMES[(i + 5) % len(NAMES)], COL, P), "float64")
    same = m
    want = x.copy()
    steps = [("+= n", lambda: n, np.add, y), ("-= r", lambda: mr, np.subtract, r),
             ("*= c", lambda: mc, np.multiply, c), ("/= n", lambda: n, np.divide, y),
             ("+= s", lambda: 1.5, np.add, 1.5), ("-= s", lambda: 0.25, np.subtract, 0.25),
             ("*= s", lambda: 3.0, np.multiply, 3.0), ("/= s", lambda: 2.0, np.divide, 2.0)]
    for label, operand, g, v in steps:
        o = operand()
        if label.startswith("+="):
            m += o
        elif label.startswith("-="):
            m -= o
        elif label.startswith("*="):
            m *= o
        else:
            m /= o
        want = g(want, v)
        assert m is same, label
        assert m.layout == lay and m.dtype == "float64", label
        np.testing.assert_allclose(m.to_numpy(), want, **tol("float64"), err_msg=label)
    np.testing.assert_array_equal(keep.to_numpy(), x)
    np.testing.assert_array_equal(n.to_numpy(), y)


@pytest.mark.parametrize("name", ["partial", "partial_g"] if P > 1 else ["partial"])
def test_linear_ops_on_partial(name):
    """Ops on Partial matrices give the right value; a new matrix stays Partial only where an addend
    cannot overflow alone (negation, a factor of magnitude at most 1), in place the addends are
    written one by one."""
    lay = layout(name, SHAPE, P)
    x, y = values(SHAPE, 22), values(SHAPE, 23)
    a, b = make(x, lay, "float64"), make(y, lay, "float64")
    assert not (a + b).layout.partial and not (a * 2.0).layout.partial
    assert (-a).layout.partial and (a / 4.0).layout.partial and (a * -0.5).layout.partial
    check_cases([
        ("a+b", lambda: a + b, x + y), ("a-b", lambda: a - b, x - y), ("-a", lambda: -a, -x),
        ("a*2", lambda: a * 2.0, x * 2), ("a/4", lambda: a / 4.0, x / 4),
        ("a+1", lambda: a + 1.0, x + 1), ("1-a", lambda: 1.0 - a, 1 - x),
        ("a*b", lambda: a * b, x * y), ("2/a", lambda: 2.0 / (dmath.abs(a) + 1.0), 2 / (np.abs(x) + 1)),
    ], "float64")
    a += b
    np.testing.assert_allclose(a.to_numpy(), x + y, **tol("float64"))
    a *= 0.5
    np.testing.assert_allclose(a.to_numpy(), (x + y) * 0.5, **tol("float64"))
    a -= b
    np.testing.assert_allclose(a.to_numpy(), (x + y) * 0.5 - y, **tol("float64"))
    assert a.layout == lay.resolved(P)
    # adding a scalar to every addend would count it once per member: refused in place
    with pytest.raises(dmath.LayoutError):
        a += 1.0
    np.testing.assert_allclose(a.to_numpy(), (x + y) * 0.5 - y, **tol("float64"))


@pytest.mark.parametrize("name", ["partial", "partial_g"] if P > 1 else ["partial"])
def test_partial_scaled_by_a_non_finite_factor_is_summed_first(name):
    """A Partial matrix times inf (or NaN, or divided by 0) is its sum's value, not the NaN that the
    zero addends would give (0 * inf); a finite factor keeps it Partial."""
    lay = layout(name, SHAPE, P)
    x = values(SHAPE, 27)
    x[1, 2] = 0.0
    a = make(x, lay, "float64")
    with np.errstate(all="ignore"):
        cases = [("a*inf", a * np.inf, x * np.inf), ("a*-inf", a * -np.inf, x * -np.inf),
                 ("a*nan", a * np.nan, x * np.nan), ("a/0", a / 0.0, x / 0.0), ("a/-0", a / -0.0, x / -0.0),
                 ("a/inf", a / np.inf, x / np.inf), ("inf*a", np.inf * a, np.inf * x)]
    for label, got, want in cases:
        assert not got.layout.partial or label == "a/inf", label
        np.testing.assert_array_equal(got.to_numpy(), want, err_msg=label)
    assert not (a * 2.0).layout.partial and (a / 4.0).layout.partial
    with pytest.raises(dmath.LayoutError, match="not exact on its addends"):
        a *= np.inf
    with pytest.raises(dmath.LayoutError, match="not exact on its addends"):
        a /= 0.0
    np.testing.assert_array_equal(a.to_numpy(), x)      # refused before anything was written


@pytest.mark.parametrize("dtype", ["float64", "float16"])
def test_partial_addends_that_cancel_do_not_overflow(dtype):
    """Column sums of a RowBlock matrix come out Partial; rows of +big and -big sum to 0 on any worker
    count. Scaled by more than 1, or added to another Partial, addend by addend, that gave
    inf - inf = NaN from 2 workers on (a hostile-use probe); now such operands are summed first."""
    big = float(np.finfo(dtype).max)
    x = np.zeros((P, 3))             # one row a worker: the addends +big, -big, ... (0 for an odd last)
    x[0:P - P % 2:2, :2], x[1:P - P % 2:2, :2] = big, -big
    x[:, 2] = 1.0
    a = make(x, dmath.RowBlock(), dtype)
    s = a.sum(axis=0)
    want = x.sum(axis=0, keepdims=True)
    with np.errstate(all="ignore"):
        for label, got, w in [("s*10", s * 10.0, want * 10), ("s/0.5", s / 0.5, want / 0.5), ("s+s", s + s, 2 * want),
                              ("-s-s", -s - s, -2 * want), ("s-s", s - s, 0 * want),
                              ("mean*4", a.mean(axis=0) * 4.0, want / len(x) * 4)]:
            np.testing.assert_allclose(got.to_numpy().astype(np.float64), w, rtol=1e-3, atol=0, err_msg=label)
    # through GEMM: a ColBlock row times RowBlock ones lands Partial, one addend a worker
    g = make(x[:, :1].T.copy(), dmath.ColBlock(), dtype) @ make(np.ones((P, 1)), dmath.RowBlock(), dtype)
    np.testing.assert_array_equal((g * 2.0).to_numpy(), np.zeros((1, 1)))


def test_where_takes_the_dtype_of_its_values():
    """where's result has a's and b's dtype, never the condition's (as in NumPy); the condition's only
    when a and b are both scalars."""
    x, y = values(SHAPE, 28), values(SHAPE, 29)
    cond = make((x > 0).astype(np.float64), layout("row", SHAPE, P), "float64")
    a, b = make(x, layout("row", SHAPE, P), "float16"), make(y, layout(NAMES[-1], SHAPE, P), "float16")
    for got, want in ((dmath.where(cond, a, b), np.where(x > 0, x.astype("float16"), y.astype("float16"))),
                      (dmath.where(cond, a, 0.0), np.where(x > 0, x.astype("float16"), np.float16(0)))):
        assert got.dtype == "float16"
        np.testing.assert_array_equal(got.to_numpy(), want)
    c32 = cond.astype("float32")
    assert dmath.where(c32, 1.0, -1.0).dtype == "float32"
    assert dmath.where(c32, a, make(y, layout("row", SHAPE, P), "float64")).dtype == "float64"


def test_reflected_pow():
    """scalar ** Matrix, as dmath.pow(scalar, M)."""
    x = values(SHAPE, 30)
    a = make(x, layout(NAMES[-1], SHAPE, P), "float64")
    np.testing.assert_allclose((2.0 ** a).to_numpy(), 2.0 ** x, **tol("float64"))
    np.testing.assert_allclose((2 ** a).to_numpy(), dmath.pow(2.0, a).to_numpy(), **tol("float64"))


@pytest.mark.parametrize("da,db", [("float16", "float32"), ("float32", "float64"), ("float16", "float64")])
def test_mixed_dtypes_promote(da, db):
    x, y = values(SHAPE, 24), values(SHAPE, 25)
    a = make(x, layout("row", SHAPE, P), da)
    b = make(y, layout(NAMES[-1], SHAPE, P), db)
    for r in (a + b, b * a):
        assert r.dtype == db
    np.testing.assert_allclose((a + b).to_numpy(), x.astype(da) + y.astype(db), **tol(db))
    h = a * 2.0
    assert h.dtype == da
    np.testing.assert_allclose(h.to_numpy(), x.astype(da) * 2, **tol(da))


@pytest.mark.parametrize("dtype", ["float16", "float64"])
def test_ops_in_other_dtypes(dtype):
    x = values(SHAPE, 26, 0.5, 1.5)
    y = values(SHAPE, 27, 0.5, 1.5)
    lay = layout("bc23", SHAPE, P)
    a, b = make(x, lay, dtype), make(y, layout("col", SHAPE, P), dtype)
    xa, ya = x.astype(dtype), y.astype(dtype)
    check_cases([
        ("add", lambda: a + b, xa + ya), ("mul", lambda: a * b, xa * ya),
        ("div", lambda: a / b, xa / ya), ("exp", lambda: dmath.exp(a), np.exp(xa)),
        ("sigmoid", lambda: dmath.sigmoid(-a), _sigmoid(-xa)), ("s-m", lambda: 1.0 - a, 1.0 - xa),
    ], dtype)


@pytest.mark.parametrize("shape", [(0, 4), (4, 0)], ids=["0x4", "4x0"])
def test_empty_matrices(shape):
    x = np.zeros(shape)
    for name in NAMES:
        m = make(x, layout(name, shape, P), "float64")
        r = dmath.exp(m * 2.0 + m) - 1.0
        assert r.shape == shape, name
        np.testing.assert_array_equal(r.to_numpy(), x, err_msg=name)
        assert m.T.shape == shape[::-1]
        assert m.sum() == 0.0
        np.testing.assert_array_equal(m.sum(axis=0).to_numpy(), np.zeros((1, shape[1])), err_msg=name)
        np.testing.assert_array_equal(m.sum(axis=1).to_numpy(), np.zeros((shape[0], 1)), err_msg=name)


@pytest.mark.parametrize("shape", [(1, 9), (9, 1), (2, 9), (3, 1)], ids=lambda s: f"{s[0]}x{s[1]}")
def test_awkward_shapes(shape):
    """Vectors, fewer rows than workers; operands in different layouts."""
    x, y = values(shape, 28), values(shape, 29)
    failures = Failures()
    for i, name in enumerate(NAMES):
        other = NAMES[(i * 3 + 1) % len(NAMES)]
        a = make(x, layout(name, shape, P), "float64")
        b = make(y, layout(other, shape, P), "float64")
        for label, got, want in [("a*b+1", lambda: a * b + 1.0, x * y + 1),
                                 ("exp(a)-b", lambda: dmath.exp(a) - b, np.exp(x) - y),
                                 ("a/(|b|+1)", lambda: a / (abs(b) + 1.0), x / (np.abs(y) + 1)),
                                 ("max(a,b)", lambda: dmath.maximum(a, b), np.maximum(x, y))]:
            with failures.case(f"{name}, {other}: {label}"):
                np.testing.assert_allclose(got().to_numpy(), want, **tol("float64"))
        if a.layout.partial:
            continue   # in place, a Partial target only takes Partial operands of its layout
        with failures.case(f"{name}, {other}: +="):
            a += b
            np.testing.assert_allclose(a.to_numpy(), x + y, **tol("float64"))
    failures.check()


def _special(shape, dtype, seed):
    """Random values with zeros, infinities and NaNs sprinkled in (what the edge cases of each
    function's expression see), in `dtype`."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape) * 3
    picks = rng.random(shape)
    x[picks < 0.04] = 0.0
    x[(picks >= 0.04) & (picks < 0.07)] = np.inf
    x[(picks >= 0.07) & (picks < 0.10)] = -np.inf
    x[(picks >= 0.10) & (picks < 0.13)] = np.nan
    x[(picks >= 0.13) & (picks < 0.18)] = np.round(x[(picks >= 0.13) & (picks < 0.18)])   # ties in comparisons
    return x.astype(dtype)


@pytest.mark.parametrize("dtypes", [("float16",), ("float32",), ("float64",), ("float16", "float32"),
                                    ("float32", "float64")], ids="-".join)
def test_gpu_one_launch_path_gives_cupys_bits(dtypes):
    """On a GPU, the generated one-launch kernel of every function with a CUDA expression gives the
    bits of CuPy's ufunc (the generic kernel), for array, row, column, (1, 1) and scalar operands
    on either side, mixed dtypes, and zeros, infinities and NaNs (a NaN result only has to be a
    NaN). Its grid-stride loop is taken past the largest grid; whole operands of the result's dtype
    take the 16-byte vector loop (sizes with a remainder; past the largest grid in float16) and the
    scalar one when an operand's address is not 16-byte aligned (a view one element in)."""
    if dmath.device() != "gpu":
        pytest.skip("the one-launch path is the GPU kernel's")
    import cupy
    from dmath.gpu import launcher as cuda
    from dmath.ops.elementwise import FUNCTIONS
    from dmath.ops.elementwise_cuda import run
    failures = Failures()
    for fn, f in FUNCTIONS.items():
        arity = len(f.params)
        if f.cuda is None or (len(dtypes) > arity):
            continue                # (mixed dtypes: two array operands)
        forms = [("full",) * arity]
        if arity == 2:
            forms += [("full", "row"), ("col", "full"), ("one", "full")]
            if len(dtypes) == 1:
                forms += [("full", "scalar"), ("scalar", "full"), ("row", "scalar")]
        for form in forms:
            # past the largest grid (the grid-stride loop) for one function; the vector loop's too in
            # float16 (8 elements a step); a first operand one element into its buffer (unaligned)
            big = fn == "add" and form == ("full",) * arity
            sizes = ((37, 53), (cuda.MAX_BLOCKS * 256 + 1000, 1), "unaligned") if big else ((37, 53),)
            if big and dtypes == ("float16",):
                sizes += ((cuda.MAX_BLOCKS * 256 * 8 + 1003, 1),)
            for size in sizes:
                shift = size == "unaligned"
                size = (37, 53) if shift else size
                operands = []
                for k, kind in enumerate(form):
                    shape = {"full": size, "row": (1, size[1]), "col": (size[0], 1), "one": (1, 1)}.get(kind)
                    if shape is not None and shift and k == 0:
                        flat = cupy.asarray(_special((size[0] * size[1] + 1,), dtypes[0], 40))
                        operands.append(flat[1:].reshape(size))
                    elif shape is not None:
                        operands.append(cupy.asarray(_special(shape, dtypes[k % len(dtypes)], 40 + k)))
                    else:
                        operands.append([0.3, -1.7, 2.0][k])
                out_dtype = np.result_type(*[a.dtype for a in operands if hasattr(a, "dtype")]).name
                want = cupy.empty(size, out_dtype)
                f.compute(cupy, want, *operands)
                got = run(fn, operands, cupy.full(size, 7, out_dtype))
                w, g = cupy.asnumpy(want), cupy.asnumpy(got)
                same = (w.view(f"u{w.itemsize}") == g.view(f"u{g.itemsize}")) | (np.isnan(w) & np.isnan(g))
                if not same.all():
                    k = int(np.argmin(same.ravel()))
                    failures.add(f"{fn} ({', '.join(form)}, {size})", f"{int((~same).sum())} differ, first at "
                                 f"{k}: {g.ravel()[k]!r} against CuPy's {w.ravel()[k]!r}")
    del operands, want, got
    # the large arrays' blocks go back to the device: a later test that measures what clear() gives
    # back must not find its requests carved out of them
    dmath.memory.clear()
    failures.check()


def test_eager_elementwise_chain_on_every_path():
    """The GPU's one-launch path (contiguous pieces, a column vector and scalars), the generic
    kernel (in-place writes, a worker's several pieces, a vector's scattered positions) mixed in
    one chain, in every layout, against NumPy."""
    shape = (11, 6)
    x, y, c = values(shape, 50), values(shape, 51), values((shape[0], 1), 52)
    for name in NAMES:
        lay = layout(name, shape, P)
        a, b = make(x, lay, "float32"), make(y, lay, "float32")
        col = make(c, dmath.Replicated(), "float32")
        r = dmath.tanh(a * 0.5 + b) - col
        r = dmath.maximum(r, 0.25 * b) / (abs(a) + 1.0)
        r += a
        want = np.maximum(np.tanh(x * 0.5 + y) - c, 0.25 * y) / (np.abs(x) + 1.0) + x
        np.testing.assert_allclose(r.to_numpy(), want, **tol("float32"), err_msg=name)
