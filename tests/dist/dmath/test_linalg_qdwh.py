"""dmath.linalg's distributed eigh / eigvalsh / svd / svdvals (method='qdwh': QDWH spectral divide
and conquer) against NumPy (float64 oracles), with a small leaf size so that the recursion really
splits: spectra well separated, clustered, repeated, rank deficient, all equal; uneven RowBlock and
BlockCyclic inputs; float32 and float64; tall, wide and square SVDs."""
import numpy as np
import pytest

import dmath
from dmath import linalg as la
from dmath.linalg import qdwh, spectral

from _cases import layout, make

P = dmath.num_workers()
LEAF = 6


def _tol(dtype, n):
    """The bound on residuals and orthogonality: a small multiple of n eps (LAPACK's own)."""
    return 10 * n * float(np.finfo(dtype).eps)


def _with_spectrum(ev, seed):
    q, _ = np.linalg.qr(np.random.default_rng(seed).standard_normal((len(ev), len(ev))))
    s = (q * np.asarray(ev, dtype=np.float64)) @ q.T
    return (s + s.T) / 2


def _spectra(n):
    rng = np.random.default_rng(7)
    x = rng.standard_normal((n, n))
    return {
        "random": (x + x.T) / 2,
        "clustered": _with_spectrum(np.repeat([-3.0, 0.5, 4.0], [n // 3, n // 3, n - 2 * (n // 3)])
                                    + 1e-9 * rng.standard_normal(n), 1),
        "repeated": _with_spectrum(np.r_[np.full(n // 2, 2.0), np.linspace(-1, 1, n - n // 2)], 2),
        "rank_deficient": _with_spectrum(np.r_[np.zeros(n - 5), rng.standard_normal(5)], 3),
        "all_equal": _with_spectrum(np.full(n, -1.5), 4),
        "diagonal": np.diag(rng.permutation(np.arange(n, dtype=np.float64))),
    }


def _check_eigh(S, A, dtype, fn_kwargs):
    n = S.shape[0]
    s = S.astype(dtype).astype(np.float64)
    w, V = la.eigh(A, method="qdwh", **fn_kwargs)
    assert isinstance(w, np.ndarray) and w.shape == (n,) and isinstance(V, dmath.Matrix) and V.dtype == dtype
    assert np.all(np.diff(w) >= 0)
    scale = max(np.linalg.norm(s, 2), 1.0)
    np.testing.assert_allclose(w, np.linalg.eigvalsh(s), rtol=0, atol=_tol(dtype, n) * scale)
    v = V.to_numpy().astype(np.float64)
    assert np.abs(v.T @ v - np.eye(n)).max() < _tol(dtype, n)
    assert np.linalg.norm(s @ v - v * w) <= _tol(dtype, n) * max(np.linalg.norm(s), 1.0)
    return w


@pytest.mark.parametrize("kind", ["random", "clustered", "repeated", "rank_deficient", "all_equal", "diagonal"])
@pytest.mark.parametrize("name", ["bc23", "row_all_last"])
@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_eigh(kind, name, dtype):
    n = 37                       # divisible by nothing
    S = _spectra(n)[kind]
    A = make(S, layout(name, (n, n), P), dtype)
    w = _check_eigh(S, A, dtype, {"leaf_size": LEAF})
    run = dict(qdwh.last_run)
    if kind == "all_equal":
        assert run["splits"] == 0                     # a multiple of the identity is not split
    else:
        # (a cluster of width 1e-9 is one eigenvalue to float32: a leaf of its own, not split)
        assert run["splits"] >= 2 and all(m <= LEAF for m in run["leaves"])
        # the leaves are spread over the workers
        assert len(set(run["owners"])) == min(P, len(run["leaves"]))
    np.testing.assert_allclose(la.eigvalsh(A, method="qdwh", leaf_size=LEAF), w, rtol=0,
                               atol=_tol(dtype, n) * max(np.abs(w).max(), 1.0))


@pytest.mark.parametrize("name", ["partial", "row_g_last", "tiles", "rep"])
def test_eigh_and_svd_of_other_layouts(name):
    n = 19
    S = _spectra(n)["random"]
    A = make(S, layout(name, (n, n), P), "float64")
    _check_eigh(S, A, "float64", {"leaf_size": 4})
    U, s, Vh = la.svd(A, method="qdwh", leaf_size=4)
    np.testing.assert_allclose(s, np.linalg.svd(S, compute_uv=False), atol=1e-12)
    assert np.linalg.norm((U.to_numpy() * s) @ Vh.to_numpy() - S) < 1e-12 * np.linalg.norm(S)


def test_a_larger_matrix_with_the_default_leaf():
    # n = 1024 at 2 workers: the products of a split are large enough for gemm's SUMMA plans (a
    # product forced into another block width than its operands' came out wrong there)
    n = 1024
    S = _spectra(n)["random"]
    A = make(S, layout("row", (n, n), P), "float64")
    w, V = la.eigh(A, method="qdwh")
    assert qdwh.last_run["leaf"] >= 640
    np.testing.assert_allclose(w, np.linalg.eigvalsh(S), rtol=0, atol=1e-12 * np.abs(w).max())
    v = V.to_numpy()
    assert np.abs(v.T @ v - np.eye(n)).max() < 1e-13
    assert np.linalg.norm(S @ v - v * w) < 1e-14 * n * np.linalg.norm(S)


def test_eigh_reads_the_lower_triangle_and_places_the_result():
    n = 23
    S = _spectra(n)["random"]
    junk = S + np.triu(np.random.default_rng(5).standard_normal((n, n)), 1)
    A = make(junk, layout("col_uneven", (n, n), P), "float64")
    w, V = la.eigh(A, layout=dmath.BlockCyclic((4, 4)), method="qdwh", leaf_size=5)
    assert V.layout == dmath.BlockCyclic((4, 4)).resolved(P)
    np.testing.assert_allclose(w, np.linalg.eigvalsh(S), rtol=0, atol=1e-12)
    v = V.to_numpy()
    assert np.linalg.norm(S @ v - v * w) < 1e-12 * np.linalg.norm(S)


def test_one_leaf_is_the_whole_matrix():
    n = 12
    S = _spectra(n)["random"]
    w, V = la.eigh(make(S, layout("row", (n, n), P), "float64"), method="qdwh", leaf_size=n)
    assert qdwh.last_run["splits"] == 0 and qdwh.last_run["leaves"] == [n]
    np.testing.assert_allclose(w, np.linalg.eigvalsh(S), atol=1e-13)


@pytest.mark.parametrize("shape", [(40, 13), (13, 40), (29, 29), (31, 22)], ids=["tall", "wide", "square", "near"])
@pytest.mark.parametrize("name", ["bc23", "row_all_last"])
@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_svd(shape, name, dtype):
    G = np.random.default_rng(11).standard_normal(shape)
    if shape == (29, 29):
        G[:, 3] = G[:, 5]                             # rank deficient: a zero singular value
    A = make(G, layout(name, shape, P), dtype)
    g = G.astype(dtype).astype(np.float64)
    k = min(shape)
    tol = _tol(dtype, max(shape))
    U, s, Vh = la.svd(A, method="qdwh", leaf_size=LEAF)
    assert qdwh.last_run["splits"] >= 1
    assert U.shape == (shape[0], k) and Vh.shape == (k, shape[1]) and s.shape == (k,)
    assert U.dtype == dtype and Vh.dtype == dtype
    assert np.all(np.diff(s) <= 0) and np.all(s >= 0)
    s_ref = np.linalg.svd(g, compute_uv=False)
    np.testing.assert_allclose(s, s_ref, rtol=0, atol=tol * s_ref[0])
    u, vh = U.to_numpy().astype(np.float64), Vh.to_numpy().astype(np.float64)
    assert np.abs(u.T @ u - np.eye(k)).max() < tol
    assert np.abs(vh @ vh.T - np.eye(k)).max() < tol
    assert np.linalg.norm((u * s) @ vh - g) < tol * np.linalg.norm(g)
    np.testing.assert_allclose(la.svdvals(A, method="qdwh", leaf_size=LEAF), s_ref, rtol=0, atol=tol * s_ref[0])


@pytest.mark.parametrize("shape", [(17, 7), (7, 17)], ids=["tall", "wide"])
def test_svd_full_matrices(shape):
    G = np.random.default_rng(3).standard_normal(shape)
    m, n = shape
    k = min(shape)
    U, s, Vh = la.svd(make(G, layout("bc23", shape, P), "float64"), full_matrices=True, method="qdwh",
                      leaf_size=4)
    assert U.shape == (m, m) and Vh.shape == (n, n)
    u, vh = U.to_numpy(), Vh.to_numpy()
    assert np.abs(u.T @ u - np.eye(m)).max() < 1e-13
    assert np.abs(vh @ vh.T - np.eye(n)).max() < 1e-13
    np.testing.assert_allclose((u[:, :k] * s) @ vh[:k], G, atol=1e-13)


@pytest.mark.parametrize("kind", ["well", "ill", "singular"])
@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_polar_factor_against_scipy(kind, dtype):
    scipy_linalg = pytest.importorskip("scipy.linalg")
    n = 23
    rng = np.random.default_rng(9)
    u, _ = np.linalg.qr(rng.standard_normal((n, n)))
    v, _ = np.linalg.qr(rng.standard_normal((n, n)))
    s = {"well": np.linspace(1, 3, n), "ill": np.logspace(-6, 0, n),
         "singular": np.r_[np.linspace(1, 2, n - 1), 0]}[kind]
    G = (u * s) @ v.T
    g = G.astype(dtype).astype(np.float64)
    steps = []
    U = qdwh.polar(make(G, layout("bc23", (n, n), P), dtype), steps=steps).to_numpy().astype(np.float64)
    # from eps 6 steps in float64; from the estimates of ||A||_2 and sigma_min fewer where A is
    # not (nearly) singular
    assert steps[0] <= {"well": 4, "ill": 5, "singular": qdwh.MAX_STEPS}[kind]
    tol = 100 * float(np.finfo(dtype).eps)
    H = U.T @ g
    assert np.linalg.norm(U @ H - g) <= tol * np.linalg.norm(g)        # A = U H
    assert np.abs(H - H.T).max() <= tol * np.abs(g).max()               # H symmetric
    assert np.linalg.eigvalsh((H + H.T) / 2).min() >= -tol * np.abs(g).max()    # ... positive semidefinite
    if kind != "singular":                                              # unique: against SciPy's
        np.testing.assert_allclose(U, scipy_linalg.polar(g)[0], atol=tol * (1e6 if kind == "ill" else 1))
        assert np.abs(U.T @ U - np.eye(n)).max() <= tol


def test_the_methods_agree():
    n = 30
    S = _spectra(n)["random"]
    A = make(S, layout("bc23", (n, n), P), "float64")
    w_g, _ = la.eigh(A, method="gather")
    w_q, _ = la.eigh(A, method="qdwh", leaf_size=8)
    np.testing.assert_allclose(w_q, w_g, atol=1e-12)
    np.testing.assert_allclose(la.svdvals(A, method="qdwh", leaf_size=8), la.svdvals(A, method="gather"),
                               atol=1e-12)


def test_auto_gathers_small_matrices():
    # below AUTO_QDWH_N (and on one worker) 'auto' is the gathered solver
    assert spectral._method("auto", "eigh", 10) == "gather"
    assert spectral._method("qdwh", "eigh", 10) == "qdwh"
    n = 16
    S = _spectra(n)["random"]
    w, _ = la.eigh(make(S, layout("row", (n, n), P), "float64"))
    np.testing.assert_allclose(w, np.linalg.eigvalsh(S), atol=1e-13)


def test_auto_takes_qdwh_past_the_threshold_on_several_workers(monkeypatch):
    for where in ("cpu", "gpu"):
        monkeypatch.setitem(spectral.AUTO_QDWH_N, where, {"eigh": 20, "svd": 12})
    want = "qdwh" if P > 1 else "gather"
    assert spectral._method("auto", "eigh", 20) == want and spectral._method("auto", "eigvalsh", 19) == "gather"
    assert spectral._method("auto", "svdvals", 12) == want and spectral._method("auto", "svd", 11) == "gather"
    n = 24
    S = _spectra(n)["random"]
    qdwh.last_run.clear()
    w, _ = la.eigh(make(S, layout("bc23", (n, n), P), "float64"))
    assert bool(qdwh.last_run) == (P > 1)
    np.testing.assert_allclose(w, np.linalg.eigvalsh(S), atol=1e-12)


@pytest.mark.parametrize("fn", [la.eigh, la.eigvalsh, la.svdvals])
def test_bad_method_and_leaf_size_are_refused(fn):
    A = make(np.eye(4), layout("row", (4, 4), P), "float64")
    with pytest.raises(dmath.DMathError, match="method must be 'auto', 'gather' or 'qdwh'"):
        fn(A, method="lapack")
    with pytest.raises(dmath.DMathError, match="leaf_size must be a positive integer"):
        fn(A, method="qdwh", leaf_size=0)
    with pytest.raises(dmath.DMathError, match="leaf_size must be a positive integer"):
        fn(A, leaf_size=2.5)


def test_svd_refuses_a_bad_method():
    A = make(np.ones((5, 3)), layout("row", (5, 3), P), "float64")
    with pytest.raises(dmath.DMathError, match="svd: method must be"):
        la.svd(A, method=None)


@pytest.mark.parametrize("scale", [1e200, 1e-200])
def test_entries_far_from_one(scale):
    """Entries whose squares overflow or underflow float64: the matrix is scaled by a power of two
    first (exactly), so the norms and power steps stay finite; values as LAPACK's."""
    n = 12
    ev = np.arange(1.0, n + 1) * scale
    S = _with_spectrum(ev, 6)
    for leaf in (None, 2):
        w, V = la.eigh(dmath.from_numpy(S), method="qdwh", leaf_size=leaf)
        np.testing.assert_allclose(w / scale, ev / scale, rtol=1e-10)
        np.testing.assert_allclose(np.abs(V.to_numpy().T @ V.to_numpy()), np.eye(n), atol=1e-10)
        s = la.svdvals(dmath.from_numpy(S), method="qdwh", leaf_size=leaf)
        np.testing.assert_allclose(s / scale, ev[::-1] / scale, rtol=1e-10)


def test_solve_triangular_refuses_an_unhashable_or_float_trans():
    A = dmath.from_numpy(np.tril(np.ones((3, 3))) + 2 * np.eye(3))
    b = dmath.from_numpy(np.ones((3, 1)))
    for bad in ([1], 1.0, None):
        with pytest.raises(dmath.DMathError, match="trans must be"):
            la.solve_triangular(A, b, trans=bad)
