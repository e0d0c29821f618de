"""Statistics kernels: gather every worker's counters on the master, or reset them."""
from .. import memory
from ..comm import counters
from ..comm.control import gather_objects
from ..runtime import kernel
from ..runtime.core import clear_cprofile


@kernel("stats")
def _stats(call):
    call.result = gather_objects(call.world, call.rt.local_stats())
    return []


@kernel("reset_stats")
def _reset_stats(call):
    counters.reset()
    memory.reset_local_stats()
    call.rt.commands = 0
    call.rt.profile.clear()
    clear_cprofile()
    return []


@kernel("sync")
def _sync(call):
    """Every worker finishes its queued device work, then checks in with the master."""
    from ..comm.collectives import device_done
    device_done()
    gather_objects(call.world, None)
    return []
