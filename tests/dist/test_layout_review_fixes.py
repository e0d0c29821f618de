"""Regressions of the layout/remap/Matrix API review (findings 1 to 10), NumPy as the oracle.

Each test fails on the code the review ran and passes now. Findings 1 and 2
(sums of Partial addends) need two addends, so at P = 1 their tests only
check the values (a Partial over one worker has a single addend).
"""
import numpy as np
import pytest

import dmath
from dmath.ops.nn_batch import take_rows

P = dmath.num_workers()
LAST = P - 1


def _partial(columns, dtype):
    """A (rows, 1) Partial over every worker whose addend on worker w is columns[:, w] (P columns),
    made by a test kernel (tests/dist/_kernels.py): dmath's own float16 Partial results (row sums
    of a ColBlock matrix, say) hold their sums rounded once, not such addends (issue 35)."""
    from dmath.ops.base import dispatch, new_meta
    C = dmath.from_numpy(columns, layout=dmath.ColBlock(), dtype=dtype)
    S = dispatch("test_partial_addends", [C], [new_meta(dmath.Partial(), (columns.shape[0], 1), dtype)])[0][0]
    assert S.layout.partial
    return S


def _cancelling(big, dtype="float64"):
    """(1, 1) Partial: addend `big` on worker 0 and `1 - big` on the last (1 at P = 1)."""
    cols = np.zeros((1, P))
    cols[0, 0] = big
    cols[0, LAST] += 1 - big
    return _partial(cols, dtype)


# ---- 1. a Partial narrowed to a Partial is summed first, then rounded once ------------------
def _narrowed_partials(S, dtype):
    """S converted to a narrower Partial every way the API offers."""
    T = dmath.zeros(S.shape, dtype=dtype, layout=dmath.Partial())
    T.assign(S)
    out = {"astype": S.astype(dtype), "remap": S.remap(dmath.Partial(), dtype), "assign": T}
    if P > 1:
        out["remap onto another group"] = S.remap(dmath.Partial(group=[LAST]), dtype)
        out["remap onto a permuted group"] = S.remap(dmath.Partial(group=list(reversed(range(P)))), dtype)
    return out


def test_partial_to_narrower_partial_does_not_overflow_an_addend():
    # 1e5 and 1 - 1e5 overflow float16 one by one (inf - inf = nan); their sum is 1
    S = _cancelling(1e5)
    for how, R in _narrowed_partials(S, "float16").items():
        assert R.layout.partial and R.dtype == "float16"
        np.testing.assert_array_equal(R.to_numpy(), [[1.0]], err_msg=how)


def test_partial_to_narrower_partial_rounds_once():
    # 2049 and -1: converted one by one 2049 rounds (to even) to 2048 and the sum is 2047;
    # the sum 2048 is exact in float16
    cols = np.zeros((1, P))
    cols[0, 0] = 2049.0
    cols[0, LAST] -= 1.0
    S = _partial(cols, "float64")
    for how, R in _narrowed_partials(S, "float16").items():
        np.testing.assert_array_equal(R.to_numpy(), [[2048.0]], err_msg=how)


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_partial_to_narrower_partial_equals_the_sum_rounded_once(dtype):
    rng = np.random.default_rng(11)
    cols = rng.standard_normal((37, P)) * 3000.0
    S = _partial(cols, "float64")
    expected = S.to_numpy().astype(dtype)          # the float64 sum, rounded once
    for how, R in _narrowed_partials(S, dtype).items():
        np.testing.assert_array_equal(R.to_numpy(), expected, err_msg=how)


def test_partial_widened_to_partial_keeps_its_value():
    # widening converts addend by addend (exact); the sum is then made in the wide dtype
    S = _partial(np.full((3, P), 60000.0), "float16")
    R = S.astype("float32")
    assert R.layout.partial
    np.testing.assert_array_equal(R.to_numpy(), np.full((3, 1), 60000.0 * P))


