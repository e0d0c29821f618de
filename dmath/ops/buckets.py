"""Bucketed sums: several Partial matrices summed by one all-reduce (`sum_partials`).

A data-parallel training step ends its backward pass with one all-reduce per
weight gradient. Each collective has a fixed price besides its bytes (a NCCL
launch and protocol start, an MPI round on the CPU), which ResNet-50 pays for
161 weights. `sum_partials` packs the addends of several Partial matrices
into one buffer, converting each into the result's dtype on the way (a
float16 gradient summed in float32, as `remap` sums it), all-reduces the
buffer once, and hands back each sum as a view of its part: one copy in, none
out. Every part starts at an ALIGN-byte boundary, so each result is as
aligned as a pool allocation (vector loads in the kernels that read it).

With background=True the all-reduce runs on the communication stream (a
GPU's side stream, see collectives.allreduce_start): the commands issued next
overlap it, and the first command that reads a result waits for it (every
result shares the one Pending). This is how dnn's gradient buckets overlap
the backward pass of the layers below them, DDP's buckets inside a recorded
step.

One command carries at most protocol.MAX_OPERANDS matrices (inputs and
outputs), so a list of more than PER_COMMAND matrices is summed by several
commands, each one all-reduce of its own buffer (a bucket of many small
addends, such as the scales and shifts of a network's batch norms).
"""
import math
from typing import NamedTuple

import numpy as np

from .. import memory
from ..comm import collectives
from ..errors import DMathError, DTypeError, LayoutError, ShapeError
from ..layout import Replicated
from ..runtime import Shard, define, protocol, runtime
from ..runtime.registry import collectives_in_graphs
from . import cast
from .base import dispatch, is_matrix, new_meta

#: every part of the buffer starts at a multiple of this many bytes
ALIGN = 256
#: the most matrices one sum_partials command sums (each an input and an output of the command)
PER_COMMAND = protocol.MAX_OPERANDS // 2
#: ... and with out= (each input, its target, and the target again as the command's output)
PER_COMMAND_INTO = protocol.MAX_OPERANDS // 3


class SumArgs(NamedTuple):
    """Static arguments of `sum_partials`: whether the all-reduce runs in the background, and whether
    the sums are written into given matrices (the command's second half of inputs)."""
    background: bool
    into: bool = False


SUM_PARTIALS = define("sum_partials", SumArgs)


