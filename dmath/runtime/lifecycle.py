"""Starting and ending the process's runtime: `init` (settings, world, backend, pool, heartbeat,
exit hooks) and `finalize`."""
import atexit
import faulthandler
import os
import sys
import threading

from .. import backend, memory, settings
from ..comm import World, set_progress_hook
from ..comm.control import gather_objects
from ..comm.heartbeat import Beacon, Pinger
from ..errors import RuntimeStateError
from ..memory import replicas
from . import dispatch, execute
from .core import Runtime
from .failures import install_excepthook
from .profiler import start_profile
from .worker import heartbeat


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
    world = World()
    values = _agreed_settings(world)     # checked on every rank before any of them starts serving
    dispatch.configure(values)
    execute.configure(values)
    replicas.cache.budget = values.replica_cache_bytes
    _enable_crash_stacks()
    watchdog = values.watchdog_s
    if watchdog > 0:
        # hang diagnosis: every rank prints its Python stack every `watchdog` seconds
        faulthandler.dump_traceback_later(watchdog, repeat=True)
    be = backend.select(device, world.local_rank)
    memory.install()       # the pool (on a GPU: CuPy's allocators) serves every allocation from here on
    rt = _runtime = Runtime(world, be, values.careful)
    start_profile()
    # every worker's memory, so that the master refuses what cannot fit before sending it
    capacities = gather_objects(world, memory.capacity(world.local_size))
    if world.rank != 0:
        rt.serve()
    rt.ledger.set_capacity(capacities)
    if heartbeat(world) and values.timeout_s > 0:
        rt.pinger = Pinger(world, values.timeout_s)
        rt.beacon = Beacon(world, values.timeout_s)     # the workers end the job if the master falls silent
    set_progress_hook(rt.check_failures)
    atexit.register(finalize)
    os.register_at_fork(after_in_child=_forked)
    if world.is_mpi:
        install_excepthook(rt)
    return rt


def _enable_crash_stacks():
    """A crash in native code (cuDNN, NCCL, the driver: SIGSEGV, SIGFPE, SIGABRT, SIGBUS) prints every
    thread's Python stack on this rank's stderr before the process dies, so the job's log says which
    call was running; without it a dead rank left only mpiexec's "exited on signal 11". A handler the
    program installed itself is left as it is."""
    if faulthandler.is_enabled():
        return
    try:
        faulthandler.enable(all_threads=True)
    except (RuntimeError, ValueError, OSError, AttributeError):
        pass        # no usable stderr (closed or replaced by an object without a file descriptor)


def _agreed_settings(world):
    """settings.load() on every rank, the same values on every rank, or a SettingError on every rank.

    A bad value on one rank raised there alone and left the others waiting in init() forever; a
    value that differed between ranks (Open MPI passes a variable to other hosts only with -x) made
    their decisions differ (the replica cache's keep or evict: one rank skipped a collective the
    others entered), a hang. Found by a hostile-use probe at 3 workers."""
    try:
        values, error = settings.load(), None
    except settings.SettingError as exc:
        values, error = None, str(exc)
    if not world.is_mpi:
        if error:
            raise settings.SettingError(error)
        return values
    every = world.ctl.allgather((error, values))        # (small objects, in memory; once, at init)
    bad = [(r, e) for r, (e, _) in enumerate(every) if e]
    if bad and len(bad) == len(every) and len({e for _, e in bad}) == 1:
        raise settings.SettingError(error)              # the same bad value everywhere: said as it is
    if bad:
        more = f" (and on {len(bad) - 1} other ranks)" if len(bad) > 1 else ""
        raise settings.SettingError(f"on rank {bad[0][0]}: {bad[0][1]}{more}")
    names = settings.differing([v for _, v in every])
    if names:
        raise settings.SettingError(f"{', '.join(names)} differ between ranks: every rank must see the same "
                                    f"dmath settings (only {', '.join(settings.PER_RANK)} may differ); with "
                                    f"Open MPI pass each one to every host (mpiexec -x NAME)")
    return values


def finalize():
    """Shut the workers down (also runs at exit). After a worker failure the job exits non-zero.

    Nothing in a process forked from the master after init(): its exit must not end the master's
    workers (`_forked`). Only the thread that called init() may finalize while it runs (another
    thread's shutdown crossed that thread's command: a reduction summed the drain's answer, a
    TypeError reported as a worker failure, and the job could exit 0; a hostile-use probe); at exit,
    once that thread has ended, any thread may."""
    if _runtime is not None and not _runtime.closed and _runtime.world.rank == 0:
        owner = next((t for t in threading.enumerate() if t.ident == _runtime.owner), None)
        if owner is not None and owner is not threading.current_thread():
            raise RuntimeStateError(f"dmath.finalize() must come from the thread that called dmath.init() "
                                    f"(thread {owner.name!r}, still running); this is thread "
                                    f"{threading.current_thread().name!r}")
        _runtime.shutdown()


def _forked():
    """In a child forked from an initialised process: the runtime is the parent's. The child may not
    issue commands (check_usable says why) nor shut the workers down at its exit, and an uncaught
    exception in it ends only the child (failures.install_excepthook).

    Nor may it finalize MPI: mpi4py's MPI_Finalize at exit, a collective of the parent's job, would
    wait forever for ranks that never join. So the child leaves through os._exit once its own exit
    handlers (those registered after the fork) have run, with the status its sys.exit() or an
    uncaught exception gave (0 otherwise: a `raise SystemExit(n)` is not seen)."""
    if _runtime is None or _runtime.world.rank != 0:
        return
    _runtime.forked = True
    _runtime.closed = True
    if _runtime.world.is_mpi:
        status = _runtime.child_status = [0]
        leave = sys.exit

        def exit_noting(code=None):
            status[0] = code if isinstance(code, int) else (0 if code is None else 1)
            leave(code)
        sys.exit = exit_noting
        atexit.register(_leave_child)


def _leave_child():
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(_runtime.child_status[0])
