"""The worker kernels of the factorizations and triangular solves, on the 1D column-cyclic layout.

Each kernel is one command: a loop over the column panels in which a
panel's owner factors it, `panels.Pipeline` broadcasts it (with
look-ahead) and every worker applies it to the columns it holds. Inputs
are already in `panels.work_layout(nb, P)` (the master half remapped them)
and are overwritten in place; right-hand sides are in ColBlock over every
worker (all rows, a share of the columns). What the master needs back
(the failing minor, the pivots, U's diagonal) reaches rank 0 through the
broadcast panels and is returned as the command's result, never the
matrix.
"""
from typing import NamedTuple

import numpy as np

from .. import backend, memory
from ..gpu import blas
from ..layout import indexset as ix
from ..runtime import Shard, define
from . import dense
from .panels import Columns, Pipeline, group_of


class FactorArgs(NamedTuple):
    """Static arguments of the factorization kernels."""
    nb: int             # the column-block width of the work layout
    with_b: bool        # a right-hand side B (input 1) is carried along (LU) / Q is formed (QR)


class TrsmArgs(NamedTuple):
    """Static arguments of `linalg_trsm`: solve op(A) X = B in place of B (A in the work layout)."""
    nb: int
    lower: bool         # A's triangle (the other is not read)
    trans: bool         # solve A^T X = B
    unit: bool          # A's diagonal taken as ones (not read)


class TriangleArgs(NamedTuple):
    """Static arguments of `linalg_triangle`: the lower (or upper) triangle from diagonal k."""
    lower: bool
    k: int
    unit: bool          # the main diagonal set to 1 (the L of an LU: k = -1, unit)


CHOLESKY = define("linalg_cholesky", FactorArgs)
LU = define("linalg_lu", FactorArgs)
QR = define("linalg_qr", FactorArgs)
TRSM = define("linalg_trsm", TrsmArgs)
TRIANGLE = define("linalg_triangle", TriangleArgs)


def _xp():
    return backend.current().xp


def _first_nonzero(flags):
    """Rank 0: the first nonzero status (one host transfer for all panels), 0 if none."""
    if not flags:
        return 0
    host = backend.current().asnumpy(_xp().concatenate(flags))
    nz = np.flatnonzero(host)
    return int(host[nz[0]]) if nz.size else 0


# ---- Cholesky ---------------------------------------------------------------------------------
@CHOLESKY.kernel()
def _cholesky(call):
    """Right-looking blocked Cholesky, A = L L^T, L written over A (its upper part zeroed).

    Panel t: its owner factors the diagonal block (potrf), solves the
    panel below it (trsm) and broadcasts L[c0:, t] with a status element
    (the order of the failing leading minor, or 0); every worker subtracts
    L[cs:, t] L[cs:cs+w, t]^T from each of its blocks s > t (the lower part
    only: rows from the block's first column). Result on rank 0: the first
    failing minor, or 0."""
    a_shard = call.inputs[0]
    A = a_shard.pieces[0]
    n = a_shard.dist.shape[0]
    nb = call.entry.static.nb
    cols = Columns(n, nb, call.world.size, call.rank)
    xp = _xp()

    def shape(t):
        c0, c1 = cols.span(t)
        return ((n - c0) * (c1 - c0) + 1,)

    def fill(t, buf):
        c0, c1 = cols.span(t)
        l0, l1 = cols.local(t)
        diag = A[c0:c1, l0:l1]
        info = dense.potrf_lower(diag)
        if c1 < n:
            A[c1:, l0:l1] = dense.trsm_right_lower_t(diag, A[c1:, l0:l1])
        A[:c0, l0:l1] = 0
        buf[:-1].reshape(n - c0, c1 - c0)[...] = A[c0:, l0:l1]
        buf[-1:] = xp.where(xp.asarray(info) > 0, xp.asarray(info) + c0, 0)

    def update(t, panel, blocks):
        c0, _ = cols.span(t)
        for s in blocks:
            s0, s1 = cols.span(s)
            l0, l1 = cols.local(s)
            blas.gemm(panel[s0 - c0:], panel[s0 - c0:s1 - c0].T, A[s0:, l0:l1], -1.0, 1.0)

    def panel_of(t, buf):
        c0, c1 = cols.span(t)
        return buf[:-1].reshape(n - c0, c1 - c0)

    flags = []
    _right_looking(call, cols, shape, A.dtype, fill, update, panel_of,
                   lambda t, buf: flags.append(buf[-1:].copy()) if call.rank == 0 else None)
    if call.rank == 0:
        call.result = _first_nonzero(flags)
    return [a_shard]


