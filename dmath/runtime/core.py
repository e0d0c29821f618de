"""The master-worker runtime: command dispatch, handle table, metadata-ID cache, worker loop.

Rank 0 runs the user's program and is also worker 0: it validates a call,
broadcasts the command, then runs its own share. Ranks 1..P-1 run `serve`,
executing commands until the master shuts them down.

A command is (signature, handles, scalars). The signature (operation, static
arguments, input and output layouts, shapes and dtypes) is sent once and
registered on every rank under an integer ID, together with whatever the
kernel derives from it (remap plans, index arrays); afterwards only the ID,
the handle numbers and the dynamic scalars travel.

A recorded plan (plans.py) is a program of such commands stored on every rank
under a plan ID; a replay is one REPLAY frame and every rank runs the program
through the same entries (`_run_program`), or launches the CUDA graph it
captured of them (graphs.py).

Queued commands. A command whose kernel never communicates (its op declares
it local for the signature: registry.py) need not reach the workers before
the master runs its own share, so the master queues it instead of
broadcasting it, runs its share, and goes on; the queue travels in the next
message it sends (one BATCH: protocol.py), which every worker runs in order.
That message goes out before any command that is not queued (a collective, a
remap, a read to the master, a careful command, anything recorded or with a
payload: all wait for, or talk to, other ranks), any plan definition or
replay, the OOM check, and shutdown (followed there by a DRAIN, sent at
every shutdown: the master waits until every worker has run everything it
was sent, so a failure in the queue, or in the last command sent, ends the
job non-zero at once). The master never
enters a collective its peers have not been sent. The queue is also sent
when it holds BATCH_MAX commands (the one that fills it goes with them) or
when its first command has waited BATCH_AGE_S (checked at the next command:
how far the workers may lag behind the master), and a local command is
queued only when the master's own share of its signature last took at most
BATCH_SHARE_S (a costly kernel is sent at once so that the workers run it
beside the master, not after it). What this changes: a worker's failure in
a queued command reaches the master at its next wait (at the latest at the
next message sent), and a refused allocation there cannot be undone (the
master ran on past it; only the last message of a BATCH is "the last
command" of oom.py). Failure probes run only before a message is sent, not
before each queued command: nothing new has reached the workers meanwhile.

Handle numbers. The master numbers new matrices 1, 2, 3, ... and the
numbers travel as int32 (protocol.py). Once HANDLE_MAX has been handed out
(after 2**31 matrices: about half a day of an eager loop), `_free_run` scans for
the numbers nothing uses (`_handles_in_use`) and hands those out, run by
run, lowest first; when they are used up it scans again. A number is in use
while a Matrix holds it, while its free has not left the master (pending, or
in a queued command: so a worker has always run the free, in an earlier
message, before it sees the number again), and while a recorded plan (or
the block being recorded) names it: a replay makes and frees the plan's
temporaries, and writes its outputs, under the recorded numbers. Until the
first wrap the dispatch path pays one comparison for this; the scan costs a
pass over the live matrices and the plans, once per wrap.
"""
import atexit
import collections
import gc
import os
import sys
import threading
import time
import traceback
import weakref
from threading import get_ident as _get_ident
from time import perf_counter as _perf_counter

from .. import backend, memory, tuning
from ..comm import World, agreement, counters, set_progress_hook
from ..comm.heartbeat import Hang, Pinger, Responder
from ..comm.control import ControlChannel, gather_objects, pending_failure, report_failure
from ..errors import OutOfMemoryError, PlanError, RuntimeStateError, WorkerError
from ..layout import distribution
from ..memory import replicas
from . import oom, protocol
from .graphs import Replayer
from .ledger import Ledger, careful_mode_from_env
from .replica_ledger import ReplicaLedger, budget as replica_budget
from .registry import is_local, local_rule, lookup
from .shard import Meta

#: how long a failed worker waits for the master to end the job before ending it itself
FAILED_WORKER_GRACE_S = float(os.environ.get("DMATH_FAILED_WORKER_GRACE_S", "120"))
#: DMATH_PROFILE=1: every kernel is timed on its worker (the device synchronised before and after,
#: so kernels run one at a time and CUDA graphs are off); dmath.stats() reports it under 'profile'
PROFILE = os.environ.get("DMATH_PROFILE", "0") not in ("", "0")
#: DMATH_CPROFILE=PREFIX: every rank runs Python's profiler from init and writes PREFIX.<rank>.prof
#: (pstats format) when it ends: where the master's and the workers' dispatch time goes
CPROFILE = os.environ.get("DMATH_CPROFILE", "")
#: queued commands (see the module's doc): a message carries at most this many queued commands
#: (DMATH_BATCH_MAX=0 or 1: none are queued; unset: 16); BATCH_AGE_S: the longest the first one
#: waits (checked at the next command); BATCH_SHARE_S: a local command is queued only when the
#: master's own share of its signature last took at most this. Read on the master when it sends
#: (tests may set them).
BATCH_MAX = int(os.environ["DMATH_BATCH_MAX"]) if os.environ.get("DMATH_BATCH_MAX") else 16
BATCH_AGE_S = float(os.environ.get("DMATH_BATCH_AGE_US", "500")) * 1e-6
BATCH_SHARE_S = float(os.environ.get("DMATH_BATCH_SHARE_US", "50")) * 1e-6


