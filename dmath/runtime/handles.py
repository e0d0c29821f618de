"""Handle numbers: the master numbers new matrices and releases them, and hands numbers out again
after the int32 range has been used up once.

The master numbers new matrices 1, 2, 3, ... and the numbers travel as
int32 (protocol.py). Once HANDLE_MAX has been handed out, `_free_run` scans
for the numbers nothing uses (`_handles_in_use`) and hands those out, run by
run, lowest first; when they are used up it scans again. A number is in use
while a Matrix holds it, while its free has not left the master (pending, or
in a queued command: so a worker has always run the free, in an earlier
message, before it sees the number again), and while a recorded plan (or the
block being recorded) names it: a replay makes and frees the plan's
temporaries, and writes its outputs, under the recorded numbers.
"""
import weakref
from threading import get_ident as _get_ident

from ..errors import RuntimeStateError
from . import protocol


def _runs_outside(used, last):
    """The runs (start, stop) of the numbers 1..last not in `used`, lowest first (a generator)."""
    start = 1
    for h in sorted(h for h in used if 0 < h <= last):
        if h > start:
            yield start, h
        start = h + 1
    if start <= last:
        yield start, last + 1


class Handles:
    """The Runtime's handle numbering, releases and plan watchers (master side)."""

    def new_handles(self, n):
        """n consecutive free handle numbers for new matrices (master)."""
        first = self.next_handle
        if first + n > self.handle_end:
            first = self._free_run(n)
        self.next_handle = first + n
        return list(range(first, first + n))

    def _free_run(self, n):
        """Master: the first of n consecutive handle numbers that may be handed out, once those up to
        HANDLE_MAX have all been (cold: after 2**31 matrices). See "Handle numbers" in the module's doc.

        Sets next_handle's run: the caller takes n numbers from the returned one, the hot path then
        goes on up to `handle_end`. A run shorter than n is skipped (found again by the next scan).
        """
        for _ in range(2):
            if self._free_runs is None:
                self._free_runs = _runs_outside(self._handles_in_use(), protocol.HANDLE_MAX)
            for start, stop in self._free_runs:
                if stop - start >= n:
                    self.handle_end = stop
                    return start
            self._free_runs = None          # every run found by the last scan is used: scan again
        raise RuntimeStateError(f"no {n} consecutive handle numbers are free: more than "
                                f"{protocol.HANDLE_MAX:,} matrices are live or held by recorded plans")

    def _handles_in_use(self):
        """Master: every handle number that must not go to a new matrix now: those of live matrices
        (each charged to the ledger when made), of matrices undone but still held (poisoned), of
        released ones whose free has not been sent (pending, or in a queued command: a number is
        reused only after its free reached the workers in an earlier frame), and every number a
        defined plan, or the one being recorded, names (a replay makes and frees its temporaries
        and dropped outputs again under those numbers)."""
        used = set(self.ledger.live)
        used.update(self.table)
        used.update(self.poisoned)
        used.update(h for h in self.pending_frees if h > 0)
        for message in self.queue:
            used.update(protocol.decode(message)[4])
        steps = [step for r in self.programs.values() for step in r.program.steps]
        for r in self.programs.values():
            used.update(r.program.tail)
        if self.recorder is not None:
            steps.extend(self.recorder.steps)
            used.update(self.recorder.inputs)
        for step in steps:
            used.update(step.handles)
            used.update(step.frees)
        return used

    def release(self, handle):
        """Called when a master-side Matrix is collected; freed with the next command.

        A Matrix may be collected in another thread (the cyclic garbage collector runs in whichever
        thread's allocation triggers it, a data loader's included): its number is then handed over
        (a deque's append is atomic) and released by the owner thread before its next command, so
        that the frees, the ledger and the plans' watchers are only ever changed by one thread."""
        if _get_ident() != self.owner:
            self.released_elsewhere.append(handle)
            return
        self.pending_frees.append(handle)
        if self.recorder is not None:
            self.recorder.releasing(handle, self.ledger.live)
        self.ledger.release(handle)
        self.replicas.written(handle)
        if self.poisoned:
            self.poisoned.discard(handle)
        plans = self.watchers.pop(handle, None) if self.watchers else None
        if plans:
            for plan in list(plans):
                plan.handle_released(handle)

    def watch(self, handle, plan):
        """Have `plan.handle_released(handle)` called when `handle` is released (weakly held)."""
        self.watchers.setdefault(handle, weakref.WeakSet()).add(plan)

    def unwatch(self, handle, plan):
        plans = self.watchers.get(handle)
        if plans is not None:
            plans.discard(plan)
            if not plans:
                del self.watchers[handle]

    def _take_frees(self):
        frees = self.pending_frees
        if len(frees) <= protocol.MAX_FREES:        # the usual case: all of them, no slicing
            self.pending_frees = []
            return frees
        self.pending_frees = frees[protocol.MAX_FREES:]
        return frees[:protocol.MAX_FREES]

    def drop_plan(self, plan_id):
        """Forget plan `plan_id` on every rank, with the next command (safe from a finalizer, in any
        thread: see `release`)."""
        if _get_ident() != self.owner:
            self.released_elsewhere.append(-plan_id)
            return
        self.pending_frees.append(-plan_id)

    def _take_released_elsewhere(self):
        """Owner thread: release what other threads' finalizers handed over (see `release`)."""
        handed = self.released_elsewhere
        while handed:
            h = handed.popleft()
            if h < 0:
                self.pending_frees.append(h)        # a plan dropped
            else:
                self.release(h)
