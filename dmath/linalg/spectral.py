"""Eigenvalues and singular values: eigh, eigvalsh, svd, svdvals (dense), eigsh (Lanczos), svds
(randomized), and the matrix norms built on them.

Dense eigh/svd. The reduction of a dense symmetric matrix to tridiagonal
form (and of a general one to bidiagonal form) is not distributed here:
`eigh` gathers A on worker 0 with a remap (a worker-side gather: the
workers exchange the pieces, nothing passes through the master's program)
and runs LAPACK's / cuSOLVER's eigensolver there, then scatters the
eigenvectors back the same way; only the eigenvalues (n numbers) reach the
master. `svd` first makes a tall (or wide) A square with the distributed
QR (TSQR or Householder: min(m, n)^2 numbers are gathered instead of m n),
takes the SVD of R on worker 0 and multiplies Q by R's left singular
vectors on the workers. Nothing is computed from A^T A, whose condition
number is squared.

`eigsh` is Lanczos with full reorthogonalization in one worker command
(`linalg_lanczos`): A in RowBlock, each step one all-gather of the vector
(n numbers), the product with the local rows, and two all-reduces of the
basis coefficients (classical Gram-Schmidt twice); the tridiagonal matrix
is on every worker's host (the same numbers everywhere, so every worker
stops at the same step). The basis grows until the k wanted Ritz pairs
have residuals below tol (no restart: memory n x steps).
"""
from typing import NamedTuple

import numpy as np

from .. import backend, memory, random as drandom
from ..gpu import blas
from ..comm import collectives
from ..errors import DMathError, LinAlgError
from ..layout import RowBlock
from ..ops import elementwise, movement
from ..ops.base import as_int, dispatch, new_meta
from ..ops.gemm import gemm
from ..runtime import Shard, define
from . import checks
from .decompose import qr
from .panels import group_of
from .tsqr import EIGH, SVD

#: a factor of this many is "tall": svd goes through QR first (gathering n^2 numbers, not m n)
_TALL = 2


class LanczosArgs(NamedTuple):
    """Static arguments of `linalg_lanczos`."""
    k: int
    which: str          # 'LM', 'LA' or 'SA'
    steps: int          # the largest basis
    tol: float
    seed: int           # the start vector's


LANCZOS = define("linalg_lanczos", LanczosArgs)


def _root():
    """The layout of a matrix gathered whole on worker 0."""
    return RowBlock((0,))


def _gathered(A, dtype):
    return movement.remap(A, _root(), dtype)


@checks.entry
def eigh(A, *, layout=None):
    """Eigenvalues (ascending, a NumPy array on the master) and orthonormal eigenvectors (a Matrix,
    RowBlock unless `layout` is given) of the symmetric A; its lower triangle is read.

    The eigensolver runs on worker 0 on A gathered there by the workers
    (see the module's docstring)."""
    checks.square(A, "eigh")
    checks.layout(layout, "eigh")
    dtype = checks.dtype_of(A)
    G = _gathered(A, dtype)
    made, (w, failed) = dispatch("linalg_eigh", [G], [new_meta(_root(), A.shape, dtype)],
                                 static=EIGH.static(vectors=True, full=False))
    _refused("eigh", failed)
    return w, made[0].remap(layout if layout is not None else RowBlock())


def _refused(fn, message):
    """LinAlgError when the local solver refused the matrix (it did not converge: NaN or inf in it)."""
    if message is not None:
        raise LinAlgError(f"{fn}: the eigensolver did not converge ({message}); does the matrix hold NaN or inf?")


@checks.entry
def eigvalsh(A):
    """The eigenvalues of the symmetric A, ascending (a NumPy array on the master)."""
    checks.square(A, "eigvalsh")
    G = _gathered(A, checks.dtype_of(A))
    w, failed = dispatch("linalg_eigh", [G], [], static=EIGH.static(vectors=False, full=False))[1]
    _refused("eigvalsh", failed)
    return w


