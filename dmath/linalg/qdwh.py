"""Distributed dense eigh and SVD: QDWH polar decomposition and spectral divide and conquer.

Nakatsukasa & Higham, "Stable and efficient spectral divide and conquer
algorithms for the symmetric eigenvalue decomposition and the SVD", SIAM J.
Sci. Comput. 35 (2013); what JAX runs for eigh on TPUs. A master-side
program of distributed operations (gemm, the Householder/TSQR `qr`,
`cholesky`, `cho_solve`, elementwise ops, norms, `trace`): every worker
takes part in every step, for any input layout and worker count, and
nothing of size n^2 passes through the master (it reads norms, traces, the
diagonal and the eigenvalues: O(n) numbers per node).

- `polar(A)`: the orthogonal polar factor U of A = U H by QDWH: X_0 = A /
  alpha, alpha a little above a power-method estimate of ||A||_2 (at most
  sqrt(||A||_1 ||A||_inf)), l_0 a lower bound estimate of X_0's smallest
  singular value (an LU and inverse iteration; eps for a singular A, from
  which the iteration converges in 6 steps in float64, 4 in float32; 1e-5
  saves a QR step: `_estimates`), then the
  dynamically weighted Halley steps of dc_plan.weights: while c > 100
  through the QR of the stacked [sqrt(c) X; I] (X_new = b/c X + (a - b/c) /
  sqrt(c) Q1 Q2^T), after that through the Cholesky factor of Z = I + c X^T X
  (X_new = b/c X + (a - b/c) X Z^-1).
- `eigh_dc(A)`: split at sigma (dc_plan.split_candidates: the median of the
  diagonal first); U = polar(A - sigma I) is V sign(Lambda - sigma) V^T, so P =
  (U + I) / 2 projects onto the eigenvectors above sigma and trace(U) counts
  them (k). A basis: the QR of [(I - P) W_lo, P W_hi] for a Gaussian W (again
  from its own Q while the coupling below is too large: a subspace
  iteration, SUBSPACE_PASSES), whose first
  n - k columns V_lo span the eigenvectors below sigma and the rest V_hi
  those above, orthogonal to each other to the working precision
  (Householder). A_lo = V_lo^T A V_lo and A_hi = V_hi^T A V_hi are split in
  turn. A split is refused (the next candidate tried) when the trace is not
  near an integer (an eigenvalue at sigma), when one side is empty, or when
  the coupling ||V_hi^T A V_lo||_F exceeds the backward-error bound; a node
  that is a multiple of the identity is a leaf with the identity as its
  vectors; a node no candidate splits is solved whole by a leaf solver.
- The leaves (order <= the leaf size: by default about n / P, dc_plan.default_leaf)
  are solved in ONE command by the local
  dense eigensolver (LAPACK / cuSOLVER), each on one worker, different
  leaves on different workers at the same time (dc_plan.assign_leaves), and
  the eigenvectors are assembled back up the tree by GEMMs: V_node =
  [V_lo E_lo, V_hi E_hi].
- `svd_square(A)`: A = U_p H by QDWH, H = (U_p^T A + A^T U_p) / 2 symmetric
  positive semidefinite, H = V diag(w) V^T by eigh_dc, so A = (U_p V) diag(w)
  V^T: the singular values are w (descending, non-negative). Never A^T A.
  For a rank-deficient A, U_p V's columns of the zero singular values are
  completed to orthonormal ones by a QR (`_orthonormal`).
"""
import math
from typing import NamedTuple

import numpy as np

from .. import backend, memory
from ..errors import LinAlgError
from ..layout import ColBlock, RowBlock
from ..matrix import eye
from ..ops import creation, elementwise, movement
from ..ops.assembly import hstack, vstack
from ..ops.base import dispatch, new_meta
from ..ops.gemm import gemm
from ..ops.data import from_numpy
from ..ops.structure import diag, take_rows, trace, tril
from ..runtime import Shard, define
from . import checks, dc_plan, dense
from .decompose import _lu_work, _trsm, _tsqr_fits, cho_solve, cholesky, qr
from .panels import work_layout

