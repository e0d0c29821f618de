"""Conjugate gradients, written with dmath operations on the master (a sequential program over
distributed vectors): each step one product with A, two dot products (floats to the master) and
three vector updates."""
import numpy as np

from ..errors import DMathError, LinAlgError, ShapeError
from ..ops.base import as_int, is_matrix
from ..ops.gemm import gemm
from . import checks


@checks.entry
def cg(A, b, x0=None, *, tol=1e-5, atol=0.0, maxiter=None, callback=None):
    """Solve A x = b for the symmetric positive definite A by conjugate gradients (SciPy's cg).

    A: an n x n Matrix, or a callable operator `A(p)` returning the Matrix
    A p for an n x 1 Matrix p. b: n x 1. Stops when ||r|| <= max(tol ||b||,
    atol). Returns (x, info): info 0 when converged, else the number of
    steps taken (maxiter, default 10 n). Raises LinAlgError when p^T A p <= 0
    (A is not positive definite). callback(xk) is called after each step."""
    fn = "cg"
    checks.matrix(b, fn, "b")
    n = b.shape[0]
    if b.shape[1] != 1:
        raise ShapeError(f"{fn}: b must be an n x 1 Matrix, got {b.shape}")
    if is_matrix(A):
        checks.square(A, fn)
        if A.shape[0] != n:
            raise ShapeError(f"{fn}: A is {A.shape[0]} x {A.shape[1]} but b has {n} rows")
        matvec = lambda p: gemm(A, p, layout=p.layout)      # noqa: E731  (vectors stay in b's layout)
    elif callable(A):
        matvec = A
    else:
        raise DMathError(f"{fn}: A must be a dmath.Matrix or a callable operator, got {type(A).__name__}")
    if x0 is None:
        x = b * 0.0
    else:
        checks.matrix(x0, fn, "x0")
        if x0.shape != b.shape:
            raise ShapeError(f"{fn}: x0 is {x0.shape}, b is {b.shape}")
        x = x0.remap(b.layout, dtype=b.dtype)
    maxiter = 10 * n if maxiter is None else as_int(maxiter, "maxiter")
    tol, atol = float(tol), float(atol)
    if tol < 0 or atol < 0 or np.isnan(tol) or np.isnan(atol):
        raise DMathError(f"{fn}: tol and atol must be non-negative, got {tol!r} and {atol!r}")
    bound = max(tol * b.norm(), atol)
    r = b - _apply(matvec, x, b, fn)
    rs = (r * r).sum()
    if rs ** 0.5 <= bound:
        return x, 0
    p = r
    for i in range(maxiter):
        Ap = _apply(matvec, p, b, fn)
        pap = (p * Ap).sum()
        if not pap > 0:
            raise LinAlgError(f"{fn}: p^T A p = {pap:g} at step {i}: A is not positive definite")
        alpha = rs / pap
        x += alpha * p
        r -= alpha * Ap
        rs_new = (r * r).sum()
        if callback is not None:
            callback(x)
        if rs_new ** 0.5 <= bound:
            return x, 0
        p = r + (rs_new / rs) * p
        rs = rs_new
    return x, maxiter


def _apply(matvec, p, b, fn):
    y = matvec(p)
    if not is_matrix(y) or y.shape != b.shape:
        raise ShapeError(f"{fn}: the operator must return an {b.shape} Matrix, got "
                         f"{getattr(y, 'shape', type(y).__name__)}")
    return y if y.layout == b.layout and y.dtype == b.dtype else y.remap(b.layout, dtype=b.dtype)
