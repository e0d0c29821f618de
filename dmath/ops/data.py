"""Moving whole matrices between the master's host memory and the workers: scatter and gather
(`from_numpy`, `Matrix.to_numpy`, `Matrix.assign`: master halves and kernels)."""
import math

import numpy as np

from .. import backend, memory
from ..backend import canonical_dtype
from ..comm import collectives
from ..errors import DMathError, DTypeError, ShapeError
from ..layout import indexset as ix
from ..memory import kinds
from ..runtime import define
from .base import dispatch, is_matrix, new_meta
from .creation import PARTIAL_ZERO, holds_value
from .movement import remap_into
from .storage import check_kind, compute_empty, create, new_shard

SCATTER = define("scatter")
SCATTER_INTO = define("scatter_into")
GATHER = define("gather")


# ---- master halves ------------------------------------------------------------------------
def from_numpy(array, layout=None, dtype=None, memory=None):
    """Scatter a 2-D numpy array (1-D arrays become one row) from the master."""
    memory = check_kind(memory)
    try:
        a = np.asarray(array)
    except ValueError as exc:           # nested lists of unequal lengths (NumPy refuses them)
        raise ShapeError(f"from_numpy needs a rectangular 1-D or 2-D array: {exc}") from exc
    if a.ndim == 1:
        a = a[None, :]
    if a.ndim != 2:
        raise ShapeError(f"from_numpy needs a 1-D or 2-D array, got {a.ndim}-D of shape {a.shape}")
    if not np.issubdtype(a.dtype, np.number):
        raise DTypeError(f"from_numpy needs a numeric array, got dtype {a.dtype}")
    if a.dtype.kind == "c":
        raise DTypeError(f"from_numpy: dmath matrices are real; the array is {a.dtype}. Pass a.real and "
                         f"a.imag as two matrices (converting would drop the imaginary part)")
    if dtype is None and a.dtype.kind == "f" and a.dtype.itemsize > 8:
        raise DTypeError(f"from_numpy: {a.dtype} (long double) is wider than any dmath dtype; pass dtype= "
                         f"(e.g. 'float64', which rounds it) or a.astype(np.float64)")
    dtype = canonical_dtype(dtype if dtype is not None else
                            (a.dtype if a.dtype.name in ("float16", "float32", "float64") else "float64"))
    check_exact_integers(a, dtype, "from_numpy")
    out = new_meta(layout, a.shape, dtype)
    return create(out, "scatter", memory, payload=np.ascontiguousarray(a, dtype=dtype))


def to_numpy(m):
    """Master half of Matrix.to_numpy: the whole matrix gathered on the master."""
    return dispatch("gather", [m])[1]


def assign(m, value):
    """Master half of Matrix.assign: overwrite m in place with a numpy array or a Matrix; returns m."""
    m._check_writable("assign")
    if is_matrix(value):
        if value.shape != m.shape:
            raise ShapeError(f"assign: the source matrix has shape {value.shape}, this matrix {m.shape}")
        remap_into(m, value)
        return m
    if not isinstance(value, np.ndarray):
        raise DMathError(f"assign needs a numpy array or a dmath.Matrix, got {type(value).__name__}")
    if value.shape != m.shape:
        raise ShapeError(f"assign: the array has shape {value.shape}, this matrix {m.shape}")
    if value.dtype.kind not in "iuf":
        raise DTypeError(f"assign needs a real numeric array, got dtype {value.dtype}")
    check_exact_integers(value, m.dtype, "assign")
    dispatch("scatter_into", [m], [0], payload=np.ascontiguousarray(value, dtype=m.dtype))
    return m


#: the largest magnitude below which every integer is exact in each dtype (2 ** mantissa bits)
_EXACT = {"float16": 2 ** 11, "float32": 2 ** 24, "float64": 2 ** 53}


def check_exact_integer_scalar(v, dtype, what):
    """DTypeError when the integer scalar v is not exact in `dtype` (2049 in float16), as for
    integer arrays; floats are rounded as NumPy rounds them (nothing to check)."""
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)):
        return
    v = int(v)
    if abs(v) <= _EXACT[np.dtype(dtype).name]:
        return
    with np.errstate(all="ignore"):
        got = float(np.array(float(v) if abs(v) < 2 ** 1023 else np.inf).astype(dtype))
    if not (math.isfinite(got) and got == v):
        raise DTypeError(f"{what}: the integer {v} is not exact in {dtype} (it would become {got!r}); pass "
                         f"float({v}) if rounding is what you want")


