"""dmath.linalg refuses what it cannot do on the master, with typed errors, before anything is sent,
and the runtime stays usable."""
import numpy as np
import pytest

import dmath
from dmath import linalg as la

SQ = dict(shape=(6, 6))


def _m(shape=(6, 6), dtype="float64"):
    return dmath.from_numpy(np.eye(*shape) * 2 + 0.1, dtype=dtype)


NON_SQUARE = [
    ("cholesky", lambda A: la.cholesky(A)), ("solve", lambda A: la.solve(A, _m((6, 1)))),
    ("inv", lambda A: la.inv(A)), ("det", lambda A: la.det(A)), ("slogdet", lambda A: la.slogdet(A)),
    ("eigh", lambda A: la.eigh(A)), ("eigvalsh", lambda A: la.eigvalsh(A)), ("eigsh", lambda A: la.eigsh(A, 1)),
    ("solve_triangular", lambda A: la.solve_triangular(A, _m((6, 1)))),
]


@pytest.mark.parametrize("fn", [f for _, f in NON_SQUARE], ids=[n for n, _ in NON_SQUARE])
def test_non_square(fn):
    with pytest.raises(dmath.ShapeError, match="square"):
        fn(_m((6, 4)))


ALL = NON_SQUARE + [("lu", lambda A: la.lu(A)), ("qr", lambda A: la.qr(A)), ("svd", lambda A: la.svd(A)),
                    ("svdvals", lambda A: la.svdvals(A)), ("svds", lambda A: la.svds(A, 2)),
                    ("norm", lambda A: la.norm(A)), ("lstsq", lambda A: la.lstsq(A, _m((6, 1)))),
                    ("cho_solve", lambda A: la.cho_solve((A, True), _m((6, 1))))]


@pytest.mark.parametrize("fn", [f for _, f in ALL], ids=[n for n, _ in ALL])
def test_float16_refused(fn):
    with pytest.raises(dmath.DTypeError, match="float16.*astype"):
        fn(_m(dtype="float16"))


@pytest.mark.parametrize("fn", [f for _, f in ALL], ids=[n for n, _ in ALL])
def test_not_a_matrix(fn):
    with pytest.raises(dmath.DMathError, match="must be a dmath.Matrix"):
        fn(np.eye(6))


def test_shape_mismatches():
    A = _m()
    for call in (lambda: la.solve(A, _m((5, 1))), lambda: la.solve_triangular(A, _m((7, 2))),
                 lambda: la.cho_solve((A, True), _m((5, 1))), lambda: la.lstsq(A, _m((4, 1))),
                 lambda: la.cg(A, _m((5, 1))), lambda: la.cg(A, _m((6, 2))),
                 lambda: la.cg(A, _m((6, 1)), x0=_m((5, 1))),
                 lambda: la.cg(lambda p: _m((5, 1)), _m((6, 1)))):
        with pytest.raises(dmath.ShapeError):
            call()


def test_bad_arguments():
    A = _m()
    b = _m((6, 1))
    for call, what in [(lambda: la.solve(A, b, assume_a="sym"), "assume_a"),
                       (lambda: la.qr(A, mode="complete"), "mode"),
                       (lambda: la.solve_triangular(A, b, trans=3), "trans"),
                       (lambda: la.solve_triangular(A, b, lower="yes"), "lower"),
                       (lambda: la.cholesky(A, block=0), "block"),
                       (lambda: la.cholesky(A, block=2.5), "block"),
                       (lambda: la.cholesky(A, layout="row"), "layout"),
                       (lambda: la.svd(A, full_matrices=None), "full_matrices"),
                       (lambda: la.eigsh(A, k=0), "k"), (lambda: la.eigsh(A, k=2, which="BE"), "which"),
                       (lambda: la.eigsh(A, k=3, maxiter=2), "maxiter"),
                       (lambda: la.svds(A, k=7), "k"), (lambda: la.svds(A, k=2, oversample=-1), "oversample"),
                       (lambda: la.norm(A, 3), "ord"), (lambda: la.norm(A, True), "ord"),
                       (lambda: la.cg(A, b, tol=-1.0), "tol"), (lambda: la.cg("A", b), "callable"),
                       (lambda: la.cho_solve(A, b), "factor, lower")]:
        with pytest.raises(dmath.DMathError, match=what):
            call()
    # the runtime is usable afterwards
    np.testing.assert_allclose(la.solve(A, b).to_numpy(), np.linalg.solve(A.to_numpy(), b.to_numpy()), atol=1e-15)


def test_linalg_error_is_a_dmath_error():
    assert issubclass(dmath.LinAlgError, dmath.DMathError)
    assert dmath.linalg.LinAlgError is dmath.LinAlgError


def test_refused_inside_a_record_block():
    A = _m()
    with pytest.raises(dmath.PlanError, match="cannot be recorded"):
        with dmath.record():
            la.cholesky(A)
    np.testing.assert_allclose(la.cholesky(A).to_numpy(), np.linalg.cholesky(A.to_numpy()), atol=1e-15)


def test_non_finite_input_is_a_linalg_error_not_a_failed_job():
    M = np.eye(6) * 2 + 0.1
    M[2, 3] = M[3, 2] = np.nan
    A = dmath.from_numpy(M, dtype="float64")
    for fn in (la.eigh, la.eigvalsh, la.svd, la.svdvals, lambda X: la.eigsh(X, 2)):
        with pytest.raises(dmath.LinAlgError, match="NaN or inf"):
            fn(A)
    # the factorizations refuse it too, as SciPy's check_finite (LAPACK would pass NaN through, and
    # cuSOLVER's LU returned finite numbers for this matrix)
    for fn in (lambda X: la.solve(X, _m((6, 1))), la.cholesky, la.lu, la.qr, la.inv):
        with pytest.raises(dmath.LinAlgError, match="A holds NaN or inf"):
            fn(A)
    np.testing.assert_allclose(la.eigvalsh(_m()), np.linalg.eigvalsh(_m().to_numpy()), atol=1e-14)
