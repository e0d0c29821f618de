"""Eigenvalues and singular values: eigh, eigvalsh, svd, svdvals (dense), eigsh (Lanczos), svds
(randomized), and the matrix norms built on them.

Dense eigh/svd, two methods (`method=`; 'auto' chooses, see AUTO_QDWH_N):
- 'qdwh' (dmath/linalg/qdwh.py): distributed. QDWH polar decompositions and
  spectral divide and conquer down to leaves that the local eigensolver
  solves, each on one worker, different leaves on different workers at once;
  the svd through the polar decomposition A = U_p H and eigh of H.
- 'gather': `eigh` gathers A on worker 0 with a remap (a worker-side
  gather: the workers exchange the pieces, nothing passes through the
  master's program) and runs LAPACK's / cuSOLVER's eigensolver there, then
  scatters the eigenvectors back the same way; only the eigenvalues (n
  numbers) reach the master. `svd` first makes a tall (or wide) A square
  with the distributed QR (TSQR or Householder: min(m, n)^2 numbers are
  gathered instead of m n), takes the SVD of R on worker 0 and multiplies Q
  by R's left singular vectors on the workers.
Neither computes anything from A^T A, whose condition number is squared.

`eigsh` is Lanczos with full reorthogonalization in one worker command
(`linalg_lanczos`): A in RowBlock, each step one all-gather of the vector
(n numbers), the product with the local rows, and two all-reduces of the
basis coefficients (classical Gram-Schmidt twice); the tridiagonal matrix
is on every worker's host (the same numbers everywhere, so every worker
stops at the same step). The basis grows until the k wanted Ritz pairs
have residuals below tol (no restart: memory n x steps).
"""
import math
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
from . import checks, qdwh
from .decompose import qr
from .panels import group_of
from .tsqr import EIGH, SVD

#: a factor of this many is "tall": svd goes through QR first (gathering n^2 numbers, not m n)
_TALL = 2

#: method='auto' takes 'qdwh' from this order up when there are several workers, per backend and
#: problem (None: never). QDWH's divide and conquer does several times the flops of the local
#: solver (six QR or Cholesky iterations and the products of every split: about 47 n^3 for the
#: first split, against about 9 n^3 for a tridiagonal eigensolver), nearly all in GEMM, QR and
#: Cholesky, so it pays where the workers' added speed outweighs that and the local solver is
#: slow. On GPUs cuSOLVER's syevd runs n = 16384 at about 1.8 TFLOP/s of its nominal 4/3 n^3
#: (3.2 s on an H200, issue 33's anchor) and its gesvd n = 8192 in 9.7 s, against DGEMM's ~50
#: TFLOP/s per GPU: by that count the SVD gains from n = 4096 on, eigh only from n = 16384 on 4
#: GPUs (the flop model; benchmarks/qdwh_gpu.sh measures it). On the CPU (2 workers,
#: benchmarks/results/linalg_cpu_qdwh_2026-11-26.json) LAPACK alone on one worker was faster:
#: n = 1024, eigh 0.22 s gathered against 1.24 s by qdwh, svd 0.49 s against 2.50 s (Heat 4.1 s
#: and 7.8 s, SciPy in one process 0.21 s and 0.53 s); so 'auto' gathers there. Measured on 4
#: H100s (float64, benchmarks/results/linalg_h100_p4_qdwh_2026-11-26.json, one-GPU cuSOLVER in the
#: same job): svd n = 8192 2.65 s against 10.7 s, n = 16384 5.75 s against 63.7 s (4.0x, 11.1x);
#: eigh n = 16384 4.53 s against 3.80 s (0.84x: the gathered syevd wins there), so eigh takes
#: qdwh only from n = 32768 (where the flop model puts the crossover; not yet measured).
AUTO_QDWH_N = {"cpu": {"eigh": None, "svd": None}, "gpu": {"eigh": 32768, "svd": 4096}}

METHODS = ("auto", "gather", "qdwh")


def _method(method, fn, n):
    """'gather' or 'qdwh': `method` checked, 'auto' resolved for order n (AUTO_QDWH_N; svdvals as
    svd, eigvalsh as eigh)."""
    if not isinstance(method, str) or method not in METHODS:
        raise DMathError(f"{fn}: method must be 'auto', 'gather' or 'qdwh', got {method!r}")
    if method != "auto":
        return method
    least = AUTO_QDWH_N["gpu" if backend.current().is_gpu else "cpu"]["svd" if fn.startswith("svd") else "eigh"]
    return "qdwh" if least is not None and checks.workers() > 1 and n >= least else "gather"


