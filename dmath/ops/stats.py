"""Statistics and synchronisation: every worker's counters gathered on the master, reset, sync
(`dmath.stats`, `dmath.reset_stats`, `dmath.synchronize`: master halves and kernels)."""
from .. import memory
from ..comm import counters
from ..comm.control import gather_objects
from ..runtime import define
from ..runtime.profiler import clear_cprofile
from .base import dispatch
from .storage import not_recorded

STATS = define("stats")
RESET_STATS = define("reset_stats")
SYNC = define("sync")


def stats():
    """Per-worker counters since init or the last reset_stats(), a list indexed by rank."""
    not_recorded("dmath.stats()")
    return dispatch("stats")[1]


def synchronize():
    """Wait until every worker has run the commands sent so far and finished the work they queued
    on its current (compute) stream (for timing).

    Work on the side stream and non-blocking transfers are not waited for: a background
    replication (`Matrix.replicate(wait=False)`: NCCL on the GPU's side stream, MPI Ibcast on the
    CPU) or a background sum (`Matrix.remap(..., background=True)`) may still be in flight when
    this returns; each completes when its result is first used.
    """
    dispatch("sync")


def reset_stats():
    """Zero every worker's counters."""
    not_recorded("dmath.reset_stats()")
    dispatch("reset_stats")


@STATS.kernel()
def _stats(call):
    call.result = gather_objects(call.world, call.rt.local_stats())
    return []


@RESET_STATS.kernel()
def _reset_stats(call):
    counters.reset()
    memory.reset_local_stats()
    call.rt.commands = 0
    call.rt.profile.clear()
    clear_cprofile()
    return []


@SYNC.kernel()
def _sync(call):
    """Every worker finishes its queued device work, then checks in with the master."""
    from ..comm.collectives import device_done
    device_done()
    gather_objects(call.world, None)
    return []