def check_exact_integers(a, dtype, what):
    """DTypeError when integer array `a` holds values that `dtype` rounds (int64 past 2**53 in
    float64, say): a conversion that changes values is the user's to ask for (a.astype(float))."""
    if a.dtype.kind not in "iu" or a.size == 0:
        return
    limit = _EXACT[np.dtype(dtype).name]
    lo, hi = int(a.min()), int(a.max())
    if -limit <= lo and hi <= limit:
        return
    flat = a.reshape(-1)
    big = np.flatnonzero((flat < -limit) | (flat > limit))      # the only values that may round
    with np.errstate(all="ignore"):
        conv = flat[big].astype(dtype).astype(np.float64).tolist()
    # Python ints and floats compare exactly (no conversion of either to the other's type)
    bad = big[[not (math.isfinite(c) and c == v) for c, v in zip(conv, flat[big].tolist())]]
    if bad.size:
        v = int(flat[bad[0]])
        raise DTypeError(f"{what}: {bad.size} integer value(s) are not exact in {dtype} (the first: {v}, "
                         f"which would become {float(np.array(v).astype(dtype))!r}); convert them yourself "
                         f"(a.astype(np.float64)) if rounding is what you want")


# ---- kernels ------------------------------------------------------------------------------


def _region(piece):
    return ix.selection(piece.rows), ix.selection(piece.cols)


def host_block(array, piece):
    """The host sub-array of `array` that `piece` covers, copied into a pooled host (staging) buffer."""
    r, c = _region(piece)
    block = memory.host_empty(piece.shape, array.dtype)
    block[...] = array[r, c] if isinstance(r, slice) or isinstance(c, slice) else array[np.ix_(r, c)]
    return block


def _put_block(array, piece, block):
    r, c = _region(piece)
    if isinstance(r, slice) or isinstance(c, slice):
        array[r, c] = block
    else:
        array[np.ix_(r, c)] = block


def _contiguous_block(array, piece):
    """The block of the C-contiguous `array` that `piece` covers, as a view, when it is contiguous
    (whole rows: a RowBlock piece); else None."""
    r, c = _region(piece)
    if isinstance(r, slice) and isinstance(c, slice) and c.start == 0 and c.stop == array.shape[1]:
        return array[r]
    return None


def _host_blocks(call, dist, dtype):
    """This rank's pieces of the master's host array (call.payload, already in `dtype`).

    The master sends every other worker its pieces at once (non-blocking,
    straight from the array when a piece is whole rows), and every member
    of a replicated matrix receives it by one broadcast. A Partial matrix:
    the first member's addend is the array, the others are zeros (so the
    sum is the array, not a multiple of it); only it is sent, and the others
    get None (their pieces are zeros).
    """
    world, mine = call.world, dist.pieces[call.rank]
    group = dist.group
    if dist.replicated and 0 in group and len(group) > 1:
        if call.rank not in group:
            return None
        members = world.group(group)
        if call.rank == 0:
            # broadcast straight from the array, and make the master's own copy meanwhile
            requests = collectives.bcast_host_start(members, call.payload, root=members.index(0))
            block = host_block(call.payload, mine[0])
        else:
            block = memory.host_empty(mine[0].shape, dtype)
            requests = collectives.bcast_host_start(members, block, root=members.index(0))
        collectives.wait_host(requests, block.nbytes)
        return [block]
    if call.rank == 0:
        src = call.payload
        requests, outgoing, nbytes = [], [], 0
        for r in range(1, dist.nworkers):
            if holds_value(dist, r):
                for p in dist.pieces[r]:
                    block = _contiguous_block(src, p)
                    block = host_block(src, p) if block is None else block
                    outgoing.append(block)         # alive until the sends complete
                    requests += collectives.send_host_start(world, block, r)
                    nbytes += block.nbytes
        own = [host_block(src, p) for p in mine] if holds_value(dist, 0) else None
        collectives.wait_host(requests, nbytes)
        return own
    if not holds_value(dist, call.rank):
        return None
    blocks = [memory.host_empty(p.shape, dtype) for p in mine]
    requests = [q for b in blocks for q in collectives.recv_host_start(world, b, 0)]
    collectives.wait_host(requests, sum(b.nbytes for b in blocks))
    return blocks


