"""Master halves of the factorizations and solvers: validation, the remap into the algorithm's
layout, one command, the result's layout. See factor.py and tsqr.py for the kernels."""
import numpy as np

from ..errors import DMathError, LinAlgError
from ..layout import ColBlock, Replicated, RowBlock
from ..matrix import eye
from ..ops import movement
from ..ops.base import dispatch, new_meta
from ..ops.gemm import gemm
from . import checks
from .factor import CHOLESKY, LU, QR, TRIANGLE, TRSM
from .panels import work_layout
from .tsqr import TSQR

#: TSQR's all-gathered stack is P n^2 numbers and worker 0 factors it alone: past this many
#: columns the column-panel Householder QR is used instead
TSQR_MAX_COLS = 2048


def _all():
    return tuple(range(checks.workers()))


def _work(A, nb, dtype):
    """A copy of A in the factorizations' layout (the factorization overwrites it)."""
    return movement.remap(A, work_layout(nb, checks.workers()), dtype)


def _is_work(M, nb):
    return M.layout == work_layout(nb, checks.workers())


def _rhs(B, dtype):
    """A copy of B in ColBlock over every worker: all rows, a share of the columns each."""
    return movement.remap(B, ColBlock(_all()), dtype)


def _out(M, layout):
    return checks.placed(M, layout)


def triangle(M, lower, k=0, unit=False):
    """The lower (k: from diagonal k down) or upper triangle of M, in M's layout (a new Matrix)."""
    static = TRIANGLE.static(lower=bool(lower), k=int(k), unit=bool(unit))
    return dispatch("linalg_triangle", [M], [new_meta(M.layout, M.shape, M.dtype)], static=static)[0][0]


# ---- Cholesky ---------------------------------------------------------------------------------
def _cholesky_work(A, nb, fn, dtype=None):
    """L (lower, in the work layout, in `dtype`: A's by default) of the square A; LinAlgError names
    the failing minor."""
    W = _work(A, nb, dtype or checks.dtype_of(A))
    status = dispatch("linalg_cholesky", [W], [0], static=CHOLESKY.static(nb=nb, with_b=False))[1]
    if status:
        raise LinAlgError(f"{fn}: the matrix is not positive definite: its leading minor of order {status} "
                          f"(rows and columns 0..{status - 1}) is not positive definite")
    return W


@checks.entry
def cholesky(A, lower=True, *, block=None, layout=None):
    """The Cholesky factor of the symmetric positive definite A: L with A = L L^T (lower=True), or
    U = L^T with A = U^T U. Only A's lower triangle is read.

    Blocked right-looking algorithm on the workers (block: the column-block
    width, default per backend); the result is in BlockCyclic((block,
    block), grid=(1, P)) unless `layout` is given. Raises LinAlgError
    naming the first leading minor that is not positive definite."""
    checks.square(A, "cholesky")
    lower = checks.flag(lower, "cholesky", "lower")
    checks.layout(layout, "cholesky")
    nb = checks.block(block, A.shape[0])
    L = _cholesky_work(A, nb, "cholesky")
    if lower:
        return _out(L, layout)
    U = L.T
    # a transpose is marked as derived (in-place writes refused: they would not reach L), but L is
    # this call's own and dropped here: U is the user's matrix, writable as the lower factor is
    U._derived = None
    return _out(U, layout)


# ---- triangular solves ------------------------------------------------------------------------
_TRANS = {0: False, 1: True, 2: True, "N": False, "T": True, "C": True}


def _trsm(T, X, lower, trans, unit, nb, fn, check=True):
    """Solve op(T) Y = X in place of X (T in the work layout of width nb, X in ColBlock)."""
    diag = dispatch("linalg_trsm", [T, X], [1], static=TRSM.static(nb=nb, lower=lower, trans=trans, unit=unit))[1]
    if check and not unit:
        _check_pivots(diag, fn, "the triangular matrix is singular: its diagonal element")


def _check_pivots(diag, fn, what):
    zero = np.flatnonzero(np.asarray(diag) == 0)
    if zero.size:
        i = int(zero[0])
        raise LinAlgError(f"{fn}: {what} [{i}, {i}] is zero (pivot {i})")


