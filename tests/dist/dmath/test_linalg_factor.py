"""dmath.linalg factorizations and solvers against NumPy/SciPy (float64 oracles), in many input
layouts (BlockCyclic, uneven RowBlock, Partial, Tiles, groups), float32 and float64, several block
widths (one panel, many panels, a last panel narrower than the others). The oracles are NumPy's
(SciPy may be missing where the GPU path runs)."""
import numpy as np
import pytest
import dmath
from dmath import linalg as la

from _cases import layout, make

P = dmath.num_workers()
LAYOUTS = ["row", "col", "row_all_last", "col_uneven", "b2d", "bc23", "bc_grid", "tiles", "partial", "rep",
           "row_g_last"]
#: residual bounds relative to the norms involved, per dtype
EPS = {"float32": 2e-5, "float64": 1e-12}


def _spd(n, seed):
    x = np.random.default_rng(seed).standard_normal((n, n))
    return x @ x.T + n * np.eye(n)


def _general(shape, seed):
    return np.random.default_rng(seed).standard_normal(shape)


def _input(shape, seed, name, dtype):
    """A random general matrix in layout `name` and dtype, and its values as float64 (the oracle's)."""
    G = _general(shape, seed)
    return make(G, layout(name, shape, P), dtype), G.astype(dtype).astype(np.float64)


def _lu_ref(a):
    """U of LAPACK's LU with partial pivoting (the row of largest magnitude, first on ties), in
    float64: the oracle of the pivots."""
    u = a.copy()
    m, n = u.shape
    for j in range(min(m, n)):
        p = j + int(np.argmax(np.abs(u[j:, j])))
        u[[j, p]] = u[[p, j]]
        if u[j, j] != 0:
            u[j + 1:, j] /= u[j, j]
            u[j + 1:, j + 1:] -= np.outer(u[j + 1:, j], u[j, j + 1:])
    return np.triu(u)[:min(m, n)]


def _tri_solve(T, B, lower, trans=0, unit=False):
    """op(T) X = B by NumPy for the triangle of T that `lower` names (SciPy's solve_triangular)."""
    M = np.tril(T) if lower else np.triu(T)
    if unit:
        np.fill_diagonal(M, 1.0)
    return np.linalg.solve(M.T if trans in (1, 2, "T", "C") else M, B)


def _rel(a, b):
    return np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-300)


@pytest.mark.parametrize("name", LAYOUTS)
@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_cholesky(name, dtype):
    n = 23
    S = _spd(n, 1)
    A = make(S, layout(name, (n, n), P), dtype)
    for block in (None, 4, 7):
        L = la.cholesky(A, block=block)
        assert L.shape == (n, n) and L.dtype == dtype
        l = L.to_numpy().astype(np.float64)
        assert np.all(np.triu(l, 1) == 0)
        assert _rel(l @ l.T, S) < EPS[dtype]
        assert _rel(l, np.linalg.cholesky(S)) < 10 * EPS[dtype]
    U = la.cholesky(A, lower=False, block=5, layout=dmath.RowBlock()).to_numpy().astype(np.float64)
    assert np.all(np.tril(U, -1) == 0) and _rel(U.T @ U, S) < EPS[dtype]


def test_cholesky_reads_lower_triangle_only():
    n = 17
    S = _spd(n, 2)
    junk = np.tril(S) + np.triu(np.full((n, n), 1e6), 1)
    L = la.cholesky(dmath.from_numpy(junk, dtype="float64"), block=4).to_numpy()
    np.testing.assert_allclose(L, np.linalg.cholesky(S), rtol=1e-12, atol=1e-12)


