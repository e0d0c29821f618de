"""Undoing a command whose allocation a worker refused: the master's check, and careful commands.

The master admits a command only when its new matrices fit (ledger.py), but
the temporaries of a kernel (pack buffers, GEMM panels, convolution
workspaces) are not in the ledger, and a worker's pool refuses them past the
device's memory or the limit. A worker cannot give up alone: the others may
be inside a collective of the same command, waiting for it.

The check. After a refused allocation in command n (in its own share, or
reported by a worker that names n as the last command it received), the
master broadcasts OOM_CHECK and waits up to AGREE_S seconds for every
worker's answer. A worker answers only between commands: one that finished
n, or one that left it. If all answer, none is waiting in a collective of n;
the master then tests, polled for up to AGREE_S seconds, that its own
device work of n is done too (its kernel returned once its NCCL calls were
queued, and one of them may wait for a worker that left: a blocking
synchronize would never return). Then n is undone: its new matrices are freed on every rank and marked on the
master (a Matrix the user already holds raises when used), every rank drops
its replica cache (a rank that left n early made different keep, evict and
LRU decisions than its peers, and the cache must be alike everywhere: a hit
skips a collective that a miss enters), and OutOfMemoryError is raised with
the runtime still usable. A worker that does not answer is inside n: the
runtime is broken (WorkerError), as for any failure. So is a command that
writes an operand in place (some workers wrote it, some did not), a plan
replay (never careful: see below), and, outside careful commands, a refusal
the master learns of only after it has sent another command.

Careful commands make the check succeed when a worker is refused while its
peers are, or will be, inside a collective with it. The master marks a
command careful (a flag in its frame's kind byte, protocol.CAREFUL) when its
ledger says the workers are under memory pressure: with the command's new
matrices, some worker's live matrices pass ledger.CAREFUL_FRACTION of its
capacity or limit (`dmath.memory.set_careful('always' | 'never' | 'auto')`,
or DMATH_CAREFUL, forces it). In-place commands are never careful: they
could not be undone anyway. In a careful command (comm/agreement.py):

- every collective entry point (collectives.py; gather_objects in
  control.py; the creation of a sub-communicator in world.py) allocates
  its buffers first, then agrees with the members of its group, and only
  then communicates. No rank is ever committed to a transfer with a member
  that might still be refused before it;
- a rank whose allocation is refused, or that learns at an agreement that a
  member has left, leaves the command: it tells every other rank (a NOTICE),
  completes the transfers it had started after agreements (its peers
  complete them too), and goes to the check;
- every worker ends the command by telling the master it is out (END), and
  the master's share ends by waiting for every worker's END or NOTICE. So
  the master never returns from a careful command, nor sends the next one,
  while a worker is in it or has left it: the refusal is always found in
  the command itself (a refusal after the last collective, with every peer
  done, included), and by the time the master checks, every worker has
  already left or finished: everyone answers.

Why point-to-point flags and a NOTICE to every rank, not an all-reduce of a
flag on each group's communicator with the refused worker joining "its next
agreement" with 0. With a single group that works: collectives run in the
same order on every member, so the refused worker's one agreement matches
every peer's next one. But a command's collectives run on several groups
(the row and column communicators of a SUMMA grid, a remap on a group then
an all-reduce on all, point-to-point scatter pairs), and the refused worker
would have to feed the next agreement of every group whose members will
wait for it: it cannot know which, because it would learn its own later
collectives only by running the rest of the kernel. Each worker that leaves
in turn has the same problem. And an all-reduce some members entered and
others never will stays pending on its communicator, shifting every later
collective there by one. A NOTICE sent to every rank answers any agreement
that waits for its sender, in whatever group, whenever it is reached; the
flags are numbered by command, so those left unread are recognised and
skipped later, and nothing is left pending on any communicator. The end of
the command must be world-wide for the same reason: only the master (every
worker's peer at the end) can hold the next command back.

The cost, in careful commands only: per collective, a flag to and from each
other member of its group, and per command a message to the master, which
then waits for the slowest worker instead of running ahead (some tens of
microseconds per command on a small CPU host: benchmarks/results/README.md,
benchmarks/probes/careful_cost.py). Outside careful commands: one attribute test per
collective and per command, and the ledger's bound of the headroom.
Agreements never touch the device; a plan replay (and so a CUDA graph
capture) never runs a careful command, as replays are not undone.

A refusal report from a careful command's worker reaches the master while
it is still inside that command; it is noted, and the runtime is declared
broken only if the command has not been left by every rank within AGREE_S
seconds (a worker stuck in a collective with one that failed after agreeing
to it: no kernel allocates between its agreement and its transfer, so that
needs a defect).
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
        reason = f"{last.op!r} writes an operand in place, which some workers had written and some had not"
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
