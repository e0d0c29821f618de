"""The control channel: command frames broadcast from the master (rank 0) to every worker.

A frame is FRAME bytes; a longer message sends its first FRAME bytes and then
the rest in a second broadcast, whose length the first frame carries. A cached
command or a plan replay fits one frame. Small Python objects a worker owes
the master (statistics, failure reports) travel point to point.
"""
import numpy as np

from . import counters
from .world import poll, wait

FRAME = 64
ERROR_TAG = 99
OBJECT_TAG = 98


class ControlChannel:
    """Broadcasts command messages (bytes) from the master; counts them on both sides."""

    def __init__(self, world):
        self.world = world
        self._frame = np.zeros(FRAME, dtype=np.uint8)

    def send(self, message, total_len):
        """Master: broadcast `message` (bytes whose bytes 8..12 hold its total length)."""
        counters.count_control(max(FRAME, total_len))
        if not self.world.is_mpi:
            return
        MPI = self.world.mpi_module
        head = np.frombuffer(message[:FRAME].ljust(FRAME, b"\0"), dtype=np.uint8).copy()
        wait(self.world.ctl.Ibcast([head, MPI.BYTE], root=0))
        if total_len > FRAME:
            rest = np.frombuffer(message[FRAME:], dtype=np.uint8).copy()
            wait(self.world.ctl.Ibcast([rest, MPI.BYTE], root=0))

    def recv(self, total_len_of):
        """Worker: wait for the next message; `total_len_of(frame)` reads its length."""
        MPI = self.world.mpi_module
        wait(self.world.ctl.Ibcast([self._frame, MPI.BYTE], root=0))
        total = total_len_of(self._frame)
        message = self._frame.tobytes()
        if total > FRAME:
            rest = np.empty(total - FRAME, dtype=np.uint8)
            wait(self.world.ctl.Ibcast([rest, MPI.BYTE], root=0))
            message += rest.tobytes()
        counters.count_control(max(FRAME, total))
        return message[:total]


def report_failure(world, rank, text):
    """Worker: send a failure report to the master without waiting for it to be received."""
    return world.err.isend((rank, text), dest=0, tag=ERROR_TAG)


def pending_failure(world):
    """Master: a (rank, traceback) failure report if one has arrived, else None."""
    if world.is_mpi and world.err.Iprobe(source=world.mpi_module.ANY_SOURCE, tag=ERROR_TAG):
        return world.err.recv(source=world.mpi_module.ANY_SOURCE, tag=ERROR_TAG)
    return None


def gather_objects(world, obj, ranks=None):
    """Gather one small Python object per rank on the master (in memory only; never read from disk).

    ranks: the ranks that take part (ascending; None: every rank); the others
    return at once, so reading a value held by a group waits for that group
    only. Returns the list (in `ranks` order) on the master, None elsewhere.
    """
    if ranks is None:
        ranks = range(world.size)
    if not world.is_mpi:
        return [obj]
    if world.rank != 0:
        if world.rank not in ranks:
            return None
        req = world.err.isend(obj, dest=0, tag=OBJECT_TAG)
        poll(lambda: req.test()[0])
        return None
    out = [obj] if 0 in ranks else []
    for r in ranks:
        if r == 0:
            continue
        box = {}

        def done(r=r, box=box):
            # a matched probe, then a receive of exactly the message's size: an object of any
            # size arrives whole (a receive posted first gets a fixed-size buffer and truncates)
            msg = world.err.improbe(source=r, tag=OBJECT_TAG)
            if msg is None:
                return False
            box["v"] = msg.recv()
            return True
        poll(done)
        out.append(box["v"])
    return out
