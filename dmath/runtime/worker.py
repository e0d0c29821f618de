"""The worker loop: ranks 1..P-1 receive commands and run them until the master shuts them down."""
import os
import sys
import time
import traceback

from .. import settings, tuning
from ..comm import agreement
from ..comm.control import gather_objects
from ..comm.heartbeat import Responder
from ..errors import OutOfMemoryError
from . import oom, protocol
from .entry import Entry
from .profiler import dump_profile


class Worker:
    """The Runtime's worker side."""

    def serve(self):
        """Worker loop: execute commands until the master shuts down. Never returns.

        Any exception, waiting for a command (Ctrl-C, an MPI error) or running
        one, goes to the master as a failure report.
        """
        timeout = settings.current.timeout_s
        # with a timeout, the responder also ends the job when the master falls silent (its Beacon)
        responder = Responder(self.world, self._status, timeout, self.world.abort) \
            if heartbeat(self.world) else None
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
        dump_profile(self.world.rank)
        tuning.flush_all()          # (the exit below skips Python's exit handlers)
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



def heartbeat(world):
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