# ---- 2. a narrow Partial going to a wider dtype is summed in the wider one --------------------
def _wide_targets():
    yield "Replicated", dmath.Replicated(), False
    yield "Replicated in the background", dmath.Replicated(), True
    yield "RowBlock", dmath.RowBlock(), False
    yield "Replicated on worker 0", dmath.Replicated(group=[0]), False
    if P > 1:
        yield "Replicated on the last worker", dmath.Replicated(group=[LAST]), False


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_float16_partial_sums_in_the_wider_target_dtype(dtype):
    # 60000 per worker: the sum overflows float16 from P = 2 on, never float32
    S = _partial(np.full((4, P), 60000.0), "float16")
    expected = np.full((4, 1), 60000.0 * P)
    for how, layout, background in _wide_targets():
        R = S.remap(layout, dtype, background=background)
        assert R.dtype == dtype
        np.testing.assert_array_equal(R.to_numpy(), expected, err_msg=how)


def test_float16_partial_sum_keeps_the_digits_float16_would_round():
    # 2048 + 1 + ... : in float16 every + 1 past 2048 is lost; in float32 it is kept
    cols = np.ones((1, P))
    cols[0, 0] = 2048.0
    S = _partial(cols, "float16")
    for how, layout, background in _wide_targets():
        R = S.remap(layout, "float32", background=background)
        np.testing.assert_array_equal(R.to_numpy(), [[2047.0 + P]], err_msg=how)


# ---- 3. gemm into a narrower C computes in the operands' precision, rounds once --------------
def _exact_operands(m, k, n, seed):
    """float64 operands whose products and sums are exact in float64, with entries past float16's
    range in A (up to 2**17) and below its normal range in B (multiples of 2**-10)."""
    rng = np.random.default_rng(seed)
    a = rng.integers(-128, 129, (m, k)).astype(np.float64) * 1024.0
    b = rng.integers(-8, 9, (k, n)).astype(np.float64) / 1024.0
    return a, b


def _c_layouts():
    yield "row", dmath.RowBlock()
    yield "rep", dmath.Replicated()
    yield "partial", dmath.Partial()
    yield "b2d", dmath.Block2D()
    yield "bc", dmath.BlockCyclic((2, 3))
    if P > 1:
        yield "partial_g", dmath.Partial(group=[LAST, 0])
        yield "col_g", dmath.ColBlock(group=[LAST])


@pytest.mark.parametrize("beta", [0.0, 1.0, 0.5])
@pytest.mark.parametrize("cdtype", ["float16", "float32"])
def test_gemm_into_a_narrower_c_rounds_the_exact_result_once(beta, cdtype):
    m, k, n = 7, 9, 5
    a, b = _exact_operands(m, k, n, seed=3)
    c0 = np.random.default_rng(4).integers(-6, 7, (m, n)).astype(cdtype)
    expected = (a @ b + beta * c0.astype(np.float64)).astype(cdtype)       # exact, then rounded once
    for (an, al), (bn, bl) in [(("row", dmath.RowBlock()), ("rep", dmath.Replicated())),
                               (("col", dmath.ColBlock()), ("row", dmath.RowBlock())),
                               (("b2d", dmath.Block2D()), ("b2d", dmath.Block2D()))]:
        A, B = dmath.from_numpy(a, layout=al), dmath.from_numpy(b, layout=bl)
        for cn, cl in _c_layouts():
            C = dmath.from_numpy(c0, layout=cl, dtype=cdtype)
            assert dmath.gemm(A, B, C, beta=beta) is C
            np.testing.assert_array_equal(C.to_numpy(), expected, err_msg=f"A {an}, B {bn}, C {cn}")


def test_gemm_into_a_narrower_c_keeps_the_digits_of_a_cancellation():
    a, b = np.array([[1.0001, 1.0]]), np.array([[1.0], [-1.0]])
    C = dmath.zeros((1, 1), dtype="float16")
    dmath.gemm(dmath.from_numpy(a), dmath.from_numpy(b), C)
    np.testing.assert_array_equal(C.to_numpy(), (a @ b).astype(np.float16))