def _right_looking(call, cols, shape, dtype, fill, update, panel_of, seen, steps=None):
    """The loop every right-looking factorization here shares, with look-ahead.

    At step t every worker takes panel t (`seen(t, buf)` lets rank 0 note
    what it needs), posts the next panel's broadcast, and applies panel t
    to its blocks after t; the owner of panel t + 1 first updates that
    block alone, factors it (`fill`) and starts its broadcast, so that the
    broadcast travels while the other blocks are updated."""
    steps = cols.blocks if steps is None else steps
    pipe = Pipeline(group_of(call), cols, shape, dtype, fill)
    if steps:
        pipe.start(0)
    for t in range(steps):
        buf = pipe.get(t)
        seen(t, buf)
        panel = panel_of(t, buf)
        rest = cols.mine(t + 1)
        nxt = t + 1 if t + 1 < steps else None
        if nxt is not None and cols.owner(nxt) == cols.rank:
            update(t, panel, [nxt])
            rest = [s for s in rest if s != nxt]
        if nxt is not None:
            pipe.start(nxt)
        update(t, panel, rest)


# ---- LU ---------------------------------------------------------------------------------------
def _swaps_to_perm(piv, size):
    """The row order (as indices into the rows before) that LAPACK's swaps `piv` make of `size` rows."""
    perm = np.arange(size)
    for i, p in enumerate(piv):
        if p != i:
            perm[i], perm[p] = perm[p], perm[i]
    return perm


def _permute_rows(xp, X, start, perm, col_ranges):
    """Rows start + i of X become rows start + perm[i] (only the rows that move, in `col_ranges`)."""
    moved = np.flatnonzero(perm != np.arange(perm.size))
    if not moved.size or X.shape[1] == 0:
        return
    dst = xp.asarray(start + moved)
    src = xp.asarray(start + perm[moved])
    for lo, hi in col_ranges:
        if hi > lo:
            X[dst, lo:hi] = X[src, lo:hi]


