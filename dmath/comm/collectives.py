"""Data collectives among workers: MPI for host arrays, NCCL for device arrays.

Every function takes a `Group` (see world.py) and arrays of the current
backend, and counts the payload it moves in `counters`. Counts are in
elements of the array's dtype. Host arrays travel as bytes, so float16 needs
no MPI datatype; reductions of host arrays are done locally in the array's
own dtype after a byte exchange, so that MPI never has to add half floats.

In a careful command (`agreement.state` set, see agreement.py and
runtime/oom.py) every entry point first allocates all the buffers it needs,
then agrees with the members of its group, then communicates: a member whose
allocation is refused leaves before any of its peers is committed to a
transfer with it. Outside careful commands that is one test of a module
attribute per call.
"""
import numpy as np

from .. import backend
from . import agreement, counters
from .world import poll, wait, waitall

_OPS = {"sum": "add", "max": "maximum", "min": "minimum"}


def _backend_empty(shape, dtype):
    return backend.current().xp.empty(shape, dtype=dtype)


#: where the buffers allocated here come from; dmath.memory installs its pool
_empty = _backend_empty


def set_buffer_allocator(fn):
    """Allocate this module's buffers with `fn(shape, dtype)` (dmath.memory registers its pool)."""
    global _empty
    _empty = fn


def _nccl_dtype(dtype):
    from cupy.cuda import nccl
    return {"float16": nccl.NCCL_FLOAT16, "float32": nccl.NCCL_FLOAT32,
            "float64": nccl.NCCL_FLOAT64}[np.dtype(dtype).name]


def _nccl_op(op):
    from cupy.cuda import nccl
    return {"sum": nccl.NCCL_SUM, "max": nccl.NCCL_MAX, "min": nccl.NCCL_MIN}[op]


def _stream_ptr():
    return backend.current().xp.cuda.get_current_stream().ptr


def _displs(counts):
    return np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64) if len(counts) else []


def _bytes(a):
    return a.reshape(-1).view(np.uint8)


def _count_exchange(group, send_counts, recv_counts, isz):
    me = group.rank
    counters.count_send(isz * sum(c for k, c in enumerate(send_counts) if k != me),
                        sum(1 for k, c in enumerate(send_counts) if c and k != me))
    counters.count_recv(isz * sum(c for k, c in enumerate(recv_counts) if k != me),
                        sum(1 for k, c in enumerate(recv_counts) if c and k != me))


def exchange(group, sendbuf, send_counts, recvbuf, recv_counts, send_displs=None, recv_displs=None,
             point_to_point=False):
    """All-to-all-v: send_counts[k] elements of `sendbuf` (in group order) go to member k.

    The part for this rank itself must be 0 (callers copy it locally).
    `send_displs` / `recv_displs` (element offsets per member) place the parts
    anywhere in the 1-D buffers; by default they follow each other in group
    order. Explicit offsets let a caller send from, or receive into, its
    arrays directly when every part is one contiguous range of them.
    point_to_point: the parts go as MPI sends and receives between the peers
    with a part only (a halo exchange between neighbours), not as a
    collective over the group; NCCL's path is point-to-point anyway.
    """
    if group.size == 1:
        return
    if agreement.state is not None:
        agreement.agree(group.ranks)
    _exchange(group, sendbuf, send_counts, recvbuf, recv_counts, send_displs, recv_displs, point_to_point)