def test_the_upper_cholesky_factor_is_a_writable_matrix():
    """U = L^T was returned as a transpose, which refused in-place writes naming an 'A.T' the user
    never wrote; it is the user's own matrix, as the lower factor is."""
    n = 9
    S = _spd(n, 4)
    for layout_ in (None, dmath.RowBlock()):
        U = la.cholesky(dmath.from_numpy(S, dtype="float64"), lower=False, block=4, layout=layout_)
        U *= 2.0
        U[0, 0] = 1.0
        want = 2.0 * np.linalg.cholesky(S).T
        want[0, 0] = 1.0
        np.testing.assert_allclose(U.to_numpy(), want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("order", [1, 6, 9, 17])
def test_cholesky_not_positive_definite_names_the_minor(order):
    n = 17
    S = _spd(n, 3)
    S[order - 1, order - 1] = -abs(S[order - 1, order - 1])     # minors of order < `order` stay definite
    with pytest.raises(dmath.LinAlgError, match=f"leading minor of order {order} "):
        la.cholesky(dmath.from_numpy(S, dtype="float64"), block=4)
    assert la.cholesky(dmath.from_numpy(_spd(5, 1))).shape == (5, 5)      # still usable


@pytest.mark.parametrize("shape", [(21, 21), (30, 13), (13, 30)], ids=["square", "tall", "wide"])
@pytest.mark.parametrize("name", ["row_all_last", "bc23", "col", "tiles"])
@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_lu(shape, name, dtype):
    A, g = _input(shape, 4, name, dtype)
    u_ref = _lu_ref(g)
    for block in (None, 4):
        perm, L, U = la.lu(A, block=block)
        k = min(shape)
        assert isinstance(perm, np.ndarray) and perm.dtype.kind == "i" and sorted(perm) == list(range(shape[0]))
        assert L.shape == (shape[0], k) and U.shape == (k, shape[1])
        l, u = L.to_numpy().astype(np.float64), U.to_numpy().astype(np.float64)
        assert np.all(np.triu(l, 1) == 0) and np.all(np.diag(l) == 1) and np.all(np.tril(u, -1) == 0)
        assert np.abs(l).max() <= 1 + 1e-6                      # partial pivoting
        assert _rel(l @ u, g[perm]) < EPS[dtype]
        assert _rel(u, u_ref) < 1e3 * EPS[dtype]                 # the same pivots as LAPACK's


@pytest.mark.parametrize("name", ["row", "bc23", "partial", "row_g_last"])
@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("assume_a", ["gen", "pos"])
def test_solve(name, dtype, assume_a):
    n = 19
    M = _spd(n, 5) if assume_a == "pos" else _general((n, n), 5) + 4 * np.eye(n)
    Bv = _general((n, 3), 6)
    A = make(M, layout(name, (n, n), P), dtype)
    B = make(Bv, layout("col_uneven", (n, 3), P), dtype)
    X = la.solve(A, B, assume_a=assume_a, block=4)
    assert X.shape == (n, 3) and X.dtype == dtype
    np.testing.assert_allclose(X.to_numpy(), np.linalg.solve(M, Bv), rtol=50 * EPS[dtype], atol=50 * EPS[dtype])
    x1 = la.solve(A, B[:, 1:2], assume_a=assume_a, layout=dmath.Replicated())
    assert x1.layout == dmath.Replicated().resolved(P)
    np.testing.assert_allclose(x1.to_numpy()[:, 0], np.linalg.solve(M, Bv[:, 1]), rtol=50 * EPS[dtype],
                               atol=50 * EPS[dtype])


def test_solve_singular_names_the_pivot():
    n = 12
    M = _general((n, n), 7)
    M[:, 5] = 0.0           # column 5 stays zero through the elimination: U[5, 5] == 0 exactly
    A = dmath.from_numpy(M, dtype="float64")
    with pytest.raises(dmath.LinAlgError, match=r"singular.*\[5, 5\].*pivot 5"):
        la.solve(A, dmath.ones((n, 1), dtype="float64"), block=4)
    with pytest.raises(dmath.LinAlgError, match="pivot 5"):
        la.inv(A)
    assert la.det(A) == 0.0
    assert la.slogdet(A) == (0.0, -np.inf)


@pytest.mark.parametrize("name", ["row", "bc23", "tiles"])
@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_inv_det_slogdet(name, dtype):
    n = 16
    M = _general((n, n), 8) + 2 * np.eye(n)
    A = make(M, layout(name, (n, n), P), dtype)
    m = M.astype(dtype).astype(np.float64)
    np.testing.assert_allclose(la.inv(A, block=5).to_numpy(), np.linalg.inv(m), rtol=100 * EPS[dtype],
                               atol=100 * EPS[dtype])
    np.testing.assert_allclose(la.det(A, block=3), np.linalg.det(m), rtol=100 * EPS[dtype])
    sign, logdet = la.slogdet(A)
    ref = np.linalg.slogdet(m)
    assert sign == ref[0]
    np.testing.assert_allclose(logdet, ref[1], rtol=100 * EPS[dtype])


@pytest.mark.parametrize("lower", [True, False])
@pytest.mark.parametrize("trans", [0, 1, "T"])
@pytest.mark.parametrize("unit", [False, True])
@pytest.mark.parametrize("name", ["row_all_last", "bc23"])
def test_solve_triangular(lower, trans, unit, name):
    n = 18
    T = _general((n, n), 9) + n * np.eye(n)
    Bv = _general((n, 4), 10)
    A = make(T, layout(name, (n, n), P), "float64")
    B = make(Bv, layout("bc_grid", (n, 4), P), "float64")
    for block in (None, 4):
        X = la.solve_triangular(A, B, lower=lower, trans=trans, unit_diagonal=unit, block=block)
        ref = _tri_solve(T, Bv, lower, trans, unit)
        np.testing.assert_allclose(X.to_numpy(), ref, rtol=1e-11, atol=1e-11)


def test_solve_triangular_singular_and_float32():
    n = 9
    T = np.triu(_general((n, n), 11)) + n * np.eye(n)
    T[4, 4] = 0.0
    with pytest.raises(dmath.LinAlgError, match=r"\[4, 4\] is zero"):
        la.solve_triangular(dmath.from_numpy(T), dmath.ones((n, 2)), lower=False)
    T[4, 4] = 3.0
    X = la.solve_triangular(dmath.from_numpy(T, dtype="float32"), dmath.ones((n, 2), dtype="float32"),
                            block=2)
    assert X.dtype == "float32"
    np.testing.assert_allclose(X.to_numpy(), _tri_solve(T, np.ones((n, 2)), False), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("lower", [True, False])
def test_cho_solve(lower):
    n = 20
    S = _spd(n, 12)
    Bv = _general((n, 2), 13)
    A = make(S, layout("bc23", (n, n), P), "float64")
    c = la.cholesky(A, lower=lower, block=6)
    X = la.cho_solve((c, lower), make(Bv, layout("row", (n, 2), P), "float64"), block=6)
    np.testing.assert_allclose(X.to_numpy(), np.linalg.solve(S, Bv), rtol=1e-11, atol=1e-11)
    # a factor in another layout and block width is remapped first
    X = la.cho_solve((c.remap(dmath.Block2D()), lower), make(Bv, dmath.RowBlock(), "float64"), block=4)
    np.testing.assert_allclose(X.to_numpy(), np.linalg.solve(S, Bv), rtol=1e-11, atol=1e-11)


def _ill_conditioned(shape, seed, cond):
    m, n = shape
    k = min(m, n)
    rng = np.random.default_rng(seed)
    u, _ = np.linalg.qr(rng.standard_normal((m, k)))
    v, _ = np.linalg.qr(rng.standard_normal((n, k)))
    return (u * np.logspace(0, -np.log10(cond), k)) @ v.T


@pytest.mark.parametrize("shape", [(40, 5), (24, 24), (14, 31), (7 * P + 3, 7)],
                         ids=["tall", "square", "wide", "tsqr_edge"])
@pytest.mark.parametrize("name", ["row_all_last", "bc23", "tiles", "partial"])
@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_qr(shape, name, dtype):
    A, g = _input(shape, 14, name, dtype)
    k = min(shape)
    r_ref = np.linalg.qr(g, mode="r")
    for block in (None, 4):          # None: TSQR where it fits; a block: the Householder panels
        Q, R = la.qr(A, block=block)
        assert Q.shape == (shape[0], k) and R.shape == (k, shape[1])
        q, r = Q.to_numpy().astype(np.float64), R.to_numpy().astype(np.float64)
        assert np.all(np.tril(r, -1) == 0)
        assert np.abs(q.T @ q - np.eye(k)).max() < 10 * EPS[dtype]
        assert _rel(q @ r, g) < 10 * EPS[dtype]
        np.testing.assert_allclose(np.abs(np.diag(r)), np.abs(np.diag(r_ref)), rtol=100 * EPS[dtype],
                                   atol=100 * EPS[dtype])
        R_only = la.qr(A, mode="r", block=block).to_numpy().astype(np.float64)
        np.testing.assert_allclose(np.abs(R_only), np.abs(r), rtol=100 * EPS[dtype], atol=100 * EPS[dtype])


@pytest.mark.parametrize("shape", [(60, 6), (30, 30)], ids=["tsqr", "householder"])
def test_qr_orthonormal_for_ill_conditioned(shape):
    G = _ill_conditioned(shape, 15, 1e14)
    Q, R = la.qr(dmath.from_numpy(G, layout=dmath.BlockCyclic((5, 3)), dtype="float64"))
    q, r = Q.to_numpy(), R.to_numpy()
    k = min(shape)
    assert np.abs(q.T @ q - np.eye(k)).max() < 1e-13
    assert np.linalg.norm(q @ r - G) < 1e-13 * np.linalg.norm(G)


@pytest.mark.parametrize("shape", [(40, 6), (9, 9), (6, 25)], ids=["over", "square", "under"])
@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_lstsq(shape, dtype):
    G = _general(shape, 16)
    Bv = _general((shape[0], 2), 17)
    A = make(G, layout("bc23", shape, P), dtype)
    B = make(Bv, layout("row_all_last", (shape[0], 2), P), dtype)
    X, res, rank, s = la.lstsq(A, B)
    g, b = G.astype(dtype).astype(np.float64), Bv.astype(dtype).astype(np.float64)
    x_ref, res_ref, rank_ref, s_ref = np.linalg.lstsq(g, b, rcond=None)
    np.testing.assert_allclose(X.to_numpy(), x_ref, rtol=1e3 * EPS[dtype], atol=1e3 * EPS[dtype])
    assert rank == rank_ref
    np.testing.assert_allclose(s, s_ref, rtol=100 * EPS[dtype])
    np.testing.assert_allclose(res, res_ref, rtol=1e3 * EPS[dtype], atol=1e3 * EPS[dtype])


def test_lstsq_rank_deficient():
    G = _general((20, 4), 18)
    G[:, 3] = G[:, 0] + G[:, 1]
    with pytest.raises(dmath.LinAlgError, match="rank 3 < 4"):
        la.lstsq(dmath.from_numpy(G, dtype="float64"), dmath.ones((20, 1), dtype="float64"))


def test_results_stay_on_the_workers():
    """Nothing of size n^2 goes to the master: the bytes the master receives from workers are
    those of the small results only (pivots, diagonals), whatever the matrix size."""
    n = 64
    A = dmath.from_numpy(_general((n, n), 19) + 8 * np.eye(n), dtype="float64", layout=dmath.RowBlock())
    B = dmath.ones((n, 2), dtype="float64")
    dmath.reset_stats()
    X = la.solve(A, B, block=16)
    L = la.cholesky(A @ A.T, block=16)
    received = dmath.stats()[0]["data_bytes_recv"]
    # worker 0's share of the panel broadcasts is what it receives: at most the whole matrix once
    # per factorization (three here, with the triangular solve), never a gather of everything
    assert received <= 4 * n * n * 8
    assert X.shape == (n, 2) and L.shape == (n, n)


def test_qr_with_identity_reflectors():
    """Columns already zero below the diagonal give tau = 0 (a reflector that is the identity),
    where the closed form of the block reflector has no inverse: the recurrence takes over."""
    G = _general((20, 12), 20)
    G[1:, 0] = 0.0
    G[6:, 5] = 0.0
    for M in (G, np.triu(G), np.eye(20, 12)):
        Q, R = la.qr(dmath.from_numpy(M, dtype="float64"), block=4)
        q, r = Q.to_numpy(), R.to_numpy()
        assert np.abs(q.T @ q - np.eye(12)).max() < 1e-14
        assert np.abs(q @ r - M).max() < 1e-13


@pytest.mark.parametrize("assume_a", ["gen", "pos"])
def test_solve_mixed_dtypes(assume_a):
    """float32 A with float64 B: computed in float64 (NumPy's result type) from A's float32 values."""
    n = 10
    M = _spd(n, 21)
    Bv = _general((n, 2), 22)
    X = la.solve(dmath.from_numpy(M, dtype="float32"), dmath.from_numpy(Bv, dtype="float64"), assume_a=assume_a)
    assert X.dtype == "float64"
    np.testing.assert_allclose(X.to_numpy(), np.linalg.solve(M.astype(np.float32).astype(np.float64), Bv),
                               rtol=1e-12, atol=1e-12)
