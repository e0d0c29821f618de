"""The master's command path: a call becomes a command, sent at once or queued.

A command is (signature, handles, scalars). The signature (operation, static
arguments, input and output layouts, shapes and dtypes) is sent once and
registered on every rank under an integer ID, together with whatever the
kernel derives from it (remap plans, index arrays); afterwards only the ID,
the handle numbers and the dynamic scalars travel.

Queued commands. A command whose kernel never communicates (its op declares
it local for the signature: registry.py) need not reach the workers before
the master runs its own share, so the master queues it, runs its share and
goes on; the queue travels in the next message it sends (one BATCH:
protocol.py), which every worker runs in order. That message goes out before
any command that is not queued (a collective, a remap, a read to the master,
a careful command, anything recorded or with a payload), any plan definition
or replay, the OOM check, and shutdown (followed by a DRAIN: the master waits
until every worker has run everything it was sent). The master never enters
a collective its peers have not been sent. The queue also goes when it holds
BATCH_MAX commands or when its first command has waited BATCH_AGE_S (checked
at the next command), and a local command is queued only when the master's
own share of its signature last took at most BATCH_SHARE_S, so that a costly
kernel runs on the workers beside the master, not after it. A worker's
failure in a queued command reaches the master at its next wait, and a
refused allocation there cannot be undone (only the last command of a BATCH
is "the last command" of oom.py).
"""
from time import perf_counter as _perf_counter
from threading import get_ident as _get_ident

from ..comm import agreement
from ..comm.control import gather_objects
from ..errors import DMathError, OutOfMemoryError, PlanError
from . import oom, protocol
from .entry import Entry
from .shard import Meta

#: queued commands (see the module's doc): at most BATCH_MAX to a message (0 or 1: none are queued),
#: the first waits at most BATCH_AGE_S, and a local command is queued only when the master's share of
#: its signature last took at most BATCH_SHARE_S. Set from dmath.settings at init (tests may set them)
BATCH_MAX = 16
BATCH_AGE_S = 500e-6
BATCH_SHARE_S = 50e-6
#: Bounded signatures. Past this many registered signatures the master drops the least recently
#: used, down to three quarters of it (none of a defined plan's, none while a block records), on
#: every rank with the next commands' frees (protocol.SIGNATURE_DROP). Signatures that carry data
#: (the rows of a take_rows, the corner of a window write in a loop over rows) are each used once:
#: without a bound the master's table and every worker's kernels' caches grew by each of them for
#: the life of the job (5 MB per permutation of 100,000 rows). A dropped signature used again is
#: registered again.
MAX_SIGNATURES = 16384
#: ... and past this many bytes of their registration messages (the signatures pickled: a take_rows
#: of 100,000 rows is 800 kB), so that a few large signatures cannot hold what many small ones may
MAX_SIGNATURE_BYTES = 64 << 20


def configure(values):
    """Take the queue's limits from the checked settings (`dmath.settings.current`)."""
    global BATCH_MAX, BATCH_AGE_S, BATCH_SHARE_S
    BATCH_MAX = values.batch_max
    BATCH_AGE_S = values.batch_age_us * 1e-6
    BATCH_SHARE_S = values.batch_share_us * 1e-6


class Dispatch:
    """The Runtime's master side: commands, their queue, plan definitions and replays."""

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
        beside its cached planning: no signature is built or looked up. Pooled, no payload. The entry
        must still be registered (sig_id not None: a dropped one goes by `call`, as dispatch_known does)."""
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
            if (len(self.signatures) >= MAX_SIGNATURES or self.signature_bytes >= MAX_SIGNATURE_BYTES) \
                    and recorder is None:
                self._drop_signatures()
            new_outs = tuple(m for m in outputs if type(m) is Meta)
            in_place = tuple(m for m in outputs if type(m) is not Meta)
            sig_id = None
        else:
            new_outs, in_place, sig_id = entry.new_outputs, entry.in_place, entry.sig_id
            entry.used = self.commands
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
                sig_id = self.next_sig_id
                if sig_id >= protocol.SIGNATURE_DROP:
                    raise DMathError(f"{op}: this job has registered {sig_id - 1:,} command signatures, the most "
                                     f"the protocol numbers")
                message, total = protocol.encode(protocol.REGISTER | protocol.CAREFUL if careful
                                                 else protocol.REGISTER, sig_id,
                                                 in_handles + out_handles, scalars, frees, signature)
                # registered once its message exists: a command that cannot be encoded registers nothing
                entry = self.entries[sig_id] = self.signatures[signature] = Entry(signature, self.nworkers, sig_id)
                entry.used, entry.nbytes = self.commands, total
                self.signature_bytes += total
                self.next_sig_id = sig_id + 1
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
        try:
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
        except BaseException:
            if recorder is not None and frees:
                recorder.failed(frees)      # (the workers freed them with the command all the same)
            raise
        if recorder is not None:
            recorder.command(sig_id, tuple(zip(in_handles, in_metas)), out_handles, out_handles_new, scalars,
                             frees, result is not None)
        return out_handles, result

    def _drop_signatures(self):
        """Drop the least recently used signatures down to three quarters of MAX_SIGNATURES and of
        MAX_SIGNATURE_BYTES, but none that a defined plan replays: here at once, on every rank (the
        master's share included) with the next commands' frees."""
        pinned = {step.sig_id for replayer in self.programs.values() for step in replayer.program.steps}
        unpinned = sorted((e for e in self.signatures.values() if e.sig_id not in pinned), key=lambda e: e.used)
        keep, keep_bytes = 3 * MAX_SIGNATURES // 4, 3 * MAX_SIGNATURE_BYTES // 4
        for entry in unpinned:
            if len(self.signatures) <= keep and self.signature_bytes <= keep_bytes:
                break
            del self.signatures[(entry.op, entry.static, entry.inputs, entry.outputs)]
            self.signature_bytes -= entry.nbytes
            self.ledger.forget(entry.sig_id)
            self.pending_frees.append(-(protocol.SIGNATURE_DROP + entry.sig_id))
            entry.sig_id = None

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

    def replay_plan(self, plan_id, need=(), plan=None):
        """Run plan `plan_id` on every rank: one REPLAY frame. Returns the master's result of every step.

        need: the bytes per worker the replay allocates at once beside the live matrices, admitted by
        the ledger first (OutOfMemoryError, nothing sent, when it does not fit); plan: for the message."""
        self.check_usable()
        self.check_failures()
        if self.recorder is not None:
            raise PlanError("a plan cannot be replayed inside a dmath.record() block")
        if plan_id not in self.programs:
            raise PlanError(f"plan {plan_id} is not defined (closed?)")
        if self.released_elsewhere:
            self._take_released_elsewhere()
        if need:
            # (after the matrices released on other threads are taken: they may make the room)
            self.ledger.admit_transient(f"replaying {plan!r}" if plan is not None else "a plan replay", need,
                                        "what its commands held at once when it was recorded: temporaries, "
                                        "outputs made again, the kernels' scratch")
        frees = self._take_frees()
        message, total = protocol.encode(protocol.REPLAY, plan_id, frees=frees)
        self._send(message, total, "a plan replay")
        self._free(frees)
        return self._own_share(self.programs[plan_id].replay)

    def gather_objects(self, obj):
        return gather_objects(self.world, obj)
