"""Running a remap plan on one worker: pack, one exchange, local copies, unpack.

Every selection is a strided view (see `plan.Segment` and `ix.Runs`), never
an index array: packing and unpacking are copies between views of the same
4-D shape, which convert the dtype on the way. Data moves straight from the
source pieces into the send buffer and straight from the receive buffer into
the target pieces; a part that is one contiguous range of a piece skips the
buffer altogether (the piece is the buffer). The same code runs on NumPy and
CuPy through the backend's `xp`; every allocation goes through
`dmath.memory`.
"""
from typing import NamedTuple

import numpy as np

from .. import memory
from ..comm import collectives
from ..layout import RowBlock, distribution
from .plan import AllReduce, localize, plan, send_dtype


def view(a, rows, cols):
    """The strided 4-D view of 2-D `a` at `rows` x `cols` (ix.Runs): (rows.count, rows.length, cols.count, cols.length).

    A slice, a reshape that only splits each axis in two (always a view, on
    NumPy and CuPy), and a slice: writing to it writes to `a`.
    """
    w = a[rows.base:rows.base + rows.count * rows.stride, cols.base:cols.base + cols.count * cols.stride]
    w = w.reshape(rows.count, rows.stride, cols.count, cols.stride)
    return w[:, rows.offset:rows.offset + rows.length, :, cols.offset:cols.offset + cols.length]


def _store(dst, src, accumulate):
    # in-place on a view: the ufunc and the assignment convert the dtype as they go
    if accumulate:
        dst += src
    else:
        dst[...] = src


def pack(seg, piece, block):
    """Copy the selection `seg` of `piece` into `block`, its packed (h, w) form."""
    for (pr, pc), (br, bc) in seg.views:
        view(block, br, bc)[...] = view(piece, pr, pc)


def unpack(seg, block, piece, accumulate):
    """Write (or add) the packed `block` into the selection `seg` of `piece`."""
    for (pr, pc), (br, bc) in seg.views:
        _store(view(piece, pr, pc), view(block, br, bc), accumulate)


def new_pieces(dist, rank, dtype, zero):
    """This rank's new pieces of `dist`; zero: filled with -0.0, the identity of the sums a Partial
    source's addends are added into and of a Partial target's other addends (+0.0 turned a -0.0
    value into +0.0)."""
    if zero:
        return [memory.fill(memory.empty(shape, dtype), -0.0) for shape in dist.shard_shapes(rank)]
    return [memory.empty(shape, dtype) for shape in dist.shard_shapes(rank)]


def prepared_steps(cache, src, dst, offset, rank):
    """The plan's steps with this rank's part localised; cached in the command's entry."""
    steps = cache.get("remap")
    if steps is None:
        steps = [(step, None if isinstance(step, AllReduce) else localize(step, rank))
                 for step in plan(src, dst, offset)]
        cache["remap"] = steps
    return steps


def run(world, cache, pieces, src, dst, src_dtype, dst_dtype, offset=(0, 0), pending=None):
    """Redistribute this rank's `pieces` of `src` into new pieces of `dst` (returned).

    pending: None, or a list: then a final all-reduce (Partial to its sums) runs
    in the background (collectives.allreduce_start, in the destination dtype)
    and its Pending is appended; the pieces are complete once it is waited for.

    A Partial source's sum is never made in a dtype narrower than both ends
    can hold it in: going to a narrower dtype it is summed in its own and
    converted once (`narrows_partial`); going to a wider one, in the wider.
    """
    rank = world.rank
    if src.partial and np.dtype(dst_dtype).itemsize < np.dtype(src_dtype).itemsize:
        # a Partial source is summed on the way: in the narrower dtype the addends could overflow or
        # round where their sum does not (1e5 + (1 - 1e5) in float16), so it is summed in its own
        # dtype and converted once, at the end (in the foreground)
        if narrows_partial(src, dst, src_dtype, dst_dtype):
            # a Partial target sums nothing (each addend travels whole): converting its addends one
            # by one would round (or overflow) each of them. The sums are made first, as row blocks
            # over the source group in the source dtype, and each is converted once on its way into
            # the target (every element on one member, zeros elsewhere)
            mid = distribution(RowBlock(src.group), dst.shape, src.nworkers)
            sums = run(world, cache.setdefault("narrow sums", {}), pieces, src, mid, src_dtype, src_dtype, offset)
            return run(world, cache.setdefault("narrow spread", {}), sums, mid, dst, src_dtype, dst_dtype)
        return [_converted(p, dst_dtype) for p in run(world, cache, pieces, src, dst, src_dtype, src_dtype, offset)]
    held = src_dtype            # the dtype this rank's pieces are in before each step
    for step, loc in prepared_steps(cache, src, dst, offset, rank):
        last = step.dst is dst
        wire = send_dtype(held, dst_dtype)
        # a step that sums a Partial source sums in the destination dtype (here at least as wide
        # as the source's): a float16 gradient summed into float32 must not overflow in float16
        # (the Exchange accumulates into pieces of `dtype`, the all-reduce reduces a buffer of it)
        dtype = dst_dtype if (last or src.partial) else wire
        if isinstance(step, AllReduce):
            # converted first, summed after; in the background nothing is left to do once it lands
            pieces = _allreduce(world, step, pieces, rank, dtype, offset, pending if last else None)
        else:
            pieces = _exchange(world, step, loc, pieces, rank, wire, dtype)
        held = dtype
    return pieces


