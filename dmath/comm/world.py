"""The process world: MPI when launched by mpiexec, a single process otherwise.

Owns every communicator: the control channel's, the error channel's, the
data communicator and the cached communicators of worker subgroups. Waiting
is done by polling so that a waiting process neither spins a core (several
ranks share few cores) nor misses a failure report from another worker.
"""
import os
import time

from .. import settings

_LAUNCHER_VARS = ("PMI_RANK", "PMI_SIZE", "PMIX_RANK", "OMPI_COMM_WORLD_SIZE",
                  "MPI_LOCALRANKID", "HYDRA_CONTROL_FD")

#: called on every polling round while waiting (the runtime raises worker failures from it)
_progress_hook = None


def set_progress_hook(fn):
    global _progress_hook
    _progress_hook = fn


def launched_by_mpi():
    return any(v in os.environ for v in _LAUNCHER_VARS)




def poll(done, nbytes=0):
    """Wait until `done()` is true, running the progress hook on every round.

    The first DMATH_SPIN_S seconds (plus nbytes / DMATH_SPIN_BYTES_PER_S for a
    wait on a transfer of `nbytes`: long enough for the transfer at any
    plausible host bandwidth, so that an MPI that moves bytes only while it is
    called never waits on a nap) poll continuously, yielding the core between
    tests; then the wait backs off to sleeps of at most 1 ms: an idle rank
    must leave the cores to the ranks that compute.
    """
    if done():
        return
    values = settings.current
    spin = values.spin_s + nbytes / values.spin_bytes_per_s
    start = time.perf_counter()
    nap = 0.0
    while not done():
        if _progress_hook is not None:
            _progress_hook()
        if time.perf_counter() - start < spin:
            os.sched_yield()
        else:
            nap = min(1e-3, nap + 2e-5)
            time.sleep(nap)


def wait(req, nbytes=0):
    """Complete an MPI request of a transfer of `nbytes` by polling (see `poll`)."""
    poll(req.Test, nbytes)


def waitall(reqs, nbytes=0):
    """Complete MPI requests moving `nbytes` together (see `poll`); they progress side by side."""
    pending = [r for r in reqs if r is not None]
    if not pending:
        return

    def done():
        # Test each once per round: every one of them progresses while we wait
        pending[:] = [r for r in pending if not r.Test()]
        return not pending
    poll(done, nbytes)


#: [times this process took a group's NCCL communicator]: a step whose run moves it communicated
#: (dmath/runtime/streams.py keeps such steps on the capture stream)
NCCL_USES = [0]


class Group:
    """A communicator over a sorted tuple of world ranks (MPI, plus NCCL on demand)."""

    def __init__(self, world, ranks, mpi_comm):
        self.world = world
        self.ranks = ranks
        self.size = len(ranks)
        self.rank = ranks.index(world.rank)
        self.mpi = mpi_comm
        self._nccl = None
        self._nccl_side = None

    def index(self, world_rank):
        return self.ranks.index(world_rank)

    @property
    def nccl(self):
        """This group's NCCL communicator for the compute stream, created on first use."""
        NCCL_USES[0] += 1
        if self._nccl is None:
            self._nccl = self._new_nccl()
        return self._nccl

    @property
    def nccl_side(self):
        """A second NCCL communicator, used only on the side (communication) stream.

        NCCL orders the operations of one communicator by the order in which
        ranks enqueue them; two streams sharing one communicator could run its
        kernels in different orders on different GPUs and deadlock. Each
        communicator therefore belongs to exactly one stream.
        """
        NCCL_USES[0] += 1
        if self._nccl_side is None:
            self._nccl_side = self._new_nccl()
        return self._nccl_side

    def _new_nccl(self):
        from cupy.cuda import nccl
        uid = nccl.get_unique_id() if self.rank == 0 else None
        uid = self.mpi.bcast(uid, root=0) if self.mpi is not None else uid
        return nccl.NcclCommunicator(self.size, uid, self.rank)

    def close_nccl(self):
        for name in ("_nccl", "_nccl_side"):
            comm = getattr(self, name)
            if comm is not None:
                comm.destroy()
                setattr(self, name, None)


class World:
    """rank, size, local rank and the communicators of this process."""

    def __init__(self):
        self.mpi_module = None
        self.rank, self.size, self.local_rank, self.local_size = 0, 1, 0, 1
        self.thread_multiple = False    # MPI may be called from several threads at once (the heartbeat's)
        self._groups = {}
        if launched_by_mpi():
            from mpi4py import MPI
            self.mpi_module = MPI
            world = MPI.COMM_WORLD
            self.rank, self.size = world.Get_rank(), world.Get_size()
            self.thread_multiple = MPI.Query_thread() == MPI.THREAD_MULTIPLE
            # separate communicators so control, error and data traffic never match each other
            self.ctl = world.Dup()
            self.err = world.Dup()
            self.data = world.Dup()
            self.hb = world.Dup()      # the heartbeat's pings and answers (heartbeat.py)
            self.agree = world.Dup()   # the agreements of careful commands (agreement.py)
            node = world.Split_type(MPI.COMM_TYPE_SHARED)
            self.local_rank, self.local_size = node.Get_rank(), node.Get_size()
            node.Free()
        # (an attribute, not a property: the control channel reads it on every command)
        self.is_mpi = self.mpi_module is not None and self.size > 1

    def group(self, ranks):
        """The cached `Group` over `ranks` (this rank must be a member); collective over its members."""
        ranks = tuple(sorted(ranks))
        g = self._groups.get(ranks)
        if g is None:
            if ranks == tuple(range(self.size)) or not self.is_mpi:
                comm = self.data if self.is_mpi else None
            else:
                from . import agreement     # (here: it imports this module; a new group is rare)
                if agreement.state is not None:
                    # making the communicator is collective over `ranks` and cannot be left half way:
                    # in a careful command every member first agrees to it
                    agreement.agree(ranks)
                mgroup = self.data.Get_group().Incl(list(ranks))
                comm = self.data.Create_group(mgroup)
                mgroup.Free()
            g = self._groups[ranks] = Group(self, ranks, comm)
        return g

    def close(self):
        """Release the NCCL communicators (before MPI_Finalize, on every rank at shutdown)."""
        from .. import backend
        if any(g._nccl is not None or g._nccl_side is not None for g in self._groups.values()):
            backend.current().synchronize_all()
        for g in self._groups.values():
            g.close_nccl()

    def abort(self, code=1):
        """End every process of the job with exit status `code`."""
        if self.is_mpi:
            import sys
            sys.stdout.flush()
            sys.stderr.flush()
            # the process manager forwards output asynchronously and kills
            # every rank on abort: give it a moment to pass on what was printed
            time.sleep(0.5)
            self.mpi_module.COMM_WORLD.Abort(code)
        os._exit(code)