def test_gemm_float32_operands_into_float16_c_with_beta():
    # 70000 overflows float16, 70000 * 0.001 + 2 = 72 does not
    C = dmath.full((1, 1), 2.0, dtype="float16")
    A = dmath.from_numpy(np.array([[70000.0]]), dtype="float32")
    B = dmath.from_numpy(np.array([[0.001]]), dtype="float32")
    dmath.gemm(A, B, C, beta=1.0)
    np.testing.assert_array_equal(C.to_numpy(), [[np.float16(np.float32(70000.0) * np.float32(0.001) + 2)]])


def test_gemm_partial_addends_are_summed_before_c_rounds_them():
    # A ColBlock times B RowBlock into a Partial C: the workers' addends (1e5 and 1 - 1e5) overflow
    # float16 one by one; their sum is 1
    a = np.zeros((1, P))
    a[0, 0] = 1e5
    a[0, LAST] += 1 - 1e5
    A = dmath.from_numpy(a, layout=dmath.ColBlock())
    B = dmath.from_numpy(np.ones((P, 1)), layout=dmath.RowBlock())
    for beta in (0.0, 1.0):
        C = dmath.from_numpy(np.array([[0.5]]), layout=dmath.Partial(), dtype="float16")
        dmath.gemm(A, B, C, beta=beta)
        np.testing.assert_array_equal(C.to_numpy(), [[1.0 + 0.5 * beta]])


def test_gemm_float16_operands_into_float16_c_is_unchanged():
    # float16 operands keep their mixed precision: into C as into a new result
    rng = np.random.default_rng(5)
    a, b = rng.standard_normal((6, 40)), rng.standard_normal((40, 4))
    A, B = dmath.from_numpy(a, dtype="float16"), dmath.from_numpy(b, dtype="float16")
    C = dmath.zeros((6, 4), dtype="float16")
    dmath.gemm(A, B, C)
    np.testing.assert_array_equal(C.to_numpy(), (A @ B).to_numpy())


def test_gemm_into_a_wider_c_still_computes_in_c_dtype():
    # 4096 float16 ones: their sum is exact in float64 (C's dtype) and in float32 accumulation
    A = dmath.from_numpy(np.ones((1, 4096)), dtype="float16")
    B = dmath.from_numpy(np.ones((4096, 1)), dtype="float16")
    C = dmath.zeros((1, 1), dtype="float64")
    dmath.gemm(A, B, C)
    np.testing.assert_array_equal(C.to_numpy(), [[4096.0]])


# ---- 4. reshape inside on_group stays on the group -------------------------------------------
def _groups():
    yield [LAST]
    if P > 2:
        yield [LAST, 0]


@pytest.mark.parametrize("kind", ["row", "col", "rep", "partial", "b2d"])
def test_reshape_inside_on_group(kind):
    a = np.arange(24.0).reshape(4, 6)
    make = {"row": dmath.RowBlock, "col": dmath.ColBlock, "rep": dmath.Replicated,
            "partial": dmath.Partial, "b2d": dmath.Block2D}[kind]
    for group in _groups():
        with dmath.on_group(group):
            M = dmath.from_numpy(a, layout=make())
            for shape in [(3, 8), (8, 3), (2, 12), (24, 1), (-1, 4)]:
                R = M.reshape(*shape)
                np.testing.assert_array_equal(R.to_numpy(), a.reshape(shape), err_msg=f"{group} {shape}")
                assert set(R.layout.members(P)) <= set(group), R.layout
            R = M.reshape(12, 2, layout=dmath.RowBlock())
            np.testing.assert_array_equal(R.to_numpy(), a.reshape(12, 2))


def test_reshape_of_a_group_matrix_stays_on_its_group_outside_on_group():
    # a layout that does not fit the new shape (sizes=) gives way to row blocks on the same workers
    a = np.arange(24.0).reshape(6, 4)
    M = dmath.from_numpy(a, layout=dmath.RowBlock(group=[LAST], sizes=(6,)))
    R = M.reshape(4, 6)
    np.testing.assert_array_equal(R.to_numpy(), a.reshape(4, 6))
    assert R.layout.members(P) == (LAST,)


