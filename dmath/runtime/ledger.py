"""The master's account of the bytes each worker holds in live matrices, checked against the limit.

A worker cannot refuse an allocation on its own: the others may be waiting
for it in a collective, and a worker failure ends the job. So the master,
which creates every matrix, keeps per worker the bytes of the live matrices'
local pieces (sized as the pool sizes its blocks) and refuses, before
anything is sent, a command whose new matrices would take some worker past
`dmath.memory.set_limit`: an OutOfMemoryError, after which the runtime goes
on. Temporaries, communication buffers and replica copies are not in this
account; the pool on each worker enforces the limit on everything it holds.

Without a limit the cost per command is a dictionary lookup per signature
and one insertion per new matrix.
"""
import numpy as np

from .. import memory
from ..errors import OutOfMemoryError
from ..layout import distribution

_reporter = None


def set_refusal_reporter(fn):
    """`fn(rank)` -> text added to a refusal: the worker's own pool after releasing its cache.

    dmath.ops.storage registers it (it runs a command, which this layer cannot name).
    """
    global _reporter
    _reporter = fn


class Ledger:
    """Bytes of live matrices per worker (master side)."""

    def __init__(self, nworkers):
        self.nworkers = nworkers
        self.limit = None
        self.live = {}          # handle -> bytes per worker (a tuple)
        self.held = None        # bytes per worker, kept while a limit is set
        self._by_sig = {}       # signature id -> (bytes per worker of each new output, their sum)

    def worker_bytes(self, meta):
        """The bytes each worker's pool sets aside for a matrix of `meta`."""
        dist = distribution(meta.layout, meta.shape, self.nworkers)
        isz = np.dtype(meta.dtype).itemsize
        return tuple(sum(memory.block_bytes(p.shape[0] * p.shape[1] * isz) for p in dist.pieces[r])
                     for r in range(self.nworkers))

    def admit(self, op, sig_id, metas):
        """The per-worker bytes of each new matrix of a command; raises OutOfMemoryError past the limit."""
        entry = self._by_sig.get(sig_id) if sig_id is not None else None
        if entry is None:
            sizes = tuple(self.worker_bytes(m) for m in metas)
            need = tuple(sum(col) for col in zip(*sizes)) if sizes else (0,) * self.nworkers
            entry = (sizes, need)
            if sig_id is not None:
                self._by_sig[sig_id] = entry
        if self.limit is not None and metas:
            need = entry[1]
            for r in range(self.nworkers):
                if self.held[r] + need[r] > self.limit:
                    raise OutOfMemoryError(self._refusal(op, metas, r, need[r]))
        return entry[0]

    def _refusal(self, op, metas, rank, need):
        what = ", ".join(f"{m.shape} {m.dtype}" for m in metas)
        text = (f"{op}: the new matrix ({what}) needs {need:,} bytes on worker {rank}, which holds "
                f"{self.held[rank]:,} bytes of live matrices; its memory limit is {self.limit:,} bytes "
                f"(dmath.memory.set_limit). Nothing was allocated: delete matrices you no longer need "
                f"or raise the limit.")
        if _reporter is not None:
            text += " " + _reporter(rank)
        return text

    def add(self, handles, sizes):
        """New matrices `handles` hold `sizes` (from `admit`)."""
        live, held = self.live, self.held
        for h, s in zip(handles, sizes):
            live[h] = s
            if held is not None:
                for r, b in enumerate(s):
                    held[r] += b

    def release(self, handle):
        """The matrix is gone (or, `exempt`, lives outside the capped pool)."""
        s = self.live.pop(handle, None)
        if s is not None and self.held is not None:
            for r, b in enumerate(s):
                self.held[r] -= b

    exempt = release

    def set_limit(self, nbytes):
        self.limit = nbytes
        self.held = None if nbytes is None else self.per_worker()

    def per_worker(self):
        """Bytes of live matrices on each worker."""
        held = [0] * self.nworkers
        for s in self.live.values():
            for r, b in enumerate(s):
                held[r] += b
        return held
