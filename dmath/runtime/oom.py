"""Undoing a command whose allocation a worker refused: the master's check, and careful commands.

The master admits a command only when its new matrices fit (ledger.py), but a kernel's temporaries
are not in the ledger and a worker's pool may refuse them; that worker cannot give up alone, its
peers may be inside a collective of the same command, waiting for it.

The check: after a refusal in command n, the master sends OOM_CHECK and waits up to AGREE_S for
every worker's answer (a worker answers only between commands), then for its own device work of
n. If all answer, n is undone on every rank (its new matrices freed and marked, the replica caches
dropped, which must stay alike everywhere) and OutOfMemoryError is raised with the runtime usable.
A silent worker is inside n: the runtime is broken (WorkerError). So is a refusal in a command that
writes in place, in a plan replay, or, outside careful commands, one learnt of after the next
command was sent.

Careful commands (under memory pressure: ledger.CAREFUL_FRACTION, or DMATH_CAREFUL /
dmath.memory.set_careful) make the check succeed when a refused worker's peers are in a
collective with it (comm/agreement.py): every collective allocates first, then agrees with its
group, then communicates; a refused rank tells every rank it left (a NOTICE: it may not know which
groups will wait for it), and every worker tells the master it is out (END), so the master never
runs ahead of a careful command. Outside careful commands this costs one attribute test per
collective and per command. A refusal report arriving inside a careful command is noted, and the
runtime is broken only if some rank has not left it within AGREE_S.
"""
import time
import traceback

from ..comm import agreement
from ..comm.control import gather_objects, gather_within, pending_failure, report_failure
from ..errors import OutOfMemoryError, RuntimeStateError, WorkerError
from ..memory import replicas
from . import protocol

#: seconds the master waits for every worker's answer (or, in a careful command, for every rank to
#: leave it after a refusal) before it declares the runtime broken
AGREE_S = 10.0


def worker_refused(rt, text, exc):
    """Worker: an allocation of the command just received was refused (`exc`, traceback `text`), or a
    careful command's agreement found that a peer had left it (`exc` is a PeerRefused). Leave the
    command, report, answer the check.

    Raises (a failure that ends the job) when the master's next message is not the check.
    """
    peer = isinstance(exc, agreement.PeerRefused)
    agreement.leave()       # in a careful command: every rank that waits for this one leaves too
    release_frames(exc)
    if not peer:
        report_failure(rt.world, rt.world.rank, text, rt.ctl.seq)
    rt.activity = ("waiting for the master's check after a refused allocation", rt.activity[1])
    message = rt.ctl.recv(protocol.total_length)
    kind, _, _, _, frees, _ = protocol.decode(message)
    if kind != protocol.OOM_CHECK:
        raise RuntimeStateError(f"worker {rt.world.rank}: the master sent another command before it had "
                                f"seen that this worker left one for want of memory:\n{text}")
    rt._free(frees)
    _after_command(rt)
    gather_objects(rt.world, ("left" if peer else "refused", text))


def worker_check(rt):
    """Worker: the master's check after some rank's refusal; this one finished the command."""
    _after_command(rt)
    gather_objects(rt.world, ("done", None))


def _after_command(rt):
    """What every rank does once it is out of an undone command (a worker before it answers the check)."""
    # the replica caches must stay alike on every rank (see the module's doc): drop them all
    replicas.cache.clear()
    # an NCCL collective this rank queued runs on, into buffers its kernel has let go: nothing is
    # allocated again, nor an answer given, until it is done (if it waits for a worker that left the
    # command, no answer comes and the master gives up)
    rt.backend.synchronize_all()


def _out_on_device(rt):
    """Master: whether its own device work of the last command finishes within AGREE_S (polled).

    Every worker that answered the check is out of the command, but the master's kernel returns
    as soon as its NCCL calls are queued: one of them may wait for a worker that left. Then the
    blocking synchronize of `_after_command` would never return (no heartbeat runs in it), so the
    master tests the streams instead, and a device still busy at the deadline breaks the runtime."""
    be = rt.backend
    deadline = time.monotonic() + AGREE_S
    while not be.device_idle():
        if time.monotonic() > deadline:
            return False
        time.sleep(1e-3)
    return True


def release_frames(exc):
    """Drop the local variables of the finished frames `exc` went through: the kernel's arrays go
    back to the pool now, not whenever the exception (or one chained to it) is collected."""
    traceback.clear_frames(exc.__traceback__)