def _svd_gathered(X, vectors, full):
    """(U, s, Vh) of X on worker 0 (U, Vh as Matrices there, or None)."""
    m, n = X.shape
    dtype = checks.dtype_of(X)
    G = _gathered(X, dtype)
    if not vectors:
        s, failed = dispatch("linalg_svd", [G], [], static=SVD.static(vectors=False, full=False))[1]
        _refused("svd", failed)
        return None, s, None
    k = min(m, n)
    ushape, vshape = ((m, m), (n, n)) if full else ((m, k), (k, n))
    made, (s, failed) = dispatch("linalg_svd", [G], [new_meta(_root(), ushape, dtype),
                                                     new_meta(_root(), vshape, dtype)],
                                 static=SVD.static(vectors=True, full=bool(full)))
    _refused("svd", failed)
    return made[0], s, made[1]


@checks.entry
def svd(A, full_matrices=False, *, layout=None):
    """(U, s, Vh) with A = U diag(s) Vh, s descending (a NumPy array on the master).

    U and Vh are Matrices (RowBlock unless `layout` is given). A tall A
    (m >= 2n) is reduced by the distributed QR first, U = Q U_R; a wide one
    likewise through A^T; otherwise, and for full_matrices=True, the SVD
    runs on worker 0 on A gathered there (see the module's docstring)."""
    checks.matrix(A, "svd")
    checks.layout(layout, "svd")
    full = checks.flag(full_matrices, "svd", "full_matrices")
    m, n = A.shape
    out = layout if layout is not None else RowBlock()
    if not full and min(m, n) > 0 and m >= _TALL * n:
        Q, R = qr(A)
        Ur, s, Vh = _svd_gathered(R, True, False)
        return gemm(Q, Ur, layout=out), s, Vh.remap(out)
    if not full and min(m, n) > 0 and n >= _TALL * m:
        Q, R = qr(A.T)                           # A^T = Q R = Q Ur s Vr  ->  A = Vr^T s (Q Ur)^T
        Ur, s, Vr = _svd_gathered(R, True, False)
        return Vr.T.remap(out), s, gemm(Ur, Q, trans_a=True, trans_b=True, layout=out)
    U, s, Vh = _svd_gathered(A, True, full)
    return U.remap(out), s, Vh.remap(out)


@checks.entry
def svdvals(A):
    """The singular values of A, descending (a NumPy array on the master); a tall or wide A is
    reduced by the distributed QR first (svd)."""
    checks.matrix(A, "svdvals")
    m, n = A.shape
    if min(m, n) > 0 and m >= _TALL * n:
        return _svd_gathered(qr(A, mode="r"), False, False)[1]
    if min(m, n) > 0 and n >= _TALL * m:
        return _svd_gathered(qr(A.T, mode="r"), False, False)[1]
    return _svd_gathered(A, False, False)[1]


# ---- Lanczos ----------------------------------------------------------------------------------
@checks.entry
def eigsh(A, k=6, which="LM", *, tol=None, maxiter=None, seed=0, layout=None):
    """k eigenvalues of the symmetric A and their eigenvectors, by Lanczos (SciPy's eigsh): which='LM'
    (largest magnitude, the default), 'LA' (largest) or 'SA' (smallest).

    Returns (w, V): w ascending (a NumPy array on the master), V n x k
    (RowBlock unless `layout` is given). tol: the residual bound relative
    to the largest Ritz value (default: eps^(3/4) of the dtype); maxiter:
    the largest basis (default min(n, max(20 k, 200))); seed: the start
    vector's. Raises LinAlgError when k pairs have not converged by then."""
    fn = "eigsh"
    checks.square(A, fn)
    checks.layout(layout, fn)
    n = A.shape[0]
    k = as_int(k, "k")
    if not 1 <= k <= n:
        raise DMathError(f"{fn}: k must be in 1..{n}, got {k}")
    if which not in ("LM", "LA", "SA"):
        raise DMathError(f"{fn}: which must be 'LM', 'LA' or 'SA', got {which!r}")
    dtype = checks.dtype_of(A)
    steps = min(n, max(20 * k, 200)) if maxiter is None else as_int(maxiter, "maxiter")
    if steps < k:
        raise DMathError(f"{fn}: maxiter must be at least k = {k}, got {steps}")
    steps = min(steps, n)
    tol = float(np.finfo(dtype).eps ** 0.75) if tol is None else float(tol)
    if not tol > 0:
        raise DMathError(f"{fn}: tol must be positive, got {tol!r}")
    rows = RowBlock(tuple(range(checks.workers())))
    X = A if A.layout == rows.resolved(checks.workers()) and A.dtype == dtype else movement.remap(A, rows, dtype)
    made, (w, converged) = dispatch(
        "linalg_lanczos", [X], [new_meta(rows, (n, k), dtype)],
        static=LANCZOS.static(k=k, which=which, steps=steps, tol=tol, seed=as_int(seed, "seed")))
    if w is None:
        raise LinAlgError(f"{fn}: the Lanczos recurrence met NaN or inf: does A hold them?")
    if not converged:
        raise LinAlgError(f"{fn}: {k} eigenpairs did not converge to tol={tol:g} within {steps} Lanczos steps; "
                          f"raise maxiter or tol")
    return w, checks.placed(made[0], layout)


