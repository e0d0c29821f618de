"""TSQR: the communication-avoiding QR of a tall and skinny matrix, and the eigen/SVD kernels of a
matrix gathered on one worker.

TSQR (Demmel, Grigori, Hoemmen, Langou 2012), one level: every worker
factors its row block A_i = Q1_i R_i (Householder, local), the n x n R_i
are all-gathered, worker 0 factors their stack [R_1; ...; R_P] = Q2 R and
broadcasts Q2 and R, and every worker forms its rows of Q as Q1_i Q2_i.
One all-gather and one broadcast of P n^2 + n^2 numbers, against a
broadcast per column panel for Householder on columns; Q is a product of
orthogonal factors from Householder reflections, so it is orthonormal to
the working precision whatever A's condition number (unlike CholeskyQR or
Gram-Schmidt). It needs every worker's block to have at least n rows,
which the master half arranges (RowBlock sizes).
"""
from typing import NamedTuple

import numpy as np

from .. import backend, memory
from ..gpu import blas
from ..comm import collectives
from ..runtime import Shard, define
from . import dense
from .panels import group_of


class TsqrArgs(NamedTuple):
    """Static arguments of `linalg_tsqr`."""
    with_q: bool        # form Q (output 0) as well as R (the last output)


class GatheredArgs(NamedTuple):
    """Static arguments of `linalg_eigh` / `linalg_svd` (a matrix held whole by one worker)."""
    vectors: bool       # eigenvectors / singular vectors too
    full: bool          # svd: full_matrices


TSQR = define("linalg_tsqr", TsqrArgs)
EIGH = define("linalg_eigh", GatheredArgs)
SVD = define("linalg_svd", GatheredArgs)


@TSQR.kernel()
def _tsqr(call):
    """Q (RowBlock, A's row blocks) and R (Replicated) of input 0 (RowBlock, >= n rows per worker)."""
    x = call.inputs[0]
    A = x.pieces[0]
    m, n = x.dist.shape
    P, rank = call.world.size, call.rank
    xp = backend.current().xp
    dtype = A.dtype
    Q1, R1 = dense.qr_reduced(A)
    stack = memory.empty((P * n * n,), dtype)
    collectives.allgatherv(group_of(call), xp.ascontiguousarray(R1).reshape(-1), stack, [n * n] * P)
    # worker 0 factors the stack alone and broadcasts it: every worker then uses bit-identical
    # factors (a library may not give the same bits on two devices)
    both = memory.empty((P * n * n + n * n,), dtype)
    if rank == 0:
        Q2, R = dense.qr_reduced(stack.reshape(P * n, n))
        both[:P * n * n].reshape(P * n, n)[...] = Q2
        both[P * n * n:].reshape(n, n)[...] = R
    collectives.bcast(group_of(call), both, 0)
    R = both[P * n * n:].reshape(n, n)
    shards = []
    if call.entry.static.with_q:
        Q2i = both[:P * n * n].reshape(P * n, n)[rank * n:(rank + 1) * n]
        Q = memory.empty(A.shape, dtype)
        blas.gemm(Q1, Q2i, Q, 1.0, 0.0)
        shards.append(Shard([Q], call.entry.out_dists[0], x.dtype))
    rdist = call.entry.out_dists[-1]
    shards.append(Shard([xp.ascontiguousarray(R)], rdist, x.dtype))
    return shards


def _on_root(call):
    """Whether this rank holds the gathered matrix (input 0 lives on one worker)."""
    return bool(call.inputs[0].pieces)


def _empty_outputs(call, k):
    """Output k's (empty) shard on a worker that does not hold the gathered matrix."""
    dist, dtype = call.entry.out_dists[k], call.entry.outputs[k].dtype
    return Shard([memory.empty(s, dtype) for s in dist.shard_shapes(call.rank)], dist, dtype)


def _solver_failed(exc):
    """Whether `exc` is a local eigensolver's refusal of its data (LAPACK / cuSOLVER did not converge:
    NaN or inf in the matrix), which the master reports as a LinAlgError instead of a failed job."""
    return isinstance(exc, np.linalg.LinAlgError)


@EIGH.kernel()
def _eigh(call):
    """w (to the master) and V (output 0 when vectors, on the same worker) of the gathered matrix.
    The master gets (w, None), or (None, message) when the solver refused the matrix."""
    x = call.inputs[0]
    vectors = call.entry.static.vectors
    if not _on_root(call):
        return [_empty_outputs(call, 0)] if vectors else []
    try:
        w, V = dense.eigh(x.pieces[0], vectors)
    except Exception as exc:           # noqa: BLE001  (only the solver's own refusal: see _solver_failed)
        if not _solver_failed(exc):
            raise
        call.result = (None, str(exc))
        return [_nan_outputs(call, 0)] if vectors else []
    call.result = (backend.current().asnumpy(w).astype(np.float64), None)
    return [Shard([V.astype(x.dtype, copy=False)], call.entry.out_dists[0], x.dtype)] if vectors else []


@SVD.kernel()
def _svd(call):
    """s (to the master) and U, Vh (outputs 0 and 1 when vectors, on the same worker); the master gets
    (s, None), or (None, message) when the solver refused the matrix."""
    x = call.inputs[0]
    vectors, full = call.entry.static
    if not _on_root(call):
        return [_empty_outputs(call, k) for k in range(len(call.entry.outputs))]
    try:
        U, s, Vh = dense.svd(x.pieces[0], vectors, full)
    except Exception as exc:           # noqa: BLE001  (only the solver's own refusal: see _solver_failed)
        if not _solver_failed(exc):
            raise
        call.result = (None, str(exc))
        return [_nan_outputs(call, k) for k in range(len(call.entry.outputs))]
    call.result = (backend.current().asnumpy(s).astype(np.float64), None)
    if not vectors:
        return []
    return [Shard([U.astype(x.dtype, copy=False)], call.entry.out_dists[0], x.dtype),
            Shard([Vh.astype(x.dtype, copy=False)], call.entry.out_dists[1], x.dtype)]


def _nan_outputs(call, k):
    """Output k filled with NaN (the master raises; the matrix is dropped)."""
    shard = _empty_outputs(call, k)
    for p in shard.pieces:
        p.fill(np.nan)
    return shard