def _broadcast_on_device(call, dist, kind):
    """A replicated matrix bound for device memory on GPUs travels host to device once, on the
    master, then device to device (NCCL over NVLink, many times the host path's bandwidth)."""
    return (backend.current().is_gpu and dist.replicated and 0 in dist.group and len(dist.group) > 1
            and kind in ("device", "cuda_managed"))


def _scatter_by_device_broadcast(call, dist, dtype, kind):
    piece = dist.pieces[call.rank]
    if not piece:
        return new_shard([], dist, dtype, kind)
    out = compute_empty(kind, piece[0].shape, dtype)
    if call.rank == 0:
        staging = host_block(call.payload, piece[0])          # pinned: the copy below may run async
        backend.current().copy_to_device(out, staging)
    members = call.world.group(dist.group)
    collectives.bcast(members, out.reshape(-1), root=members.index(0))
    if call.rank == 0:
        collectives.device_done()                             # the staging block goes back to the pool
    return new_shard([out], dist, dtype, kind)


@SCATTER.kernel()
def _scatter(call):
    """Master sends every worker its pieces of the host array it holds (call.payload).

    scalars = (memory kind,). The received host blocks (copies, never views of
    the user's array) become the shard: kept as they are in host memory, or
    copied to the device.
    """
    dist, dtype = call.entry.out_dists[0], call.entry.outputs[0].dtype
    kind = kinds.from_code(call.scalars[0])
    if _broadcast_on_device(call, dist, kind):
        return [_scatter_by_device_broadcast(call, dist, dtype, kind)]
    blocks = _host_blocks(call, dist, dtype)
    if blocks is None:
        blocks = [compute_empty(kind, p.shape, dtype) for p in dist.pieces[call.rank]]
        for b in blocks:
            memory.fill(b, PARTIAL_ZERO)
    return [new_shard(blocks, dist, dtype, kind)]


@SCATTER_INTO.kernel()
def _scatter_into(call):
    """Overwrite input 0 in place with the master's host array (call.payload, in its dtype).

    The matrix keeps its handle and its buffers; the runtime gives it a new version.
    """
    be, target = backend.current(), call.inputs[0]
    blocks = _host_blocks(call, target.dist, target.dtype)
    for k, a in enumerate(target.pieces):
        if blocks is None:
            memory.fill(a, PARTIAL_ZERO)
        else:
            a[...] = be.asarray(blocks[k])
    return [target]


def senders(dist):
    """Ranks whose pieces the master needs: one holder of a replicated matrix, every member otherwise."""
    if dist.replicated:
        return (dist.group[0],)
    return tuple(r for r in range(dist.nworkers) if dist.pieces[r])


@GATHER.kernel()
def _gather(call):
    """Every sender ships its pieces to the master, which assembles (and sums, for Partial) them."""
    world = call.world
    shard = call.inputs[0]
    dist, dtype = shard.dist, shard.dtype
    who = senders(dist)
    if call.rank != 0:
        if call.rank in who:
            # a host copy that is current is sent as it is, without a trip to the device
            for a in kinds.host_arrays(shard):
                collectives.send_host(world, a, 0)
        return []
    acc_dtype = np.float64 if dist.partial else dtype
    # the pieces of a distributed or replicated matrix cover it exactly: no need to clear it first
    out = np.zeros(dist.shape, dtype=acc_dtype) if dist.partial else np.empty(dist.shape, dtype=acc_dtype)
    # every block is received at once: straight into the result where it is whole rows of it,
    # else into a buffer of its own, assembled afterwards
    incoming, requests, nbytes = [], [], 0
    for r in who:
        if r != 0:
            for p in dist.pieces[r]:
                block = None if dist.partial else _contiguous_block(out, p)
                if block is None:
                    block = memory.host_empty(p.shape, dtype)
                    incoming.append((p, block))
                requests += collectives.recv_host_start(world, block, r)
                nbytes += block.nbytes
    own = kinds.host_arrays(shard) if 0 in who else None
    collectives.wait_host(requests, nbytes)
    parts = ([] if own is None else list(zip(dist.pieces[0], own))) + incoming
    for k, (p, block) in enumerate(parts):
        if dist.partial and k:
            out += block
        elif dist.partial:
            out[...] = block        # the first addend as it is: 0.0 + -0.0 would lose a lone addend's sign
        else:
            _put_block(out, p, block)
    call.result = out.astype(dtype, copy=False)
    return []