#: the least leaf size when none is given, per backend (dc_plan.default_leaf: otherwise about one
#: leaf per worker, n / P and a quarter). A leaf solve costs about 9 m^3 flops against roughly
#: 40 m^3 for a QDWH split of the same node (six iterations of QR or Cholesky plus products), and
#: a small node split on every worker is many small commands. CPU (a shared 2-core machine, so
#: rough): eigh of n = 1024 on one worker took 3.75 s at leaf 512 (leaves 511, 269, 244), 7.3 s at
#: 320, 8.2 s at 256; with benchmarks/linalg_bench.py --leaf at 2 workers, 3.4 s at 512 against
#: 4.4 s at 256 (n = 512: 256 beat 128 and 64). GPUs: cuSOLVER's syevd ran n = 8192 in 0.55 s on the
#: project's GPU machine (benchmarks/results/linalg_gpu_2026-11-26_072034.json) against 3.2 s
#: for n = 16384 (issue 33's anchor): it is fast up to a few thousand;
#: `SWEEP=1 benchmarks/qdwh_gpu.sh` measures leaves of 2560, 5120 and 10240 at
#: n = 16384.
LEAF_SIZE = {"cpu": 640, "gpu": 2560}

#: the seed of the Gaussian sketches of the projectors' ranges (their own streams: the user's
#: dmath.random state is left as it was, and the result does not depend on it)
SKETCH_SEED = 0x5ca1ab1e

#: a split is accepted when ||V_hi^T A V_lo||_F <= COUPLING sqrt(n) eps ||A||_F (the backward
#: error the split commits; QDWH-eigh's is a small multiple of eps ||A||, Nakatsukasa & Higham
#: section 5, and LAPACK's is about sqrt(n) eps ||A|| in practice)
COUPLING = 4.0

#: subspace iterations for a basis of the projector's range, at most. The first, from a Gaussian
#: sketch, loses digits to the condition of the sketch's k x k block: measured, a coupling of 47,
#: 227 and 74 eps ||A||_F at n = 256, 512 and 1024 (QDWH from its estimates), against the bound's
#: 64, 90 and 128; the second, from the first's basis, brings it to about 4 eps ||A||_F (3.0, 3.4,
#: 3.8 there); a third where even that is not enough
SUBSPACE_PASSES = 3

#: QDWH starts from estimates of ||A||_2 and of A's smallest singular value (`_estimates`: a few
#: power steps, an LU and a few inverse-iteration steps, about 2/3 n^3 flops), not from the safe
#: sqrt(||A||_1 ||A||_inf) and l = eps: for a random A the safe alpha is ~0.4 sqrt(n) times too
#: large, and l ~ 1e-5 instead of eps saves one of the two QR steps (about 9 n^3 flops) and often
#: one Cholesky step (dc_plan.schedule)
ESTIMATE = True
POWER_STEPS = 6
INVERSE_STEPS = 2
L_SAFETY = 2.0

#: more QDWH steps than this mean the iteration is not converging (6 from l = eps in float64)
MAX_STEPS = 12


class LeafArgs(NamedTuple):
    """Static arguments of `linalg_eigh_leaves`."""
    vectors: bool       # eigenvectors too (output 2i + 1 of leaf i)


LEAVES = define("linalg_eigh_leaves", LeafArgs)


# ---- QDWH polar decomposition -----------------------------------------------------------------
def _eps(dtype):
    return float(np.finfo(dtype).eps)


def _balanced(A):
    """(A times 2**-e, e): A scaled by a power of two (exactly, no rounding) so that its largest
    magnitude is near 1 when it lies so far from 1 that the norms and power steps here, sums of
    squares, would overflow or underflow (beyond about 2**(maxexp / 4)); else (A, 0)."""
    amax = max(abs(float(A.max())), abs(float(A.min())))
    if amax == 0 or not math.isfinite(amax):
        return A, 0
    e = math.frexp(amax)[1]             # amax = m 2**e, 0.5 <= m < 1
    if abs(e) <= np.finfo(A.dtype).maxexp // 4:
        return A, 0
    return A * math.ldexp(1.0, -e), e


