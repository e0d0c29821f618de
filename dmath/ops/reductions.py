"""Reduction kernels: sum, mean, max, min along an axis or over everything, and sum of squares.

Along an axis, a layout that keeps the reduced axis on one worker reduces
locally ('local'); otherwise sums come out Partial ('partial', no
communication) and max/min are combined by an all-reduce ('allreduce').
Float16 data is accumulated in float32.
"""
import numpy as np

from .. import backend, memory
from ..comm import collectives
from ..comm.control import gather_objects
from ..layout import indexset as ix
from ..runtime import Shard, kernel
from ..runtime.registry import COLLECTIVES_IN_GRAPHS

_IDENTITY = {"sum": 0.0, "max": -np.inf, "min": np.inf}


def _acc_dtype(dtype):
    return np.float32 if np.dtype(dtype) == np.float16 else dtype


def _local_reduce(xp, a, op, axis):
    if op == "sum":
        return a.sum(axis=axis, keepdims=True, dtype=_acc_dtype(a.dtype))
    return getattr(xp, "max" if op == "max" else "min")(a, axis=axis, keepdims=True)


def _reduce_axis_capturable(entry):
    """Capturable without communication and with every piece's result slots a slice (no index
    array to copy to the device during a capture)."""
    op, axis, mode, scale = entry.static
    if mode == "local":
        return True
    if mode == "allreduce":
        return COLLECTIVES_IN_GRAPHS
    return all(len(p.cols if axis == 0 else p.rows) <= 1 for ps in entry.in_dists[0].pieces for p in ps)


@kernel("reduce_axis", capturable=_reduce_axis_capturable)
def _reduce_axis(call):
    """static = (op, axis, mode, scale); the result is multiplied by scale (1/count for mean)."""
    xp = backend.current().xp
    op, axis, mode, scale = call.entry.static
    src = call.inputs[0]
    dist, dtype = call.entry.out_dists[0], call.entry.outputs[0].dtype
    if mode == "local":
        out = []
        for a in src.pieces:
            r = _local_reduce(xp, a, op, axis)
            o = memory.empty(r.shape, dtype)
            o[...] = r * scale if scale != 1.0 else r
            out.append(o)
        return [Shard(out, dist, dtype)]
    if call.rank not in dist.group:
        return [Shard([], dist, dtype)]
    acc_dtype = _acc_dtype(dtype) if mode == "partial" else dtype
    full = memory.empty(dist.shape, acc_dtype)
    full.fill(_IDENTITY[op])
    for a, p in zip(src.pieces, src.dist.pieces[call.rank]):
        if a.size == 0:
            continue
        r = _local_reduce(xp, a, op, axis)
        # the piece's other-axis indices in the result vector
        sel = ix.selection(p.cols if axis == 0 else p.rows)
        sel = sel if isinstance(sel, slice) else xp.asarray(sel)
        view = (0, sel) if axis == 0 else (sel, 0)
        r = r.reshape(-1)
        if op == "sum":
            full[view] += r
        else:
            full[view] = getattr(xp, "maximum" if op == "max" else "minimum")(full[view], r)
    if mode == "allreduce":
        flat = full.reshape(-1)
        collectives.allreduce(call.world.group(dist.group), flat, op)
    if scale != 1.0:
        full *= scale
    if full.dtype == np.dtype(dtype):
        out = full
    else:
        out = memory.empty(full.shape, dtype)
        out[...] = full
    return [Shard([out], dist, dtype)]


@kernel("reduce_all")
def _reduce_all(call):
    """static = (op, finish) with op in sum, max, min, sumsq; the master gets a float.

    finish ('mean', 'sqrt' or None) completes the value on the master inside
    the kernel, so that the kernel's result is what the user sees (a
    recorded plan's replay returns kernel results).
    """
    xp = backend.current().xp
    op = call.entry.static[0]
    finish = call.entry.static[1] if len(call.entry.static) > 1 else None
    src = call.inputs[0]
    dist = src.dist
    # one member of a replicated matrix speaks for it; only contributors answer the master, so a
    # reduction of a worker group's matrix waits for that group alone
    contributors = sorted(dist.group[:1] if dist.replicated else dist.group)
    contributes = call.rank in contributors
    value = _IDENTITY["sum" if op == "sumsq" else op]
    if contributes:
        for a in src.pieces:
            if a.size == 0:
                continue
            if op == "sum":
                v = float(a.sum(dtype=np.float64))
            elif op == "sumsq":
                v = float(xp.square(a.astype(np.float64)).sum())
            else:
                v = float(a.max() if op == "max" else a.min())
            value = value + v if op in ("sum", "sumsq") else (max(value, v) if op == "max" else min(value, v))
    values = gather_objects(call.world, value, contributors)
    if call.rank == 0:
        value = sum(values) if op in ("sum", "sumsq") else (max(values) if op == "max" else min(values))
        if finish == "mean":
            size = dist.shape[0] * dist.shape[1]
            value = value / size if size else float("nan")
        elif finish == "sqrt":
            value = float(np.sqrt(value))
        call.result = value
    return []