def _timeout_s():
    """DMATH_TIMEOUT_S: seconds a worker may leave the master's pings unanswered (0: no limit)."""
    text = os.environ.get("DMATH_TIMEOUT_S", "120")
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value >= 0:
        raise RuntimeStateError(f"DMATH_TIMEOUT_S must be a number of seconds >= 0 (0: no limit), got {text!r}")
    return value


class Entry:
    """A registered signature, prepared on every rank; `cache` keeps what kernels derive from it.

    sig_id: its integer ID. new_outputs: the Metas of the matrices each
    command of it makes; in_place: the input indices it overwrites, in output
    order (both functions of the signature: the master works them out once,
    not on every command). local: its commands never communicate (registry.py),
    so the master may queue them; share_s: master, the seconds its own share of
    the last such command took (infinite until one has run, and for commands
    that are not local: never queued).
    """
    __slots__ = ("op", "static", "inputs", "outputs", "in_dists", "out_dists", "kernel", "capture_rule", "cache",
                 "sig_id", "new_outputs", "in_place", "doing", "local_rule", "local", "share_s")

    def __init__(self, signature, nworkers, sig_id=None):
        self.op, self.static, self.inputs, self.outputs = signature
        self.kernel, self.capture_rule = lookup(self.op, backend.current().name)
        self.in_dists = tuple(distribution(m.layout, m.shape, nworkers) for m in self.inputs)
        self.out_dists = tuple(distribution(m.layout, m.shape, nworkers) if isinstance(m, Meta) else None
                               for m in self.outputs)
        self.cache = {}
        self.sig_id = sig_id
        self.new_outputs = tuple(m for m in self.outputs if type(m) is Meta)
        self.in_place = tuple(m for m in self.outputs if type(m) is not Meta)
        self.doing = f"running {self.op!r}"      # a worker's activity while it runs a command of it
        self.local_rule = local_rule(self.op, backend.current().name)
        self.local = is_local(self)
        self.share_s = _NEVER


_NEVER = float("inf")


def _runs_outside(used, last):
    """The runs (start, stop) of the numbers 1..last not in `used`, lowest first (a generator)."""
    start = 1
    for h in sorted(h for h in used if 0 < h <= last):
        if h > start:
            yield start, h
        start = h + 1
    if start <= last:
        yield start, last + 1


class Call:
    """What a kernel sees: its entry, input shards (and their handles), dynamic scalars and the runtime.

    `handles` identify the inputs for the replica cache, whose keys are
    (handle, shard version, layout, dtype).
    """
    __slots__ = ("rt", "entry", "inputs", "handles", "scalars", "payload", "result")

    def __init__(self, rt, entry, inputs, scalars, payload, handles=()):
        self.rt, self.entry, self.inputs, self.scalars, self.payload = rt, entry, inputs, scalars, payload
        self.handles = handles
        self.result = None

    @property
    def rank(self):
        return self.rt.world.rank

    @property
    def world(self):
        return self.rt.world