def _block(n, op=None):
    """The factorizations' column-block width for a node of order n: the backend's default
    (DEFAULT_BLOCK, measured at large n), made smaller (a power of 2, at least 64) until every
    worker holds at least 4 column blocks: the nodes shrink down the tree, and a factorization
    with one panel per worker runs its panels one after the other (one worker: the default)."""
    nb = checks.block(None, max(1, n), op)
    P = checks.workers()
    per = n // (4 * P)
    if P > 1 and per < nb:
        nb = min(nb, max(64, 1 << max(per, 1).bit_length() - 1))
    return max(1, min(nb, n))


def _layout(n):
    """The layout the iterations run in: the factorizations' (cholesky reads it as it is)."""
    return work_layout(_block(n), checks.workers())


def _qr(M):
    """qr(M) with the node's block width (TSQR where it fits: qr takes no block then)."""
    m, n = M.shape
    return qr(M) if _tsqr_fits(m, n, checks.workers()) else qr(M, block=_block(min(m, n), "qr"))


def _qr_layout(m, n):
    """The layout `_qr` factors an m x n matrix in (TSQR's RowBlock or the Householder work layout):
    a matrix made there for it is copied in place, not moved."""
    P = checks.workers()
    if _tsqr_fits(m, n, P):
        return RowBlock(tuple(range(P)))
    return work_layout(_block(min(m, n), "qr"), P)


# The products below let gemm choose their layouts (the next operation remaps what it needs): a
# product forced into a BlockCyclic layout whose block differs from its operands' can take a
# SUMMA plan whose result columns do not match B's (wrong values at n >= 1024 on 2 workers:
# gemm(A, B, trans_a=True, layout=BlockCyclic((64, 64), grid=(1, 2))) with A, B 1024 x 511 in
# BlockCyclic((128, 128), grid=(1, 2)); reported with this branch).


def _unit_columns(Z):
    """(Z with its columns scaled to norm 1, the columns' norms as a NumPy array)."""
    norms = np.sqrt(np.maximum((Z * Z).sum(axis=0).to_numpy().reshape(-1).astype(np.float64), 0.0))
    scale = np.where(norms > 0, 1.0 / np.where(norms > 0, norms, 1.0), 0.0)
    return Z * from_numpy(scale.reshape(1, -1).astype(Z.dtype), layout=RowBlock((0,))), norms


def _estimates(X, symmetric, upper, sketch):
    """(alpha, l): an estimate of ||X||_2 a little above it, and a lower bound estimate of
    X's smallest singular value divided by alpha (the start of QDWH), from k = max(2, P) Gaussian
    columns (one per worker in the solves).

    alpha: POWER_STEPS steps of the power method on X (X^T X when not symmetric), 10% above its
    estimate, at most `upper` (sqrt(||X||_1 ||X||_inf), which can be sqrt(n) times too large: a
    tight alpha is what lets l be large). l: the LU of X with partial pivoting and INVERSE_STEPS
    steps of inverse iteration on (X^T X)^-1 (four blocked triangular solves each), whose
    estimate of sigma_min is at or above it: halved (L_SAFETY), and eps when X is singular. An l
    above the true bound only delays convergence (a few steps more), an alpha below ||X||_2 by
    10% converges as well (Halley's map takes 1.1 to 1.0005)."""
    n = X.shape[0]
    P = checks.workers()
    k = max(2, P)
    eps = _eps(X.dtype)
    cols = ColBlock(tuple(range(P)))
    V, _ = _unit_columns(sketch.gaussian((n, k), X.dtype, cols))
    for _ in range(POWER_STEPS):
        Z = gemm(X, V)
        if not symmetric:
            Z = gemm(X, Z, trans_a=True)
        V, norms = _unit_columns(Z)
    top = float(norms.max()) if symmetric else math.sqrt(float(norms.max()))
    alpha = min(upper, 1.1 * top) if top > 0 else upper
    nb = _block(n)
    W, perm, pivots = _lu_work(X, nb)
    pivots = np.asarray(pivots, dtype=np.float64)
    if not np.all(np.isfinite(pivots)) or np.any(pivots == 0):
        return alpha, eps
    back = np.argsort(perm)
    V, _ = _unit_columns(sketch.gaussian((n, k), X.dtype, cols))
    for _ in range(INVERSE_STEPS):
        Y = take_rows(V, perm, layout=cols)                         # P V: X[perm] = L U
        _trsm(W, Y, True, False, True, nb, "eigh", check=False)     # L^-1
        _trsm(W, Y, False, False, False, nb, "eigh", check=False)   # U^-1: X^-1 V
        _trsm(W, Y, False, True, False, nb, "eigh", check=False)    # U^-T
        _trsm(W, Y, True, True, True, nb, "eigh", check=False)      # L^-T, then P^T: X^-T X^-1 V
        V, norms = _unit_columns(take_rows(Y, back, layout=cols))
    growth = float(norms.max())
    if not (math.isfinite(growth) and growth > 0):
        return alpha, eps
    l = 1.0 / math.sqrt(growth) / alpha / L_SAFETY
    return alpha, min(max(l, eps), 1.0)


