"""Careful commands: host-side agreements that let every rank leave a command one of them cannot finish.

Why this exists, and why it is built this way rather than as an all-reduce
on each group's communicator, is told in `dmath/runtime/oom.py`; this module
is the mechanism. While a careful command runs, `state` is set (it is None
otherwise, and every hook below is one `if agreement.state is not None`):

- `agree(ranks)`: before a collective among world ranks `ranks` (after the
  collective has allocated every buffer it needs), each member sends every
  other member a FLAG and waits for theirs. A member that has left the
  command sends a NOTICE instead; receiving one in place of a member's flag
  makes this rank leave too (`PeerRefused`). A collective is therefore
  entered only when every member has its buffers and is committed to it.
- `track(requests)`: the requests of a non-blocking transfer started after
  an agreement. A rank that leaves completes them first (its peers, who
  agreed, complete theirs): a buffer goes back to the pool only when no
  transfer writes into it.
- `leave()`: this rank is out of the command (its allocation was refused,
  or a peer's NOTICE reached it): a NOTICE to every other rank, then its
  tracked transfers are completed. On the master it also waits until every
  worker has said it is out (END or NOTICE), so that the master's check
  that follows is answered at once.
- `finish()`: the end of the command on this rank. A worker sends END to the
  master; the master waits for every worker's END or NOTICE and raises
  `PeerRefused` on a NOTICE. The master therefore never returns from a
  careful command while a worker is still in it or has left it.

The messages are four int64 (command number, kind, group key, sequence) on
the world's `agree` communicator, point to point, one tag. MPI delivers the
messages of one sender on one communicator and tag in order, so the next
message a rank receives from a member is either that member's flag for this
very agreement, or its NOTICE (it sent nothing after it), or, from an
earlier command, one its receiver never read (it had left first): those are
skipped by their command number. The key and sequence number of a flag are
checked: a kernel that made two ranks agree on different collectives is a
bug, reported at once instead of a hang.

Agreements never touch the device and allocate nothing from the pool (the
messages are a few bytes of host memory), so they cannot be refused
themselves; on a GPU a collective is still only enqueued after its
agreement, never waited for.
"""
import zlib

import numpy as np

from ..errors import OutOfMemoryError, RuntimeStateError
from . import counters
from .world import waitall

#: the tag of every agreement message (on the world's own `agree` communicator)
TAG = 11
_FLAG, _NOTICE, _END = 1, 2, 3

#: the careful command in progress (a `_Careful`), or None
state = None

#: send requests still in flight, with the message each one reads (kept alive until done)
_outgoing = []


class PeerRefused(OutOfMemoryError):
    """A member of a collective of a careful command left it: this rank leaves the command too."""

    def __init__(self, ranks, where):
        self.ranks = tuple(ranks)
        who = ", ".join(map(str, self.ranks))
        super().__init__(f"worker(s) {who} left the command ({where}); this worker left it too")


class _Careful:
    """One careful command on this rank: its number, the agreements so far per group, live transfers."""
    __slots__ = ("world", "comm", "epoch", "seqs", "inflight", "out", "collected")

    def __init__(self, world, epoch):
        self.world, self.comm, self.epoch = world, world.agree, epoch
        self.seqs = {}          # group key -> agreements of that group in this command
        self.inflight = []      # requests of transfers started after an agreement
        self.out = set()        # ranks whose NOTICE this rank has read (they send nothing more)
        self.collected = False  # master: every worker's END or NOTICE has been read


_keys = {}


def _key(ranks):
    """A number naming the group `ranks` (a sorted tuple) in a flag: a check that both sides mean one group."""
    k = _keys.get(ranks)
    if k is None:
        k = _keys[ranks] = zlib.crc32(np.asarray(ranks, dtype=np.int64).tobytes())
    return k


def begin(world, epoch):
    """This rank starts careful command number `epoch` (the control message's number, alike on every rank)."""
    global state
    if not world.is_mpi:
        raise RuntimeStateError("careful commands need several ranks: there is nobody to agree with")
    state = _Careful(world, int(epoch))
    counters.counters["careful_commands"] += 1


