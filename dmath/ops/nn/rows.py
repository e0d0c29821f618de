"""Shared helpers of the nn kernels: matrices in a row layout, where each worker holds whole rows.

The master puts every batch matrix of an nn operation in a row layout before
dispatch: RowBlock (each member holds a block of samples, data parallelism)
or Replicated (each member holds every sample). Either way a member's single
piece is a (local samples, features) array, and the kernels treat it as a
batch. Statistics over the batch are summed over the members only for a
RowBlock batch; a Replicated one already holds them all.
"""
import numpy as np

from ... import memory
from ...gpu import blas
from ...comm import collectives
from ...runtime import Shard
from ...runtime.registry import capture_hook

# cuBLAS sets up its capture workspace before a plan with these products is captured
capture_hook(blas.prepare_capture)


def compute_dtype(dtype):
    """The dtype arithmetic runs in: float16 data computes in float32 (exp, sums, GEMM accumulation)."""
    return np.dtype(np.float32) if np.dtype(dtype) == np.float16 else np.dtype(dtype)


def matmul(a, b, out):
    """out[...] = a @ b on local arrays through dmath.gpu.blas (views such as a.T need no copy).

    float16 operands accumulate in float32; an `out` of a third dtype gets
    the float32 (or float64) product rounded once.
    """
    if out.flags.c_contiguous and out.dtype in (a.dtype, compute_dtype(a.dtype)):
        return blas.gemm(a, b, out)
    tmp = memory.empty(out.shape, compute_dtype(a.dtype))
    blas.gemm(a, b, tmp)
    out[...] = tmp
    return out


def local(shard):
    """This worker's block of whole rows, or None when it holds no part of the matrix."""
    return shard.pieces[0] if shard.pieces else None


def out_dist(call, k):
    return call.entry.out_dists[k], call.entry.outputs[k].dtype


def new_output(call, k):
    """Uninitialised local array(s) of output k, as a list (empty on non-members)."""
    dist, dtype = out_dist(call, k)
    return [memory.empty(p.shape, dtype) for p in dist.pieces[call.rank]]


def shard(call, k, arrays):
    dist, dtype = out_dist(call, k)
    return Shard(arrays, dist, dtype)


def nothing_here(call):
    """The answer of a worker outside the batch's group: empty shards for new outputs,
    the input shards themselves for outputs written in place (an int in the signature)."""
    return [call.inputs[o] if isinstance(o, int) else shard(call, k, [])
            for k, o in enumerate(call.entry.outputs)]


def whole_on_each(dist):
    """Whether every member of `dist` holds all of it (Replicated, or a group of one worker): sums over
    its rows are then complete on each member, with no communication."""
    return dist.replicated or len(dist.group) == 1


def sum_over_batch_start(call, dist, buf, then):
    """sum_over_batch in the background, followed by then(buf): on a GPU both run on the
    communication stream and the returned Pending (for the shards that hold buf) makes their next
    reader wait, so the compute stream does not wait for the slowest worker here; elsewhere (the CPU,
    a batch whole on each member) both run now and None is returned."""
    if whole_on_each(dist):
        then(buf)
        return None
    pending = collectives.then(collectives.allreduce_start(call.world.group(dist.group), buf, "sum"),
                               lambda: then(buf))
    return pending if pending.event is not None else None


def sum_over_batch(call, dist, buf):
    """Sum the 1-D contiguous `buf` over the members of the batch distribution `dist`, in place.

    Only a batch split over several members needs it (whole_on_each: a Replicated batch holds every
    sample on each member, whose sums are therefore already complete). Whether to communicate
    depends on the layout alone, the same on every rank.
    """
    if not whole_on_each(dist):
        collectives.allreduce(call.world.group(dist.group), buf, "sum")