def _exchange(group, sendbuf, send_counts, recvbuf, recv_counts, send_displs=None, recv_displs=None,
              point_to_point=False):
    """`exchange` once agreed (a group of two or more)."""
    isz = sendbuf.dtype.itemsize
    _count_exchange(group, send_counts, recv_counts, isz)
    sd = _displs(send_counts) if send_displs is None else np.asarray(send_displs, dtype=np.int64)
    rd = _displs(recv_counts) if recv_displs is None else np.asarray(recv_displs, dtype=np.int64)
    if backend.current().is_gpu:
        from cupy.cuda import nccl
        dt, stream = _nccl_dtype(sendbuf.dtype), _stream_ptr()
        comm = group.nccl   # created outside the group call: an init inside it completes only at groupEnd
        nccl.groupStart()
        for k in range(group.size):
            if send_counts[k]:
                comm.send(sendbuf[sd[k]:].data.ptr, int(send_counts[k]), dt, k, stream)
            if recv_counts[k]:
                comm.recv(recvbuf[rd[k]:].data.ptr, int(recv_counts[k]), dt, k, stream)
        nccl.groupEnd()
        return
    sc = np.asarray(send_counts, dtype=np.int64) * isz
    rc = np.asarray(recv_counts, dtype=np.int64) * isz
    if point_to_point or max(sendbuf.nbytes, recvbuf.nbytes) > MAX_COLLECTIVE_BYTES:
        _exchange_in_parts(group, _bytes(sendbuf), sc, sd * isz, _bytes(recvbuf), rc, rd * isz)
        return
    MPI = group.world.mpi_module
    req = group.mpi.Ialltoallv([_bytes(sendbuf), (sc, sd * isz), MPI.BYTE],
                               [_bytes(recvbuf), (rc, rd * isz), MPI.BYTE])
    wait(req, int(sc.sum() + rc.sum()))


def _exchange_in_parts(group, sb, sc, sd, rb, rc, rd):
    """An all-to-all-v of byte buffers sb -> rb (byte counts and offsets per member) as point-to-point
    messages of at most MAX_MESSAGE_BYTES: for buffers past the C ints in which an MPI-3 library
    counts and places a collective's parts, and for halo exchanges (`exchange`'s point_to_point). Parts between one pair arrive in the order they were
    posted (MPI's non-overtaking rule), so the k-th receive from a member gets its k-th send."""
    BYTE, comm = group.world.mpi_module.BYTE, group.mpi
    reqs = []
    for counts, displs, buf, start in ((rc, rd, rb, comm.Irecv), (sc, sd, sb, comm.Isend)):
        for k in range(group.size):
            n, lo = int(counts[k]), int(displs[k])
            for o in range(0, n, MAX_MESSAGE_BYTES):
                reqs.append(start([buf[lo + o:lo + min(n, o + MAX_MESSAGE_BYTES)], BYTE], k, _PARTS_TAG))
    waitall(reqs, int(sc.sum() + rc.sum()))


def allgatherv(group, sendbuf, recvbuf, counts):
    """Member k contributes counts[k] elements; every member receives the concatenation."""
    if group.size == 1:
        recvbuf[:counts[0]] = sendbuf[:counts[0]]
        return
    if agreement.state is not None:
        agreement.agree(group.ranks)
    _allgatherv(group, sendbuf, recvbuf, counts)


def _allgatherv(group, sendbuf, recvbuf, counts):
    """`allgatherv` once agreed (a group of two or more)."""
    isz = recvbuf.dtype.itemsize
    mine = counts[group.rank]
    counters.count_send(isz * mine * (group.size - 1), group.size - 1 if mine else 0)
    counters.count_recv(isz * (sum(counts) - mine), sum(1 for k, c in enumerate(counts) if c and k != group.rank))
    if backend.current().is_gpu:
        from cupy.cuda import nccl
        dt, stream = _nccl_dtype(recvbuf.dtype), _stream_ptr()
        if len(set(counts)) == 1:
            group.nccl.allGather(sendbuf.data.ptr, recvbuf.data.ptr, int(mine), dt, stream)
            return
        d = _displs(counts)
        comm = group.nccl
        nccl.groupStart()
        for k in range(group.size):
            if k != group.rank:
                if mine:
                    comm.send(sendbuf.data.ptr, int(mine), dt, k, stream)
                if counts[k]:
                    comm.recv(recvbuf[d[k]:].data.ptr, int(counts[k]), dt, k, stream)
        nccl.groupEnd()
        recvbuf[d[group.rank]:d[group.rank] + mine] = sendbuf[:mine]
        return
    MPI = group.world.mpi_module
    bc = np.asarray(counts, dtype=np.int64) * isz
    if recvbuf.nbytes > MAX_COLLECTIVE_BYTES:
        # my part to every other member, theirs into place, mine copied here
        me, d, others = group.rank, _displs(bc), np.arange(group.size) != group.rank
        rb = _bytes(recvbuf)
        rb[d[me]:d[me] + bc[me]] = _bytes(sendbuf)[:bc[me]]
        _exchange_in_parts(group, _bytes(sendbuf), bc[me] * others, np.zeros_like(bc), rb, bc * others, d)
        return
    req = group.mpi.Iallgatherv([_bytes(sendbuf[:mine]), MPI.BYTE],
                                [_bytes(recvbuf), (bc, _displs(bc)), MPI.BYTE])
    wait(req, int(bc.sum()))


