"""The 1D block-cyclic column geometry and the panel pipeline every factorization here runs on.

The factorizations work on a matrix in `BlockCyclic(block=(nb, nb), grid=(1,
P))`: column block t lives on worker t mod P, every worker holds all rows of
its column blocks, stored as one local array in global order (ScaLAPACK's
local layout on a 1 x P grid). Why 1D: the panel of a right-looking
factorization is then whole on one worker (LU's pivot search and the
Householder panel need no communication), row swaps are local, and one
broadcast per panel is all the communication; a 2D grid would move less at
large P (sqrt(P) less panel traffic) but at the 1 to 8 workers of one node
the panel broadcast is a small part of the trailing update.

`Pipeline` runs a sequence of panel broadcasts with look-ahead: the receive
of panel t + 1 is posted before panel t is applied, and the owner of panel
t + 1 updates that panel first, factors it and starts its broadcast before
its other trailing updates (on a GPU the broadcast runs on the side stream,
`collectives.bcast_start`, while the compute stream does the update).
"""
from .. import backend, memory
from ..comm import collectives
from ..layout import BlockCyclic


def work_layout(nb, P):
    """The layout the factorizations run in: 1D block-cyclic columns of width nb over all workers."""
    return BlockCyclic(block=(nb, nb), grid=(1, P), group=tuple(range(P)))


class Columns:
    """Where the column blocks of an n-column matrix in `work_layout(nb, P)` are, seen from `rank`."""

    def __init__(self, n, nb, P, rank):
        self.n, self.nb, self.P, self.rank = n, nb, P, rank
        self.blocks = (n + nb - 1) // nb

    def owner(self, t):
        return t % self.P

    def span(self, t):
        """Global columns [c0, c1) of block t."""
        return t * self.nb, min(self.n, (t + 1) * self.nb)

    def local(self, t):
        """Local columns [l0, l1) of block t on its owner."""
        c0, c1 = self.span(t)
        lo = (t // self.P) * self.nb
        return lo, lo + c1 - c0

    def mine(self, start=0):
        """My blocks t >= start, in order."""
        first = start + ((self.rank - start) % self.P)
        return list(range(first, self.blocks, self.P))

    def local_from(self, t):
        """The first local column of my blocks at or after block t."""
        m = self.mine(t)
        return self.local(m[0])[0] if m else self.local_end()

    def ranges(self, blocks):
        """The local column ranges [(l0, l1)] of my `blocks` (increasing), adjacent ones merged: a
        worker's trailing blocks are one range, updated by one product."""
        out = []
        for t in blocks:
            l0, l1 = self.local(t)
            if out and out[-1][1] == l0:
                out[-1] = (out[-1][0], l1)
            else:
                out.append((l0, l1))
        return out

    def local_end(self):
        m = self.mine(0)
        return self.local(m[-1])[1] if m else 0


class Pipeline:
    """Broadcasts of panels 0, 1, ... (in that order on every worker) with look-ahead.

    fill(t, buf): the owner's panel t into buf (its own work: factor the
    panel); shape(t): the buffer's shape. `get(t)` returns panel t's buffer
    once it has arrived; `start(t)` posts it (the owner fills it first).
    Every worker starts the panels in increasing order, which is the order
    MPI and NCCL match collectives in.
    """

    def __init__(self, group, cols, shape, dtype, fill):
        self.group, self.cols, self.shape, self.dtype, self.fill = group, cols, shape, dtype, fill
        self.pending = {}
        self.started = 0

    def start(self, t):
        """Post panel t's broadcast (filled first on its owner); every earlier panel is posted."""
        while self.started <= t:
            s = self.started
            buf = memory.empty(self.shape(s), self.dtype)
            owner = self.cols.owner(s)
            if owner == self.group.rank:
                self.fill(s, buf)
            # the side stream sees only the compute work queued before side_begin (the fill)
            collectives.side_begin()
            self.pending[s] = (buf, collectives.bcast_start(self.group, buf.reshape(-1), owner))
            self.started += 1

    def get(self, t):
        """Panel t's buffer once it has arrived (posted now if it was not)."""
        self.start(t)
        buf, pend = self.pending.pop(t)
        pend.wait()
        return buf


def group_of(call):
    """The collective group of every worker."""
    return call.world.group(tuple(range(call.world.size)))


def xp():
    return backend.current().xp