def offsets(sizes, itemsize):
    """(start of each part in elements, total elements) of parts of `sizes` elements packed in one
    buffer of `itemsize`-byte elements, each part starting at an ALIGN-byte boundary (pure)."""
    step = max(1, ALIGN // itemsize)
    starts, at = [], 0
    for n in sizes:
        starts.append(at)
        at += -(-n // step) * step
    return starts, at


def sum_partials(matrices, dtype=None, background=False, out=None):
    """The sums of several Partial matrices over one group, made by one all-reduce.

    matrices: a non-empty list of dmath.Matrix, each in a `Partial` layout
    over the same workers. dtype: the results' dtype (None: the inputs' own,
    which must then agree); it may not be narrower than an input's (addends
    rounded or overflowing where their sum does not: `remap` sums narrowing
    cases first). Returns one new matrix per input, `Replicated` over the
    same workers, the value of `m.remap(Replicated(group), dtype=dtype)` up
    to the order of the additions (an all-reduce adds in NCCL's or MPI's
    order, the remap in its exchange's; addends that cancel may round
    differently), the same on every worker; more
    than PER_COMMAND matrices take one all-reduce per PER_COMMAND
    (PER_COMMAND_INTO with out=).
    background: run the all-reduce on the communication stream (see the
    module docstring); the results are complete for every later command.
    out: None, or one matrix per input, each Replicated over the inputs'
    workers with its input's shape and the sums' dtype: the sums are written
    into them (in place; with background=True, on the communication stream
    right after the all-reduce) and they are returned. A training step's
    running statistics take their sums so, where assigning new sums copied
    each one again after the backward pass.
    """
    ms = list(matrices) if isinstance(matrices, (list, tuple)) else None
    if not ms or not all(is_matrix(m) for m in ms):
        raise DMathError(f"sum_partials takes a non-empty list of dmath matrices, got {matrices!r}")
    if not isinstance(background, (bool, np.bool_)):
        raise DMathError(f"sum_partials: background must be True or False, got {background!r}")
    background = bool(background)
    rt = runtime()
    group = None
    for i, m in enumerate(ms):
        if not m.layout.partial:
            raise LayoutError(f"sum_partials: matrix {i} is in {m.layout!r}; it sums Partial matrices "
                              "(any other layout holds its value already: remap it instead)")
        members = m.layout.members(rt.nworkers)
        if group is None:
            group = members
        elif sorted(members) != sorted(group):    # (the same workers in another order: the same sum)
            raise LayoutError(f"sum_partials: matrix {i} is Partial over workers {members}, matrix 0 over "
                              f"{group}: one all-reduce sums over one group")
    if dtype is None:
        kinds = sorted({m.dtype for m in ms})
        if len(kinds) > 1:
            raise DTypeError(f"sum_partials: the matrices have dtypes {kinds}; pass dtype= for the sums")
        dtype = kinds[0]
    outs = [new_meta(Replicated(group), m.shape, dtype) for m in ms]
    out_dtype = outs[0].dtype
    for i, m in enumerate(ms):
        if np.dtype(out_dtype).itemsize < np.dtype(m.dtype).itemsize:
            raise DTypeError(f"sum_partials: matrix {i} is {m.dtype}, wider than the sums' {out_dtype}: "
                             "its addends would be rounded before they are summed (use remap, which sums first)")
    if out is not None:
        targets = _targets(out, ms, group, out_dtype, rt.nworkers)
        static = SUM_PARTIALS.static(background=background, into=True)
        for at in range(0, len(ms), PER_COMMAND_INTO):
            part = ms[at:at + PER_COMMAND_INTO]
            n = len(part)
            dispatch("sum_partials", part + targets[at:at + n], tuple(range(n, 2 * n)), static=static)
        return targets
    static = SUM_PARTIALS.static(background=background)
    sums = []
    for at in range(0, len(ms), PER_COMMAND):
        sums += dispatch("sum_partials", ms[at:at + PER_COMMAND], outs[at:at + PER_COMMAND], static=static)[0]
    return sums


def _targets(out, ms, group, dtype, nworkers):
    """sum_partials' `out`, checked: a list of distinct matrices, one per input, Replicated over the
    inputs' workers, of its input's shape and the sums' dtype."""
    targets = list(out) if isinstance(out, (list, tuple)) else None
    if targets is None or len(targets) != len(ms) or not all(is_matrix(t) for t in targets):
        raise DMathError(f"sum_partials: out must be a list of {len(ms)} dmath matrices (one per input), "
                         f"got {out!r}")
    if len({t._handle for t in targets}) != len(targets):
        raise DMathError("sum_partials: out names one matrix twice; each sum needs a matrix of its own")
    for i, (t, m) in enumerate(zip(targets, ms)):
        t._check_writable(f"sum_partials into out[{i}]")     # a slice or transpose is a copy: the sums would be lost
        if not t.layout.replicated or sorted(t.layout.members(nworkers)) != sorted(group):
            raise LayoutError(f"sum_partials: out[{i}] is in {t.layout!r}; the sums are Replicated over the "
                              f"inputs' workers {group}")
        if t.shape != m.shape:
            raise ShapeError(f"sum_partials: out[{i}] has shape {t.shape}, its input {m.shape}")
        if np.dtype(t.dtype) != np.dtype(dtype):
            raise DTypeError(f"sum_partials: out[{i}] is {t.dtype}, the sums are {dtype}")
    return targets


def _capturable(entry):
    # one all-reduce on the compute or the side stream: capturable where collectives are, and
    # always over one worker (then no collective runs)
    return len(entry.in_dists[0].group) == 1 or collectives_in_graphs()


@SUM_PARTIALS.kernel(capturable=_capturable)
def _sum_partials(call):
    """Pack this worker's addends into one buffer in the output dtype, all-reduce it over the group,
    and return each sum as a view of its part (into: copied into the given matrices instead)."""
    into = call.entry.static.into
    count = len(call.inputs) // 2 if into else len(call.inputs)
    # into: the second half of the inputs are the targets (the command's outputs, written in place)
    dists = call.entry.in_dists[count:] if into else call.entry.out_dists
    dtype = (call.entry.inputs[count] if into else call.entry.outputs[0]).dtype
    group = call.entry.in_dists[0].group
    addends, targets = call.inputs[:count], call.inputs[count:]
    if call.rank not in group:
        return list(targets) if into else [Shard([], d, dtype) for d in dists]
    sizes = [math.prod(d.shape) for d in dists]
    starts, total = offsets(sizes, np.dtype(dtype).itemsize)
    buf = memory.empty((max(total, 1),), dtype)
    # a Partial shard holds its whole addend as one piece (converted on the copy); the alignment gap
    # after it: zeros, not whatever the pool held (a sum of leftover bits can overflow, and NumPy warns)
    # (on a GPU a table kernel: a launch per source dtype, not two per addend)
    cast.pack(list(zip((shard.pieces[0] for shard in addends), starts, starts[1:] + [total])), buf)
    comm = call.world.group(group)
    pending = None
    if call.entry.static.background:
        pending = collectives.allreduce_start(comm, buf[:total])
    else:
        collectives.allreduce(comm, buf[:total])
    if into:
        return _write_into(targets, buf, starts, sizes, pending)
    outs = []
    for start, n, d in zip(starts, sizes, dists):
        s = Shard([buf[start:start + n].reshape(d.shape)], d, dtype)
        if pending is not None and pending.event is not None:
            s.pending = [pending]
        outs.append(s)
    return outs


def _write_into(targets, buf, starts, sizes, pending):
    """Copy each sum from its part of `buf` into its target's piece (one table kernel per launch on a
    GPU); after a background all-reduce on the side stream, right behind it, so the compute stream
    neither waits for the sums nor for the copies: the targets' next reader does (their Pending)."""
    pairs = [(buf[start:start + n].reshape(t.pieces[0].shape), t.pieces[0])
             for t, start, n in zip(targets, starts, sizes)]
    if pending is None:
        cast.copy_many(pairs)
        return list(targets)
    collectives.then(pending, lambda: cast.copy_many(pairs))
    if pending.event is not None:
        pending.keep = buf              # (the pool may not hand buf out before the copies have read it)
        for t in targets:
            t.pending = (t.pending or []) + [pending]
    return list(targets)
