"""The control channel: command frames broadcast from the master (rank 0) to every worker.

A frame is FRAME bytes; a longer message sends its first FRAME bytes and then
the rest in a second broadcast, whose length the first frame carries. A cached
command or a plan replay fits one frame. Small Python objects a worker owes
the master (statistics, failure reports) travel point to point.
"""
import time

import numpy as np

from . import agreement, counters
from .world import poll, wait

FRAME = 64
ERROR_TAG = 99
OBJECT_TAG = 98


class ControlChannel:
    """Broadcasts command messages (bytes) from the master; counts them on both sides."""

    def __init__(self, world):
        self.world = world
        self._frame = np.zeros(FRAME, dtype=np.uint8)
        self._out = bytearray(FRAME)     # the master's frame: reused (each broadcast completes before the next)
        self._out_spec = None            # [_out, MPI.BYTE], made at the first send
        self.seq = 0     # messages sent (master) or received (worker): both sides count alike

    def send(self, message, total_len):
        """Master: broadcast `message` (bytes whose bytes 8..12 hold its total length)."""
        counters.count_control(FRAME if total_len < FRAME else total_len)
        self.seq += 1
        if not self.world.is_mpi:
            return
        MPI = self.world.mpi_module
        head = self._out
        n = min(len(message), FRAME)
        head[:n] = message[:n]          # the frame's tail is never read: no need to clear it
        if self._out_spec is None:
            self._out_spec = [head, MPI.BYTE]
        wait(self.world.ctl.Ibcast(self._out_spec, root=0))
        if total_len > FRAME:
            rest = bytearray(message[FRAME:])
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
        self.seq += 1
        return message[:total]


def report_failure(world, rank, text, seq=None):
    """Worker: send a failure report to the master without waiting for it to be received.

    `seq`: None for a failure that ends the job; for an allocation refused in the
    command that was control message number `seq`, which the master may undo.
    """
    return world.err.isend((rank, text, seq), dest=0, tag=ERROR_TAG)


def pending_failure(world, source=None):
    """Master: a (rank, traceback, seq) failure report (from `source`, else any rank) if one has arrived,
    else None."""
    if not world.is_mpi:
        return None
    src = world.mpi_module.ANY_SOURCE if source is None else source
    # twice: MPICH's first probe may only make progress, matching a report that arrived while the
    # master ran the user's code on the second (a refusal found between commands can be undone)
    if world.err.Iprobe(source=src, tag=ERROR_TAG) or world.err.Iprobe(source=src, tag=ERROR_TAG):
        return world.err.recv(source=src, tag=ERROR_TAG)
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
    if world.rank != 0 and world.rank not in ranks:
        return None
    if agreement.state is not None:
        # in a careful command, as before a collective: nobody sends until every one can
        agreement.agree(tuple(sorted(set(ranks) | {0})))
    if world.rank != 0:
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


def gather_within(world, seconds):
    """Master: the objects every worker sends with `gather_objects`, waiting at most `seconds`.

    Returns one entry per rank (index 0, the master's, is None), None for a rank
    that has not answered in time. No progress hook runs: the caller is deciding
    what a failure means, and must see the workers' answers, not be interrupted.
    """
    out = [None] * world.size
    missing = set(range(1, world.size))
    deadline = time.monotonic() + seconds
    while missing and time.monotonic() < deadline:
        for r in sorted(missing):
            msg = world.err.improbe(source=r, tag=OBJECT_TAG)
            if msg is not None:
                out[r] = msg.recv()
                missing.discard(r)
        if missing:
            time.sleep(0.001)
    return out
