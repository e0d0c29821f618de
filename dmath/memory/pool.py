"""The memory pools behind every worker-side allocation: host size classes, CuPy's device pool.

`HostPool` (the CPU backend, and the pure logic tested without MPI) keeps
free lists of host byte blocks by size class. An allocation is an array view
of a block; numpy makes every array derived from it keep the block's lease
alive, so the block goes back to its free list exactly when the last array
that uses it dies, and the next request of that class reuses it.

`CudaPool` (the GPU backend) installs a `cupy.cuda.MemoryPool` as CuPy's
allocator, so every device array of the process, temporaries of `a + b`
included, comes from it, and a `cupy.cuda.PinnedMemoryPool` for the host
staging buffers of scatter and gather and for the host copies of 'host' and
'managed' matrices.

Both count new versus reused allocations, track the bytes in use, cached
(free blocks held for reuse) and the high-water mark of their footprint, and
enforce an optional limit: past it they first release the cached blocks,
then raise `OutOfMemoryError` saying what was asked and what is held.
"""
import ctypes
import math
import weakref

import numpy as np

from .. import backend
from ..errors import OutOfMemoryError

#: the smallest block: every request up to this size shares one class
MIN_CLASS = 256


def size_class(nbytes):
    """The block size that serves a request of `nbytes` (> 0).

    Classes step by a quarter of the power of two below the request (1.25,
    1.5, 1.75, 2 times it), so a block wastes less than a quarter of itself
    while a few dozen classes cover every size that occurs; the smallest is
    MIN_CLASS bytes.
    """
    if nbytes <= MIN_CLASS:
        return MIN_CLASS
    step = 1 << ((nbytes - 1).bit_length() - 3)
    return -(-nbytes // step) * step


def as_shape(shape):
    """`shape` (an int or a sequence of ints) as a tuple of ints."""
    if isinstance(shape, (int, np.integer)):
        return (int(shape),)
    return tuple(int(s) for s in shape)


def nbytes_of(shape, dtype):
    """Bytes of an array of `shape` (a tuple) and `dtype`."""
    return math.prod(shape) * _dtype(dtype).itemsize


def refusal(nbytes, what, in_use, released, limit):
    """The message of an allocation refused by a worker's pool: what was asked, what is held."""
    cap = f"its memory limit of {limit:,} bytes (dmath.memory.set_limit)" if limit is not None \
        else "the memory of its device"
    after = "" if released is None else f" after {released:,} cached bytes were released first"
    return (f"allocating {nbytes:,} bytes for {what} would exceed {cap} on this worker: "
            f"{in_use:,} bytes are in use (matrices, replica copies and buffers){after}")


_DTYPES = {}      # dtype spec -> np.dtype (np.dtype() is slow on the allocation path)


def _dtype(spec):
    dt = _DTYPES.get(spec)
    if dt is None:
        dt = _DTYPES[spec] = np.dtype(spec)
    return dt


class HostPool:
    """Size-class free lists of host byte blocks (one per process on the CPU backend)."""

    is_device = False
    #: whether close_window() counts only the window's own blocks (a block made before it and freed
    #: meanwhile lowers the base): the master adds back nothing
    window_exact = True

    def __init__(self):
        self.limit = None
        self._free = {}          # size class -> [(block, its address)]
        self._leases = {}        # id(weakref to a lease) -> (weakref, block, address, size, serial)
        self._returned = []      # lease entries whose last array died, not yet filed
        self._types = {}         # size class -> lease type
        self._requests = {}      # (shape, dtype) as asked -> `_request`'s answer
        self._on_dead = self._on_lease_dead     # the weak references' callback, bound once
        self.in_use = self.cached = self.high_water = 0
        self.peak_in_use = 0     # the most bytes in use at once (torch's max_memory_allocated)
        self.new_allocs = self.reused_allocs = 0
        self.serial = 0          # allocations so far (a lease's serial tells whether a window made it)
        self.window_serial = None  # while a window is open (open_window): the serial it opened at
        self.window_base = 0     # the bytes in use of blocks made before the window and still in use
        self.window_peak = 0     # the most bytes the window's own blocks held at once

    def open_window(self):
        """Start measuring the most bytes in use at once by blocks allocated from now on;
        close_window() returns it. (Exact: a block made before and freed meanwhile does not hide it.)"""
        self._file_returned()
        self.window_serial, self.window_base, self.window_peak = self.serial, self.in_use, 0

    def close_window(self):
        """The most bytes the blocks allocated since open_window() held at once (0: no window open)."""
        self._file_returned()
        opened, self.window_serial = self.window_serial, None
        return 0 if opened is None else self.window_peak

    # ---- allocation ---------------------------------------------------------
    def empty(self, shape, dtype):
        """An uninitialised numpy array backed by a pooled block."""
        request = self._requests.get((shape, dtype)) if type(shape) is tuple else None
        if request is None:
            request = self._request(shape, dtype)
        shape, dtype, size, lease_type = request
        if not size:
            return np.empty(shape, dtype)
        if self._returned:
            self._file_returned()
        blocks = self._free.get(size)
        if blocks:
            block, address = blocks.pop()
            self.cached -= size
            self.reused_allocs += 1
        else:
            self._make_room(size, shape, dtype)
            block = np.empty(size, np.uint8)
            address = block.ctypes.data
            self.new_allocs += 1
            self.high_water = max(self.high_water, self.in_use + self.cached + size)
        self.in_use += size
        if self.in_use > self.peak_in_use:
            self.peak_in_use = self.in_use
        self.serial += 1
        if self.window_serial is not None and self.in_use - self.window_base > self.window_peak:
            self.window_peak = self.in_use - self.window_base
        # The lease: a ctypes view of the block that holds the block and is the base
        # numpy keeps for every array made from the one returned (numpy collapses
        # chains of views only through ndarrays). It dies with the last of them.
        lease = lease_type.from_address(address)
        lease.block = block
        ref = weakref.ref(lease, self._on_dead)
        self._leases[id(ref)] = (ref, block, address, size, self.serial)
        return np.ndarray(shape, dtype, lease)

    def _request(self, shape, dtype):
        """(shape as a tuple, np.dtype, block size or 0 for an empty array, lease type) of a request;
        kept per (shape, dtype) as asked, so a repeated request looks nothing up again."""
        key = (shape, dtype) if type(shape) is tuple else None
        shape, dtype = as_shape(shape), _dtype(dtype)
        nbytes = math.prod(shape) * dtype.itemsize
        size = size_class(nbytes) if nbytes else 0
        lease_type = self._types.get(size)
        if lease_type is None:
            lease_type = self._types[size] = ctypes.c_char * size
        request = (shape, dtype, size, lease_type)
        if key is not None:
            if len(self._requests) >= 4096:     # shapes that keep changing: start over
                self._requests.clear()
            self._requests[key] = request
        return request

    # host staging buffers are the same host memory on the CPU backend
    host_empty = empty

    def _on_lease_dead(self, ref):
        # called from wherever the last array died (possibly inside the garbage
        # collector, in the middle of a pool call): only note it; `_file_returned`
        # does the accounting at the next pool call
        entry = self._leases.pop(id(ref), None)
        if entry is not None:
            self._returned.append(entry)

    def _file_returned(self):
        returned, free = self._returned, self._free
        while returned:
            _, block, address, size, serial = returned.pop()
            self.in_use -= size
            if self.window_serial is not None and serial <= self.window_serial:
                self.window_base -= size        # made before the window: no longer in its base
            self.cached += size
            blocks = free.get(size)
            if blocks is None:
                blocks = free[size] = []
            blocks.append((block, address))

    def _make_room(self, size, shape, dtype):
        """Check the limit for a new block of `size`, releasing the cached blocks first if needed."""
        if self.limit is None or self.in_use + self.cached + size <= self.limit:
            return
        released = self.release_cached()
        if self.in_use + size > self.limit:
            raise OutOfMemoryError(refusal(size, f"a {shape} {dtype} array", self.in_use, released, self.limit))

    # ---- control ------------------------------------------------------------
    def release_cached(self):
        """Give every free block back to the system; returns the bytes released."""
        self._file_returned()
        released = self.cached
        self._free.clear()
        self.cached = 0
        return released

    def set_limit(self, nbytes):
        """Cap in-use plus cached bytes (None: no cap); cached blocks over it are released now."""
        self.limit = nbytes
        if nbytes is not None:
            self._file_returned()
            if self.in_use + self.cached > nbytes:
                self.release_cached()

    def block_bytes(self, nbytes):
        """The bytes the pool sets aside for a request of `nbytes`."""
        return size_class(nbytes) if nbytes else 0

    def stats(self):
        self._file_returned()
        return {"in_use": self.in_use, "cached": self.cached, "high_water": self.high_water,
                "peak_in_use": self.peak_in_use, "new_allocs": self.new_allocs,
                "reused_allocs": self.reused_allocs, "limit": self.limit, "graphs": 0}

    def reset_stats(self):
        self._file_returned()
        self.new_allocs = self.reused_allocs = 0
        self.high_water = self.in_use + self.cached
        self.peak_in_use = self.in_use


class CudaPool:
    """CuPy's device memory pool and pinned host pool, installed as CuPy's allocators, with counters.

    The high-water mark is the most device memory the pool has held at once
    (in use plus cached): what the device had to provide. New versus reused
    allocations count both pools; the byte counts are the device pool's.
    """

    #: close_window() measures the peak above the bytes in use when it opened (CuPy's frees are not
    #: seen one by one): a block made before and freed meanwhile hides that much of the window's own
    window_exact = False

    is_device = True
    _UNIT = 512      # CuPy rounds device allocations to this many bytes

    def __init__(self, cupy):
        self._cp = cupy
        self.device = cupy.cuda.MemoryPool()
        self.pinned = cupy.cuda.PinnedMemoryPool()
        self.limit = None
        self.high_water = 0
        self.peak_in_use = 0         # the most device bytes in use at once (torch's max_memory_allocated)
        self.new_allocs = self.reused_allocs = 0
        self.unified = 0             # bytes of live CUDA managed ('cuda_managed') allocations
        self.graph_pools = {}        # id(owner) -> the private MemoryPool of a live captured CUDA graph
        self.capture_refs = None     # during a capture: what the graph being captured must keep alive
        self.capture_lane = 0        # during a capture on several streams: the current step's (runtime/streams.py)
        self.graph_peaks = {}        # id(owner) -> the most bytes its graph's buffers held at once
        self.retired_pools = []      # pools of graphs gone whose blocks arrays still use (`_drop_graph_pool`)
        self.used_peak = None        # while measure_peak() runs: the most device bytes in use so far
        self.window_base = 0
        self.window_peak = None      # while a window is open (open_window): the most device bytes in use
        self.footprint = 0           # the device pool's total bytes when last seen (see _malloc)
        self._unified_freed = []
        self._specs = {}             # (shape, dtype) -> (bytes, numpy dtype) of a non-empty array (`empty`)
        self._ndarray = cupy.ndarray
        cupy.cuda.set_allocator(self._malloc)
        cupy.cuda.set_pinned_memory_allocator(self._pinned_malloc)

    # ---- the allocators CuPy calls ------------------------------------------
    def _malloc(self, size):
        pool = self.device
        limit = self.limit
        if limit is not None and pool.used_bytes() + self.block_bytes(size) > limit:
            # the limit caps the bytes in use (what the master's ledger predicts), not the pool's
            # cache: a cached block inside a chunk that is partly in use cannot be given back, and
            # counting it would refuse here what the master admitted (a worker failure)
            raise OutOfMemoryError(refusal(size, "a device array", pool.used_bytes(), None, limit))
        try:
            mem = pool.malloc(size)     # on a full device CuPy frees its cached blocks and retries
        except self._cp.cuda.memory.OutOfMemoryError:
            self.footprint = pool.total_bytes()
            raise OutOfMemoryError(refusal(size, "a device array", pool.used_bytes(), None, None)) from None
        # the footprint grows only here (a new block) and shrinks only where cached blocks are
        # freed, which keep `footprint` up to date: one pool query per allocation, not two
        after = pool.total_bytes()
        if after > self.footprint:
            self.new_allocs += 1
            self.high_water = max(self.high_water, after)
        elif size:
            self.reused_allocs += 1
        self.footprint = after
        used = pool.used_bytes()
        if used > self.peak_in_use:
            self.peak_in_use = used
        if self.used_peak is not None:
            self.used_peak = max(self.used_peak, used)
        if self.window_peak is not None and used > self.window_peak:
            self.window_peak = used
        return mem

    def open_window(self):
        """Start measuring the most device bytes in use at once; close_window() says how many above now."""
        self.window_base = self.window_peak = self.device.used_bytes()

    def close_window(self):
        """The most device bytes in use at once since open_window(), less those in use then (0: none)."""
        peak, self.window_peak = self.window_peak, None
        return 0 if peak is None else max(0, peak - self.window_base)

    def measure_peak(self, run):
        """(run()'s result, the most bytes its allocations added to those in use at once)."""
        base = self.used_peak = self.device.used_bytes()
        try:
            return run(), self.used_peak - base
        finally:
            self.used_peak = None

    def _pinned_malloc(self, size):
        pinned = self.pinned
        free_before = pinned.n_free_blocks()
        mem = pinned.malloc(size)
        if size:
            if pinned.n_free_blocks() < free_before:
                self.reused_allocs += 1
            else:
                self.new_allocs += 1
        return mem

    # ---- allocation ---------------------------------------------------------
    def empty(self, shape, dtype):
        """An uninitialised device array from the pool.

        The block comes from `_malloc` directly and the array is made on it:
        `cupy.empty` would find the same allocator through CuPy's allocator
        hook, which costs about a microsecond of every eager operation. During
        a CUDA-graph capture the capture's own allocator is in force (graphs.py
        sets it), so CuPy's path is taken there.
        """
        if self.capture_refs is not None or type(shape) is not tuple:
            return self._cp.empty(shape, dtype)
        spec = self._specs.get((shape, dtype))
        if spec is None:
            nbytes = nbytes_of(shape, dtype)
            if not nbytes or len(self._specs) >= 4096:     # (an empty array; or past the kept shapes)
                return self._cp.empty(shape, dtype)
            spec = self._specs[(shape, dtype)] = (nbytes, np.dtype(dtype))
        return self._ndarray(shape, spec[1], self._malloc(spec[0]))

    def host_empty(self, shape, dtype):
        """An uninitialised numpy array in pinned host memory (for asynchronous copies)."""
        shape = as_shape(shape)
        nbytes = nbytes_of(shape, dtype)
        if nbytes == 0:
            return np.empty(shape, dtype)
        mem = self._cp.cuda.alloc_pinned_memory(nbytes)
        return np.ndarray(shape, dtype, mem)

    def unified_empty(self, shape, dtype):
        """An uninitialised device array in CUDA managed (unified) memory.

        Refused when the device has less free memory than asked: unified memory
        could oversubscribe the device, and paging it would be silent and slow.
        """
        shape = as_shape(shape)
        nbytes = nbytes_of(shape, dtype)
        if nbytes == 0:
            return self._cp.empty(shape, dtype)
        self._file_unified()
        free, _ = self._cp.cuda.runtime.memGetInfo()
        if nbytes > free:
            released = self.release_cached()
            free, _ = self._cp.cuda.runtime.memGetInfo()
            if nbytes > free:
                raise OutOfMemoryError(
                    f"allocating {nbytes:,} bytes of CUDA managed memory ('cuda_managed') would exceed the "
                    f"{free:,} bytes free on this worker's device (after releasing {released:,} cached bytes)")
        mem = self._cp.cuda.malloc_managed(nbytes)
        self.unified += nbytes
        self.new_allocs += 1
        arr = self._cp.ndarray(shape, dtype, memptr=mem)
        # CuPy's MemoryPointer takes no weak reference: watch the allocation it
        # points into (or, failing that, the array) to learn when it is freed
        for owner in (getattr(mem, "mem", None), arr):
            try:
                weakref.finalize(owner, self._unified_freed.append, nbytes)
                break
            except TypeError:
                continue
        return arr

    def _file_unified(self):
        while self._unified_freed:
            self.unified -= self._unified_freed.pop()

    # ---- control ------------------------------------------------------------
    def release_cached(self):
        """Give the free blocks of both pools back to the driver; returns the device bytes released."""
        self._prune_retired()
        before = self.device.total_bytes()
        self.device.free_all_blocks()
        self.pinned.free_all_blocks()
        self.footprint = self.device.total_bytes()
        return before - self.footprint

    def set_limit(self, nbytes):
        """Cap the device bytes in use (None: no cap); cached blocks beyond it go back to the driver."""
        self.limit = nbytes
        if nbytes is not None and self.device.total_bytes() > nbytes:
            self.release_cached()

    def block_bytes(self, nbytes):
        return -(-nbytes // self._UNIT) * self._UNIT

    def keep_for_capture(self, obj):
        """Keep `obj` (a buffer the current capture reads or writes but did not allocate, such as a
        shared workspace) alive as long as the graph being captured; nothing outside a capture."""
        if self.capture_refs is not None:
            self.capture_refs.append(obj)

    def hold_graph_pool(self, owner, mem_pool, peak):
        """Count `mem_pool` (a captured graph's own pool: its buffers, held while the graph lives) in
        stats()['graphs'], and `peak` (the most bytes its buffers held at once) in 'graphs_peak',
        until `owner` is collected; the pool itself lives on while any of its blocks is in use."""
        self._prune_retired()
        key = id(owner)
        self.graph_pools[key] = mem_pool
        self.graph_peaks[key] = peak
        weakref.finalize(owner, self._drop_graph_pool, key)

    def _drop_graph_pool(self, key):
        # (called when the graph's owner is collected) CuPy's pooled memory holds its pool by a weak
        # reference: a pool dropped while arrays still use its blocks (a graph's outputs left in the
        # handle table, a workspace kept for later captures) gives their memory back to the device
        # under them, for the next allocation to take. The pool is kept until its blocks are all free
        pool = self.graph_pools.pop(key, None)
        self.graph_peaks.pop(key, None)
        if pool is not None:
            self.retired_pools.append(pool)

    def _prune_retired(self):
        """Give the free blocks of gone graphs' pools back to the device; drop the pools none of whose
        blocks is in use any more."""
        kept = []
        for pool in self.retired_pools:
            pool.free_all_blocks()
            if pool.used_bytes():
                kept.append(pool)
        self.retired_pools = kept

    def stats(self):
        self._file_unified()
        return {"in_use": self.device.used_bytes(), "cached": self.device.free_bytes(),
                "high_water": self.high_water, "peak_in_use": self.peak_in_use, "new_allocs": self.new_allocs,
                "reused_allocs": self.reused_allocs, "limit": self.limit,
                "pinned_free_blocks": self.pinned.n_free_blocks(), "unified": self.unified,
                "graphs": sum(p.total_bytes() for p in self.graph_pools.values()),
                "graphs_in_use": sum(p.used_bytes() for p in self.graph_pools.values()),
                "graphs_peak": sum(self.graph_peaks.values())}

    def reset_stats(self):
        self.new_allocs = self.reused_allocs = 0
        self.high_water = self.device.total_bytes()
        self.peak_in_use = self.device.used_bytes()


def create(be):
    """The pool for backend `be` (installing CuPy's allocators on a GPU backend)."""
    return CudaPool(be.xp) if be.is_gpu else HostPool()


_installed = [None, None]     # (backend, its pool)


def current():
    """The pool of the current backend, created (and on a GPU installed) on first use."""
    be = backend.current()
    if _installed[0] is not be:
        _installed[:] = [be, create(be)]
    return _installed[1]
