"""The master's account of the bytes each worker holds in live matrices, checked before dispatch.

A worker cannot refuse an allocation on its own: the others may be waiting
for it in a collective, and a worker failure ends the job. So the master,
which creates every matrix, keeps per worker the bytes of the live matrices'
local pieces (sized as the pool sizes its blocks) and refuses, before
anything is sent, a command whose new matrices would not fit on some worker:
an OutOfMemoryError, after which the runtime goes on. "Fit" means within the
worker's capacity, the memory its kernels compute in as `dmath.init` measured
it (free device memory on a GPU, the worker's share of the host's available
memory on the CPU backend), and within `dmath.memory.set_limit` when one is
set. A plan replay makes its block's temporaries again without a command for
each: `admit_transient` checks, before the replay is sent, that what the
block's own allocations held at once while it was recorded (measured by every
worker's pool, runtime/plans.py) fits beside the live matrices. A kernel's own temporaries, communication
buffers and replica copies are not in this account; the pool on each worker
enforces the limit on everything it holds.

The cost per command is a dictionary lookup per signature and, per new
matrix, one insertion and an addition per worker. The check itself is one
comparison: `room` is a lower bound of the smallest headroom (ceiling minus
held bytes) over the workers, lowered by each new matrix's largest share and
made exact only when a command's largest need passes it (a freed matrix
never lowers the headroom), so far from the ceilings no worker is looked at.

The ledger also says when a command must be careful (runtime/oom.py): when
some worker's live matrices, the command's new ones included, pass
CAREFUL_FRACTION of its ceiling. It keeps `low`, a lower bound of the
smallest headroom (mark minus held bytes) over the workers: a new matrix
lowers it by its largest share (`Shares.most`, worked out once per
signature), and whenever it is below zero it is made exact again, after a
new matrix or a freed one. Below zero after that, some worker is past its
mark. So the decision per command is one attribute read, and far from the
marks the bookkeeping is a subtraction per new matrix and a comparison per
freed one (per-worker counting in the update loops, or a `max` and a `min`
of each matrix's shares, would cost the eager path on every operation).
"""

import numpy as np

from .. import memory
from ..errors import OutOfMemoryError
from ..layout import distribution

#: a command is careful when some worker's live matrices, with the command's new ones, exceed this
#: fraction of its ceiling (capacity or limit). The temporaries of a remap or a GEMM (pack buffers,
#: panels) are about as large as the local pieces of its operands and result, so past half of the
#: ceiling a command's temporaries may no longer fit beside the matrices; below it they do unless
#: one command's temporaries are larger than all the live matrices together
CAREFUL_FRACTION = 0.5


_reporter = None


class Shares(tuple):
    """A matrix's bytes on each worker (a tuple), with the largest of them, `most`."""

    def __new__(cls, values):
        self = super().__new__(cls, values)
        self.most = max(self) if self else 0
        return self


def set_refusal_reporter(fn):
    """`fn(rank)` -> text added to a refusal: the worker's own pool after releasing its cache.

    dmath.ops.storage registers it (it runs a command, which this layer cannot name).
    """
    global _reporter
    _reporter = fn