@checks.entry
def solve_triangular(A, B, lower=False, trans=0, unit_diagonal=False, *, block=None, layout=None):
    """X with op(A) X = B for the triangular A (SciPy's convention: lower=False reads A's upper
    triangle; trans 0/'N', 1/'T' or 2/'C' for A, A^T, A^H). B is (n, k).

    Blocked substitution on the workers: A's column blocks are broadcast in
    turn and every worker solves its share of B's columns. The result is in
    ColBlock over every worker unless `layout` is given. Raises LinAlgError
    naming a zero diagonal element."""
    fn = "solve_triangular"
    checks.square(A, fn)
    checks.same_rows(A, B, fn)
    lower = checks.flag(lower, fn, "lower")
    unit = checks.flag(unit_diagonal, fn, "unit_diagonal")
    # (only ints and strings: a list is unhashable, and 1.0 == 1 would pass a dict lookup)
    if not isinstance(trans, (int, np.integer, str)) or isinstance(trans, (bool, np.bool_)) or trans not in _TRANS:
        raise DMathError(f"{fn}: trans must be 0, 1, 2, 'N', 'T' or 'C', got {trans!r}")
    checks.layout(layout, fn)
    nb = checks.block(block, A.shape[0])
    dtype = checks.dtype_of(A, B)
    T = A if (_is_work(A, nb) and A.dtype == dtype) else _work(A, nb, dtype)
    X = _rhs(B, dtype)
    _trsm(T, X, lower, _TRANS[trans], unit, nb, fn)
    return _out(X, layout)


@checks.entry
def cho_solve(c_and_lower, B, *, block=None, layout=None):
    """X with A X = B from A's Cholesky factor: `c_and_lower` is (L, True) or (U, False) as
    `cholesky` returns them (SciPy's convention). Two blocked triangular solves."""
    fn = "cho_solve"
    if not isinstance(c_and_lower, tuple) or len(c_and_lower) != 2:
        raise DMathError(f"{fn}: the first argument must be (factor, lower), got {type(c_and_lower).__name__}")
    C, lower = c_and_lower
    checks.square(C, fn, "the factor")
    checks.same_rows(C, B, fn)
    lower = checks.flag(lower, fn, "lower")
    checks.layout(layout, fn)
    nb = checks.block(block, C.shape[0])
    dtype = checks.dtype_of(C, B)
    T = C if (_is_work(C, nb) and C.dtype == dtype) else _work(C, nb, dtype)
    X = _rhs(B, dtype)
    # A = L L^T: L Y = B then L^T X = Y; A = U^T U: U^T Y = B then U X = Y
    _trsm(T, X, lower, not lower, False, nb, fn)
    _trsm(T, X, lower, lower, False, nb, fn, check=False)
    return _out(X, layout)


# ---- LU and what is built on it ----------------------------------------------------------------
def _lu_work(A, nb, B=None):
    """(W, perm, U's diagonal) with W = the work-layout copy of A holding L and U; with B (ColBlock,
    in place) also L^-1 P B."""
    W = _work(A, nb, checks.dtype_of(A) if B is None else B.dtype.name)    # (B is already in the common dtype)
    ins, outs = ([W], [0]) if B is None else ([W, B], [0, 1])
    perm, diag = dispatch("linalg_lu", ins, outs, static=LU.static(nb=nb, with_b=B is not None))[1]
    return W, perm, diag


@checks.entry
def lu(A, *, block=None, layout=None):
    """LU with partial pivoting: (perm, L, U) with A[perm] == L @ U.

    A is m x n; L is m x k with a unit diagonal, U is k x n (k = min(m,
    n)); perm is a NumPy int array on the master. Blocked right-looking LU
    on the workers (each panel factored by the worker that holds it whole,
    its pivots broadcast with it). L and U are in BlockCyclic((block,
    block), grid=(1, P)) unless `layout` is given. A singular A is
    factored (U has a zero on its diagonal) as LAPACK does."""
    checks.matrix(A, "lu")
    checks.layout(layout, "lu")
    m, n = A.shape
    nb = checks.block(block, max(1, min(m, n)))
    W, perm, _ = _lu_work(A, nb)
    k = min(m, n)
    L = triangle(W if k == n else W[:, :k], lower=True, k=-1, unit=True)
    U = triangle(W if k == m else W[:k, :], lower=False)
    return perm, _out(L, layout), _out(U, layout)