def polar(A, symmetric=False, steps=None, sketch=None):
    """The orthogonal polar factor U of the square A (A = U H, H symmetric positive semidefinite),
    by QDWH (see the module's docstring), in the factorizations' layout. symmetric: A is, and so
    is U (symmetrized at the end). steps: a list the number of iterations is appended to.
    sketch: the random streams of the norm and condition estimates (_estimates; ESTIMATE)."""
    n = A.shape[0]
    dtype = A.dtype
    lay = _layout(n)
    X = A if A.layout == lay.resolved(checks.workers()) else movement.remap(A, lay, dtype)
    absx = elementwise.abs(X)
    one = float(absx.sum(axis=0).max())
    alpha = one if symmetric else math.sqrt(one * float(absx.sum(axis=1).max()))
    I = eye(n, dtype=dtype, layout=lay)
    if not alpha > 0:
        return I                        # A = 0: every orthogonal matrix is a polar factor
    eps = _eps(dtype)
    l = eps
    if ESTIMATE:
        alpha, l = _estimates(X, symmetric, alpha, sketch or _Sketch())
    X = X * (1.0 / alpha)
    done = 0
    for done in range(1, MAX_STEPS + 1):
        a, b, c, l_next = dc_plan.weights(l)
        if c > dc_plan.QR_ABOVE:
            Q, _ = _qr(vstack([X * math.sqrt(c), I], layout=_qr_layout(2 * n, n)))
            M = gemm(Q[:n, :], Q[n:, :], trans_b=True)
            X_new = X * (b / c) + M * ((a - b / c) / math.sqrt(c))
        else:
            Z = gemm(X, X, trans_a=True) * c + I
            nb = _block(n)
            Y = cho_solve((cholesky(Z, block=nb), True), X.T, block=nb)   # Z^-1 X^T (Z is symmetric)
            X_new = X * (b / c) + Y.T * (a - b / c)
        diff = float((X_new - X).norm())
        X, l = X_new, l_next
        # cubic convergence: once a step moves X by less than eps^(1/3), X is within eps of U
        if 1.0 - l <= 10 * eps and diff <= (5 * eps) ** (1.0 / 3.0):
            break
    if steps is not None:
        steps.append(done)
    if symmetric:
        X = (X + X.T) * 0.5
    return X


# ---- spectral divide and conquer ---------------------------------------------------------------
class _Leaf:
    """A node solved whole: by the local eigensolver (`matrix`), or a multiple of the identity
    (`scalar`: its value; the identity is its vectors)."""

    def __init__(self, n, matrix=None, scalar=None):
        self.n, self.matrix, self.scalar = n, matrix, scalar
        self.w = self.V = None