# ---- 5. rand stays in [0, 1) in every dtype ----------------------------------------------------
def test_rand_float16_never_returns_one():
    dmath.random.seed(123)
    R = dmath.random.rand((1000, 1000), dtype="float16")
    a = R.to_numpy()
    assert a.max() < 1.0 and a.min() >= 0.0
    assert a.max() == np.nextafter(np.float16(1), np.float16(0))


def test_rand_float32_never_returns_one():
    # seed 0: element (30588, 310) of this draw is within 2**-25 of 1 as a double
    dmath.random.seed(0)
    R = dmath.random.rand((30589, 1000), dtype="float32")
    assert R.get((30588, 310)) == float(np.nextafter(np.float32(1), np.float32(0)))
    assert R.max() < 1.0


def test_rand_float64_stream_is_unchanged():
    # the doubles drawn before the fix (dnn checkpoints and seeded tests depend on them)
    dmath.random.seed(7)
    R = dmath.random.rand((2, 3), dtype="float64", layout=dmath.BlockCyclic((1, 2)))
    np.testing.assert_array_equal(R.to_numpy(), [
        [0.07253549889621946, 0.5624197862394222, 0.5050316882229421],
        [0.6879061813539603, 0.20979420013483263, 0.35048333717573965]])


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_rand_narrow_dtypes_change_only_the_values_that_rounded_to_one(dtype):
    dmath.random.seed(99)
    wide = dmath.random.rand((300, 200), dtype="float64").to_numpy()
    dmath.random.seed(99)
    narrow = dmath.random.rand((300, 200), dtype=dtype, layout=dmath.ColBlock()).to_numpy()
    below_one = np.nextafter(np.dtype(dtype).type(1), np.dtype(dtype).type(0))
    np.testing.assert_array_equal(narrow, np.minimum(wide.astype(dtype), below_one))


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


def _commands():
    """Commands worker 0 has run (the stats command that asks included)."""
    return dmath.stats()[0]["commands"]


def test_reshape_checks_its_layout_before_sending_anything():
    M = dmath.from_numpy(np.arange(12.0).reshape(3, 4))
    idle = -(_commands() - _commands())              # what asking costs: one command
    for bad in ["x", dmath.RowBlock(sizes=(7,) + (0,) * (P - 1))]:      # not a layout; 7 rows of 6
        before = _commands()
        with pytest.raises(dmath.LayoutError):
            M.reshape(6, 2, layout=bad)
        assert _commands() - before == idle, "reshape sent commands before refusing its layout"
    np.testing.assert_array_equal(M.reshape(6, 2).to_numpy(), np.arange(12.0).reshape(6, 2))


# ---- 8. in-place writers refuse a derived copy --------------------------------------------------
def test_take_rows_and_permutation_refuse_a_derived_out():
    X = dmath.zeros((4, 3), layout=dmath.Replicated())
    S = dmath.from_numpy(np.arange(21.0).reshape(7, 3), layout=dmath.Replicated())
    O = dmath.from_numpy(np.arange(7.0)[None], layout=dmath.Replicated())
    pos = dmath.zeros((1, 1), dtype="float64", layout=dmath.Replicated())
    with pytest.raises(dmath.NotSupportedError, match="take_rows on A\\[0:2"):
        take_rows(S, O, pos, X[0:2])
    Y = dmath.zeros((2, 4), dtype="float64", layout=dmath.Replicated())
    state = dmath.random.get_state()
    with pytest.raises(dmath.NotSupportedError, match="permutation on A\\[0:1"):
        dmath.random.permutation(4, key=(1,), out=Y[0:1])
    with pytest.raises(dmath.NotSupportedError, match="permutation"):
        dmath.random.permutation(4, out=Y[0:1])
    assert dmath.random.get_state() == state
    # into the matrices themselves they write
    take_rows(S, O, pos, X)
    np.testing.assert_array_equal(X.to_numpy(), np.arange(12.0).reshape(4, 3))
    Z = dmath.zeros((1, 4), dtype="float64", layout=dmath.Replicated())
    dmath.random.permutation(4, key=(1,), out=Z)
    np.testing.assert_array_equal(np.sort(Z.to_numpy()[0]), np.arange(4.0))