class LastCommand:
    """Master: what undoing the last command needs: its operation, control message number, new
    handles, whether it wrote an operand in place and whether it was careful (set by the caller
    when it is: one argument less on every command)."""
    __slots__ = ("op", "seq", "new_handles", "in_place", "careful")

    def __init__(self, op, seq, new_handles, in_place):
        self.op, self.seq, self.new_handles, self.in_place = op, seq, new_handles, in_place
        self.careful = False


def noted(rt, rank, text):
    """Master: in a careful command, `rank` was refused (traceback `text`). Every rank must be out of
    the command within AGREE_S seconds of the first such refusal (`overdue`)."""
    rt.refusals.setdefault(rank, text)
    if rt.refusal_deadline is None:
        rt.refusal_deadline = time.monotonic() + AGREE_S


def overdue(rt):
    """Master (check_failures): raises WorkerError when a careful command was not left by every rank
    within AGREE_S seconds of a refusal in it."""
    if time.monotonic() < rt.refusal_deadline:
        return
    first = min(rt.refusals)
    text = rt.refusals[first]
    rt.refusals, rt.refusal_deadline = {}, None
    op = rt.last_command.op if rt.last_command is not None else "the operation"
    rt.broken = WorkerError(first, text + f"\n(the operation cannot be undone: {op!r} was not left by every "
                                          f"worker within {AGREE_S:g} s; one is inside a collective, "
                                          f"waiting for a worker that left it)")
    raise rt.broken


def verdict(rt, refused):
    """Master: the last command was refused an allocation; `refused` maps the ranks known to be refused
    (reports read) to their tracebacks (empty: only that a worker left a careful command is known).

    Raises OutOfMemoryError when the command was undone, else WorkerError
    (the runtime is broken).
    """
    last, rt.last_command = rt.last_command, None
    refused = {**rt.refusals, **refused}
    rt.refusals, rt.refusal_deadline = {}, None
    message, total = protocol.encode(protocol.OOM_CHECK)
    rt.deciding = True         # the check's own waits must not read the refusal reports as failures
    try:
        rt._post(message, total)        # (nothing is queued: the last command was sent)
        answers = gather_within(rt.world, AGREE_S)
    finally:
        rt.deciding = False
    silent = []
    for r in range(1, rt.world.size):
        if answers[r] is None:
            silent.append(r)
        elif answers[r][0] == "refused" and r not in refused:
            refused[r] = answers[r][1]
            _take_report(rt, r)
    reason = None
    if silent:
        reason = (f"worker(s) {', '.join(map(str, silent))} did not answer within {AGREE_S:g} s: they are "
                  f"inside {last.op!r}, waiting for a worker that left it")
    elif last.in_place:
        # (with one worker no other worker is involved: its kernel may have written part of the operand)
        reason = (f"{last.op!r} writes an operand in place, which some workers had written and some had not"
                  if rt.world.size > 1 else
                  f"{last.op!r} writes an operand in place and may have written part of it before the refusal")
    elif not refused:
        reason = f"a worker left {last.op!r} but none says it was refused an allocation"
    elif not _out_on_device(rt):
        reason = (f"the master's own device work of {last.op!r} did not finish within {AGREE_S:g} s: a "
                  f"collective it queued waits for a worker that left the command")
    if reason is not None:
        first = min(refused) if refused else (silent[0] if silent else 0)
        text = refused.get(first, f"worker {first} is out of {last.op!r}")
        rt.broken = WorkerError(first, text + f"\n(the operation cannot be undone: {reason})")
        raise rt.broken
    for h in last.new_handles:
        rt.release(h)           # freed on every rank with the next command
        rt.poisoned.add(h)      # until the Matrix holding it is collected (it releases it again: harmless)
    # as every worker did before answering (see the module's doc), and the master's account of them
    _after_command(rt)
    rt.replicas.clear()
    first = min(refused)
    where = ", ".join(str(r) for r in sorted(refused))
    cause = refused[first].strip().splitlines()[-1]
    raise OutOfMemoryError(f"{last.op}: worker {where} could not allocate the memory the operation needs "
                           f"({cause}). The operation was undone on every worker and dmath goes on; a "
                           f"matrix it returned cannot be used. Free matrices (del, dmath.memory.clear()) "
                           f"or use smaller pieces, then retry")


def _take_report(rt, r):
    """Read worker r's refusal report (sent before its answer) so that it is not taken for a new failure."""
    while True:
        report = pending_failure(rt.world, source=r)
        if report is not None:
            if report[2] is None:       # a real failure on the same worker: the runtime is broken
                rt.broken = WorkerError(report[0], report[1])
                raise rt.broken
            return
        time.sleep(0.001)
