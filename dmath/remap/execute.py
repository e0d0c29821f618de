"""Running a remap plan on one worker: pack, one exchange, local copies, unpack."""
import numpy as np

from .. import backend, memory
from ..comm import collectives
from .plan import AllReduce, localize, plan, send_dtype


def sub(a, rows, cols):
    """a[rows, cols] for selections that are slices or index arrays (an outer product of them)."""
    if isinstance(rows, slice) or isinstance(cols, slice):
        return a[rows, cols]
    return a[backend.current().xp.ix_(rows, cols)]


def put(a, rows, cols, value, accumulate):
    if not isinstance(rows, slice) and not isinstance(cols, slice):
        rows, cols = backend.current().xp.ix_(rows, cols)
    if accumulate:
        a[rows, cols] += value
    else:
        a[rows, cols] = value


def _to_device(loc):
    """Move a LocalExchange's index arrays to the device once (cached with the plan)."""
    xp = backend.current().xp
    conv = lambda s: s if isinstance(s, slice) else xp.asarray(s)
    loc.local = [(sp, conv(r), conv(c), dp, conv(dr), conv(dc)) for sp, r, c, dp, dr, dc in loc.local]
    loc.sends = [[(sp, conv(r), conv(c), shp) for sp, r, c, shp in seg] for seg in loc.sends]
    loc.recvs = [[(dp, conv(r), conv(c), shp) for dp, r, c, shp in seg] for seg in loc.recvs]
    return loc


def new_pieces(dist, rank, dtype, zero):
    alloc = memory.zeros if zero else memory.empty
    return [alloc(shape, dtype) for shape in dist.shard_shapes(rank)]


def prepared_steps(cache, src, dst, offset, rank):
    """The plan's steps with this rank's part localised; cached in the command's entry."""
    steps = cache.get("remap")
    if steps is None:
        gpu = backend.current().is_gpu
        steps = []
        for step in plan(src, dst, offset):
            if isinstance(step, AllReduce):
                steps.append((step, None))
            else:
                loc = localize(step, rank)
                steps.append((step, _to_device(loc) if gpu else loc))
        cache["remap"] = steps
    return steps


def run(world, cache, pieces, src, dst, src_dtype, dst_dtype, offset=(0, 0)):
    """Redistribute this rank's `pieces` of `src` into new pieces of `dst` (returned)."""
    rank = world.rank
    wire = send_dtype(src_dtype, dst_dtype)
    for step, loc in prepared_steps(cache, src, dst, offset, rank):
        last = step.dst is dst
        dtype = dst_dtype if last else wire
        if isinstance(step, AllReduce):
            pieces = _allreduce(world, step, pieces, rank, wire, dtype, offset)
        else:
            pieces = _exchange(world, step, loc, pieces, rank, wire, dtype)
    return pieces


def _allreduce(world, step, pieces, rank, wire, dtype, offset):
    if rank not in step.dst.group:
        return []
    m, n = step.dst.shape
    buf = memory.empty((m * n,), wire)
    buf.reshape(m, n)[...] = pieces[0][offset[0]:offset[0] + m, offset[1]:offset[1] + n]
    collectives.allreduce(world.group(step.src.group), buf)
    out = buf.reshape(m, n)
    return [out if np.dtype(dtype) == np.dtype(wire) else out.astype(dtype)]


def _exchange(world, step, loc, pieces, rank, wire, dtype):
    out = new_pieces(step.dst, rank, dtype, step.zero_init)
    acc = step.accumulate
    if rank in loc.group:
        sendbuf = memory.empty((sum(loc.send_counts),), wire)
        o = 0
        for segs in loc.sends:
            for sp, r, c, (h, w) in segs:
                sendbuf[o:o + h * w].reshape(h, w)[...] = sub(pieces[sp], r, c)
                o += h * w
        recvbuf = memory.empty((sum(loc.recv_counts),), wire)
        collectives.exchange(world.group(loc.group), sendbuf, loc.send_counts, recvbuf, loc.recv_counts)
        _local_copies(loc, pieces, out, acc)
        o = 0
        for segs in loc.recvs:
            for dp, r, c, (h, w) in segs:
                put(out[dp], r, c, recvbuf[o:o + h * w].reshape(h, w), acc)
                o += h * w
    else:
        _local_copies(loc, pieces, out, acc)
    return out


def _local_copies(loc, pieces, out, acc):
    for sp, r, c, dp, dr, dc in loc.local:
        put(out[dp], dr, dc, sub(pieces[sp], r, c), acc)