def reduce_scatter(group, sendbuf, recvbuf, counts, op="sum"):
    """Reduce `sendbuf` (sum(counts) elements) over the group; member k keeps part k (counts[k])."""
    mine = counts[group.rank]
    if group.size == 1:
        recvbuf[:mine] = sendbuf[:mine]
        return
    if backend.current().is_gpu and len(set(counts)) == 1:
        if agreement.state is not None:
            agreement.agree(group.ranks)
        isz = sendbuf.dtype.itemsize
        counters.count_send(isz * (sum(counts) - mine), group.size - 1)
        counters.count_recv(isz * mine * (group.size - 1), group.size - 1)
        group.nccl.reduceScatter(sendbuf.data.ptr, recvbuf.data.ptr, int(mine),
                                 _nccl_dtype(sendbuf.dtype), _nccl_op(op), _stream_ptr())
        return
    bufs = _scatter_buffers(group, counts, sendbuf.dtype)     # before the agreement: see the module's doc
    if agreement.state is not None:
        agreement.agree(group.ranks)
    _reduce_scatter(group, sendbuf, recvbuf, counts, op, bufs)


def _scatter_buffers(group, counts, dtype):
    """The buffers of `_reduce_scatter` on this member: (packed sends, received parts, accumulator)."""
    mine = counts[group.rank]
    return (_empty(sum(counts) - mine, dtype), _empty(mine * (group.size - 1), dtype), _empty(mine, dtype))


def _reduce_scatter(group, sendbuf, recvbuf, counts, op, bufs):
    """Direct reduce-scatter, once agreed: an exchange of the parts, then a local reduction."""
    xp = backend.current().xp
    mine = counts[group.rank]
    packed, incoming, acc = bufs
    d = _displs(counts)
    send_counts = [0 if k == group.rank else counts[k] for k in range(group.size)]
    o = 0
    for k in range(group.size):
        if k != group.rank:
            packed[o:o + counts[k]] = sendbuf[d[k]:d[k] + counts[k]]
            o += counts[k]
    recv_counts = [0 if k == group.rank else mine for k in range(group.size)]
    _exchange(group, packed, send_counts, incoming, recv_counts)
    acc[...] = sendbuf[d[group.rank]:d[group.rank] + mine]
    combine = getattr(xp, _OPS[op])
    for k in range(group.size - 1):
        combine(acc, incoming[k * mine:(k + 1) * mine], out=acc)
    recvbuf[:mine] = acc


def _count_allreduce(group, buf):
    # counted as the reduce-scatter + all-gather of the CPU path moves it (member k owns
    # counts[k]): exact totals, 2 (p - 1) n over the group, with no rounding that would
    # make the bytes differ between backends
    n, p = buf.size, group.size
    mine = n // p + (1 if group.rank < n % p else 0)
    moved = buf.dtype.itemsize * (n + (p - 2) * mine)
    counters.count_send(moved, 2 * (p - 1))
    counters.count_recv(moved, 2 * (p - 1))


