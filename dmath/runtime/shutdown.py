"""How the runtime ends: the master's shutdown of the workers (normally, or by aborting the job
after a failure) and the CUDA graphs released before the communicators go."""
import gc
import sys

from . import protocol
from .profiler import dump_profile


class Shutdown:
    """The Runtime's shutdown."""

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
        if self.beacon is not None:
            self.beacon.stop()      # after SHUTDOWN: the workers stop listening for beats once they get it
        self._release_graphs()
        dump_profile(0)
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
