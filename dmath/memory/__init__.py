"""Worker-side memory: the pool every allocation goes through, memory kinds, statistics, the limit.

On a worker (rank 0 included) kernels allocate with `empty`, `zeros` and
`host_empty` (host staging buffers), which come from the process's pool
(`pool.py`): size-class free lists of host blocks on the CPU backend, CuPy's
device and pinned pools on a GPU. `kinds.py` holds the memory kinds.

The user-facing functions (`stats`, `set_limit`, `clear`) act on every
worker: they run as commands, through the hook that `dmath.ops.storage`
registers (so this layer never imports the ones above it). Before
`dmath.init()`, `stats` and `clear` act on this process alone.
"""
import numbers
import os

import numpy as np

from .. import backend
from ..comm import collectives
from ..errors import DMathError, RuntimeStateError
from . import kinds, pool, replicas
from .kinds import KINDS
from .pool import size_class

__all__ = ["stats", "peak", "set_limit", "limit", "set_careful", "careful", "check_careful", "CAREFUL_MODES",
           "clear", "available", "KINDS", "install", "empty", "zeros", "fill", "host_empty",
           "keep_for_capture", "local_stats", "reset_local_stats", "set_local_limit", "release_cached",
           "block_bytes", "size_class", "kinds", "replicas", "free_bytes", "capacity", "host_available"]


# ---- worker side: allocation ---------------------------------------------------
def install():
    """Create this process's pool for the current backend (dmath.init calls it after choosing one)."""
    pool.current()


def empty(shape, dtype):
    """An uninitialised array of the current backend (device memory on a GPU) from the pool."""
    return pool.current().empty(shape, dtype)


def zeros(shape, dtype):
    """A zero-filled array of the current backend from the pool."""
    a = pool.current().empty(shape, dtype)
    a.fill(0)
    return a


def fill(a, value):
    """a[...] = value (a an array or a view of either backend), keeping the sign of a zero: CuPy
    fills a contiguous array with a zero by a memset, so -0.0 came out +0.0 there (a Partial matrix's
    -0.0 addends, pad's -0.0 constants). There a negative zero is given its sign by a second pass
    (np.copysign reaches CuPy's kernel through __array_ufunc__); NumPy's fill keeps it in one."""
    a[...] = value
    if value == 0 and not isinstance(a, np.ndarray) and a.dtype.kind in "fc" and np.signbit(value):
        np.copysign(a, value, out=a)
    return a


def host_empty(shape, dtype):
    """An uninitialised numpy array from the pool for host staging (pinned memory on a GPU)."""
    return pool.current().host_empty(shape, dtype)


def keep_for_capture(obj):
    """Tie `obj`'s lifetime to the CUDA graph being captured, if one is (runtime/graphs.py)."""
    keep = getattr(pool.current(), "keep_for_capture", None)
    if keep is not None:
        keep(obj)


def capturing():
    """Whether a CUDA graph is being captured now (a kernel then bypasses host-side caches: what it
    looked up would be baked into the graph, stale at every later launch)."""
    return getattr(pool.current(), "capture_refs", None) is not None


def capture_lane():
    """During a CUDA-graph capture on several streams, the number of the stream the current step runs
    on (0: the capture stream, and outside such a capture): a library keeps one scratch buffer per
    stream there, since steps on different streams may run at once (runtime/streams.py)."""
    return getattr(pool.current(), "capture_lane", 0)


def block_bytes(nbytes):
    """Bytes the pool sets aside for a request of `nbytes` (the master's account uses it)."""
    return pool.current().block_bytes(nbytes)


# communication buffers inside the collectives come from the pool too
collectives.set_buffer_allocator(empty)


# ---- worker side: this process's pool -------------------------------------------
def local_stats():
    """This process's pool: in_use, cached, high_water (bytes), new_allocs, reused_allocs, limit."""
    return pool.current().stats()


def reset_local_stats():
    """Zero this process's allocation counts; the high-water mark restarts at the current footprint."""
    pool.current().reset_stats()


def set_local_limit(nbytes):
    """Cap this process's pool (None: no cap)."""
    pool.current().set_limit(None if nbytes is None else int(nbytes))


def local_limit():
    return pool.current().limit


def release_cached():
    """Give this process's cached free blocks back to the system; returns the bytes released."""
    return pool.current().release_cached()


def host_available():
    """Bytes of host memory the system could give this process now (Linux MemAvailable: free memory
    plus reclaimable caches; else free pages; 0 when nothing is known)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return 0


def free_bytes(ranks_on_host=1):
    """Bytes this worker's kernels could still allocate: free device memory (GPU) or its share of the
    available host memory (CPU: shared by the `ranks_on_host` ranks of this machine, as capacity()
    shares it), plus the pool's cached blocks, which it reuses first."""
    be = backend.current()
    if be.is_gpu:
        free, _ = be.xp.cuda.runtime.memGetInfo()
    else:
        free = host_available() // max(1, ranks_on_host)
    return int(free) + int(local_stats()["cached"])


def capacity(ranks_on_host):
    """(compute, host): the bytes this worker may hold in matrices, as dmath.init measures them.

    compute: the memory the kernels compute in (the device on a GPU, host memory on the CPU
    backend); host: host memory (pinned 'host' and 'managed' matrices on a GPU). Host memory is
    shared by the `ranks_on_host` ranks of this machine, so each is given its share.
    """
    host = host_available() // max(1, ranks_on_host)
    if backend.current().is_gpu:
        return free_bytes(), host
    return host, host


# ---- user side: every worker -------------------------------------------------------
_commands = None


def set_command_hook(commands):
    """dmath.ops.storage registers the object that runs the functions below on every worker."""
    global _commands
    _commands = commands