def _solve_general(A, B, nb, fn, layout):
    dtype = checks.dtype_of(A, B)
    X = _rhs(B, dtype)
    W, _, diag = _lu_work(A, nb, X)
    _check_pivots(diag, fn, "the matrix is singular: U")
    _trsm(W, X, False, False, False, nb, fn, check=False)
    return _out(X, layout)


@checks.entry
def solve(A, B, assume_a="gen", *, block=None, layout=None):
    """X with A X = B for the square A and B of n rows.

    assume_a='gen': LU with partial pivoting (B's rows permuted and the
    forward substitution done inside the factorization), then the back
    substitution; 'pos': Cholesky of A's lower triangle (the upper is not
    read; SciPy's solve reads the upper), then two triangular solves. Raises
    LinAlgError for a singular A (naming the zero pivot) or, with 'pos', for
    an A that is not positive definite (naming the leading minor)."""
    fn = "solve"
    checks.square(A, fn)
    checks.same_rows(A, B, fn)
    checks.layout(layout, fn)
    if assume_a not in ("gen", "pos"):
        raise DMathError(f"{fn}: assume_a must be 'gen' or 'pos', got {assume_a!r}")
    nb = checks.block(block, A.shape[0])
    if assume_a == "pos":
        dtype = checks.dtype_of(A, B)
        L = _cholesky_work(A, nb, fn, dtype)
        X = _rhs(B, dtype)
        _trsm(L, X, True, False, False, nb, fn, check=False)
        _trsm(L, X, True, True, False, nb, fn, check=False)
        return _out(X, layout)
    return _solve_general(A, B, nb, fn, layout)


@checks.entry
def inv(A, *, block=None, layout=None):
    """The inverse of the square A: solve(A, I) with I made on the workers (LU with partial
    pivoting). Raises LinAlgError naming the zero pivot of a singular A."""
    checks.square(A, "inv")
    checks.layout(layout, "inv")
    n = A.shape[0]
    nb = checks.block(block, n)
    identity = eye(n, dtype=A.dtype, layout=ColBlock(_all()))
    return _solve_general(A, identity, nb, "inv", layout)


def _parity(perm):
    """+1 or -1: the sign of the permutation `perm`."""
    seen = np.zeros(perm.size, dtype=bool)
    sign = 1
    for i in range(perm.size):
        if not seen[i]:
            j, length = i, 0
            while not seen[j]:
                seen[j] = True
                j = perm[j]
                length += 1
            if length % 2 == 0:
                sign = -sign
    return sign


@checks.entry
def slogdet(A, *, block=None):
    """(sign, log|det A|) of the square A from its LU factorization, as NumPy floats (sign 0 and
    log -inf for a singular A)."""
    checks.square(A, "slogdet")
    nb = checks.block(block, A.shape[0])
    _, perm, diag = _lu_work(A, nb)
    diag = np.asarray(diag, dtype=np.float64)
    if np.any(diag == 0):
        return 0.0, -np.inf
    sign = _parity(perm) * np.prod(np.sign(diag))
    return float(sign), float(np.sum(np.log(np.abs(diag))))


@checks.entry
def det(A, *, block=None):
    """The determinant of the square A (the product of U's diagonal and the sign of the row
    permutation of its LU factorization), a float on the master."""
    checks.square(A, "det")
    nb = checks.block(block, A.shape[0])
    _, perm, diag = _lu_work(A, nb)
    with np.errstate(over="ignore", under="ignore"):      # as NumPy's det: inf or 0 past float64's range
        return float(_parity(perm) * np.prod(np.asarray(diag, dtype=np.float64)))


# ---- QR and least squares ----------------------------------------------------------------------
def _tsqr_fits(m, n, P):
    """Whether TSQR applies: every worker gets at least n of the m rows, and n is small."""
    return n <= TSQR_MAX_COLS and m >= n * P


