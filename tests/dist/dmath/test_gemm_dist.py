"""GEMM for any layouts of A, B and C against NumPy (float64 oracle), at every worker count."""
import numpy as np
import pytest

import dmath
from _cases import layout_cases

P = dmath.num_workers()
CASES = dict(layout_cases(P))
NAMES = sorted(CASES)
SHAPES = [(7, 5, 3), (1, 9, 4), (13, 1, 6), (5, 6, 1), (3, 4, 11), (9, 10, 8)]
RTOL = {"float16": 4e-3, "float32": 2e-5, "float64": 1e-11}
LAST = P - 1


def _draws(n, seed):
    rng = np.random.default_rng(seed)
    for _ in range(n):
        yield dict(a=rng.choice(NAMES), b=rng.choice(NAMES), c=rng.choice(NAMES + ["none"]),
                   shape=SHAPES[rng.integers(len(SHAPES))], ta=bool(rng.integers(2)), tb=bool(rng.integers(2)),
                   dtype=str(rng.choice(["float16", "float32", "float64"])),
                   alpha=float(rng.choice([1.0, -0.5, 2.0])), beta=float(rng.choice([0.0, 1.0, 0.25])),
                   given_c=bool(rng.integers(2)))


def _check(got, want, dtype, k):
    scale = max(1.0, np.abs(want).max())
    np.testing.assert_allclose(got, want, rtol=0, atol=RTOL[dtype] * scale * max(1, k) ** 0.5)


@pytest.mark.parametrize("case", list(_draws(150, 1234 + P)), ids=lambda c: f"{c['a']}-{c['b']}-{c['c']}")
def test_gemm_random_layouts(case):
    m, k, n = case["shape"]
    dtype = case["dtype"]
    a_shape = (k, m) if case["ta"] else (m, k)
    b_shape = (n, k) if case["tb"] else (k, n)
    rng = np.random.default_rng(7)
    a = rng.uniform(-1, 1, a_shape).astype(dtype)
    b = rng.uniform(-1, 1, b_shape).astype(dtype)
    A = dmath.from_numpy(a, layout=CASES[case["a"]](a_shape))
    B = dmath.from_numpy(b, layout=CASES[case["b"]](b_shape))
    opa = a.T.astype(np.float64) if case["ta"] else a.astype(np.float64)
    opb = b.T.astype(np.float64) if case["tb"] else b.astype(np.float64)
    want = case["alpha"] * opa @ opb
    lay = None if case["c"] == "none" else CASES[case["c"]]((m, n))
    if case["given_c"]:
        c0 = rng.uniform(-1, 1, (m, n)).astype(dtype)
        C = dmath.from_numpy(c0, layout=lay)
        out = dmath.gemm(A, B, C, alpha=case["alpha"], beta=case["beta"], trans_a=case["ta"], trans_b=case["tb"])
        assert out is C
        want = want + case["beta"] * c0.astype(np.float64)
    else:
        out = dmath.gemm(A, B, alpha=case["alpha"], trans_a=case["ta"], trans_b=case["tb"], layout=lay)
        if lay is not None:
            assert out.layout == lay.resolved(P)
    assert out.shape == (m, n) and out.dtype == dtype
    _check(out.to_numpy().astype(np.float64), want, dtype, k)


