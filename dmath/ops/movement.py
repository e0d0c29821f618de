"""Operations that move or reinterpret data: remap (with window and dtype change), transpose, get, set."""
from typing import NamedTuple

import numpy as np

from .. import backend, memory, remap as _remap
from ..comm.control import gather_objects
from ..layout import RowBlock
from ..runtime import Shard, define, kernel
from ..runtime.registry import COLLECTIVES_IN_GRAPHS
from .base import dispatch, new_meta


class RemapArgs(NamedTuple):
    """Static arguments of `remap`: the window's top-left corner in the source; sum in the background."""
    offset: tuple
    background: bool


REMAP = define("remap", RemapArgs)


def remap(m, layout, dtype=None, offset=(0, 0), shape=None, background=False):
    """Master half: a new Matrix holding `m` (read from the window at `offset` of `shape`) in
    `layout` and `dtype` (None: m's). background only matters for a Partial source (a sum)."""
    out = new_meta(layout, shape or m.shape, m.dtype if dtype is None else dtype)
    args = REMAP.static(offset=tuple(offset), background=bool(background) and m.layout.partial)
    return dispatch("remap", [m], [out], static=args)[0][0]


def resolve_partial(m):
    """A Partial matrix as the RowBlock of its sums over the same workers (a reduce-scatter); others as they are."""
    return remap(m, RowBlock(m.layout.group)) if m.layout.partial else m


def _stays_local(src, dst, offset=(0, 0)):
    """True when no element of the remap moves between workers (every step is local copies)."""
    for step in _remap.plan(src, dst, offset):
        if isinstance(step, _remap.AllReduce):
            if len(step.src.group) > 1:
                return False
        elif _remap.involved(step):
            return False
    return True


def _only_allreduces(src, dst, offset=(0, 0)):
    """True when every step that communicates is an all-reduce (Partial to Replicated: a gradient)."""
    return all(isinstance(step, _remap.AllReduce) or not _remap.involved(step)
               for step in _remap.plan(src, dst, offset))


def _remap_capturable(entry):
    # local copies, and the NCCL all-reduce of a Partial (a data-parallel gradient) when
    # collectives may be captured; other exchanges stage through buffers sized per call
    src, dst, offset = entry.in_dists[0], entry.out_dists[0], entry.static.offset
    return _stays_local(src, dst, offset) or (COLLECTIVES_IN_GRAPHS and _only_allreduces(src, dst, offset))


def _remap_into_capturable(entry):
    return _stays_local(entry.in_dists[1], entry.in_dists[0])


@REMAP.kernel(capturable=_remap_capturable)
def _remap_kernel(call):
    """Redistribute input 0 (read from the window at `offset`) into the output's layout and dtype;
    background: sum a Partial input on the communication stream (Matrix.remap's `background`)."""
    src = call.inputs[0]
    dst, dtype = call.entry.out_dists[0], call.entry.outputs[0].dtype
    offset, background = call.entry.static.offset, call.entry.static.background
    pending = [] if background else None
    pieces = _remap.run(call.world, call.entry.cache, src.pieces, src.dist, dst, src.dtype, dtype, offset, pending)
    out = Shard(pieces, dst, dtype)
    if pending:
        out.pending = pending
    return [out]


@kernel("remap_into", capturable=_remap_into_capturable)
def _remap_into(call):
    """Overwrite input 0 in place with input 1 redistributed into input 0's layout and dtype.

    The target keeps its handle and its buffers (the remap's result is copied
    into them); the runtime gives it a new version.
    """
    target, src = call.inputs
    pieces = _remap.run(call.world, call.entry.cache, src.pieces, src.dist, target.dist, src.dtype,
                        target.dtype)
    for t, p in zip(target.pieces, pieces):
        if t is not p:
            t[...] = p
    return [target]


@kernel("transpose", capturable=True)
def _transpose(call):
    """Each local piece transposed; the transposed layout puts it on the same worker."""
    src = call.inputs[0]
    dst = call.entry.out_dists[0]
    order = call.entry.cache.get("order")
    if order is None:
        # piece k of the result is the transpose of the source piece with rows and cols swapped
        mine = src.dist.pieces[call.rank]
        order = call.entry.cache["order"] = [
            next(i for i, q in enumerate(mine) if (q.cols, q.rows) == (p.rows, p.cols))
            for p in dst.pieces[call.rank]]
    pieces = src.pieces
    out = []
    for k in order:
        a = memory.empty(pieces[k].shape[::-1], src.dtype)
        a[...] = pieces[k].T
        out.append(a)
    return [Shard(out, dst, src.dtype)]


@kernel("reshape_rows", capturable=True)
def _reshape_rows(call):
    """Row blocks whose boundaries are whole rows of both shapes: each local block reshaped (row-major)."""
    src = call.inputs[0]
    dst = call.entry.out_dists[0]
    out = []
    for a, p in zip(src.pieces, dst.pieces[call.rank]):
        b = memory.empty(p.shape, src.dtype)
        b[...] = a.reshape(p.shape)
        out.append(b)
    return [Shard(out, dst, src.dtype)]


def designated(dist, locs):
    """The stored copy of an element that speaks for it: the first, or all of them for Partial."""
    return locs if dist.partial else locs[:1]


@kernel("get")
def _get(call):
    shard = call.inputs[0]
    i, j = int(call.scalars[0]), int(call.scalars[1])
    value = 0.0
    locs = designated(shard.dist, shard.dist.locate(i, j))
    for r, k, li, lj in locs:
        if r == call.rank:
            value += float(backend.current().asnumpy(shard.pieces[k][li, lj]))
    # only the holders answer: a read of a worker group's matrix waits for that group alone
    values = gather_objects(call.world, value, sorted({loc[0] for loc in locs}))
    if call.rank == 0:
        call.result = float(np.dtype(shard.dtype).type(sum(values)))
    return []


@kernel("set")
def _set(call):
    shard = call.inputs[0]
    i, j, v = int(call.scalars[0]), int(call.scalars[1]), call.scalars[2]
    locs = shard.dist.locate(i, j)
    for n, (r, k, li, lj) in enumerate(locs):
        if r == call.rank:
            # a Partial matrix: the first addend takes the value, the others zero
            shard.pieces[k][li, lj] = 0.0 if (shard.dist.partial and n > 0) else v
    shard.version += 1
    return [shard]