@checks.entry
def qr(A, mode="reduced", *, block=None, layout=None):
    """QR factorization of the m x n A: (Q, R) with Q m x k orthonormal and R k x n upper
    triangular (k = min(m, n)); mode='r' returns R alone.

    Tall and skinny A (at least n rows per worker, n <= 2048): TSQR (local
    Householder QRs of the row blocks, one reduction of the R factors);
    otherwise blocked Householder QR on column panels. Q is orthonormal to
    the working precision for any A (Householder, never Gram-Schmidt or
    CholeskyQR). TSQR gives Q in RowBlock and R Replicated; Householder
    gives both in BlockCyclic((block, block), grid=(1, P)); `layout` places
    both."""
    fn = "qr"
    checks.matrix(A, fn)
    checks.layout(layout, fn)
    if mode not in ("reduced", "r"):
        raise DMathError(f"{fn}: mode must be 'reduced' or 'r', got {mode!r}")
    m, n = A.shape
    P = checks.workers()
    want_q = mode == "reduced"
    dtype = checks.dtype_of(A)
    if _tsqr_fits(m, n, P) and block is None:
        X = movement.remap(A, RowBlock(_all()), dtype)
        outs = ([new_meta(RowBlock(_all()), (m, n), dtype)] if want_q else []) + \
            [new_meta(Replicated(_all()), (n, n), dtype)]
        made = dispatch("linalg_tsqr", [X], outs, static=TSQR.static(with_q=want_q))[0]
        Q, R = (made[0], made[1]) if want_q else (None, made[0])
    else:
        k = min(m, n)
        nb = checks.block(block, max(1, k), op="qr")
        W = _work(A, nb, dtype)
        outs = [0] + ([new_meta(work_layout(nb, P), (m, k), dtype)] if want_q else [])
        made = dispatch("linalg_qr", [W], outs, static=QR.static(nb=nb, with_b=want_q))[0]
        Q = made[0] if want_q else None
        R = triangle(W if k == m else W[:k, :], lower=False)
    R = _out(R, layout)
    return R if not want_q else (_out(Q, layout), R)


@checks.entry
def lstsq(A, B, *, block=None, layout=None):
    """The least-squares solution of A X = B: (X, residuals, rank, s) as NumPy's lstsq.

    By QR (`qr`: TSQR for tall and skinny A): X = R^-1 Q^T B when m >= n,
    the minimum-norm X = Q R^-T B from A^T = Q R when m < n. A must have
    full rank (checked from the singular values s of R, which are A's);
    raises LinAlgError for a rank-deficient A. residuals: the squared
    residual norm of each column of B when m > n (NumPy float64 array), else
    empty; rank and s on the master as NumPy values."""
    from .spectral import svdvals
    fn = "lstsq"
    checks.matrix(A, fn)
    checks.same_rows(A, B, fn)
    checks.layout(layout, fn)
    m, n = A.shape
    dtype = checks.dtype_of(A, B)
    if dtype != A.dtype:
        A = A.astype(dtype)
    tall = m >= n
    Q, R = qr(A if tall else A.T, block=block)
    s = svdvals(R)
    k = min(m, n)
    tol = max(m, n) * np.finfo(dtype).eps * (s[0] if s.size else 0.0)
    rank = int(np.sum(s > tol))
    if rank < k:
        raise LinAlgError(f"{fn}: A has rank {rank} < {k} (singular values below {tol:.3g}); the QR "
                          f"least-squares solver needs full rank")
    nb = checks.block(block, k, op="qr")
    if tall:
        X = solve_triangular(R, gemm(Q, B, trans_a=True), lower=False, block=nb)
        if m > n:
            res = B - gemm(A, X)
            residuals = np.asarray((res * res).sum(axis=0).to_numpy(), dtype=np.float64).reshape(-1)
        else:
            residuals = np.zeros(0)
    else:
        Y = solve_triangular(R, B, lower=False, trans=1, block=nb)
        X = gemm(Q, Y)
        residuals = np.zeros(0)
    return _out(X, layout), residuals, rank, s