class _Split:
    """A node split into its eigenvalues below (lo) and above (hi) the split point, with the bases
    V_lo, V_hi of the two invariant subspaces (None when no vectors are wanted)."""

    def __init__(self, lo, hi, V_lo, V_hi):
        self.lo, self.hi, self.V_lo, self.V_hi = lo, hi, V_lo, V_hi


#: what the last eigh_dc call did (tests and benchmarks read it): the leaf size, splits made,
#: split points refused, subspace iterations run, the order of every leaf and the worker that
#: solved it, the QDWH steps of every polar decomposition
last_run = {}


class _Sketch:
    """The private random streams of one eigh_dc call (see SKETCH_SEED), and its record (last_run)."""

    def __init__(self):
        self.state = {"seed": SKETCH_SEED, "stream": 0}
        self.record = {"splits": 0, "refused": 0, "passes": 0, "leaves": [], "owners": [], "steps": []}

    def gaussian(self, shape, dtype, lay):
        return creation.random("normal", shape, dtype, lay, None, self.state)


def _sym(M):
    return (M + M.T) * 0.5


def _try_split(A, sigma, sketch, norm_a, vectors):
    """(A_lo, A_hi, V_lo, V_hi) of the split of the symmetric A at sigma, or None when refused."""
    n = A.shape[0]
    dtype = A.dtype
    lay = _layout(n)
    U = polar(A - eye(n, dtype=dtype, layout=lay) * sigma, symmetric=True, steps=sketch.record["steps"],
              sketch=sketch)
    k = dc_plan.projector_rank(trace(U), n)
    if k is None or k in (0, n):
        sketch.record["refused"] += 1
        return None
    # Y = 2 [(I - P) W_lo, P W_hi] = W + U (W D), D = diag(-1 (n - k times), +1 (k times))
    signs = np.concatenate([-np.ones(n - k), np.ones(k)]).reshape(1, n).astype(dtype)
    D = from_numpy(signs, layout=RowBlock((0,)))
    Q = sketch.gaussian((n, n), dtype, _qr_layout(n, n))
    bound = COUPLING * math.sqrt(n) * _eps(dtype) * norm_a
    for _ in range(SUBSPACE_PASSES):
        sketch.record["passes"] += 1
        Q, _ = _qr(Q + gemm(U, Q * D))
        V_lo, V_hi = Q[:, :n - k], Q[:, n - k:]
        AV_lo = gemm(A, V_lo)
        coupling = float(gemm(V_hi, AV_lo, trans_a=True).norm())
        if coupling <= bound:
            break
    else:
        sketch.record["refused"] += 1
        return None
    del U
    sketch.record["splits"] += 1
    A_lo = _sym(gemm(V_lo, AV_lo, trans_a=True))
    A_hi = _sym(gemm(V_hi, gemm(A, V_hi), trans_a=True))
    return A_lo, A_hi, (V_lo if vectors else None), (V_hi if vectors else None)


def _divide(A, leaf, sketch, vectors, leaves, norm_root=None):
    """The tree of the symmetric A (a _Leaf or a _Split); the leaves it meets are appended to
    `leaves` in order. norm_root: ||A||_F of the whole problem, which the backward errors of the
    splits and the test for a multiple of the identity are relative to (a subproblem's rounding
    errors are of that size, not of its own norm's)."""
    n = A.shape[0]
    if n <= leaf:
        node = _Leaf(n, matrix=A)
        leaves.append(node)
        return node
    lay = _layout(n)
    if A.layout != lay.resolved(checks.workers()):
        A = movement.remap(A, lay, A.dtype)        # (a product's layout, Partial perhaps: gemm chose it)
    d = diag(A).to_numpy().astype(np.float64).reshape(-1)
    mean = float(d.mean())
    norm_a = float(A.norm()) if norm_root is None else norm_root
    spread = float((A - eye(n, dtype=A.dtype, layout=A.layout) * mean).norm())
    if spread <= n * _eps(A.dtype) * norm_a:
        # a multiple of the identity (to the working precision): no split point separates anything
        node = _Leaf(n, scalar=mean)
        leaves.append(node)
        return node
    for sigma in dc_plan.split_candidates(d, spread / math.sqrt(n)):
        parts = _try_split(A, sigma, sketch, norm_a, vectors)
        if parts is not None:
            break
    else:
        node = _Leaf(n, matrix=A)           # no split point works: solved whole on one worker
        leaves.append(node)
        return node
    A_lo, A_hi, V_lo, V_hi = parts
    del A
    lo = _divide(A_lo, leaf, sketch, vectors, leaves, norm_a)
    hi = _divide(A_hi, leaf, sketch, vectors, leaves, norm_a)
    return _Split(lo, hi, V_lo, V_hi)