# ---- 9. an invalid permutation call leaves the random stream where it was -----------------------
def test_invalid_permutation_does_not_advance_the_stream():
    dmath.random.seed(5)
    state = dmath.random.get_state()
    bad_calls = [lambda: dmath.random.permutation(-1),
                 lambda: dmath.random.permutation(2.5),
                 lambda: dmath.random.permutation(3, out=dmath.zeros((1, 4), dtype="float64")),
                 lambda: dmath.random.permutation(3, layout="x"),
                 lambda: dmath.random.permutation(3, key="ab")]
    for bad in bad_calls:
        with pytest.raises(dmath.DMathError):
            bad()
        assert dmath.random.get_state() == state
    after_errors = dmath.random.permutation(9).to_numpy()
    dmath.random.seed(5)
    np.testing.assert_array_equal(after_errors, dmath.random.permutation(9).to_numpy())


# ---- 10. alpha == 0 follows the BLAS rule: A @ B is not formed --------------------------------
@pytest.mark.parametrize("bad", [np.inf, np.nan])
def test_gemm_alpha_zero_does_not_read_the_operands(bad):
    m, k, n = 5, 4, 6
    c0 = np.arange(m * n, dtype=np.float64).reshape(m, n)
    for al, bl, cl in [(dmath.RowBlock(), dmath.Replicated(), dmath.RowBlock()),
                       (dmath.ColBlock(), dmath.RowBlock(), dmath.Partial()),
                       (dmath.Block2D(), dmath.Block2D(), dmath.Block2D()),
                       (dmath.Replicated(), dmath.ColBlock(), dmath.ColBlock())]:
        A = dmath.full((m, k), bad, dtype="float64", layout=al)
        B = dmath.ones((k, n), dtype="float64", layout=bl)
        for beta, expected in [(1.0, c0), (2.5, 2.5 * c0), (0.0, np.zeros((m, n)))]:
            C = dmath.from_numpy(c0, layout=cl)
            dmath.gemm(A, B, C, alpha=0.0, beta=beta)
            np.testing.assert_array_equal(C.to_numpy(), expected, err_msg=f"{al} {cl} beta={beta}")
        # beta == 0 ignores what C held, as it does for alpha != 0
        C = dmath.full((m, n), np.nan, dtype="float64", layout=cl)
        dmath.gemm(A, B, C, alpha=0.0, beta=0.0)
        np.testing.assert_array_equal(C.to_numpy(), np.zeros((m, n)))
        R = dmath.gemm(A, B, alpha=0.0)
        assert R.shape == (m, n) and R.dtype == "float64"
        np.testing.assert_array_equal(R.to_numpy(), np.zeros((m, n)))
        R = dmath.gemm(A, B, alpha=0.0, layout=dmath.Replicated())
        np.testing.assert_array_equal(R.to_numpy(), np.zeros((m, n)))


def test_gemm_alpha_zero_then_alpha_one_multiplies_again():
    # the same signature with another alpha: the product is formed again
    rng = np.random.default_rng(8)
    a, b = rng.standard_normal((4, 3)), rng.standard_normal((3, 5))
    A, B = dmath.from_numpy(a), dmath.from_numpy(b, layout=dmath.Replicated())
    np.testing.assert_array_equal(dmath.gemm(A, B, alpha=0.0).to_numpy(), np.zeros((4, 5)))
    np.testing.assert_allclose(dmath.gemm(A, B, alpha=1.0).to_numpy(), a @ b, rtol=1e-12)
    np.testing.assert_array_equal(dmath.gemm(A, B, alpha=0.0).to_numpy(), np.zeros((4, 5)))