def _leaf_size(leaf_size, fn):
    if leaf_size is None:
        return None
    if isinstance(leaf_size, (bool, np.bool_)) or not isinstance(leaf_size, (int, np.integer)) or leaf_size < 1:
        raise DMathError(f"{fn}: leaf_size must be a positive integer or None, got {leaf_size!r}")
    return int(leaf_size)


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
def eigh(A, *, layout=None, method="auto", leaf_size=None):
    """Eigenvalues (ascending, a NumPy array on the master) and orthonormal eigenvectors (a Matrix,
    RowBlock unless `layout` is given) of the symmetric A; its lower triangle is read.

    method='qdwh': QDWH spectral divide and conquer on every worker, the
    leaves (order <= leaf_size; default about n / P, at least
    qdwh.LEAF_SIZE) solved by the local eigensolver, one worker each;
    'gather': the local eigensolver on worker 0 on A gathered there;
    'auto': qdwh for large n on several workers (AUTO_QDWH_N), else
    gather. See the module's docstring."""
    checks.square(A, "eigh")
    checks.layout(layout, "eigh")
    dtype = checks.dtype_of(A)
    leaf = _leaf_size(leaf_size, "eigh")
    if A.shape[0] and _method(method, "eigh", A.shape[0]) == "qdwh":
        w, V = qdwh.eigh_dc(A.astype(dtype) if A.dtype != dtype else A, True, leaf, "eigh")
        return w, checks.placed(V, layout if layout is not None else RowBlock())
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
def eigvalsh(A, *, method="auto", leaf_size=None):
    """The eigenvalues of the symmetric A, ascending (a NumPy array on the master); `method` and
    `leaf_size` as eigh's."""
    checks.square(A, "eigvalsh")
    leaf = _leaf_size(leaf_size, "eigvalsh")
    if A.shape[0] and _method(method, "eigvalsh", A.shape[0]) == "qdwh":
        return qdwh.eigh_dc(A, False, leaf, "eigvalsh")[0]
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
def svd(A, full_matrices=False, *, layout=None, method="auto", leaf_size=None):
    """(U, s, Vh) with A = U diag(s) Vh, s descending (a NumPy array on the master).

    U and Vh are Matrices (RowBlock unless `layout` is given).
    method='qdwh': a non-square A is made square by the distributed QR
    (of A^T when wide), then the polar decomposition by QDWH and the eigh
    of its symmetric factor by the divide and conquer (leaf_size as eigh's);
    full_matrices=True completes U (or Vh) by the QR of [U, W] for a
    Gaussian W. method='gather': a tall A (m >= 2n) is reduced by the
    distributed QR first, U = Q U_R, a wide one likewise through A^T;
    otherwise, and for full_matrices=True, the SVD runs on worker 0 on A
    gathered there. 'auto' as eigh's (see the module's docstring)."""
    checks.matrix(A, "svd")
    checks.layout(layout, "svd")
    full = checks.flag(full_matrices, "svd", "full_matrices")
    leaf = _leaf_size(leaf_size, "svd")
    m, n = A.shape
    out = layout if layout is not None else RowBlock()
    if min(m, n) > 0 and _method(method, "svd", min(m, n)) == "qdwh":
        U, s, Vh = _svd_qdwh(A, True, full, leaf, "svd")
        return checks.placed(U, out), s, checks.placed(Vh, out)
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
def svdvals(A, *, method="auto", leaf_size=None):
    """The singular values of A, descending (a NumPy array on the master); a tall or wide A is
    reduced by the distributed QR first; `method` and `leaf_size` as svd's."""
    checks.matrix(A, "svdvals")
    leaf = _leaf_size(leaf_size, "svdvals")
    m, n = A.shape
    if min(m, n) > 0 and _method(method, "svdvals", min(m, n)) == "qdwh":
        return _svd_qdwh(A, False, False, leaf, "svdvals")[1]
    if min(m, n) > 0 and m >= _TALL * n:
        return _svd_gathered(qr(A, mode="r"), False, False)[1]
    if min(m, n) > 0 and n >= _TALL * m:
        return _svd_gathered(qr(A.T, mode="r"), False, False)[1]
    return _svd_gathered(A, False, False)[1]