def _wanted(theta, k, which):
    """Indices of the k wanted Ritz values of the ascending `theta`, in ascending order of value."""
    if which == "LA":
        idx = np.arange(theta.size - k, theta.size)
    elif which == "SA":
        idx = np.arange(k)
    else:
        idx = np.sort(np.argsort(np.abs(theta), kind="stable")[theta.size - k:])
    return idx


@LANCZOS.kernel()
def _lanczos(call):
    """Lanczos with full reorthogonalization on A's rows (RowBlock); output: the k Ritz vectors."""
    x = call.inputs[0]
    A = x.pieces[0]
    n = x.dist.shape[0]
    k, which, steps, tol, seed = call.entry.static
    be = backend.current()
    xp = be.xp
    dtype = A.dtype
    group = group_of(call)
    P, rank = call.world.size, call.rank
    sizes = [x.dist.shard_shapes(r)[0][0] for r in range(P)]
    r0 = sum(sizes[:rank])
    mine = sizes[rank]
    V = memory.zeros((mine, steps), dtype)
    full = memory.empty((n,), dtype)
    rng = np.random.default_rng(seed)

    def allsum(v):
        v = xp.ascontiguousarray(v)
        collectives.allreduce(group, v)
        return v

    def start_vector(j):
        """A random unit vector orthogonal to the first j basis vectors (the same on every worker)."""
        v = xp.asarray(rng.standard_normal(n)[r0:r0 + mine].astype(dtype))
        for _ in range(2):
            if j:
                h = allsum(V[:, :j].T @ v)
                v = v - V[:, :j] @ h
        nrm = float(be.asnumpy(allsum(xp.reshape(v @ v, (1,))))[0]) ** 0.5
        return v / nrm

    V[:, 0] = start_vector(0)
    alphas, betas = [], []
    converged, theta, S, m = False, None, None, 0
    for j in range(steps):
        collectives.allgatherv(group, xp.ascontiguousarray(V[:, j]), full, sizes)
        w = A @ full
        coef = np.zeros(j + 1)
        for _ in range(2):          # classical Gram-Schmidt twice: orthogonal to working precision
            h = allsum(V[:, :j + 1].T @ w)
            w = w - V[:, :j + 1] @ h
            coef += be.asnumpy(h).astype(np.float64)
        alphas.append(coef[j])
        beta = float(be.asnumpy(allsum(xp.reshape(w @ w, (1,))))[0]) ** 0.5
        m = j + 1
        if not (np.isfinite(coef).all() and np.isfinite(beta)):
            # NaN or inf in A (the same numbers on every worker: all stop here)
            call.result = (None, False)
            return [Shard([memory.zeros((mine, k), dtype)], call.entry.out_dists[0], x.dtype)]
        T = np.diag(alphas) + np.diag(betas, 1) + np.diag(betas, -1)
        theta, S = np.linalg.eigh(T)
        if m >= k:
            idx = _wanted(theta, k, which)
            scale = max(np.abs(theta).max(), np.finfo(np.float64).tiny)
            if m == n or np.all(beta * np.abs(S[-1, idx]) <= tol * scale):
                converged = True
                break
        if m == steps:
            break
        if beta <= np.finfo(dtype).eps * max(np.abs(theta).max(), 1.0):
            # an invariant subspace: continue from a new direction (T splits into blocks)
            V[:, j + 1] = start_vector(j + 1)
            betas.append(0.0)
        else:
            V[:, j + 1] = w / beta
            betas.append(beta)
    idx = _wanted(theta, k, which)
    Y = memory.empty((mine, k), dtype)
    blas.gemm(V[:, :m], xp.asarray(S[:, idx].astype(dtype)), Y, 1.0, 0.0)
    call.result = (theta[idx].copy(), converged)
    return [Shard([Y], call.entry.out_dists[0], x.dtype)]