@LU.kernel()
def _lu(call):
    """Right-looking blocked LU with partial pivoting (LAPACK's getrf on each panel).

    The owner of panel t factors A[c0:, t] (the pivot search is local: it
    holds the whole panel) and broadcasts it with its pivots; every worker
    swaps the rows of everything it holds (its other columns, and B),
    solves U[t, s] = L[t, t]^-1 A[t, s] for its blocks s > t and subtracts
    L[below, t] U[t, s]. With B (input 1, ColBlock) the same steps make
    L^-1 P B (the forward half of a solve). Result on rank 0: (perm, U's
    diagonal) as NumPy arrays."""
    a_shard = call.inputs[0]
    A = a_shard.pieces[0]
    m, n = a_shard.dist.shape
    K = min(m, n)
    nb = call.entry.static.nb
    cols = Columns(n, nb, call.world.size, call.rank)
    steps = (K + nb - 1) // nb
    B = call.inputs[1].pieces[0] if call.entry.static.with_b else None
    xp = _xp()
    perm = np.arange(m)
    diag = []

    def kt(t):
        c0, c1 = cols.span(t)
        return min(c1, m) - c0

    def shape(t):
        c0, c1 = cols.span(t)
        return ((m - c0) * (c1 - c0) + kt(t),)

    def fill(t, buf):
        c0, c1 = cols.span(t)
        l0, l1 = cols.local(t)
        piv = dense.getrf(A[c0:, l0:l1])
        buf[:-kt(t)].reshape(m - c0, c1 - c0)[...] = A[c0:, l0:l1]
        buf[-kt(t):] = xp.asarray(piv.astype(buf.dtype))

    def panel_of(t, buf):
        c0, c1 = cols.span(t)
        return buf[:-kt(t)].reshape(m - c0, c1 - c0)

    def seen(t, buf):
        c0, c1 = cols.span(t)
        k = kt(t)
        piv = backend.current().asnumpy(buf[-k:]).astype(np.int64)
        step = _swaps_to_perm(piv, m - c0)
        perm[c0:] = perm[c0:][step]
        # the owner's panel came out of getrf already swapped: its other columns are swapped here
        if cols.owner(t) == cols.rank:
            l0, l1 = cols.local(t)
            ranges = [(0, l0), (l1, A.shape[1])]
        else:
            ranges = [(0, A.shape[1])]
        _permute_rows(xp, A, c0, step, ranges)
        if B is not None:
            _permute_rows(xp, B, c0, step, [(0, B.shape[1])])
            _forward(panel_of(t, buf)[:, :k], B, c0, k)
        if call.rank == 0:
            p = panel_of(t, buf)
            diag.append(xp.diagonal(p[:k, :k]).copy())

    def update(t, panel, blocks):
        c0, _ = cols.span(t)
        k = kt(t)
        L = panel[:, :k]
        for l0, l1 in cols.ranges(blocks):
            _forward(L, A[:, l0:l1], c0, k)

    _right_looking(call, cols, shape, A.dtype, fill, update, panel_of, seen, steps)
    if call.rank == 0:
        d = backend.current().asnumpy(xp.concatenate(diag)) if diag else np.zeros(0)
        call.result = (perm, d)
    return [a_shard] if B is None else [a_shard, call.inputs[1]]


def _forward(L, X, c0, k):
    """X[c0:c0+k] = L11^-1 X[c0:c0+k] (unit lower) and X[c0+k:] -= L21 X[c0:c0+k], in place."""
    if X.shape[1] == 0:
        return
    top = X[c0:c0 + k]
    top[...] = dense.trsm_left(L[:k], top, lower=True, unit=True)
    if L.shape[0] > k:
        blas.gemm(L[k:], top, X[c0 + k:], -1.0, 1.0)