def _svd_qdwh(A, vectors, full, leaf, fn):
    """(U, s, Vh) of A by QR (when not square), QDWH and the divide and conquer (U, Vh None
    without vectors)."""
    m, n = A.shape
    dtype = checks.dtype_of(A)
    X = A if A.dtype == dtype else A.astype(dtype)
    wide = m < n
    if wide:
        X = X.T                                 # A^T = U' s Vh' gives A = Vh'^T s U'^T
    if m != n:
        if not vectors:
            return None, qdwh.svd_square(qr(X, mode="r"), False, leaf, fn)[1], None
        Q, R = qr(X)
        Ur, s, V = qdwh.svd_square(R, True, leaf, fn)
        U = gemm(Q, Ur)
    else:
        U, s, V = qdwh.svd_square(X, vectors, leaf, fn)
        if not vectors:
            return None, s, None
    if full and m != n:
        U = qdwh.completed(U)
    return (V, s, U.T) if wide else (U, s, V.T)


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
    seed = as_int(seed, "seed")
    if seed < 0:
        raise DMathError(f"{fn}: seed must be a non-negative integer (NumPy's generators take no other), got {seed}")
    rows = RowBlock(tuple(range(checks.workers())))
    X = A if A.layout == rows.resolved(checks.workers()) and A.dtype == dtype else movement.remap(A, rows, dtype)
    made, (w, converged) = dispatch(
        "linalg_lanczos", [X], [new_meta(rows, (n, k), dtype)],
        static=LANCZOS.static(k=k, which=which, steps=steps, tol=tol, seed=seed))
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

    # the recurrence runs on A * 2**-e, e the exponent of A's largest magnitude over the group (an
    # exact scaling), its eigenvalues scaled back at the end: the squares of w under- or overflowed
    # for a matrix of norm near 1e-154 or 1e154 (float32: 1e-19, 1e19), and a beta of 0 returned the
    # Ritz values of random vectors as converged eigenvalues, an inf a false "NaN or inf" error. A
    # small A scales the vector before the product (no underflow in it), a large one the product
    top = xp.reshape(xp.abs(A).max().astype(np.float64), (1,)) if A.size else xp.zeros(1, np.float64)
    collectives.allreduce(group, top, "max")
    amax = float(be.asnumpy(top)[0])
    e = math.frexp(amax)[1] if math.isfinite(amax) and amax > 0 else 0     # (NaN or inf: caught below)
    before = math.ldexp(1.0, -e) if e < 0 else 1.0
    after = math.ldexp(1.0, -e) if e > 0 else 1.0
    V[:, 0] = start_vector(0)
    alphas, betas = [], []
    converged, theta, S, m = False, None, None, 0
    # A's scale as the recurrence sees it (|alpha| and beta are entries of T, whose norm is at most
    # A's): an invariant subspace is a beta negligible against it. A floor of 1 made every step of a
    # matrix of norm below eps look invariant: restarts from random vectors, a diagonal T, and
    # "converged" Ritz pairs that were not eigenpairs
    scale_a = np.finfo(np.float64).tiny
    for j in range(steps):
        collectives.allgatherv(group, xp.ascontiguousarray(V[:, j]), full, sizes)
        if before != 1.0:
            full *= before          # (the gathered vector's buffer: refilled at every step)
        w = A @ full
        if after != 1.0:
            w *= after
        coef = np.zeros(j + 1)
        for _ in range(2):          # classical Gram-Schmidt twice: orthogonal to working precision
            h = allsum(V[:, :j + 1].T @ w)
            w = w - V[:, :j + 1] @ h
            coef += be.asnumpy(h).astype(np.float64)
        alphas.append(coef[j])
        beta = float(be.asnumpy(allsum(xp.reshape(w @ w, (1,))))[0]) ** 0.5
        scale_a = max(scale_a, abs(coef[j]), beta)
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
        if beta <= np.finfo(dtype).eps * max(np.abs(theta).max(), scale_a):
            # an invariant subspace: continue from a new direction (T splits into blocks)
            V[:, j + 1] = start_vector(j + 1)
            betas.append(0.0)
        else:
            V[:, j + 1] = w / beta
            betas.append(beta)
    idx = _wanted(theta, k, which)
    Y = memory.empty((mine, k), dtype)
    blas.gemm(V[:, :m], xp.asarray(S[:, idx].astype(dtype)), Y, 1.0, 0.0)
    call.result = (np.ldexp(theta[idx], e), converged)
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