def allreduce(group, buf, op="sum", src=None):
    """Reduce `buf` (1-D, contiguous) over the group, in place on every member.

    src: None, or a contiguous 1-D array of buf's size and dtype whose values
    are reduced instead of buf's own (the result still lands in buf): NCCL
    reads it where it is, which saves the copy into buf; the CPU path copies.
    """
    if src is not None and (group.size == 1 or not backend.current().is_gpu):
        buf[...] = src              # the CPU path reduces in place
        src = None
    if group.size == 1:
        return
    n, p = buf.size, group.size
    if backend.current().is_gpu:
        if agreement.state is not None:
            agreement.agree(group.ranks)
        _count_allreduce(group, buf)
        send = buf if src is None else src
        group.nccl.allReduce(send.data.ptr, buf.data.ptr, n, _nccl_dtype(buf.dtype), _nccl_op(op), _stream_ptr())
        return
    counts = [n // p + (1 if k < n % p else 0) for k in range(p)]
    # every buffer first, then one agreement for the reduce-scatter and the all-gather together
    part = _empty(counts[group.rank], buf.dtype)
    bufs = _scatter_buffers(group, counts, buf.dtype)
    if agreement.state is not None:
        agreement.agree(group.ranks)
    _reduce_scatter(group, buf, part, counts, op, bufs)
    _allgatherv(group, part, buf, counts)


def allreduce_start(group, buf, op="sum", src=None):
    """Start reducing `buf` (1-D, contiguous) over the group in place; returns a `Pending`.

    On the GPU it runs on the side stream over the group's side communicator,
    after the work queued so far on the compute stream (so it sees `buf`'s
    writes); computation queued next overlaps it until `Pending.wait()`. On
    the CPU it is the blocking `allreduce` (the Pending is already done).
    src: as for `allreduce`; the Pending holds it until `wait()`, so that its
    memory is not handed to other work while the side stream still reads it.
    """
    be = backend.current()
    if group.size == 1 or not be.is_gpu:
        allreduce(group, buf, op, src)
        return Pending()
    if agreement.state is not None:
        agreement.agree(group.ranks)
    side_begin()
    side = be.side_stream()
    _count_allreduce(group, buf)
    send = buf if src is None else src
    group.nccl_side.allReduce(send.data.ptr, buf.data.ptr, buf.size, _nccl_dtype(buf.dtype), _nccl_op(op), side.ptr)
    return Pending(event=side.record(), keep=src)


def bcast(group, buf, root=0):
    """Broadcast `buf` from group member `root` (group index) to the others, in place."""
    if group.size == 1:
        return
    if agreement.state is not None:
        agreement.agree(group.ranks)
    isz = buf.dtype.itemsize
    if group.rank == root:
        counters.count_send(isz * buf.size * (group.size - 1), group.size - 1)
    else:
        counters.count_recv(isz * buf.size, 1)
    if backend.current().is_gpu:
        group.nccl.bcast(buf.data.ptr, buf.size, _nccl_dtype(buf.dtype), root, _stream_ptr())
        return
    BYTE = group.world.mpi_module.BYTE
    waitall([group.mpi.Ibcast([part, BYTE], root=root) for part in _parts(buf)], buf.nbytes)


#: host messages are cut into parts of at most this many bytes: MPI counts are C ints in
#: MPI-3 libraries (Open MPI 4), so one message of 2 GiB or more would overflow them
MAX_MESSAGE_BYTES = 1 << 30
#: the largest buffer an all-to-all-v or all-gather-v passes to MPI whole (its byte counts and
#: offsets are C ints there too); past it they go as point-to-point parts
MAX_COLLECTIVE_BYTES = (1 << 31) - 1
#: the tag of those parts on a group's communicator (which carries no other point-to-point message)
_PARTS_TAG = 11


def _parts(array):
    """`array`'s bytes as consecutive views of at most MAX_MESSAGE_BYTES (at least one, maybe empty)."""
    b = _bytes(array)
    return [b[o:o + MAX_MESSAGE_BYTES] for o in range(0, max(b.size, 1), MAX_MESSAGE_BYTES)]


def send_host_start(world, array, dest, tag=7):
    """Start sending the C-contiguous host array `array` to world rank `dest`; returns the requests.

    The array must stay alive and unchanged until `wait_host` completes them.
    Parts between one pair of ranks arrive in order (MPI's non-overtaking rule).
    """
    if agreement.state is not None:
        agreement.agree(_pair(world.rank, dest))
    counters.count_send(array.nbytes, 1)
    BYTE = world.mpi_module.BYTE
    return _started([world.data.Isend([part, BYTE], dest, tag) for part in _parts(array)])


def recv_host_start(world, array, source, tag=7):
    """Start receiving into the C-contiguous host array `array` from world rank `source`."""
    if agreement.state is not None:
        agreement.agree(_pair(world.rank, source))
    counters.count_recv(array.nbytes, 1)
    BYTE = world.mpi_module.BYTE
    return _started([world.data.Irecv([part, BYTE], source, tag) for part in _parts(array)])


def _pair(a, b):
    """The agreement group of a transfer between world ranks a and b (sorted)."""
    return (a, b) if a < b else (b, a)


def _started(requests):
    """`requests` of a transfer just started (kept for agreement.leave in a careful command)."""
    if agreement.state is not None:
        agreement.track(requests)
    return requests


def wait_host(requests, nbytes):
    """Complete host transfers started together (`nbytes` in all), all progressing at once."""
    waitall(requests, nbytes)


def send_host(world, array, dest, tag=7):
    """Send a host (numpy) array to world rank `dest` (scatter and gather with the master)."""
    array = np.ascontiguousarray(array)
    wait_host(send_host_start(world, array, dest, tag), array.nbytes)


def recv_host(world, array, source, tag=7):
    """Receive into the host (numpy) array `array` from world rank `source`."""
    wait_host(recv_host_start(world, array, source, tag), array.nbytes)


def bcast_host_start(group, array, root=0):
    """Start broadcasting the C-contiguous host array `array` from group member `root` (MPI, any
    backend); returns the requests for `wait_host`. The root's array is only read.

    One collective (a tree or pipeline inside MPI) instead of a send per
    member: the root's link carries the bytes about once, not size - 1 times.
    """
    if group.size == 1:
        return []
    if agreement.state is not None:
        agreement.agree(group.ranks)
    if group.rank == root:
        counters.count_send(array.nbytes * (group.size - 1), group.size - 1)
    else:
        counters.count_recv(array.nbytes, 1)
    BYTE = group.world.mpi_module.BYTE
    return _started([group.mpi.Ibcast([part, BYTE], root=root) for part in _parts(array)])


def device_done():
    """Wait for the device work queued so far, polling so that failures elsewhere surface."""
    poll(backend.current().stream_done)


class Pending:
    """A collective in flight. `wait()` makes its result usable by the work that follows.

    On the GPU the transfer runs on the side stream and `wait()` only makes
    the compute stream wait for it (the host does not block); on the CPU it
    completes the MPI request, polling for failures elsewhere.
    """
    __slots__ = ("reqs", "event", "keep")

    def __init__(self, reqs=None, event=None, keep=None):
        self.reqs, self.event = reqs, event     # reqs: MPI requests (one per part of the message)
        self.keep = keep        # an array the transfer reads, alive until the compute stream waits for it

    def wait(self):
        if self.reqs is not None:
            reqs, self.reqs = self.reqs, None
            waitall(reqs)
        if self.event is not None:
            event, self.event = self.event, None
            backend.current().xp.cuda.get_current_stream().wait_event(event)
        self.keep = None


def then(pending, fn):
    """Run fn() once the transfer of `pending` is done: on a GPU on the side stream right behind it,
    so that the Pending covers fn's work too (its waiter waits for both) and the compute stream waits
    for neither; elsewhere (the CPU, a transfer already done) now. Returns `pending`."""
    if pending.reqs is not None:
        pending.wait()
    if pending.event is None:
        fn()
        return pending
    side = backend.current().side_stream()
    with side:
        fn()
    pending.event = side.record()
    return pending


def side_begin():
    """Order the side stream after the work queued so far on the compute stream (GPU)."""
    be = backend.current()
    if be.is_gpu:
        be.side_stream().wait_event(be.xp.cuda.get_current_stream().record())


def bcast_start(group, buf, root=0):
    """Start broadcasting `buf` from member `root`; returns a `Pending` (in place on every member).

    On the GPU it runs on the side stream over the group's side communicator,
    so computation on the compute stream overlaps it; call `side_begin()`
    once before a batch of these so they see the buffers' earlier writes.
    """
    if group.size == 1:
        return Pending()
    if agreement.state is not None:
        agreement.agree(group.ranks)
    isz = buf.dtype.itemsize
    if group.rank == root:
        counters.count_send(isz * buf.size * (group.size - 1), group.size - 1)
    else:
        counters.count_recv(isz * buf.size, 1)
    be = backend.current()
    if be.is_gpu:
        side = be.side_stream()
        group.nccl_side.bcast(buf.data.ptr, buf.size, _nccl_dtype(buf.dtype), root, side.ptr)
        return Pending(event=side.record())
    BYTE = group.world.mpi_module.BYTE
    return Pending(reqs=_started([group.mpi.Ibcast([part, BYTE], root=root) for part in _parts(buf)]))
