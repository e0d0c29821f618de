"""dmath.linalg eigenvalues, singular values, Lanczos, randomized SVD, CG and norms against NumPy
(float64 oracles), in several input layouts, float32 and float64."""
import numpy as np
import pytest

import dmath
from dmath import linalg as la

from _cases import layout, make

P = dmath.num_workers()
EPS = {"float32": 2e-5, "float64": 1e-12}


def _sym(n, seed):
    x = np.random.default_rng(seed).standard_normal((n, n))
    return (x + x.T) / 2


def _spd(n, seed):
    x = np.random.default_rng(seed).standard_normal((n, n))
    return x @ x.T + n * np.eye(n)


def _decaying(shape, seed):
    """A matrix with singular values 2^-i (well separated: randomized methods converge fast)."""
    m, n = shape
    k = min(m, n)
    rng = np.random.default_rng(seed)
    u, _ = np.linalg.qr(rng.standard_normal((m, k)))
    v, _ = np.linalg.qr(rng.standard_normal((n, k)))
    return (u * 2.0 ** -np.arange(k)) @ v.T


@pytest.mark.parametrize("name", ["row_all_last", "bc23", "tiles", "partial", "row_g_last"])
@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_eigh(name, dtype):
    n = 21
    S = _sym(n, 1)
    A = make(S, layout(name, (n, n), P), dtype)
    s = S.astype(dtype).astype(np.float64)
    w, V = la.eigh(A)
    assert isinstance(w, np.ndarray) and isinstance(V, dmath.Matrix) and V.dtype == dtype
    np.testing.assert_allclose(w, np.linalg.eigvalsh(s), rtol=10 * EPS[dtype], atol=10 * EPS[dtype])
    v = V.to_numpy().astype(np.float64)
    assert np.abs(v.T @ v - np.eye(n)).max() < 10 * EPS[dtype]
    assert np.abs(s @ v - v * w).max() < 100 * EPS[dtype]
    np.testing.assert_allclose(la.eigvalsh(A), w, rtol=10 * EPS[dtype], atol=10 * EPS[dtype])
    _, V2 = la.eigh(A, layout=dmath.BlockCyclic((4, 4)))
    assert V2.layout == dmath.BlockCyclic((4, 4)).resolved(P)


@pytest.mark.parametrize("shape", [(40, 7), (7, 40), (15, 15), (20, 12)], ids=["tall", "wide", "square", "near"])
@pytest.mark.parametrize("name", ["row", "bc23", "col_uneven"])
@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_svd(shape, name, dtype):
    G = np.random.default_rng(2).standard_normal(shape)
    A = make(G, layout(name, shape, P), dtype)
    g = G.astype(dtype).astype(np.float64)
    s_ref = np.linalg.svd(g, compute_uv=False)
    U, s, Vh = la.svd(A)
    k = min(shape)
    assert U.shape == (shape[0], k) and Vh.shape == (k, shape[1]) and s.shape == (k,)
    np.testing.assert_allclose(s, s_ref, rtol=10 * EPS[dtype], atol=10 * EPS[dtype])
    u, vh = U.to_numpy().astype(np.float64), Vh.to_numpy().astype(np.float64)
    assert np.abs(u.T @ u - np.eye(k)).max() < 10 * EPS[dtype]
    assert np.abs(vh @ vh.T - np.eye(k)).max() < 10 * EPS[dtype]
    assert np.linalg.norm((u * s) @ vh - g) < 10 * EPS[dtype] * np.linalg.norm(g)
    np.testing.assert_allclose(la.svdvals(A), s_ref, rtol=10 * EPS[dtype], atol=10 * EPS[dtype])


def test_svd_full_matrices():
    G = np.random.default_rng(3).standard_normal((12, 5))
    U, s, Vh = la.svd(make(G, layout("bc23", G.shape, P), "float64"), full_matrices=True)
    assert U.shape == (12, 12) and Vh.shape == (5, 5)
    u, vh = U.to_numpy(), Vh.to_numpy()
    assert np.abs(u.T @ u - np.eye(12)).max() < 1e-12
    np.testing.assert_allclose((u[:, :5] * s) @ vh, G, atol=1e-12)