def _solve_leaves(leaves, vectors, fn, record):
    """Solve every leaf: the matrices in one command, each on its worker (dc_plan.assign_leaves)."""
    solved = [x for x in leaves if x.matrix is not None]
    P = checks.workers()
    owners = dc_plan.assign_leaves([x.n for x in solved], P)
    record["leaves"] = [x.n for x in solved]
    record["owners"] = owners
    inputs, outputs = [], []
    for x, w in zip(solved, owners):
        lay = RowBlock((w,))
        dtype = x.matrix.dtype
        inputs.append(movement.remap(x.matrix, lay, dtype))
        x.matrix = None
        outputs.append(new_meta(lay, (x.n, 1), dtype))
        if vectors:
            outputs.append(new_meta(lay, (x.n, x.n), dtype))
    made = dispatch("linalg_eigh_leaves", inputs, outputs, static=LEAVES.static(vectors=vectors))[0] if inputs else []
    per = 2 if vectors else 1
    for i, x in enumerate(solved):
        x.w = made[per * i].to_numpy().astype(np.float64).reshape(-1)
        if not np.all(np.isfinite(x.w)):
            raise LinAlgError(f"{fn}: the eigensolver did not converge on a subproblem of order {x.n}; "
                              f"does the matrix hold NaN or inf?")
        if vectors:
            x.V = made[per * i + 1]
    for x in leaves:
        if x.scalar is not None:
            x.w = np.full(x.n, x.scalar)


def _values(node):
    if isinstance(node, _Leaf):
        return node.w
    return np.concatenate([_values(node.lo), _values(node.hi)])


def _vectors(node, dtype):
    """The eigenvectors of the node's matrix (in its own coordinates), ordered as _values."""
    if isinstance(node, _Leaf):
        return node.V if node.scalar is None else eye(node.n, dtype=dtype, layout=_layout(node.n))
    n = node.V_lo.shape[0]
    lay = _layout(n)
    lo = gemm(node.V_lo, _vectors(node.lo, dtype))
    hi = gemm(node.V_hi, _vectors(node.hi, dtype))
    node.V_lo = node.V_hi = None
    return hstack([lo, hi], layout=lay)


def eigh_dc(A, vectors=True, leaf=None, fn="eigh"):
    """(w ascending as a NumPy float64 array, V or None) of the symmetric A (its lower triangle is
    read, as LAPACK's), by the spectral divide and conquer."""
    n = A.shape[0]
    dtype = A.dtype
    if leaf is None:
        leaf = dc_plan.default_leaf(n, checks.workers(), LEAF_SIZE["gpu" if backend.current().is_gpu else "cpu"])
    lay = _layout(n)
    X = A if A.layout == lay.resolved(checks.workers()) else movement.remap(A, lay, dtype)
    X, e = _balanced(X)                 # (the eigenvalues scale with A, the vectors do not)
    leaves = []
    sketch = _Sketch()
    tree = _divide(tril(X) + tril(X, -1).T, leaf, sketch, vectors, leaves)
    del X
    _solve_leaves(leaves, vectors, fn, sketch.record)
    last_run.clear()
    last_run.update(sketch.record, leaf=leaf)
    w = np.ldexp(_values(tree), e)
    V = _vectors(tree, dtype) if vectors else None
    order = np.argsort(w, kind="stable")
    if np.any(order != np.arange(n)):
        # an eigenvalue within rounding of a split point may have landed on the other side
        w = w[order]
        if vectors:
            V = take_rows(V.T, order, layout=RowBlock()).T
    return w, V