@pytest.mark.parametrize("name", NAMES)
def test_matmul_operator_every_layout(name):
    a = np.arange(6 * 5, dtype=np.float64).reshape(6, 5) / 10
    b = np.arange(5 * 7, dtype=np.float64).reshape(5, 7) / 10 - 1
    A = dmath.from_numpy(a, layout=CASES[name]((6, 5)))
    B = dmath.from_numpy(b, layout=CASES[name]((5, 7)))
    np.testing.assert_allclose((A @ B).to_numpy(), a @ b, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose((A @ A.T).to_numpy(), a @ a.T, rtol=1e-12, atol=1e-12)


def test_mixed_dtypes_promote():
    a = np.random.default_rng(0).random((8, 6))
    A = dmath.from_numpy(a, dtype="float16")
    B = dmath.from_numpy(a.T, dtype="float64", layout=dmath.ColBlock())
    C = A @ B
    assert C.dtype == "float64"
    ah = a.astype(np.float16).astype(np.float64)
    np.testing.assert_allclose(C.to_numpy(), ah @ a.T, rtol=1e-12)


def _data_bytes():
    return sum(s["data_bytes_recv"] for s in dmath.stats())


@pytest.mark.skipif(P == 1, reason="nothing moves with one worker")
def test_unchanged_operand_moves_nothing_twice():
    n = 64
    A = dmath.random.rand((n, n), layout=dmath.RowBlock())
    B = dmath.random.rand((n, n), layout=dmath.ColBlock())
    want = A.to_numpy().astype(np.float64) @ B.to_numpy()
    dmath.reset_stats()
    C1 = dmath.gemm(A, B, layout=dmath.RowBlock())
    first = _data_bytes()
    assert first > 0
    dmath.reset_stats()
    C2 = dmath.gemm(A, B, layout=dmath.RowBlock())
    assert _data_bytes() == 0
    assert sum(s["cache_hits"] for s in dmath.stats()) > 0
    np.testing.assert_allclose(C2.to_numpy(), C1.to_numpy(), rtol=0, atol=0)
    B += 1.0                               # a write: the cached copies are stale
    dmath.reset_stats()
    C3 = dmath.gemm(A, B, layout=dmath.RowBlock())
    assert _data_bytes() == first
    np.testing.assert_allclose(C3.to_numpy(), want + A.to_numpy().sum(axis=1, keepdims=True), rtol=1e-5)
    A *= 2.0                               # the other operand changes: B's copy is still good
    dmath.reset_stats()
    C4 = dmath.gemm(A, B, layout=dmath.RowBlock())
    assert _data_bytes() == 0
    np.testing.assert_allclose(C4.to_numpy(), 2 * C3.to_numpy(), rtol=1e-5)


@pytest.mark.skipif(P == 1, reason="nothing moves with one worker")
@pytest.mark.parametrize("wait", [True, False])
def test_replicate_then_gemm_moves_nothing(wait):
    A = dmath.random.rand((12, 9), layout=dmath.RowBlock())
    B = dmath.random.rand((9, 10), layout=dmath.ColBlock())
    assert B.replicate(wait=wait) is B
    dmath.reset_stats()
    C = dmath.gemm(A, B, layout=dmath.RowBlock())
    assert _data_bytes() == 0
    np.testing.assert_allclose(C.to_numpy(), A.to_numpy() @ B.to_numpy(), rtol=1e-5)
    assert "local" in dmath.explain_gemm(A, B, layout=dmath.RowBlock())


@pytest.mark.skipif(P == 1, reason="nothing moves with one worker")
@pytest.mark.parametrize("wait", [True, False])
def test_replicate_right_after_a_write_broadcasts_the_new_rows(wait):
    """Each worker copies its rows into the full copy before broadcasting them: on a GPU the broadcast
    runs on the side stream, ordered only after the compute work queued before it starts (large rows
    make a copy queued too late show: the peers would get the pool's old bytes)."""
    n = 4096 if dmath.device() == "gpu" else 48
    rng = np.random.default_rng(11)
    b = rng.uniform(-1, 1, (n, n)).astype(np.float32)
    a = rng.uniform(-1, 1, (2 * P, n)).astype(np.float32)
    A = dmath.from_numpy(a, layout=dmath.RowBlock())
    B = dmath.from_numpy(b, layout=dmath.RowBlock())
    for k in range(1, 4):
        B *= 2.0                            # a new version, written just before the replicate
        B.replicate(wait=wait)
        assert "local" in dmath.explain_gemm(A, B, layout=dmath.RowBlock())     # reads the replicated copy
        C = dmath.gemm(A, B, layout=dmath.RowBlock())
        np.testing.assert_allclose(C.to_numpy(), (a.astype(np.float64) @ b) * 2.0 ** k,
                                   rtol=1e-4, atol=1e-3 * 2.0 ** k, err_msg=f"step {k}")


def test_partial_inputs_and_outputs():
    a = np.random.default_rng(3).random((6, 8))
    b = np.random.default_rng(4).random((8, 5))
    A = dmath.from_numpy(a, layout=dmath.ColBlock())
    B = dmath.from_numpy(b, layout=dmath.RowBlock())
    C = A @ B                               # inner products: a Partial result, no communication
    if P > 1:
        assert C.layout.partial
    np.testing.assert_allclose(C.to_numpy(), a @ b, rtol=1e-6)
    D = C @ dmath.from_numpy(np.eye(5), layout=dmath.Replicated())
    np.testing.assert_allclose(D.to_numpy(), a @ b, rtol=1e-6)


def test_explain_names_strategy_and_bytes(capsys):
    A = dmath.random.rand((40, 30), layout=dmath.Block2D())
    B = dmath.random.rand((30, 20), layout=dmath.BlockCyclic((4, 4)))
    text = dmath.explain_gemm(A, B, layout=dmath.RowBlock())
    assert "strategy" in text and "bytes" in text and "expected" in text
    assert text in capsys.readouterr().out


def test_errors_raise_on_master_and_runtime_stays_usable():
    A = dmath.zeros((4, 3))
    B = dmath.zeros((4, 5))
    with pytest.raises(dmath.ShapeError):
        A @ B
    with pytest.raises(dmath.ShapeError):
        dmath.gemm(A, B, C=dmath.zeros((3, 3)), trans_a=True)
    with pytest.raises(dmath.DMathError):
        dmath.gemm(A, B, beta=1.0, trans_a=True)
    with pytest.raises(dmath.LayoutError):
        dmath.gemm(A, B, C=dmath.zeros((3, 5)), trans_a=True, layout=dmath.Replicated())
    with pytest.raises(dmath.DMathError):
        dmath.gemm(A, np.zeros((3, 2)))
    with pytest.raises(dmath.DMathError):
        dmath.gemm(A, B, trans_a="yes")
    with pytest.raises(TypeError):
        A @ np.zeros((3, 2))
    C = dmath.gemm(A, B, trans_a=True)
    assert C.shape == (3, 5) and float(C.sum()) == 0.0


@pytest.mark.parametrize("mkn", [(9, 7, 5), (16, 12, 3), (5, 17, 11), (2, 3, 13)])
@pytest.mark.parametrize("trans", [(False, False), (True, False), (False, True), (True, True)])
def test_every_strategy_kernel_is_correct(mkn, trans):
    """Each candidate strategy run as is (not only the cheapest), from RowBlock and BlockCyclic inputs."""
    from dmath.planning import gemm as gemm_plan
    from dmath.ops.base import dispatch
    from dmath.runtime import Meta
    m, k, n = mkn
    ta, tb = trans
    rng = np.random.default_rng(11)
    a = rng.uniform(-1, 1, (k, m) if ta else (m, k))
    b = rng.uniform(-1, 1, (n, k) if tb else (k, n))
    A = dmath.from_numpy(a, layout=dmath.RowBlock())
    B = dmath.from_numpy(b, layout=dmath.BlockCyclic((2, 3)))
    want = (a.T if ta else a) @ (b.T if tb else b)
    a_op = A.layout.transposed(P) if ta else A.layout
    b_op = B.layout.transposed(P) if tb else B.layout
    names = set()
    for s in gemm_plan.candidates(a_op, b_op, None, P, ((m, k), (k, n))):
        names.add(s.name)
        out = Meta(s.c, (m, n), "float64")
        C = dispatch("gemm", [A, B], [out], static=(s, s.c, ta, tb, False), scalars=(1.5, 0.0))[0][0]
        np.testing.assert_allclose(C.to_numpy(), 1.5 * want, rtol=1e-12, atol=1e-12, err_msg=str(s))
    assert {"local", "inner"} <= names
    if P >= 4:
        assert {"summa", "astat", "bstat"} <= names


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
@pytest.mark.parametrize("trans", [(False, False), (True, False), (False, True), (True, True)])
@pytest.mark.parametrize("m", [2, 37])
def test_local_product_one_library_call(dtype, trans, m):
    """The usual local product (row-split A times replicated B, operands as held) goes by the
    prepared one-call path (ops/gemm.py `_direct`), repeatedly, for every transposition and dtype;
    m = 2 leaves some workers without rows (they take the general path beside it)."""
    from dmath.runtime import runtime
    ta, tb = trans
    k, n = 24, 9
    rng = np.random.default_rng(17)
    a = rng.uniform(-1, 1, (k, m) if ta else (m, k)).astype(dtype)
    b = rng.uniform(-1, 1, (n, k) if tb else (k, n)).astype(dtype)
    # a transposed row-split operand is column-split as held: the strategy needs it row-split
    A = dmath.from_numpy(a, layout=dmath.ColBlock() if ta else dmath.RowBlock())
    B = dmath.from_numpy(b, layout=dmath.Replicated())
    want = (a.T if ta else a).astype(np.float64) @ (b.T if tb else b).astype(np.float64)
    assert "local" in dmath.explain_gemm(A, B, trans_a=ta, trans_b=tb)
    for alpha in (1.0, -0.5, 1.0):
        C = dmath.gemm(A, B, alpha=alpha, trans_a=ta, trans_b=tb)
        assert C.layout == dmath.RowBlock().resolved(P) and C.dtype == dtype
        _check(C.to_numpy().astype(np.float64), alpha * want, dtype, k)
    entry = next(e for sig, e in runtime().signatures.items()
                 if sig[0] == "gemm" and sig[2] == (A._meta, B._meta))
    # the master (worker 0) took the prepared path when it holds rows of the result
    assert (entry.cache["direct"] is not False) == (entry.out_dists[0].shard_shapes(0)[0][0] > 0)


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
@pytest.mark.parametrize("trans", [(False, False), (True, False), (False, True), (True, True)])
@pytest.mark.parametrize("size", ["one kernel", "heuristic's choice"])
def test_prepared_product_through_cublaslt(dtype, trans, size):
    """On a GPU a prepared product (`blas.Product`) runs through cuBLASLt with its algorithm chosen
    once: a small product as one kernel (k not split), a larger one by the heuristic's first choice.
    Both agree with cuBLAS's own call (DMATH_CUBLASLT=0's path) and with a float64 product; the
    pieces a worker holds go the same way through dmath.gemm at every worker count."""
    from dmath.gpu import blas, cublaslt
    from dmath.runtime import runtime
    ta, tb = trans
    m, k, n = (48, 24, 9) if size == "one kernel" else (256, 300, 256)
    assert (2 * m * k * n <= cublaslt.ONE_KERNEL_FLOPS) == (size == "one kernel")
    rng = np.random.default_rng(23)
    a = rng.uniform(-1, 1, (k, m) if ta else (m, k)).astype(dtype)
    b = rng.uniform(-1, 1, (n, k) if tb else (k, n)).astype(dtype)
    want = (a.T if ta else a).astype(np.float64) @ (b.T if tb else b).astype(np.float64)
    if dmath.device() == "gpu":
        import cupy
        da, db = cupy.asarray(a), cupy.asarray(b)
        lt = blas.product(da, db, dtype, ta, tb)
        plain = blas.product(da, db, dtype, ta, tb)
        plain.lt = False                                  # cuBLAS's GemmEx / Dgemm
        got_lt, got_plain = cupy.empty((m, n), dtype), cupy.empty((m, n), dtype)
        lt.run(da, db, got_lt, -0.5)
        plain.run(da, db, got_plain, -0.5)
        assert isinstance(lt.lt, cublaslt.Matmul)
        _check(cupy.asnumpy(got_lt).astype(np.float64), -0.5 * want, dtype, k)
        _check(cupy.asnumpy(got_lt).astype(np.float64), cupy.asnumpy(got_plain).astype(np.float64), dtype, k)
    # through dmath.gemm: every worker's piece of a row-split m x n product (P * m rows)
    a_all = np.concatenate([a] * P, axis=1 if ta else 0)
    A = dmath.from_numpy(a_all, layout=dmath.ColBlock() if ta else dmath.RowBlock())
    B = dmath.from_numpy(b, layout=dmath.Replicated())
    C = dmath.gemm(A, B, alpha=2.0, trans_a=ta, trans_b=tb)
    _check(C.to_numpy().astype(np.float64), 2.0 * np.concatenate([want] * P), dtype, k)
    entry = next(e for sig, e in runtime().signatures.items()
                 if sig[0] == "gemm" and sig[2] == (A._meta, B._meta))
    product = entry.cache["direct"][0]
    assert isinstance(product.lt, cublaslt.Matmul) if dmath.device() == "gpu" else product.args is None


def test_gemm_in_a_recorded_plan_replays_with_new_inputs():
    """A dense layer's step (a local product) recorded once, replayed on new inputs."""
    rng = np.random.default_rng(5)
    xv = rng.uniform(-1, 1, (64, 32)).astype(np.float32)
    wv = rng.uniform(-1, 1, (32, 16)).astype(np.float32)
    x = dmath.from_numpy(xv, layout=dmath.RowBlock())
    w = dmath.from_numpy(wv, layout=dmath.Replicated())
    y = dmath.zeros((64, 16), layout=dmath.RowBlock())
    with dmath.record() as plan:
        y.assign(dmath.tanh(x @ w))
    for _ in range(3):
        xv = rng.uniform(-1, 1, (64, 32)).astype(np.float32)
        x.assign(xv)
        plan.replay()
        np.testing.assert_allclose(y.to_numpy(), np.tanh(xv @ wv), rtol=1e-4, atol=1e-5)


def test_gemm_into_a_derived_matrix_is_refused():
    """C = X.T or a slice of X is a copy: a gemm into it would be lost, so it is refused (as set and
    assign are), and X is unchanged."""
    a = dmath.from_numpy(np.ones((4, 3)), dmath.RowBlock())
    b = dmath.from_numpy(np.ones((3, 4)), dmath.ColBlock())
    x = dmath.zeros((4, 4), layout=dmath.RowBlock())
    for c in (x.T, x[0:4, 0:4], x[1:3]):
        with pytest.raises(dmath.NotSupportedError, match="gemm into C"):
            dmath.gemm(a if c.shape[0] == 4 else a[0:2], b, C=c, beta=1.0)
    np.testing.assert_array_equal(x.to_numpy(), np.zeros((4, 4)))
    dmath.gemm(a, b, C=x)
    np.testing.assert_array_equal(x.to_numpy(), np.full((4, 4), 3.0))


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


@pytest.mark.parametrize("want_block", [(64, 64), (128, 128), (32, 96)])
@pytest.mark.parametrize("grid", ["row", "col"])
def test_products_large_enough_for_summa_into_another_block(want_block, grid):
    # the shapes above are too small for the cost model to pick SUMMA; at these it does, and a wanted
    # BlockCyclic result whose block differs from the operands' once came out wrong (2 workers)
    from dmath.layout import BlockCyclic
    g = (1, P) if grid == "row" else (P, 1)
    rng = np.random.default_rng(11)
    a, b = rng.standard_normal((1024, 511)), rng.standard_normal((1024, 511))
    A = dmath.from_numpy(a, layout=BlockCyclic((128, 128), grid=g))
    B = dmath.from_numpy(b, layout=BlockCyclic((128, 128), grid=g))
    want = BlockCyclic(want_block, grid=g)
    _check(dmath.gemm(A, B, trans_a=True, layout=want).to_numpy(), a.T @ b, "float64", 1024)
    _check(dmath.gemm(A, B, trans_b=True, layout=want).to_numpy(), a @ b.T, "float64", 511)
    _check(dmath.gemm(A.T, A, layout=want).to_numpy(), a.T @ a, "float64", 1024)