# ---- Householder QR ---------------------------------------------------------------------------
@QR.kernel()
def _qr(call):
    """Right-looking blocked Householder QR; with `with_b`, Q (output 1) formed explicitly.

    Panel t: its owner factors A[c0:, t] (geqrf: R above, the reflectors
    V below) and makes T of the compact WY form Q_t = I - V T V^T; it
    broadcasts [V | T] and every worker applies Q_t^T to its blocks s > t:
    C -= V (T^T (V^T C)). Q = Q_0 Q_1 ... [I; 0] is then accumulated
    backwards (each panel broadcast again by its owner, who kept T),
    touching only the columns from the panel's first on. Q is orthonormal
    to the working precision whatever A's condition number."""
    a_shard = call.inputs[0]
    A = a_shard.pieces[0]
    m, n = a_shard.dist.shape
    K = min(m, n)
    nb = call.entry.static.nb
    P, rank = call.world.size, call.rank
    cols = Columns(n, nb, P, rank)
    steps = (K + nb - 1) // nb
    xp = _xp()
    kept_T = {}

    def kt(t):
        c0, c1 = cols.span(t)
        return min(c1, m) - c0

    def shape(t):
        c0, c1 = cols.span(t)
        return ((m - c0) * kt(t) + kt(t) ** 2,)

    def reflectors(t):
        """The owner's V (unit lower trapezoidal) of panel t, from A's columns below R."""
        c0, _ = cols.span(t)
        l0, _ = cols.local(t)
        k = kt(t)
        V = xp.tril(A[c0:, l0:l0 + k], -1)
        V[xp.arange(k), xp.arange(k)] = 1
        return V

    def fill(t, buf):
        c0, _ = cols.span(t)
        l0, l1 = cols.local(t)
        k = kt(t)
        tau = dense.householder(A[c0:, l0:l1])
        V = reflectors(t)
        T = kept_T[t] = dense.block_reflector(V, tau[:k])
        _pack(buf, V, T, m - c0, k)

    def panel_of(t, buf):
        c0, _ = cols.span(t)
        return _unpack(buf, m - c0, kt(t))

    def update(t, VT, blocks):
        V, T = VT
        c0, _ = cols.span(t)
        for l0, l1 in cols.ranges(blocks):
            _apply_reflector(V, T.T, A[c0:, l0:l1])

    _right_looking(call, cols, shape, A.dtype, fill, update, panel_of, lambda t, buf: None, steps)
    if not call.entry.static.with_b:
        return [a_shard]

    # Q = Q_0 ... Q_{steps-1} [I; 0], backwards: the panels again, last first
    qdist = call.entry.out_dists[1]
    qcols = Columns(K, nb, P, rank)
    Q = memory.zeros(qdist.shard_shapes(rank)[0], A.dtype)
    for s in qcols.mine(0):
        s0, s1 = qcols.span(s)
        l0, _ = qcols.local(s)
        Q[xp.arange(s0, s1), xp.arange(l0, l0 + s1 - s0)] = 1

    order = list(range(steps - 1, -1, -1))

    class Reverse:
        """Panel index j of this pass is panel order[j]."""
        def owner(self, j):
            return cols.owner(order[j])

    def fill_back(j, buf):
        t = order[j]
        c0, _ = cols.span(t)
        _pack(buf, reflectors(t), kept_T[t], m - c0, kt(t))

    pipe = Pipeline(group_of(call), Reverse(), lambda j: shape(order[j]), A.dtype, fill_back)
    for j, t in enumerate(order):
        buf = pipe.get(j)
        if j + 1 < len(order):
            pipe.start(j + 1)
        c0, _ = cols.span(t)
        V, T = _unpack(buf, m - c0, kt(t))
        lo = qcols.local_from(t)
        if lo < Q.shape[1]:
            _apply_reflector(V, T, Q[c0:, lo:])
    return [a_shard, Shard([Q], qdist, a_shard.dtype)]


def _pack(buf, V, T, rows, k):
    buf[:rows * k].reshape(rows, k)[...] = V
    buf[rows * k:].reshape(k, k)[...] = T


def _unpack(buf, rows, k):
    return buf[:rows * k].reshape(rows, k), buf[rows * k:].reshape(k, k)


def _apply_reflector(V, T, C):
    """C -= V (T (V^T C)) in place: the block reflector I - V T V^T applied from the left."""
    if C.shape[1] == 0 or V.shape[1] == 0:
        return
    W = memory.empty((V.shape[1], C.shape[1]), C.dtype)
    blas.gemm(V.T, C, W, 1.0, 0.0)
    W2 = memory.empty(W.shape, C.dtype)
    blas.gemm(T, W, W2, 1.0, 0.0)
    blas.gemm(V, W2, C, -1.0, 1.0)


