"""The failure policy: what a worker's failure, a hung worker, or a failure of the master's own
share means for the runtime (it breaks, or a refused allocation is undone: oom.py), and how a job
ends after one instead of hanging."""
import os
import sys
import threading
import time
import traceback

from .. import settings
from ..comm import agreement
from ..comm.control import pending_failure, report_failure
from ..comm.heartbeat import Hang
from ..errors import OutOfMemoryError, RuntimeStateError, WorkerError
from . import oom


class Failures:
    """The Runtime's checks for failures and its answers to them."""

    def check_usable(self):
        if self.forked:
            raise RuntimeStateError(
                f"this process (pid {os.getpid()}) was forked from the dmath master (pid {self.pid}) after "
                f"dmath.init(): only the master issues commands. Compute with numpy in the child, or fork "
                f"before dmath.init()")
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

    def _failure_pending(self):
        try:
            self.check_failures()
        except WorkerError:
            return True
        return False

    def _fail(self, text):
        req = report_failure(self.world, self.world.rank, text)
        # the master raises WorkerError and ends the job; if it never does
        # (it is stuck outside dmath), end the job ourselves after a grace period
        grace = settings.current.failed_worker_grace_s
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline:
            req.Test()
            time.sleep(0.01)
        sys.stderr.write(f"dmath worker {self.world.rank}: the master did not end the job "
                         f"{grace:.0f} s after this failure; aborting\n{text}")
        self.world.abort(1)



def install_excepthook(rt):
    """An uncaught exception on the master ends every process of the job (the workers would wait)."""
    previous = sys.excepthook

    def hook(kind, value, tb):
        # an uncaught exception on the master: report it, then end every process
        previous(kind, value, tb)
        if rt.forked:
            rt.child_status[0] = 1
            return          # in a child forked from the master: it ends alone (lifecycle._forked)
        sys.stderr.write("dmath: uncaught exception on the master; ending all workers\n")
        sys.stderr.flush()
        rt.world.abort(1)
    sys.excepthook = hook