def narrows_partial(src, dst, src_dtype, dst_dtype):
    """Whether `run` sums a Partial source into a Partial target of a narrower dtype first (a
    reduce-scatter over the source group that the plan itself does not show)."""
    return (src.partial and dst.partial and len(src.group) > 1
            and np.dtype(dst_dtype).itemsize < np.dtype(src_dtype).itemsize)


#: the dtype the addends of a Partial product of each dtype are made and summed in: float16 ones
#: alone may overflow (or round) where their sum does not, which made a float16 result depend on
#: the worker count (NaN at 2 workers, 0 at one); wider ones are summed as they are
PARTIAL_SUM = {"float16": "float32"}


def sums_wider(natural, dtype):
    """Whether a product landing as `natural` (a Distribution) in `dtype` is made in a wider dtype and
    summed before it is rounded: a Partial product of float16 addends over several workers."""
    return dtype in PARTIAL_SUM and natural.partial and len(natural.group) > 1


def _allreduce(world, step, pieces, rank, dtype, offset, pending=None):
    """The sums of a Partial step, made in `dtype` (the addends converted into it first)."""
    if rank not in step.dst.group:
        return []
    m, n = step.dst.shape
    piece = pieces[0]
    buf = memory.empty((m * n,), dtype)
    # a whole contiguous piece in that dtype is reduced from where it is (no copy into buf first)
    src = _flat(piece) if (offset == (0, 0) and piece.shape == (m, n) and piece.dtype == np.dtype(dtype)) else None
    if src is None:
        buf.reshape(m, n)[...] = piece[offset[0]:offset[0] + m, offset[1]:offset[1] + n]
    if pending is not None:
        pending.append(collectives.allreduce_start(world.group(step.src.group), buf, src=src))
        return [buf.reshape(m, n)]
    collectives.allreduce(world.group(step.src.group), buf, src=src)
    return [buf.reshape(m, n)]


def _converted(piece, dtype):
    out = memory.empty(piece.shape, dtype)
    out[...] = piece
    return out


def _flat(a):
    """`a` as a 1-D view (None when it is not contiguous, so that a reshape would copy)."""
    return a.reshape(-1) if a.flags.c_contiguous else None


class Buffers(NamedTuple):
    """What one worker hands to the all-to-all-v: each buffer with its per-member offsets (None: packed)."""
    send: object
    send_displs: object
    recv: object
    recv_displs: object


def prepare(loc, pieces, out, wire, accumulate):
    """Pack this worker's sends and choose the receive buffer (before the exchange).

    A source piece is the send buffer, and a target piece the receive buffer,
    when the plan says every part is one range of it and no conversion (nor
    accumulation) is due; else parts are packed into, or received in, a
    buffer in the wire dtype. The choice never changes what is exchanged.
    """
    send = recv = None
    if loc.send_displs is not None and pieces[loc.send_piece].dtype == np.dtype(wire):
        send = _flat(pieces[loc.send_piece])
    sdispls = loc.send_displs if send is not None else None
    if send is None:
        send = memory.empty((sum(loc.send_counts),), wire)
        _pack_all(loc.sends, pieces, send)
    if loc.recv_displs is not None and not accumulate and out[loc.recv_piece].dtype == np.dtype(wire):
        recv = _flat(out[loc.recv_piece])
    rdispls = loc.recv_displs if recv is not None else None
    if recv is None:
        recv = memory.empty((sum(loc.recv_counts),), wire)
    return Buffers(send, sdispls, recv, rdispls)


def finish(loc, pieces, out, bufs, accumulate):
    """Local copies, then the received parts into the target pieces (after the exchange).

    Contributions are applied in this order (own part, then members in group
    order), which fixes the summation order of a Partial source.
    """
    _local_copies(loc, pieces, out, accumulate)
    if bufs is not None and bufs.recv_displs is None:
        _unpack_all(loc.recvs, bufs.recv, out, accumulate)


def _exchange(world, step, loc, pieces, rank, wire, dtype):
    out = new_pieces(step.dst, rank, dtype, step.zero_init)
    bufs = None
    if rank in loc.group:
        bufs = prepare(loc, pieces, out, wire, step.accumulate)
        collectives.exchange(world.group(loc.group), bufs.send, loc.send_counts, bufs.recv, loc.recv_counts,
                             bufs.send_displs, bufs.recv_displs)
    finish(loc, pieces, out, bufs, step.accumulate)
    return out


def _pack_all(segs_per_member, pieces, buf):
    o = 0
    for segs in segs_per_member:
        for seg in segs:
            h, w = seg.shape
            pack(seg, pieces[seg.piece], buf[o:o + h * w].reshape(h, w))
            o += h * w


def _unpack_all(segs_per_member, buf, out, acc):
    o = 0
    for segs in segs_per_member:
        for seg in segs:
            h, w = seg.shape
            unpack(seg, buf[o:o + h * w].reshape(h, w), out[seg.piece], acc)
            o += h * w


def _local_copies(loc, pieces, out, acc):
    for lc in loc.local:
        src, dst = pieces[lc.src.piece], out[lc.dst.piece]
        if lc.direct is not None:
            for (sr, sc), (dr, dc) in lc.direct:
                _store(view(dst, dr, dc), view(src, sr, sc), acc)
        else:
            # selections that do not pair view by view meet in their packed form
            block = memory.empty(lc.src.shape, src.dtype)
            pack(lc.src, src, block)
            unpack(lc.dst, block, dst, acc)