def test_svd_of_ill_conditioned_keeps_small_values():
    """No A^T A: singular values down to 1e-12 of the largest come out with relative accuracy."""
    m, n = 50, 6
    rng = np.random.default_rng(4)
    u, _ = np.linalg.qr(rng.standard_normal((m, n)))
    v, _ = np.linalg.qr(rng.standard_normal((n, n)))
    sv = np.logspace(0, -12, n)
    G = (u * sv) @ v.T
    s = la.svdvals(dmath.from_numpy(G, dtype="float64"))
    np.testing.assert_allclose(s, sv, rtol=1e-3)


@pytest.mark.parametrize("which", ["LM", "LA", "SA"])
@pytest.mark.parametrize("name", ["row", "bc23", "row_all_last"])
@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_eigsh(which, name, dtype):
    n, k = 60, 4
    rng = np.random.default_rng(5)
    q, _ = np.linalg.qr(rng.standard_normal((n, n)))
    lam = np.concatenate([-np.logspace(2, 0, n // 2), np.logspace(0, 1.5, n - n // 2)])   # spread, both signs
    S = (q * lam) @ q.T
    S = (S + S.T) / 2
    A = make(S, layout(name, (n, n), P), dtype)
    w, V = la.eigsh(A, k=k, which=which)
    ref = np.linalg.eigvalsh(S.astype(dtype).astype(np.float64))
    want = {"LA": ref[-k:], "SA": ref[:k], "LM": np.sort(ref[np.argsort(np.abs(ref))[-k:]])}[which]
    np.testing.assert_allclose(w, want, rtol=1e3 * EPS[dtype], atol=1e3 * EPS[dtype])
    v = V.to_numpy().astype(np.float64)
    assert V.shape == (n, k)
    assert np.abs(S @ v - v * w).max() < 1e4 * EPS[dtype] * np.abs(lam).max()


def test_eigsh_not_converged_raises():
    S = _sym(40, 6)
    with pytest.raises(dmath.LinAlgError, match="did not converge"):
        la.eigsh(dmath.from_numpy(S, dtype="float64"), k=3, maxiter=4, tol=1e-14)


@pytest.mark.parametrize("scale", [1.0, 1e-17, 1e-20, 1e15, 1e-300, 1e-160, 1e160, 1e300])
@pytest.mark.parametrize("which", ["LM", "LA", "SA"])
def test_eigsh_of_a_matrix_of_any_scale(which, scale):
    """A matrix whose norm is below eps was taken for an invariant subspace at every step (the test
    compared beta with eps * max(|theta|, 1)): "converged" pairs 84-99% off. Eigenpairs scale with A.
    Past 1e+-154 the squares of the recurrence's vectors under- or overflowed: a beta of 0 returned
    random Ritz values as converged (1e-300), an inf a false "NaN or inf" error (1e300)."""
    S = _sym(40, 12) * scale
    w, V = la.eigsh(dmath.from_numpy(S, dtype="float64"), k=3, which=which)
    ref = np.linalg.eigvalsh(S)
    want = {"LA": ref[-3:], "SA": ref[:3], "LM": np.sort(ref[np.argsort(np.abs(ref))[-3:]])}[which]
    np.testing.assert_allclose(w, want, rtol=1e-9, atol=1e-9 * np.abs(ref).max())
    v = V.to_numpy()
    assert np.abs(S @ v - v * w).max() < 1e-8 * np.abs(ref).max()


@pytest.mark.parametrize("scale", [1e-30, 1e-20, 1e20, 1e30])
def test_eigsh_float32_of_a_small_or_large_norm(scale):
    S = (_spd(24, 5) * scale).astype(np.float32)
    w, _ = la.eigsh(dmath.from_numpy(S), k=2, which="LA")
    ref = np.linalg.eigvalsh(S.astype(np.float64))
    np.testing.assert_allclose(w, ref[-2:], rtol=1e-4)


def test_eigsh_refuses_a_negative_seed_on_the_master():
    """NumPy's generators take no negative seed: it killed a worker (and the runtime) before. The
    refusal leaves the runtime usable, and any non-negative seed gives the eigenvalues."""
    S = _sym(10, 3)
    A = dmath.from_numpy(S, dtype="float64")
    with pytest.raises(dmath.DMathError, match="seed must be a non-negative integer"):
        la.eigsh(A, k=2, seed=-1)
    w, _ = la.eigsh(A, k=2, which="LA", seed=2**40)
    np.testing.assert_allclose(w, np.linalg.eigvalsh(S)[-2:], rtol=1e-10)


@pytest.mark.parametrize("shape", [(50, 30), (30, 50)], ids=["tall", "wide"])
@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_svds(shape, dtype):
    G = _decaying(shape, 7)
    A = make(G, layout("bc23", shape, P), dtype)
    k = 4
    U, s, Vh = la.svds(A, k=k, n_iter=3)
    np.testing.assert_allclose(s, np.linalg.svd(G, compute_uv=False)[:k], rtol=100 * EPS[dtype],
                               atol=100 * EPS[dtype])
    u, vh = U.to_numpy().astype(np.float64), Vh.to_numpy().astype(np.float64)
    assert U.shape == (shape[0], k) and Vh.shape == (k, shape[1])
    assert np.abs(u.T @ u - np.eye(k)).max() < 100 * EPS[dtype]
    ref_u, _, ref_vh = np.linalg.svd(G)
    # each singular vector matches up to its sign
    np.testing.assert_allclose(np.abs(np.sum(u * ref_u[:, :k], axis=0)), 1, atol=1e3 * EPS[dtype])


@pytest.mark.parametrize("name", ["row", "bc23", "col_uneven"])
@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_cg(name, dtype):
    n = 40
    S = _spd(n, 8)
    bv = np.random.default_rng(9).standard_normal((n, 1))
    A = make(S, layout(name, (n, n), P), dtype)
    b = make(bv, layout("row_all_last", (n, 1), P), dtype)
    tol = 1e-10 if dtype == "float64" else 1e-5
    x, info = la.cg(A, b, tol=tol)
    assert info == 0 and x.shape == (n, 1) and x.layout == b.layout
    ref = np.linalg.solve(S, bv)
    np.testing.assert_allclose(x.to_numpy(), ref, rtol=100 * tol, atol=100 * tol * np.abs(ref).max())
    # a callable operator and a start vector give the same solution
    seen = []
    x2, info2 = la.cg(lambda p: A @ p, b, x0=dmath.ones((n, 1), dtype=dtype), tol=tol,
                      callback=lambda xk: seen.append(1))
    assert info2 == 0 and seen
    np.testing.assert_allclose(x2.to_numpy(), ref, rtol=100 * tol, atol=100 * tol * np.abs(ref).max())


def test_cg_maxiter_and_indefinite():
    n = 30
    S = _spd(n, 10)
    b = dmath.from_numpy(np.ones((n, 1)), dtype="float64")
    x, info = la.cg(dmath.from_numpy(S, dtype="float64"), b, tol=1e-14, maxiter=2)
    assert info == 2
    with pytest.raises(dmath.LinAlgError, match="not positive definite"):
        la.cg(dmath.from_numpy(-S, dtype="float64"), b)


def test_cg_promotes_to_the_operands_result_type():
    """A float64 A with a float32 b ran in float32 and called a float32 residual converged at
    tol=1e-12: x is float64 (NumPy's result type, as solve's), and solves to float64 accuracy."""
    n = 30
    S, bv = _spd(n, 14), np.random.default_rng(15).standard_normal((n, 1))
    x, info = la.cg(dmath.from_numpy(S, dtype="float64"), dmath.from_numpy(bv, dtype="float32"), tol=1e-12)
    assert info == 0 and x.dtype == np.float64
    want = np.linalg.solve(S, bv.astype(np.float32).astype(np.float64))
    np.testing.assert_allclose(x.to_numpy(), want, rtol=1e-9, atol=1e-9 * np.abs(want).max())


@pytest.mark.parametrize("scale", [1e-170, 1e-300, 1e170, 1e300])
def test_cg_with_a_right_hand_side_of_extreme_size(scale):
    """||b||^2 underflowed: x = 0 came back "converged". The solve is linear in b: x scales with it."""
    n = 20
    S, bv = _spd(n, 16), np.random.default_rng(17).standard_normal((n, 1))
    seen = []
    x, info = la.cg(dmath.from_numpy(S, dtype="float64"), dmath.from_numpy(bv * scale, dtype="float64"),
                    tol=1e-10, callback=lambda xk: seen.append(float(abs(xk).max())))
    want = np.linalg.solve(S, bv) * scale
    assert info == 0
    np.testing.assert_allclose(x.to_numpy(), want, rtol=1e-8, atol=1e-8 * np.abs(want).max())
    assert seen and 0.1 < seen[-1] / np.abs(want).max() < 10     # the callback sees the user's x


def test_cg_sums_a_partial_right_hand_side():
    n = 16
    S, bv = _spd(n, 18), np.random.default_rng(19).standard_normal((n, 1))
    b = make(bv, layout("partial", (n, 1), P), "float64")
    x, info = la.cg(dmath.from_numpy(S, dtype="float64"), b, tol=1e-12)
    assert info == 0
    np.testing.assert_allclose(x.to_numpy(), np.linalg.solve(S, bv), rtol=1e-9, atol=1e-10)


def test_cg_checks_maxiter():
    b = dmath.from_numpy(np.ones((4, 1)))
    for bad in (0, -3):
        with pytest.raises(dmath.DMathError, match="maxiter must be a positive integer"):
            la.cg(dmath.from_numpy(_spd(4, 1)), b, maxiter=bad)


def test_linalg_calls_inside_cgs_operator_and_callback_check_their_inputs():
    """The operator and the callback are the user's code: a linalg call there checks for NaN/inf as
    at top level (inside cg, solve(A holding inf) returned finite garbage)."""
    n = 6
    S = _spd(n, 20)
    bad = S.copy()
    bad[2, 3] = np.inf
    B = dmath.from_numpy(bad)
    b = dmath.from_numpy(np.ones((n, 1)))
    A = dmath.from_numpy(S)

    def operator(p):
        la.solve(B, p)
        return A @ p
    with pytest.raises(dmath.LinAlgError, match="NaN or inf"):
        la.cg(operator, b)
    with pytest.raises(dmath.LinAlgError, match="NaN or inf"):
        la.cg(A, b, callback=lambda xk: la.inv(B))
    x, info = la.cg(A, b, tol=1e-12)                  # the runtime goes on
    assert info == 0


@pytest.mark.parametrize("ord", [None, "fro", "nuc", 1, -1, 2, -2, np.inf, -np.inf])
@pytest.mark.parametrize("name", ["bc23", "partial", "tiles"])
def test_norm(ord, name):
    G = np.random.default_rng(11).standard_normal((13, 9))
    A = make(G, layout(name, G.shape, P), "float64")
    np.testing.assert_allclose(la.norm(A, ord), np.linalg.norm(G, ord), rtol=1e-12)


@pytest.mark.parametrize("scale", [1e-300, 1e-160, 1e160, 1e300])
@pytest.mark.parametrize("name", ["col_uneven", "bc23", "rep", "partial"])
def test_frobenius_norm_neither_underflows_nor_overflows(scale, name):
    """Summed as plain squares, the Frobenius norm of 1e-300s was 0 and of 1e300s inf, below the
    2-norm that svdvals gives (NumPy's norm does the same); now scaled where the squares leave float64."""
    G = np.random.default_rng(12).standard_normal((13, 9))
    A = make(G * scale, layout(name, G.shape, P), "float64")
    want = np.linalg.norm(G) * scale
    np.testing.assert_allclose(la.norm(A, "fro"), want, rtol=1e-13)
    np.testing.assert_allclose(A.norm(), want, rtol=1e-13)
    assert la.norm(A, "fro") >= la.norm(A, 2)
    assert la.norm(make(np.full((3, 2), 1.5e308), layout(name, (3, 2), P), "float64"), "fro") == np.inf
    assert la.norm(make(np.zeros((3, 2)), layout(name, (3, 2), P), "float64"), "fro") == 0.0
