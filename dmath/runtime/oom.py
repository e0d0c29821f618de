"""Undoing a command whose allocation a worker refused, when every worker can be seen to be out of it.

The master admits a command only when its new matrices fit (ledger.py), but
the temporaries of a kernel (pack buffers, GEMM panels, convolution
workspaces) are not in the ledger, and a worker's pool refuses them past the
device's memory or the limit. A worker cannot give up alone: the others may
be inside a collective of the same command, waiting for it.

So the master asks. After a refused allocation in command n (in its own
share, or reported by a worker that names n as the last command it
received), the master broadcasts OOM_CHECK and waits up to AGREE_S seconds
for every worker's answer. A worker answers only between commands: one that
finished n, or one whose allocation was refused (it left the rest of n). If
all answer, none is waiting in a collective of n, and n is undone: its new
matrices are freed on every rank and marked on the master (a Matrix the user
already holds raises when used), and OutOfMemoryError is raised with the
runtime still usable. A worker that does not answer is inside n, waiting for
a peer that left: the runtime is broken (WorkerError), as for any failure.
So is a command that writes an operand in place (some workers wrote it, some
did not), a plan replay, and a refusal the master learns of only after it
has sent another command (the refusing worker cannot run that one).

The usual case is the safe one: workers allocate alike, so the master's own
share is refused too, at the same point, before any collective.
"""
import time

from ..comm.control import gather_objects, gather_within, pending_failure, report_failure
from ..errors import OutOfMemoryError, RuntimeStateError, WorkerError
from . import protocol

#: seconds the master waits for every worker's answer before it declares the runtime broken
AGREE_S = 10.0


def worker_refused(rt, text):
    """Worker: an allocation of the command just received was refused. Report it, then answer the check.

    Raises (a failure that ends the job) when the master's next message is not the check.
    """
    report_failure(rt.world, rt.world.rank, text, rt.ctl.seq)
    rt.activity = ("waiting for the master's check after a refused allocation", rt.activity[1])
    message = rt.ctl.recv(protocol.total_length)
    kind, _, _, _, frees, _ = protocol.decode(message)
    if kind != protocol.OOM_CHECK:
        raise RuntimeStateError(f"worker {rt.world.rank}: the master sent another command before it had "
                                f"seen that this worker ran out of memory:\n{text}")
    rt._free(frees)
    # an NCCL collective this worker queued before the refusal runs on: answer only once it is done
    # (if it waits for a worker that left the command, no answer comes and the master gives up)
    rt.backend.synchronize_all()
    gather_objects(rt.world, ("refused", text))


def worker_check(rt):
    """Worker: the master's check after some rank's refusal; this one finished the command."""
    # on a GPU, "finished" includes the collectives the command queued on the device
    rt.backend.synchronize_all()
    gather_objects(rt.world, ("done", None))


class LastCommand:
    """Master: what undoing the last command needs: its operation, control message number, new handles."""
    __slots__ = ("op", "seq", "new_handles", "in_place")

    def __init__(self, op, seq, new_handles, in_place):
        self.op, self.seq, self.new_handles, self.in_place = op, seq, new_handles, in_place


def verdict(rt, rank, text, reported):
    """Master: the last command's allocation was refused on `rank` (traceback `text`).

    `reported`: ranks whose refusal report the master has already read. Raises
    OutOfMemoryError when the command was undone, else WorkerError (the runtime
    is broken).
    """
    last, rt.last_command = rt.last_command, None
    message, total = protocol.encode(protocol.OOM_CHECK)
    rt.deciding = True         # the check's own waits must not read the refusal reports as failures
    try:
        rt.ctl.send(message, total)
        answers = gather_within(rt.world, AGREE_S)
    finally:
        rt.deciding = False
    refused = {rank: text}
    silent = []
    for r in range(1, rt.world.size):
        if answers[r] is None:
            silent.append(r)
        elif answers[r][0] == "refused":
            refused.setdefault(r, answers[r][1])
            if r not in reported:
                _take_report(rt, r)
    first = min(refused)
    reason = None
    if silent:
        reason = (f"worker(s) {', '.join(map(str, silent))} did not answer within {AGREE_S:g} s: they are "
                  f"inside {last.op!r}, waiting for a worker that left it")
    elif last.in_place:
        reason = f"{last.op!r} writes an operand in place, which some workers had written and some had not"
    if reason is not None:
        rt.broken = WorkerError(first, refused[first] + f"\n(the operation cannot be undone: {reason})")
        raise rt.broken
    for h in last.new_handles:
        rt.release(h)           # freed on every rank with the next command
        rt.poisoned.add(h)      # until the Matrix holding it is collected (it releases it again: harmless)
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

