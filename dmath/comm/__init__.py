"""Communication: the world and its communicators, data collectives, traffic counters."""
from . import agreement, collectives, counters
from .world import World, Group, poll, wait, waitall, set_progress_hook, launched_by_mpi

__all__ = ["World", "Group", "poll", "wait", "waitall", "set_progress_hook", "launched_by_mpi",
           "agreement", "collectives", "counters"]