class Ledger:
    """Bytes of live matrices per worker (master side), against each worker's capacity and the limit."""

    def __init__(self, nworkers, careful="auto"):
        self.nworkers = nworkers
        self.limit = None
        self.capacity = None    # bytes per worker the kernels' memory had at init (None: not measured)
        self.host_capacity = None   # each worker's share of host memory at init
        self.ceiling = None     # per worker: the smaller of capacity and limit (None: no check)
        self.live = {}          # handle -> bytes per worker (a tuple)
        self.held = [0] * nworkers   # bytes of live matrices per worker
        self._by_sig = {}       # signature id -> (bytes per worker of each new output, their sum)
        self.careful = memory.check_careful(careful, "the careful mode")
        self.pressure = None    # per worker: the held bytes past which commands are careful (None: no marks)
        self.low = float("inf")  # a lower bound of min(mark - held); exact whenever it is below zero
        self.room = float("inf")  # a lower bound of min(ceiling - held) (no ceiling: infinite)
        self.nothing = Shares((0,) * nworkers)   # the shares of a matrix outside the pools
        self._set_pressure()

    def worker_bytes(self, meta):
        """The bytes each worker's pool sets aside for a matrix of `meta`."""
        dist = distribution(meta.layout, meta.shape, self.nworkers)
        isz = np.dtype(meta.dtype).itemsize
        return Shares(sum(memory.block_bytes(p.shape[0] * p.shape[1] * isz) for p in dist.pieces[r])
                      for r in range(self.nworkers))

    def set_capacity(self, per_worker):
        """`per_worker`: (compute, host) bytes from every worker's `memory.capacity`, gathered at init."""
        self.capacity = [c for c, _ in per_worker]
        self.host_capacity = [h for _, h in per_worker]
        self._set_ceiling()

    def _set_ceiling(self):
        caps = self.capacity or [None] * self.nworkers
        self.ceiling = None if self.capacity is None and self.limit is None else [
            min(v for v in (c, self.limit) if v is not None) for c in caps]
        self._set_room()
        self._set_pressure()

    def _set_room(self):
        """`room` made exact."""
        self.room = float("inf") if self.ceiling is None else min(c - h for c, h in zip(self.ceiling, self.held))

    def set_careful(self, mode):
        """When commands are careful: 'auto', 'always' or 'never' (see memory.set_careful)."""
        self.careful = memory.check_careful(mode, "dmath.memory.set_careful")
        self._set_pressure()

    def _set_pressure(self):
        self.pressure = None
        if self.nworkers == 1 or self.careful == "never":
            self.low = float("inf")     # (alone, no worker can wait for another)
        elif self.careful == "always":
            self.low = float("-inf")    # stays there: no marks to update it against
        elif self.ceiling is None:
            self.low = float("inf")
        else:
            self.pressure = [CAREFUL_FRACTION * c for c in self.ceiling]
            self._tighten()

    def _tighten(self):
        """`low` made exact: the smallest headroom of any worker below its mark (without marks, 'never'
        or 'always', it stays at its infinity)."""
        if self.pressure is not None:
            self.low = min(m - h for m, h in zip(self.pressure, self.held))

    def pressed(self):
        """Whether commands are careful now: some worker's live matrices are past its mark (or 'always')."""
        return self.low < 0

    def forget(self, sig_id):
        """Drop what admit kept for a signature the master dropped."""
        self._by_sig.pop(sig_id, None)

    def admit(self, op, sig_id, metas):
        """The per-worker bytes of each new matrix of a command; raises OutOfMemoryError if one does not fit."""
        entry = self._by_sig.get(sig_id)      # (None, a signature not yet registered, is never a key)
        if entry is None:
            sizes = tuple(self.worker_bytes(m) for m in metas)
            need = tuple(sum(col) for col in zip(*sizes)) if sizes else (0,) * self.nworkers
            entry = (sizes, need, max(need))
            if sig_id is not None:
                self._by_sig[sig_id] = entry
        if entry[2] > self.room and metas:      # (else every worker has room: the bound says so)
            ceiling = self.ceiling
            held = self.held
            for r, n in enumerate(entry[1]):
                if held[r] + n > ceiling[r]:
                    raise OutOfMemoryError(self._refusal(op, metas, r, n))
            self._set_room()
        return entry[0]

    def fits(self, need, extra=0):
        """Whether `need` bytes per worker, and `extra` more on each, fit beside the live matrices."""
        if self.ceiling is None or max(need) + extra <= self.room:
            return True             # (far from the ceilings: no worker looked at)
        self._set_room()
        return all(h + n + extra <= c for h, n, c in zip(self.held, need, self.ceiling))

    def admit_transient(self, what, need, why=""):
        """Refuse (OutOfMemoryError) work that allocates `need` bytes per worker beside the live matrices
        and frees them again (a plan replay's temporaries, an in-place remap's scratch) when they would
        not fit on some worker; `why`: what the need is made of, for the message."""
        if self.fits(need):
            return
        r, n = next((r, n) for r, n in enumerate(need) if self.held[r] + n > self.ceiling[r])
        held = self.held[r]
        cap, fix = self._cap_and_fix(r)
        raise OutOfMemoryError(
            f"{what}: it needs {n:,} bytes at once on worker {r}{f' ({why})' if why else ''}, beside the "
            f"{held:,} bytes of live matrices it holds; {cap}, {held + n - self.ceiling[r]:,} bytes short. "
            f"Nothing was sent: {fix}.")

    def _cap_and_fix(self, rank):
        """(what bounds worker `rank`'s memory, what the user may do), for a refusal's text."""
        if self.limit is not None and self.limit == self.ceiling[rank]:
            return (f"its memory limit is {self.limit:,} bytes (dmath.memory.set_limit)",
                    "delete matrices you no longer need or raise the limit")
        return (f"the memory it computes in had {self.capacity[rank]:,} bytes for matrices when "
                f"dmath.init measured it",
                "delete matrices you no longer need, use more workers, or a layout that splits "
                "the matrix (RowBlock, Block2D) instead of replicating it")

    def _refusal(self, op, metas, rank, need):
        what = ", ".join(f"{m.shape} {m.dtype}" for m in metas)
        held = self.held[rank]
        by_limit = self.limit is not None and self.limit == self.ceiling[rank]
        cap, fix = self._cap_and_fix(rank)
        text = (f"{op}: the new matrix ({what}) needs {need:,} bytes on worker {rank}, which holds "
                f"{held:,} bytes of live matrices; {cap}. Nothing was allocated: {fix}.")
        if _reporter is not None and by_limit:
            text += " " + _reporter(rank)
        return text

    def check_host(self, meta, need):
        """Refuse a matrix in pinned host memory (a GPU's 'host' kind) larger than a worker's share."""
        if self.host_capacity is None:
            return
        for r, (n, cap) in enumerate(zip(need, self.host_capacity)):
            if n > cap:
                raise OutOfMemoryError(
                    f"memory='host': the {meta.shape} {meta.dtype} matrix needs {n:,} bytes of host memory "
                    f"on worker {r}, whose share of its machine's available memory was {cap:,} bytes at "
                    f"dmath.init. Nothing was allocated: split it over more workers or read it from a "
                    f"file (dmath.from_file(..., mapped=True))")

    def add(self, handles, sizes):
        """New matrices `handles` hold `sizes` (Shares, from `admit`)."""
        live, held = self.live, self.held
        for h, s in zip(handles, sizes):
            live[h] = s
            for r, b in enumerate(s):
                held[r] += b
            self.low -= s.most
            self.room -= s.most
        if self.low < 0:
            self._tighten()

    def release(self, handle):
        """The matrix is gone."""
        s = self.live.pop(handle, None)
        if s is not None:
            for r, b in enumerate(s):
                self.held[r] -= b
            if self.low < 0:
                self._tighten()     # (a release never lowers the headroom: `low` stays a bound otherwise)

    def set_limit(self, nbytes):
        self.limit = nbytes
        self._set_ceiling()

    def per_worker(self):
        """Bytes of live matrices on each worker."""
        return list(self.held)