# ---- triangular solve -------------------------------------------------------------------------
@TRSM.kernel()
def _trsm(call):
    """op(A) X = B for triangular A (work layout), X over B (ColBlock) in place; op(A) = A^T when
    `trans`.

    Each panel's owner broadcasts the part of its column block that holds
    the triangle (rows c0: when lower, :c1 when upper); nothing is
    factored, so the next broadcast is always in flight while a panel is
    applied. op(A) lower (A lower, or A upper transposed) runs first panel
    to last, else last to first. Without `trans` the panel's column block
    updates the rows still to be solved after its diagonal solve (right
    looking); with it, the panel's column block of A is a row block of
    A^T: its product with the rows already solved is subtracted first,
    then the diagonal block solves (left looking). Every worker works on
    its columns of B. Result on rank 0: A's diagonal, for the singularity
    test."""
    a_shard, b_shard = call.inputs
    A, B = a_shard.pieces[0], b_shard.pieces[0]
    n = a_shard.dist.shape[0]
    lower, trans, unit, nb = (call.entry.static.lower, call.entry.static.trans, call.entry.static.unit,
                              call.entry.static.nb)
    cols = Columns(n, nb, call.world.size, call.rank)
    forward = lower != trans
    order = list(range(cols.blocks)) if forward else list(range(cols.blocks - 1, -1, -1))
    xp = _xp()

    def rows_of(t):
        c0, c1 = cols.span(t)
        return (c0, n) if lower else (0, c1)

    class Order:
        def owner(self, j):
            return cols.owner(order[j])

    def shape(j):
        r0, r1 = rows_of(order[j])
        c0, c1 = cols.span(order[j])
        return (r1 - r0, c1 - c0)

    def fill(j, buf):
        r0, r1 = rows_of(order[j])
        l0, l1 = cols.local(order[j])
        buf[...] = A[r0:r1, l0:l1]

    pipe = Pipeline(group_of(call), Order(), shape, A.dtype, fill)
    diag = {}
    for j, t in enumerate(order):
        panel = pipe.get(j)
        if j + 1 < len(order):
            pipe.start(j + 1)
        c0, c1 = cols.span(t)
        r0, _ = rows_of(t)
        d = panel[c0 - r0:c1 - r0]
        if call.rank == 0:
            diag[t] = xp.diagonal(d).copy()
        if B.shape[1] == 0:
            continue
        if trans:
            # rows of A^T: the part of the panel off the diagonal block meets the solved rows
            if lower and c1 < n:
                blas.gemm(panel[c1 - r0:].T, B[c1:], B[c0:c1], -1.0, 1.0)
            elif not lower and c0 > 0:
                blas.gemm(panel[:c0].T, B[:c0], B[c0:c1], -1.0, 1.0)
            B[c0:c1] = dense.trsm_left(d, B[c0:c1], lower=lower, unit=unit, trans=True)
        else:
            B[c0:c1] = dense.trsm_left(d, B[c0:c1], lower=lower, unit=unit)
            if lower and c1 < n:
                blas.gemm(panel[c1 - r0:], B[c0:c1], B[c1:], -1.0, 1.0)
            elif not lower and c0 > 0:
                blas.gemm(panel[:c0], B[c0:c1], B[:c0], -1.0, 1.0)
    if call.rank == 0:
        parts = [diag[t] for t in sorted(diag)]
        call.result = backend.current().asnumpy(xp.concatenate(parts)) if parts else np.zeros(0)
    return [b_shard]


# ---- triangles --------------------------------------------------------------------------------
@TRIANGLE.kernel(local=True)
def _triangle(call):
    """A new matrix holding the lower (upper) triangle of input 0 from diagonal k, in its layout."""
    x = call.inputs[0]
    lower, k, unit = call.entry.static
    xp = _xp()
    out = []
    for piece, arr in zip(x.dist.pieces[call.rank], x.pieces):
        r = xp.asarray(ix.to_array(piece.rows))[:, None]
        c = xp.asarray(ix.to_array(piece.cols))[None, :]
        keep = (c - r <= k) if lower else (c - r >= k)
        o = xp.where(keep, arr, xp.zeros((), dtype=arr.dtype))
        if unit:
            o = xp.where(c == r, xp.ones((), dtype=arr.dtype), o)
        out.append(xp.ascontiguousarray(o, dtype=arr.dtype))
    return [Shard(out, x.dist, x.dtype)]
