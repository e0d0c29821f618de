"""Conjugate gradients, written with dmath operations on the master (a sequential program over
distributed vectors): each step one product with A, two dot products (floats to the master) and
three vector updates."""
import math

import numpy as np

from ..errors import DMathError, LinAlgError, ShapeError
from ..layout import RowBlock
from ..ops.base import as_int, is_matrix
from ..ops.gemm import gemm
from . import checks


@checks.entry
def cg(A, b, x0=None, *, tol=1e-5, atol=0.0, maxiter=None, callback=None):
    """Solve A x = b for the symmetric positive definite A by conjugate gradients (SciPy's cg).

    A: an n x n Matrix, or a callable operator `A(p)` returning the Matrix
    A p for an n x 1 Matrix p. b: n x 1 (any layout; a Partial b is summed
    first). Stops when ||r|| <= max(tol ||b||, atol). Returns (x, info):
    info 0 when converged, else the number of steps taken (maxiter, a
    positive integer, default 10 n). x has NumPy's result type of A's and
    b's dtypes (b's for an operator). Raises LinAlgError when p^T A p <= 0
    (A is not positive definite). callback(xk) is called after each step;
    the operator and the callback run as calls of their own (a dmath.linalg
    call in them checks its inputs as at top level)."""
    fn = "cg"
    checks.matrix(b, fn, "b")
    n = b.shape[0]
    if b.shape[1] != 1:
        raise ShapeError(f"{fn}: b must be an n x 1 Matrix, got {b.shape}")
    if is_matrix(A):
        checks.square(A, fn)
        if A.shape[0] != n:
            raise ShapeError(f"{fn}: A is {A.shape[0]} x {A.shape[1]} but b has {n} rows")
        dtype = checks.dtype_of(A, b)
        matvec = lambda p: gemm(A, p, layout=p.layout)      # noqa: E731  (vectors stay in b's layout)
    elif callable(A):
        dtype = b.dtype
        matvec = _as_user_code(A)
    else:
        raise DMathError(f"{fn}: A must be a dmath.Matrix or a callable operator, got {type(A).__name__}")
    if x0 is not None:
        checks.matrix(x0, fn, "x0")
        if x0.shape != b.shape:
            raise ShapeError(f"{fn}: x0 is {x0.shape}, b is {b.shape}")
    if maxiter is None:
        maxiter = 10 * n
    else:
        maxiter = as_int(maxiter, "maxiter")
        if maxiter < 1:
            raise DMathError(f"{fn}: maxiter must be a positive integer (the most steps), got {maxiter}")
    tol, atol = float(tol), float(atol)
    if tol < 0 or atol < 0 or np.isnan(tol) or np.isnan(atol):
        raise DMathError(f"{fn}: tol and atol must be non-negative, got {tol!r} and {atol!r}")
    # the vectors in one layout and the computation's dtype: a Partial b is summed (vector updates
    # in place cannot add to a sum of addends), a float32 b with a float64 A promoted (in b's
    # dtype the solve ran in float32 and reported a float32 residual as converged)
    lay = RowBlock() if b.layout.partial else b.layout
    if b.layout != lay or b.dtype != dtype:
        b = b.remap(lay, dtype=dtype)
    x = b * 0.0 if x0 is None else x0.remap(b.layout, dtype=b.dtype)
    # CG is linear in b: a b whose squares would underflow (or overflow) is solved scaled by a power
    # of two to entries near 1 and the answer scaled back (||b|| = 1e-170 gave x = 0 "converged":
    # every ||r||^2 was 0)
    peak = float(abs(b).max())
    shift = 0           # b and x are 2**-shift times the user's
    if peak > 0 and np.isfinite(peak) and not _SAFE[0] < peak < _SAFE[1]:
        shift = math.frexp(peak)[1]
        b, x = _times_pow2(b, -shift), _times_pow2(x, -shift)
    with np.errstate(over="ignore"):
        bound = max(tol * b.norm(), float(np.ldexp(atol, -shift)))
    report = None if callback is None else _as_user_code(callback)
    r = b - _apply(matvec, x, b, fn)
    rs = (r * r).sum()
    if rs ** 0.5 <= bound:
        return _times_pow2(x, shift), 0
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
        if report is not None:
            report(_times_pow2(x, shift))
        if rs_new ** 0.5 <= bound:
            return _times_pow2(x, shift), 0
        p = r + (rs_new / rs) * p
        rs = rs_new
    return _times_pow2(x, shift), maxiter


#: the range of ||b|| solved as it is: its square, and the step's sums of squares, stay normal
_SAFE = (1e-140, 1e140)


def _times_pow2(m, e):
    """m * 2**e, in steps a double holds (2**e alone overflows past e = 1023)."""
    while e:
        step = max(-1000, min(1000, e))
        m = m * math.ldexp(1.0, step)
        e -= step
    return m


def _as_user_code(fn):
    def call(*args):
        with checks.user_code():
            return fn(*args)
    return call


def _apply(matvec, p, b, fn):
    y = matvec(p)
    if not is_matrix(y) or y.shape != b.shape:
        raise ShapeError(f"{fn}: the operator must return an {b.shape} Matrix, got "
                         f"{getattr(y, 'shape', type(y).__name__)}")
    return y if y.layout == b.layout and y.dtype == b.dtype else y.remap(b.layout, dtype=b.dtype)