def svd_square(A, vectors=True, leaf=None, fn="svd"):
    """(U, s descending as a NumPy float64 array, V) of the square A with A = U diag(s) V^T (U, V
    None without vectors), through its polar decomposition and eigh_dc (the module's docstring)."""
    n = A.shape[0]
    lay = _layout(n)
    X = A if A.layout == lay.resolved(checks.workers()) else movement.remap(A, lay, A.dtype)
    X, e = _balanced(X)                 # (the singular values scale with A, the vectors do not)
    Up = polar(X)
    H = _sym(gemm(Up, X, trans_a=True))
    w, V = eigh_dc(H, vectors, leaf, fn)
    s = np.ldexp(np.maximum(w[::-1], 0.0), e)      # H is positive semidefinite: a negative w is rounding
    if not vectors:
        return None, s, None
    V = take_rows(V.T, np.arange(n - 1, -1, -1), layout=lay).T     # descending order
    return _orthonormal(gemm(Up, V)), s, V


def _orthonormal(U):
    """U with orthonormal columns. For a rank-deficient A, QDWH's U_p is a partial isometry: the
    singular values below its lower bound l are not mapped to 1, so the columns of U_p V for the
    zero singular values are short. Those (and only those, when U's column norms say so) are
    replaced by the Householder QR's orthonormal completion; the others keep their direction
    (the signs of R's diagonal undone). Any orthonormal directions serve for a zero singular
    value."""
    n = U.shape[1]
    norms = (U * U).sum(axis=0).to_numpy().reshape(-1)
    if np.all(np.abs(norms - 1.0) <= math.sqrt(_eps(U.dtype))):
        return U
    Q, R = _qr(U)
    signs = np.where(diag(R).to_numpy().reshape(-1) < 0, -1.0, 1.0).reshape(1, n).astype(U.dtype)
    return Q * from_numpy(signs, layout=RowBlock((0,)))


def completed(U):
    """[U, U_perp]: the m x k U with orthonormal columns completed to an orthogonal m x m matrix
    (svd's full_matrices) by the Householder QR of [U, W] for a Gaussian W: its first k columns
    are U's up to signs, the others orthogonal to them to the working precision."""
    m, k = U.shape
    lay = _layout(m)
    W = _Sketch().gaussian((m, m - k), U.dtype, lay)
    Q, _ = _qr(hstack([U, W], layout=_qr_layout(m, m)))
    return hstack([U, Q[:, k:]], layout=lay)


# ---- the leaves' kernel -----------------------------------------------------------------------
@LEAVES.kernel()
def _leaves(call):
    """Every leaf (input i, whole on one worker) solved by its worker: output 2i (or i without
    vectors) its eigenvalues as an (m, 1) column, output 2i + 1 its eigenvectors, on the same
    worker. A leaf the solver refuses (NaN or inf) gets NaN values: the master raises."""
    vectors = call.entry.static.vectors
    per = 2 if vectors else 1
    out = []
    for i, x in enumerate(call.inputs):
        dists = call.entry.out_dists[per * i:per * i + per]
        dtypes = [o.dtype for o in call.entry.outputs[per * i:per * i + per]]
        if not x.pieces:
            out.extend(Shard([memory.empty(s, t) for s in d.shard_shapes(call.rank)], d, t)
                       for d, t in zip(dists, dtypes))
            continue
        try:
            w, V = dense.eigh(x.pieces[0], vectors)
        except np.linalg.LinAlgError:
            m = x.pieces[0].shape[0]
            w, V = memory.empty((m,), x.dtype), memory.empty((m, m), x.dtype)
            w.fill(np.nan)
            V.fill(np.nan)
        out.append(Shard([w.astype(x.dtype, copy=False).reshape(-1, 1)], dists[0], dtypes[0]))
        if vectors:
            out.append(Shard([backend.current().xp.ascontiguousarray(V.astype(x.dtype, copy=False))],
                             dists[1], dtypes[1]))
    return out