class Runtime:
    """One per process; `runtime()` returns it after `init`."""

    def __init__(self, world, be, careful="auto"):
        self.world = world
        self.nworkers = world.size   # P (an attribute: read on every operation)
        self.is_mpi = world.is_mpi
        self.backend = be
        self.ctl = ControlChannel(world)
        self.table = {}            # handle -> Shard
        self.entries = {}          # signature id -> Entry
        self.signatures = {}       # master: signature -> its Entry (entries[entry.sig_id])
        self.next_handle = 1       # master: the next handle number to hand out (see _free_run)
        self.handle_end = protocol.HANDLE_MAX + 1   # master: ... while it stays below this
        self._free_runs = None     # master: the free runs of numbers left from the last scan
        self.pending_frees = []
        self.released_elsewhere = collections.deque()   # master: handles collected in other threads
        self.commands = 0
        self.next_version = 1      # shard versions, unique in this process (see _execute)
        self.broken = None         # set to the WorkerError that broke the runtime
        self.closed = False
        self.ledger = Ledger(world.size, careful)   # master: bytes of live matrices per worker, vs the limit
        self.replicas = ReplicaLedger(lambda: replica_budget(self.ledger.limit))   # master: cached copies
        self.programs = {}         # plan id -> graphs.Replayer of its protocol.Program (every rank)
        self.next_plan = 1
        self.recorder = None       # master: the plans.Recorder of an open record block
        self.watchers = {}         # master: handle -> plans to tell when it is released
        self.profile = {}          # op -> [kernels run, seconds] when PROFILE is on
        self.owner = threading.get_ident()   # master: the only thread that may issue commands
        self.pinger = None         # master: heartbeat.Pinger when a timeout is set (MPI only)
        self.activity = ("starting", time.monotonic())   # worker: what its main thread does, since when
        self.last_command = None   # master: oom.LastCommand of the last message sent, if a command
        self.poisoned = set()      # master: handles of matrices whose command was undone (oom.py)
        self.deciding = False      # master: inside oom.verdict, whose waits must not raise failures
        self.refusals = {}         # master: rank -> traceback of refusals in the careful command running
        self.refusal_deadline = None   # master: when the careful command must be left by all (oom.noted)
        self.batching = world.is_mpi   # master: local commands may be queued (alone, nothing is sent)
        self.queue = []            # master: the messages of the queued commands, oldest first
        self.queued_bytes = 0      # master: their total length
        self.queued_since = 0.0    # master: perf_counter() when the first of them was queued

    # ---- master side -------------------------------------------------------
    def check_usable(self):
        if self.closed:
            raise RuntimeStateError("dmath has been finalized")
        if self.broken is not None:
            raise RuntimeStateError(f"dmath cannot continue after a worker failure: {self.broken}")
        if threading.get_ident() != self.owner:
            # two threads' commands would interleave their frames and collectives on the workers
            raise RuntimeStateError(
                f"dmath operations must come from the thread that called dmath.init() "
                f"({self._owner_name()}); this is thread {threading.current_thread().name!r}. "
                f"Compute with numpy in other threads and hand the arrays to that thread")

    def _owner_name(self):
        return next((f"thread {t.name!r}" for t in threading.enumerate() if t.ident == self.owner),
                    "a thread that has ended")

    def check_failures(self, between=False):
        """Raise a pending worker failure or a hung worker as WorkerError (the progress hook of every wait).

        between: called between commands (not inside a wait), where a worker's
        refused allocation in the last command may be undone (oom.verdict).
        """
        if self.broken is not None or self.deciding:
            return
        report = pending_failure(self.world)
        if report is not None:
            rank, text, seq = report
            last = self.last_command
            if seq is not None and last is not None and seq == last.seq:
                if between:
                    oom.verdict(self, {rank: text})      # raises
                if last.careful:
                    # the careful command's agreements bring every rank out of it; the master's
                    # share learns of it there, and only a slow exit breaks the runtime (oom.overdue)
                    oom.noted(self, rank, text)
                    return
            self.broken = WorkerError(rank, text)
            raise self.broken
        if self.refusal_deadline is not None:
            oom.overdue(self)
        if self.pinger is not None:
            try:
                self.pinger.tick()
            except Hang as hang:
                self.broken = WorkerError(hang.rank, hang.report, message=hang.report.splitlines()[0])
                raise self.broken from None

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

    def call(self, op, in_handles, in_metas, outputs=(), static=(), scalars=(), payload=None, pooled=True):
        """Run operation `op` on every worker.

        in_handles, in_metas: the inputs' master-side handles (ints) and their Metas (a tuple).
        outputs: a tuple of a Meta per new matrix, or an int k meaning "overwrite input k in place".
        pooled: False when the new matrices live outside the pools the memory
        limit caps (a memory-mapped file): they are not counted against it.
        Returns (output handles, the master's kernel result).

        This runs once per operation: every step is a dictionary lookup or a
        few arithmetic operations once the signature is known (the eager
        dispatch cost is its sum).
        """
        # an op's typed static arguments (a NamedTuple) stay what they are: kernels read them by name
        signature = (op, static if isinstance(static, tuple) else tuple(static), in_metas, outputs)
        return self._command(signature, self.signatures.get(signature), in_handles, scalars, payload, pooled)

    def call_entry(self, entry, in_handles, scalars=()):
        """`call` of a registered signature by its Entry (`entry_of`), for a master half that keeps it
        beside its cached planning: no signature is built or looked up. Pooled, no payload."""
        return self._command(None, entry, in_handles, scalars, None, True)

    def entry_of(self, op, in_metas, outputs=(), static=()):
        """The Entry under which `call` registered this signature (None before its first command)."""
        return self.signatures.get((op, static if isinstance(static, tuple) else tuple(static), in_metas, outputs))

    def _command(self, signature, entry, in_handles, scalars, payload, pooled):
        """`call` of `signature`, whose Entry is `entry` (None: not registered yet; then `signature`
        is all that is known of it)."""
        op, _, in_metas, outputs = signature if entry is None else (entry.op, None, entry.inputs, entry.outputs)
        if self.closed or self.broken is not None or _get_ident() != self.owner:
            self.check_usable()
        if self.released_elsewhere:
            self._take_released_elsewhere()
        if self.is_mpi and not self.queue:
            # (alone, nobody can fail or hang but the master itself; while commands are queued nothing
            # has reached the workers since the last probe: the next message is probed for)
            self.check_failures(between=True)
        recorder = self.recorder
        if recorder is not None and payload is not None:
            raise PlanError(f"{op}: a command that carries data from the master (from_numpy, assign of a "
                            f"numpy array) cannot be recorded: a replay sends no data. Write new values "
                            f"into an existing matrix with Matrix.assign() outside the record block, then "
                            f"replay")
        if self.poisoned and not self.poisoned.isdisjoint(in_handles):
            raise OutOfMemoryError(f"{op}: an operand was never computed: the operation that made it ran "
                                   f"out of memory and was undone")
        if entry is None:
            # first use: what the command makes and overwrites, worked out here once (its Entry keeps
            # it); registered below, after the ledger has admitted it
            new_outs = tuple(m for m in outputs if type(m) is Meta)
            in_place = tuple(m for m in outputs if type(m) is not Meta)
            sig_id = None
        else:
            new_outs, in_place, sig_id = entry.new_outputs, entry.in_place, entry.sig_id
        n_new = len(new_outs)
        if n_new:
            # past the memory limit this raises OutOfMemoryError here, before anything is sent
            sizes = self.ledger.admit(op, sig_id, new_outs) if pooled else [self.ledger.nothing] * n_new
            first = self.next_handle
            if first + n_new > self.handle_end:
                first = self._free_run(n_new)     # (cold: every number has been handed out once)
            self.next_handle = first + n_new
            out_handles_new = [first] if n_new == 1 else list(range(first, first + n_new))
            self.ledger.add(out_handles_new, sizes)
        else:
            out_handles_new = []
        if in_place:
            it = iter(out_handles_new)
            out_handles = [next(it) if type(m) is Meta else in_handles[m] for m in outputs]
        else:
            out_handles = out_handles_new
        frees = self._take_frees() if self.pending_frees else ()
        # careful under memory pressure (ledger.pressed(): some worker past its mark, new matrices
        # included), except in place: a partly written operand cannot be undone anyway (oom.py)
        careful = self.ledger.low < 0 and not in_place
        try:
            if entry is None:
                sig_id = len(self.signatures) + 1
                message, total = protocol.encode(protocol.REGISTER | protocol.CAREFUL if careful
                                                 else protocol.REGISTER, sig_id,
                                                 in_handles + out_handles, scalars, frees, signature)
                # registered once its message exists: a command that cannot be encoded registers nothing
                entry = self.entries[sig_id] = self.signatures[signature] = Entry(signature, self.nworkers, sig_id)
            else:
                message, total = protocol.encode_numbers(protocol.EXEC_CAREFUL if careful else protocol.EXEC,
                                                         sig_id, in_handles + out_handles, scalars, frees)
        except BaseException:  # noqa: B036 - nothing was sent: the command leaves no trace, then raises
            self._not_sent(out_handles_new, frees)
            raise
        if in_place:
            for k in in_place:
                self.replicas.written(in_handles[k])    # written in place: its cached copies are stale
        if entry.share_s <= BATCH_SHARE_S and self.batching and not careful and recorder is None:
            # a local command with a cheap share (never one that is not local: its share_s is infinite):
            # queued, unless the queue is due to go (see the module's doc), then sent with it
            queue = self.queue
            now = _perf_counter()
            if not queue:
                self.queued_since = now
            if len(queue) + 1 < BATCH_MAX and now - self.queued_since <= BATCH_AGE_S:
                queue.append(message)
                self.queued_bytes += total
                self.last_command = None    # nothing sent: no refusal is undone until the next message
                if frees:
                    self._free(frees)
                try:
                    result = self._execute(entry, in_handles, out_handles, scalars, payload)
                except BaseException as exc:  # noqa: B036 - see _queued_share_failed
                    self._queued_share_failed(exc, op, out_handles_new, in_place)
                entry.share_s = _perf_counter() - now
                return out_handles, result
        # _send and _own_share, written out: this runs once per operation
        self.last_command = None
        try:
            if self.queue:
                self._post(message, total)
            else:
                self.ctl.send(message, total)
        except BaseException as exc:  # noqa: B036 - said plainly, then raised again
            self._send_failed(exc, op)
        self.last_command = oom.LastCommand(op, self.ctl.seq, out_handles_new, bool(in_place))
        if frees:
            self._free(frees)
        if careful:
            self.last_command.careful = True
            result = self._careful_share(entry, in_handles, out_handles, scalars, payload, op)
        else:
            try:
                if self.batching and entry.local:
                    t0 = _perf_counter()
                    result = self._execute(entry, in_handles, out_handles, scalars, payload)
                    entry.share_s = _perf_counter() - t0      # whether the next one may be queued
                else:
                    result = self._execute(entry, in_handles, out_handles, scalars, payload)
            except BaseException as exc:  # noqa: B036 - see _share_failed
                self._share_failed(exc, op)
        if recorder is not None:
            recorder.command(sig_id, tuple(zip(in_handles, in_metas)), out_handles, out_handles_new, scalars,
                             frees, result is not None)
        return out_handles, result

    def _not_sent(self, new_handles, frees):
        """Undo what `_command` did before its message could not be encoded (or its new signature
        not be prepared: an Entry that raises is never registered): the new matrices' bytes
        leave the ledger (no Matrix will ever release them) and the frees it took wait for the next
        message. Their numbers stay unused: nothing names them (`_handles_in_use`)."""
        for h in new_handles:
            self.ledger.release(h)
        if frees:
            self.pending_frees[:0] = frees

    def _careful_share(self, entry, in_handles, out_handles, scalars, payload, op):
        """The master's share of a careful command: its kernel, then every worker's word that it is out."""
        agreement.begin(self.world, self.ctl.seq)
        try:
            result = self._execute(entry, in_handles, out_handles, scalars, payload)
            agreement.finish()      # raises PeerRefused when a worker left the command
        except BaseException as exc:  # noqa: B036 - see _share_failed
            self._share_failed(exc, op)
        finally:
            agreement.end()
        return result

    def _send(self, message, total, what):
        self.last_command = None
        try:
            self._post(message, total)
        except BaseException as exc:  # noqa: B036 - said plainly, then raised again
            self._send_failed(exc, what)

    def _post(self, message, total):
        """Broadcast `message`; with commands queued, after them in one BATCH message (every message
        the master sends goes through here or `_command`, which does the same)."""
        queue = self.queue
        if queue:
            queue.append(message)
            message, total = protocol.batch(queue, self.queued_bytes + total)
            self.queue, self.queued_bytes = [], 0
        self.ctl.send(message, total)

    def _queued_share_failed(self, exc, op, new_handles, in_place):
        """The master's own share of a queued command `op` raised `exc` (called in its handler).

        A refused allocation is undone as in a sent command (oom.verdict): the
        queue goes now, this command last, so that every worker has run what
        the master ran when the check asks them. Anything else breaks the
        runtime (`_share_failed`); the workers never see the queue.
        """
        if isinstance(exc, OutOfMemoryError):
            last = self.queue.pop()
            self.queued_bytes -= len(last)
            try:
                self._post(last, len(last))
            except BaseException as exc2:  # noqa: B036 - said plainly, then raised again
                self._send_failed(exc2, op)
            self.last_command = oom.LastCommand(op, self.ctl.seq, new_handles, bool(in_place))
        self._share_failed(exc, op)

    def _drain(self):
        """Send the queued commands and wait until every worker has run them (a failure in one of them
        raises WorkerError here)."""
        self._post(*protocol.encode(protocol.DRAIN))
        gather_objects(self.world, None)

    def _send_failed(self, exc, what):
        """Sending command `what` raised `exc` (called in its handler): the runtime cannot go on
        unless a worker's failure is what it raised. Raises it again."""
        if not isinstance(exc, WorkerError):
            self._interrupted(exc, what)
        raise exc

    def _own_share(self, fn, *args):
        try:
            return fn(*args)
        except BaseException as exc:  # noqa: B036 - see _share_failed
            self._share_failed(exc, getattr(args[0], "op", "a plan replay") if args else "a plan replay")

    def _share_failed(self, exc, what):
        """The master's own share of command `what` raised `exc` (called in its handler); raises what
        that means for the runtime."""
        if isinstance(exc, WorkerError):
            raise exc
        if isinstance(exc, OutOfMemoryError) and self.last_command is not None:
            # refused an allocation in a command (not a replay), or, in a careful command, left it
            # because a worker was refused: undone if every worker is out of it
            refused = {} if isinstance(exc, agreement.PeerRefused) else {0: traceback.format_exc()}
            if self.last_command.careful:
                for rank, text in refused.items():
                    oom.noted(self, rank, text)      # the deadline for every worker to leave starts
                agreement.leave()       # the workers waiting for the master leave; all are out after it
            # the OutOfMemoryError raised next keeps this one as its context: not its kernel's arrays
            oom.release_frames(exc)
            oom.verdict(self, refused)     # raises
        if isinstance(exc, Exception):
            # the master's own share failed: the other workers may be inside a
            # collective waiting for it, so the runtime cannot go on
            self.broken = WorkerError(0, traceback.format_exc())
            raise self.broken from exc
        self._interrupted(exc, what)        # KeyboardInterrupt, SystemExit: the same, said plainly
        raise exc

    def _interrupted(self, exc, what):
        """The master was interrupted inside a command: the workers may be inside it; no going on."""
        self.broken = RuntimeStateError(
            f"the master was interrupted ({type(exc).__name__}) in the middle of {what!r}, which the "
            f"workers may still be running; the job ends at exit")

    # ---- recorded plans (master side) ----------------------------------------
    def define_plan(self, program):
        """Send a recorded program to every worker (one DEFINE message); returns its plan ID.

        The program's tail (temporaries of the block still pending a free) is
        taken out of the pending frees: every rank frees it now, and again at
        the end of each replay.
        """
        self.check_usable()
        if self.released_elsewhere:
            self._take_released_elsewhere()
        tail = set(program.tail)
        self.pending_frees = [h for h in self.pending_frees if h not in tail]
        plan_id, self.next_plan = self.next_plan, self.next_plan + 1
        frees = self._take_frees()
        message, total = protocol.encode(protocol.DEFINE, plan_id, frees=frees, program=program)
        self._send(message, total, "a plan definition")
        self._free(frees)
        self._define(plan_id, program)
        return plan_id

    def replay_plan(self, plan_id):
        """Run plan `plan_id` on every rank: one REPLAY frame. Returns the master's result of every step."""
        self.check_usable()
        self.check_failures()
        if self.recorder is not None:
            raise PlanError("a plan cannot be replayed inside a dmath.record() block")
        if plan_id not in self.programs:
            raise PlanError(f"plan {plan_id} is not defined (closed?)")
        if self.released_elsewhere:
            self._take_released_elsewhere()
        frees = self._take_frees()
        message, total = protocol.encode(protocol.REPLAY, plan_id, frees=frees)
        self._send(message, total, "a plan replay")
        self._free(frees)
        return self._own_share(self.programs[plan_id].replay)

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

    def gather_objects(self, obj):
        return gather_objects(self.world, obj)

    # ---- both sides --------------------------------------------------------
    def _execute(self, entry, in_handles, out_handles, scalars, payload=None):
        table = self.table
        inputs = list(map(table.__getitem__, in_handles))     # (no comprehension frame: Python < 3.12)
        call = Call(self, entry, inputs, scalars, payload, in_handles)
        homed = False
        for s in inputs:
            if s.pending is not None or s.home is not None:     # (one test for the usual shard)
                if s.pending is not None:
                    s.settle()          # written by a background all-reduce: wait for it on the device
                if s.home is not None:
                    homed = True
        self.commands += 1
        shards = self._profiled(entry, call) if PROFILE else entry.kernel(call)
        if homed:
            for s in inputs:
                if s.home is not None:
                    # held in host memory on a GPU: a write makes its device copy the newer one,
                    # and a 'host' shard gives its device copy up until the next command needs it
                    s.home.after_command(any(o is s for o in shards))
        version = self.next_version
        for h, s in zip(out_handles, shards):
            # every write makes a new version: replica-cache keys of the old one go stale
            s.version = version
            version += 1
            table[h] = s
        self.next_version = version
        return call.result

    def _profiled(self, entry, call):
        """Run the kernel alone on the device and add its seconds to self.profile[op]."""
        be = self.backend
        be.synchronize_all()
        t0 = time.perf_counter()
        shards = entry.kernel(call)
        be.synchronize_all()
        slot = self.profile.setdefault(entry.op, [0, 0.0])
        slot[0] += 1
        slot[1] += time.perf_counter() - t0
        return shards

    def _free(self, handles):
        table, cache = self.table, replicas.cache
        for h in handles:
            if h < 0:                       # -k drops plan k (protocol.py)
                self.programs.pop(-h, None)
                continue
            s = table.pop(h, None)
            if s is not None and s.pending is not None:
                s.settle()              # its buffers go back to the pool: the side stream must be done
            cache.drop(h)

    def _define(self, plan_id, program):
        self.programs[plan_id] = Replayer(self, program)
        self._free(program.tail)            # the recording's temporaries still held at its end

    def _run_program(self, program):
        """Execute a recorded program as its commands ran: same entries, frees, fresh versions."""
        results = []
        for step in program.steps:
            self._free(step.frees)
            entry = self.entries[step.sig_id]
            n_in = len(entry.inputs)
            results.append(self._execute(entry, step.handles[:n_in], step.handles[n_in:], step.scalars))
        self._free(program.tail)
        return results

    def local_stats(self):
        d = dict(counters.counters)
        d.update(commands=self.commands, pool=memory.local_stats(),
                 signatures=len(self.entries), handles=len(self.table), plans=len(self.programs),
                 plan_graphs=sum(1 for r in self.programs.values() if r.graph is not None),
                 # operation -> plans it keeps step by step (not capturable into a CUDA graph)
                 plan_blockers={op: sum(op in r.blockers for r in self.programs.values())
                                for op in {op for r in self.programs.values() for op in r.blockers}})
        d.update(replicas.cache.stats())
        if PROFILE:
            d["profile"] = {op: tuple(v) for op, v in self.profile.items()}
        return d

    # ---- worker side -------------------------------------------------------
    def serve(self):
        """Worker loop: execute commands until the master shuts down. Never returns.

        Any exception, waiting for a command (Ctrl-C, an MPI error) or running
        one, goes to the master as a failure report.
        """
        responder = Responder(self.world, self._status) if _heartbeat(self.world) else None
        while True:
            kind = None
            undoable = False
            try:
                self.activity = ("idle, waiting for the next command", time.monotonic())
                message = self.ctl.recv(protocol.total_length)
                kind, sig_id, handles, scalars, frees, extra = protocol.decode(message)
                if kind == protocol.BATCH:
                    # the commands the master queued, then the message that sent them; a refusal in a
                    # queued one cannot be undone (the master ran on past it): only in the last
                    for queued in extra[:-1]:
                        kind = queued[0]
                        self._run(*queued)
                    kind, sig_id, handles, scalars, frees, extra = extra[-1]
                undoable = True
                if self._run(kind, sig_id, handles, scalars, frees, extra):
                    break
            except OutOfMemoryError as exc:
                # a refused allocation in a command (not in a replay) may be undone: the master decides
                text = traceback.format_exc()
                try:
                    if not undoable or kind & ~protocol.CAREFUL not in (protocol.EXEC, protocol.REGISTER):
                        raise
                    oom.worker_refused(self, text, exc)
                except BaseException:  # noqa: B036 - in a replay, or the master went on: no way back
                    self._fail(traceback.format_exc())
            except BaseException:  # noqa: B036 - any failure must reach the master
                self._fail(traceback.format_exc())
        if responder is not None:
            responder.stop()
        self._release_graphs()
        _dump_profile(self.world.rank)
        _exit_worker(self.world, 0)

    def _run(self, kind, sig_id, handles, scalars, frees, extra):
        """Worker: run one decoded message (not a BATCH); True for SHUTDOWN."""
        careful = kind & protocol.CAREFUL
        if careful:
            kind ^= careful
        self._free(frees)
        if kind == protocol.SHUTDOWN:
            return True
        if kind == protocol.REGISTER:
            self.entries[sig_id] = Entry(extra, self.nworkers, sig_id)
        if kind == protocol.EXEC or kind == protocol.REGISTER:
            entry = self.entries[sig_id]
            self.activity = (entry.doing, time.monotonic())
            n_in = len(entry.inputs)
            if careful:
                agreement.begin(self.world, self.ctl.seq)
                self._execute(entry, handles[:n_in], handles[n_in:], scalars)
                agreement.finish()      # the master hears that this worker is out of it
                agreement.end()
            else:
                self._execute(entry, handles[:n_in], handles[n_in:], scalars)
        elif kind == protocol.DEFINE:
            self._define(sig_id, extra)
        elif kind == protocol.REPLAY:
            self.activity = (f"replaying plan {sig_id}", time.monotonic())
            self.programs[sig_id].replay()
        elif kind == protocol.OOM_CHECK:
            oom.worker_check(self)
        elif kind == protocol.DRAIN:
            gather_objects(self.world, None)     # everything before it has run here
        return False

    def _status(self):
        """What this worker's main thread is doing, for the heartbeat's answer."""
        what, since = self.activity
        return f"{what} for {time.monotonic() - since:.1f} s"

    def _fail(self, text):
        req = report_failure(self.world, self.world.rank, text)
        # the master raises WorkerError and ends the job; if it never does
        # (it is stuck outside dmath), end the job ourselves after a grace period
        deadline = time.monotonic() + FAILED_WORKER_GRACE_S
        while time.monotonic() < deadline:
            req.Test()
            time.sleep(0.01)
        sys.stderr.write(f"dmath worker {self.world.rank}: the master did not end the job "
                         f"{FAILED_WORKER_GRACE_S:.0f} s after this failure; aborting\n{text}")
        self.world.abort(1)

    # ---- shutdown ----------------------------------------------------------
    def shutdown(self):
        """Master: end the workers (normally), or abort the job after a worker failure.

        Under MPI the master first waits until every worker has run everything it was sent (a
        DRAIN), so that a worker's failure in the last commands ends the job non-zero within
        seconds, its traceback printed by the master (one small gather at exit).
        """
        if self.closed:
            return
        if self.is_mpi and self.nworkers > 1 and self.broken is None:
            # every worker finishes what it was sent (the queued commands included) before it is told
            # to exit, and the master waits for it: a failure in the last command, which the master
            # may have left before a worker failed (its share did not wait, or the failure came after
            # the last collective), reaches it here as WorkerError and ends the job non-zero at once,
            # not after the failed worker's grace period with no report from the master
            try:
                self._drain()
            except BaseException as exc:  # noqa: B036 - a WorkerError (or an interrupt): abort below
                sys.stderr.write(f"dmath: a command failed before the end: {exc}\n")
                if self.broken is None:
                    self.broken = exc
        self.closed = True
        if self.broken is not None or self._failure_pending():
            sys.stdout.flush()
            sys.stderr.write("dmath: ending the job after a worker failure\n")
            sys.stderr.flush()
            self.world.abort(1)
        message, total = protocol.encode(protocol.SHUTDOWN, frees=self.pending_frees[:protocol.MAX_FREES])
        self._post(message, total)
        self._release_graphs()
        _dump_profile(0)
        self.world.close()

    def _release_graphs(self):
        """Destroy every captured CUDA graph (at shutdown, before the NCCL communicators go).

        ncclCommDestroy waits until every graph that captured an operation of
        the communicator has been destroyed; a replayed training step still
        held here would make the exit hang on every rank.
        """
        for replayer in self.programs.values():
            replayer.release_graph()
        gc.collect()      # a graph kept alive by a reference cycle (a traceback's frames) goes too

    def _failure_pending(self):
        try:
            self.check_failures()
        except WorkerError:
            return True
        return False