def _everywhere():
    return _commands is not None and _commands.active()


def stats():
    """Each worker's pool statistics, a list indexed by worker rank.

    Each entry: 'in_use' and 'cached' (bytes held for arrays and kept free for
    reuse), 'high_water' (the most bytes the pool has held at once, in use
    plus cached, since init or the last reset), 'new_allocs' and
    'reused_allocs' (allocations that took new memory or reused a cached
    block), 'limit', 'graphs' (device bytes held by the private pools of
    captured CUDA graphs: a replayed step's buffers, outside the pool above),
    on GPUs only (a CPU entry has neither key) 'graphs_in_use' (of those,
    the bytes of buffers the graphs' outputs hold between launches; the rest
    is their temporaries' reserved memory) and 'graphs_peak' (the most bytes
    the graphs' buffers held at once during their steps: the step's
    temporaries at their peak),
    and 'matrices' (the bytes of live matrices on that worker, as the master
    counts them against the limit).
    """
    if _everywhere():
        return _commands.stats()
    return [local_stats()]


def peak():
    """Each worker's peak memory since init or `dmath.reset_stats()`, a list indexed by worker rank of
    {'allocated': bytes, 'reserved': bytes}: device memory on GPUs (host memory on the CPU backend),
    as PyTorch's torch.cuda.max_memory_allocated and max_memory_reserved.

    allocated: the most bytes in use at once: the pool's own peak, or the bytes in use between
    steps plus the peak of the captured CUDA graphs' buffers inside their steps (a replayed step
    allocates from its graph's private pool), whichever is larger. reserved: what the device had
    to provide: the pool's high-water mark (in use plus cached) plus the graphs' private pools.
    """
    out = []
    for s in stats():
        in_graphs = s["in_use"] + s.get("graphs_peak", 0)
        out.append({"allocated": max(s.get("peak_in_use", s["in_use"]), in_graphs),
                    "reserved": s["high_water"] + s.get("graphs", 0)})
    return out


def set_limit(nbytes):
    """Cap the bytes each worker's pool may hold (None: no cap).

    A command that would take a worker's live matrices past the limit is
    refused on the master with OutOfMemoryError before anything is sent, and
    the runtime stays usable. A worker's pool also enforces the limit on its
    temporaries, buffers and replica copies, releasing its cached blocks
    first; a refusal there is undone on every worker and raised as
    OutOfMemoryError when every worker can be seen to be out of the command,
    which careful commands ensure (see set_careful), else it breaks the
    runtime (WorkerError, the job ends). The replica cache's budget becomes
    at most half the limit.
    """
    if nbytes is not None:
        if isinstance(nbytes, bool) or not isinstance(nbytes, numbers.Integral) or nbytes <= 0:
            raise DMathError(f"set_limit takes a positive number of bytes (an integer) or None for no "
                             f"limit, got {nbytes!r}")
        nbytes = int(nbytes)
    if not _everywhere():
        raise RuntimeStateError("dmath.memory.set_limit applies to every worker: call dmath.init() first")
    _commands.set_limit(nbytes)


def limit():
    """The memory limit in bytes per worker (None: none)."""
    return local_limit()


#: when commands are careful (see set_careful)
CAREFUL_MODES = ("auto", "always", "never")


def check_careful(mode, where):
    """`mode` if it is one of CAREFUL_MODES, else DMathError naming `where` (the function or setting)."""
    if not isinstance(mode, str) or mode not in CAREFUL_MODES:
        raise DMathError(f"{where} takes one of {', '.join(map(repr, CAREFUL_MODES))}, got {mode!r}")
    return mode


def set_careful(mode):
    """When a command runs careful, so that a worker refused an allocation inside it cannot break dmath.

    A worker's pool may refuse a kernel's temporaries while other workers are
    inside a collective of the same command, waiting for it. In a careful
    command every collective is agreed on first (a few host messages per
    collective, no device synchronisation), and the master waits for every
    worker at its end, so such a refusal is undone everywhere and raised as
    OutOfMemoryError with dmath still usable (dmath/runtime/oom.py).
    'auto' (the default, or DMATH_CAREFUL): when some worker's live matrices,
    with the command's new ones, pass half its memory capacity or limit;
    'always'; 'never' (then a refusal while other workers wait for the
    refused one in a collective breaks the runtime: WorkerError).
    In-place commands and plan replays are never careful. Acts on the master
    only: the choice travels with each command.
    """
    check_careful(mode, "dmath.memory.set_careful")
    if not _everywhere():
        raise RuntimeStateError("dmath.memory.set_careful applies to the running job: call dmath.init() first")
    _commands.set_careful(mode)


def careful():
    """The careful mode in force: 'auto', 'always' or 'never' (see set_careful)."""
    if not _everywhere():
        raise RuntimeStateError("dmath.memory.careful describes the running job: call dmath.init() first")
    return _commands.careful()


def available():
    """Bytes a new matrix could take on each worker, a list indexed by rank.

    The memory the kernels compute in (free device memory on a GPU, on the
    CPU backend the worker's share of the machine's free physical memory, as
    the master's account gives it) plus the pool's cached blocks, capped
    by the memory limit less the live matrices when a limit is set. A
    snapshot: other processes on the machine may take memory meanwhile.
    """
    if not _everywhere():
        raise RuntimeStateError("dmath.memory.available asks every worker: call dmath.init() first")
    return _commands.available()


def clear(graphs=True):
    """Give back, on every worker, what no matrix needs: cached free blocks, replica copies and the
    memory of captured CUDA graphs (a plan replayed later captures again; graphs=False keeps
    them). Matrices stay. Returns the bytes released per worker."""
    if _everywhere():
        return _commands.clear(bool(graphs))
    return [release_cached()]