# ---- randomized SVD ---------------------------------------------------------------------------
@checks.entry
def svds(A, k=6, *, oversample=10, n_iter=2, layout=None):
    """The k largest singular triplets of A by randomized SVD (Halko, Martinsson, Tropp 2011, as
    Heat's rsvd): (U, s, Vh) with s descending (a NumPy array), U m x k and Vh k x n Matrices.

    A Gaussian sketch of k + oversample columns (drawn from dmath.random's
    stream), n_iter power iterations re-orthonormalised by QR (TSQR), then
    the SVD of the small Q^T A. Accurate when the spectrum decays past k;
    use `svd` for exact values."""
    fn = "svds"
    checks.matrix(A, fn)
    checks.layout(layout, fn)
    m, n = A.shape
    k = as_int(k, "k")
    if not 1 <= k <= min(m, n):
        raise DMathError(f"{fn}: k must be in 1..{min(m, n)}, got {k}")
    p = as_int(oversample, "oversample")
    q = as_int(n_iter, "n_iter")
    if p < 0 or q < 0:
        raise DMathError(f"{fn}: oversample and n_iter must be >= 0, got {p} and {q}")
    dtype = checks.dtype_of(A)
    ell = min(k + p, m, n)
    omega = drandom.randn((n, ell), dtype=dtype, layout=RowBlock())
    Q, _ = qr(gemm(A, omega, layout=RowBlock()))
    for _ in range(q):
        Z, _ = qr(gemm(A, Q, trans_a=True, layout=RowBlock()))
        Q, _ = qr(gemm(A, Z, layout=RowBlock()))
    small = gemm(Q, A, trans_a=True, layout=RowBlock())          # ell x n
    Ub, s, Vh = svd(small)
    out = layout if layout is not None else RowBlock()
    return gemm(Q, Ub[:, :k], layout=out), s[:k], Vh[:k, :].remap(out)


# ---- norms ------------------------------------------------------------------------------------
@checks.entry
def norm(A, ord=None):
    """The matrix norm of A (NumPy's norm of a 2-D array), a float on the master: None or 'fro'
    (Frobenius), 'nuc' (sum of singular values), 1 / -1 (max / min column sum of |A|), inf / -inf
    (max / min row sum), 2 / -2 (largest / smallest singular value)."""
    checks.matrix(A, "norm")
    if ord is None or ord == "fro":
        return float(A.norm())
    if ord == "nuc":
        return float(np.sum(svdvals(A)))
    if isinstance(ord, (bool, np.bool_)) or ord not in (1, -1, 2, -2, np.inf, -np.inf):
        raise DMathError(f"norm: ord must be None, 'fro', 'nuc', 1, -1, 2, -2, inf or -inf, got {ord!r}")
    if min(A.shape) == 0:
        raise DMathError(f"norm: ord={ord!r} of an empty {A.shape} matrix has no value")
    if ord in (2, -2):
        s = svdvals(A)
        return float(s[0] if ord == 2 else s[-1])
    sums = elementwise.abs(A).sum(axis=0 if ord in (1, -1) else 1)
    return float(sums.max() if ord > 0 else sums.min())