_profiler = None


def _start_profile():
    global _profiler
    if CPROFILE:
        import cProfile
        _profiler = cProfile.Profile()
        _profiler.enable()


def clear_cprofile():
    """Forget what the Python profiler (DMATH_CPROFILE) has seen so far (dmath.reset_stats)."""
    if _profiler is not None:
        _profiler.clear()


def _dump_profile(rank):
    if _profiler is not None:
        _profiler.disable()
        _profiler.dump_stats(f"{CPROFILE}.{rank}.prof")


def _heartbeat(world):
    """Whether the heartbeat runs: several ranks, and an MPI that allows calls from its thread."""
    return world.is_mpi and world.thread_multiple


def _exit_worker(world, code):
    sys.stdout.flush()
    sys.stderr.flush()
    world.close()
    if world.is_mpi:
        world.mpi_module.Finalize()
        # Leave through the C library's exit(), not os._exit(): MPICH (4.x and
        # later, which allows MPI to be initialised again) tells the process
        # manager "finalize" from a C atexit handler, not from MPI_Finalize.
        # _exit() skips that handler, and Hydra's proxy, seeing the PMI socket
        # close without a finalize, SIGKILLs every rank (a race: the job then
        # exits 9 at random after a clean shutdown). exit() still skips
        # Python's own teardown, so the user's script does not run on. Called
        # through PyDLL, which keeps the GIL: C++ destructors that run inside
        # exit() and touch Python objects (PyTorch's, once a kernel imported
        # it) abort the process when the GIL has been let go, as CDLL does.
        try:
            import ctypes
            ctypes.PyDLL(None).exit(code)
        except (OSError, AttributeError):  # no C library to call: the old way
            pass
    os._exit(code)