def end():
    """The careful command is over on this rank, however it ended."""
    global state
    state = None
    # sends complete as soon as MPI has buffered them (small messages): drop those that have
    _outgoing[:] = [(q, m) for q, m in _outgoing if not q.Test()]


def _send(s, kind, dests, key=0, seq=0):
    msg = np.array([s.epoch, kind, key, seq], dtype=np.int64)
    comm = s.comm
    for r in dests:
        _outgoing.append((comm.Isend(msg, dest=r, tag=TAG), msg))


def _receive(s, sources):
    """The next message of this command from each rank of `sources` (those of earlier commands skipped)."""
    bufs = {r: np.empty(4, dtype=np.int64) for r in sources}
    todo = list(sources)
    comm, epoch = s.comm, s.epoch
    while todo:
        waitall([comm.Irecv(bufs[r], source=r, tag=TAG) for r in todo])
        for r in todo:
            if bufs[r][0] > epoch:
                raise RuntimeStateError(f"rank {r} sent an agreement of command {int(bufs[r][0])} during "
                                        f"command {epoch}")
        todo = [r for r in todo if bufs[r][0] < epoch]
    return bufs


def agree(ranks):
    """Wait until every other member of `ranks` (sorted world ranks, this one among them) is ready for
    the collective this rank is about to enter; raises PeerRefused when one of them has left."""
    s = state
    me = s.world.rank
    others = [r for r in ranks if r != me]
    if not others:
        return
    key = _key(tuple(ranks))
    seq = s.seqs.get(key, 0) + 1
    s.seqs[key] = seq
    counters.counters["agreements"] += 1
    _send(s, _FLAG, others, key, seq)
    got = _receive(s, [r for r in others if r not in s.out])
    for r, m in got.items():
        if m[1] == _NOTICE:
            s.out.add(r)
        elif m[1] != _FLAG or m[2] != key or m[3] != seq:
            raise RuntimeStateError(
                f"rank {r} is at another collective than rank {me} (group {ranks}, agreement {seq}): "
                f"a kernel runs its collectives in different orders on different ranks")
    left = [r for r in others if r in s.out]
    if left:
        raise PeerRefused(left, f"before a collective among workers {', '.join(map(str, ranks))}")


def track(requests):
    """Requests of a transfer started after an agreement: completed by `leave` should this rank leave."""
    state.inflight.extend(requests)


def leave():
    """This rank leaves the careful command: tell every other rank, complete the transfers it started;
    on the master, wait until every worker is out of the command too. No-op outside a careful command."""
    global state
    s = state
    if s is None:
        return
    world = s.world
    _send(s, _NOTICE, [r for r in range(world.size) if r != world.rank])
    # its peers agreed to these transfers and complete them: so must this rank before the buffers go
    waitall(s.inflight)
    s.inflight = []
    if world.rank == 0 and not s.collected:
        _collect(s, flags_expected=True)
    state = None


def finish():
    """The end of the careful command on this rank: a worker tells the master; the master waits for every
    worker and raises PeerRefused when one of them left the command."""
    s = state
    world = s.world
    if world.rank != 0:
        _send(s, _END, (0,))
        return
    left = _collect(s, flags_expected=False)
    if left:
        raise PeerRefused(left, "before its end")


def _collect(s, flags_expected):
    """Master: read every worker's END or NOTICE; returns the workers that left.

    flags_expected: the master left the command early, so workers may have sent it flags
    for agreements it never reached (skipped); otherwise a flag here is a kernel's bug.
    """
    todo = [r for r in range(1, s.world.size) if r not in s.out]
    while todo:
        got = _receive(s, todo)
        nxt = []
        for r in todo:
            kind = got[r][1]
            if kind == _NOTICE:
                s.out.add(r)
            elif kind == _FLAG:
                if not flags_expected:
                    raise RuntimeStateError(f"worker {r} is at a collective with the master, which has "
                                            f"finished the command: a kernel's collectives differ by rank")
                nxt.append(r)
        todo = nxt
    s.collected = True
    return sorted(s.out)