_runtime = None


def runtime():
    """The process's Runtime; raises if dmath.init() has not been called."""
    if _runtime is None:
        raise RuntimeStateError("dmath is not initialised: call dmath.init() first")
    return _runtime


def is_initialized():
    """Whether dmath.init() has run in this process and the runtime has not been finalized."""
    return _runtime is not None and not _runtime.closed


def init(device=None):
    """Start dmath (idempotent: a second call returns the running runtime, and raises if it names
    another device than the one running). On ranks other than 0 this call never returns."""
    global _runtime
    if _runtime is not None:
        if _runtime.closed:
            raise RuntimeStateError("dmath was finalized in this process and cannot start again")
        if device is not None and device != _runtime.backend.name:
            backend.check_device(device)
            raise RuntimeStateError(f"dmath is already running on device {_runtime.backend.name!r}; "
                                    f"init(device={device!r}) cannot change it")
        return _runtime
    timeout = _timeout_s()       # checked on every rank before any of them starts serving
    careful = careful_mode_from_env()
    tuning.mode()                # DMATH_TUNE checked here: a bad value raises now, not at a worker's first convolution
    world = World()
    watchdog = float(os.environ.get("DMATH_WATCHDOG_S", "0"))
    if watchdog > 0:
        # hang diagnosis: every rank prints its Python stack every `watchdog` seconds
        import faulthandler
        faulthandler.dump_traceback_later(watchdog, repeat=True)
    be = backend.select(device, world.local_rank)
    memory.install()       # the pool (on a GPU: CuPy's allocators) serves every allocation from here on
    rt = _runtime = Runtime(world, be, careful)
    _start_profile()
    # every worker's memory, so that the master refuses what cannot fit before sending it
    capacities = gather_objects(world, memory.capacity(world.local_size))
    if world.rank != 0:
        rt.serve()
    rt.ledger.set_capacity(capacities)
    if _heartbeat(world) and timeout > 0:
        rt.pinger = Pinger(world, timeout)
    set_progress_hook(rt.check_failures)
    atexit.register(finalize)
    if world.is_mpi:
        _install_excepthook(rt)
    return rt


def finalize():
    """Shut the workers down (also runs at exit). After a worker failure the job exits non-zero."""
    if _runtime is not None and not _runtime.closed and _runtime.world.rank == 0:
        _runtime.shutdown()


def _install_excepthook(rt):
    previous = sys.excepthook

    def hook(kind, value, tb):
        # an uncaught exception on the master: report it, then end every process
        previous(kind, value, tb)
        sys.stderr.write("dmath: uncaught exception on the master; ending all workers\n")
        sys.stderr.flush()
        rt.world.abort(1)
    sys.excepthook = hook
