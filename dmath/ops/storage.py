"""Memory on every worker: the limit, pool statistics, memory kinds (to_memory, prefetch, and
the kind of every new matrix: `create`).

The kernels act on each worker's pool (`dmath.memory`); the master-side
functions validate and dispatch them. This module registers itself with
`dmath.memory` (whose public stats/set_limit/clear become commands) and with
the runtime's ledger (which reports a worker's pool in a refusal), so that
those lower layers never import this one.
"""
from typing import NamedTuple

from .. import backend, memory
from ..comm.control import gather_objects
from ..errors import OutOfMemoryError, PlanError
from ..gpu import cudnn
from ..memory import kinds, replicas
from ..runtime import Shard, define, is_initialized, runtime
from ..runtime import ledger, plans
from .base import dispatch, meta


class ReleaseArgs(NamedTuple):
    """Static arguments of `memory_release`: whether captured CUDA graphs give their memory back too."""
    graphs: bool


SET_LIMIT = define("memory_set_limit")
STATS = define("memory_stats")
WINDOW = define("memory_window")
DROP_COPIES = define("memory_drop_copies")
RELEASE = define("memory_release", ReleaseArgs)
DEVICE_FREE = define("memory_device_free")
AVAILABLE = define("memory_available")
TO_MEMORY = define("to_memory")
PREFETCH = define("prefetch")


# ---- the limit and the statistics ---------------------------------------------------
#: the replica-cache budget in force before a limit was set (restored when it is lifted)
_budget_before_limit = []


@SET_LIMIT.kernel()
def _set_limit(call):
    nbytes = call.scalars[0]
    limit = None if nbytes < 0 else int(nbytes)
    memory.set_local_limit(limit)
    # replica copies get at most half the limit. Every rank runs this same
    # command and the cache counts global bytes, so all evict the same entries.
    if limit is None:
        if _budget_before_limit:
            replicas.set_budget(_budget_before_limit.pop())
    else:
        if not _budget_before_limit:
            _budget_before_limit.append(replicas.cache.budget)
        replicas.set_budget(min(_budget_before_limit[0], limit // 2))
    return []


@STATS.kernel()
def _stats(call):
    call.result = gather_objects(call.world, memory.local_stats())
    return []


@WINDOW.kernel()
def _window(call):
    """scalars[0] 1: every worker starts measuring the most bytes its pool's new blocks hold at once; 0:
    each reports (that peak, whether it is exact (pool.window_exact), the bytes in use now, those of its
    replica copies) for a recorded block (runtime/plans.py)."""
    pool = memory.pool.current()
    if call.scalars[0]:
        pool.open_window()
    else:
        grown = int(pool.close_window())
        copies = replicas.cache.local_bytes(memory.block_bytes)
        call.result = gather_objects(call.world, (grown, bool(pool.window_exact),
                                                  int(memory.local_stats()["in_use"]), int(copies)))
    return []


def _memory_window(start):
    """plans.set_memory_hooks' window: open the workers' windows, or close them and return each one's
    (peak of its new blocks, whether exact, bytes in use, bytes of replica copies), a list by rank."""
    result = dispatch("memory_window", scalars=(1 if start else 0,))[1]
    return None if start else list(result)


@DROP_COPIES.kernel()
def _drop_copies_kernel(call):
    """Every worker drops its replica copies (before a replay they might not leave room for)."""
    replicas.cache.clear()
    call.rt.replicas.clear()     # (the master's ledger of those copies; unused on other ranks)
    return []


def _drop_copies():
    """plans.set_memory_hooks' drop_copies: every worker drops its replica copies (a cache: the next
    GEMM that wants one makes it again)."""
    dispatch("memory_drop_copies")


def _release_all(rt, graphs=True):
    """Give back everything a worker holds that nothing needs: replica copies, the memory of captured
    CUDA graphs (replayed plans capture again; kept with graphs=False), the cuDNN workspace (the
    next convolution makes it again; a timed plan that was not chosen may have grown it), the
    pool's cached blocks. Returns the bytes released.

    Every rank runs it in the same command, so the replica caches stay alike.
    """
    replicas.cache.clear()
    rt.replicas.clear()          # the master's ledger of those copies (unused on other ranks)
    released = sum(replayer.release_graph() for replayer in rt.programs.values()) if graphs else 0
    cudnn.release_workspace()
    return released + memory.release_cached()


@RELEASE.kernel()
def _release(call):
    """Every worker gives its cached memory back; the master gets (bytes released, pool stats) per worker."""
    released = _release_all(call.rt, call.entry.static.graphs)
    call.result = gather_objects(call.world, (released, memory.local_stats()))
    return []


@DEVICE_FREE.kernel()
def _device_free(call):
    """Free device memory per worker, after the worker gave its cached memory back (GPU only)."""
    _release_all(call.rt)
    free, _ = backend.current().xp.cuda.runtime.memGetInfo()
    call.result = gather_objects(call.world, int(free))
    return []


@AVAILABLE.kernel()
def _available(call):
    call.result = gather_objects(call.world, memory.free_bytes(call.world.local_size))
    return []


def not_recorded(name):
    """PlanError inside a dmath.record() block for `name`, a call whose answer is the master's (a replay
    would run its command again and return the workers' raw answer, or drop caches at every step)."""
    if runtime().recorder is not None:
        raise PlanError(f"{name} cannot be recorded into a plan: a replay would run it again, its answer "
                        f"lost; call it outside the record block")


class _Commands:
    """What dmath.memory's public functions run once dmath is initialised (see set_command_hook)."""

    @staticmethod
    def active():
        return is_initialized()

    @staticmethod
    def set_limit(nbytes):
        if runtime().recorder is not None:
            # a replay would set the workers' limit again, the master's account not (a hostile-use
            # probe: the limit lifted after the block came back on the workers at every replay)
            raise PlanError("dmath.memory.set_limit cannot be recorded into a plan: a replay would set the "
                            "workers' limit again behind the master's back; set it outside the record block")
        dispatch("memory_set_limit", scalars=(-1 if nbytes is None else nbytes,))
        runtime().ledger.set_limit(nbytes)

    @staticmethod
    def set_careful(mode):
        runtime().ledger.set_careful(mode)      # the master decides per command; nothing to send

    @staticmethod
    def careful():
        return runtime().ledger.careful

    @staticmethod
    def stats():
        not_recorded("dmath.memory.stats()")
        per_worker = dispatch("memory_stats")[1]
        for d, held in zip(per_worker, runtime().ledger.per_worker()):
            d["matrices"] = held
        return per_worker

    @staticmethod
    def available():
        not_recorded("dmath.memory.available()")
        free = dispatch("memory_available")[1]
        ledger = runtime().ledger
        if ledger.limit is None:
            return free
        return [max(0, min(f, ledger.limit - held)) for f, held in zip(free, ledger.per_worker())]

    @staticmethod
    def clear(graphs=True):
        not_recorded("dmath.memory.clear()")
        return [released for released, _ in dispatch("memory_release", static=RELEASE.static(graphs=graphs))[1]]


def _report(rank):
    """The refused worker's own view, after every worker released its cached blocks."""
    if not is_initialized() or runtime().recorder is not None:
        return ""          # no runtime, or inside a record() block, where no command of ours may go
    released, st = dispatch("memory_release", static=RELEASE.static(graphs=True))[1][rank]
    return (f"Worker {rank}'s pool holds {st['in_use']:,} bytes in use and {st['cached']:,} cached "
            f"after releasing {released:,} cached bytes.")


memory.set_command_hook(_Commands)
ledger.set_refusal_reporter(_report)
plans.set_memory_hooks(_memory_window, _drop_copies)


# ---- memory kinds ---------------------------------------------------------------------
def check_kind(kind):
    """`kind` validated ('device', 'host', 'managed', 'cuda_managed'; None: the backend's default)."""
    return kinds.check(kind)


def kind_scalar(kind):
    """The kind as a command scalar (kinds never enter a signature)."""
    return kinds.code(kind)


def new_shard(arrays, dist, dtype, kind):
    """A new shard in memory `kind` that takes over `arrays` (see memory.kinds.store)."""
    pieces, home = kinds.store(arrays, kind)
    return Shard(pieces, dist, dtype, kind, home)


def compute_empty(kind, shape, dtype):
    """An array a creation kernel fills for a shard of `kind` (memory.kinds.compute_empty)."""
    return kinds.compute_empty(kind, shape, dtype)


def pooled(kind):
    """Whether matrices of `kind` count against the pool's limit and capacity (dispatch's `pooled`)."""
    return kinds.pooled(kind)


def check_room(kind, m):
    """Refuse, on the master, a matrix outside the capped pool that some worker has no room for.

    A 'host' matrix on a GPU (pinned host memory) is checked against each worker's share of the
    host memory measured at init; a 'cuda_managed' one against the free device memory now.
    """
    if kinds.pooled(kind):
        return                 # the ledger checks it, in Runtime.call
    led = runtime().ledger
    need = led.worker_bytes(m)
    if kind != "cuda_managed":
        led.check_host(m, need)
        return
    free = dispatch("memory_device_free")[1]
    for r, (n, f) in enumerate(zip(need, free)):
        if n > f:
            raise OutOfMemoryError(
                f"memory='cuda_managed': the {m.shape} {m.dtype} matrix needs {n:,} bytes of unified memory "
                f"on worker {r}, whose device has {f:,} bytes free (after releasing the pool's cached "
                f"blocks); unified memory is not allowed to oversubscribe the device")


def create(out, op, kind, static=(), scalars=(), payload=None):
    """Run creation kernel `op` for a new matrix `out` (a Meta) in the validated memory `kind`; the Matrix.

    The kind travels as the command's last scalar, never in its signature.
    """
    check_room(kind, out)
    scalars = tuple(scalars) + (kind_scalar(kind),)
    made = dispatch(op, [], [out], static=static, scalars=scalars, payload=payload, pooled=pooled(kind))
    return placed(made[0][0], kind)


def placed(m, kind):
    """The new Matrix m, marked as held in memory `kind`."""
    m._memory = kind
    return m


def to_memory(m, kind):
    """Master half of Matrix.to_memory: a new matrix with m's layout and values in memory `kind`."""
    kind = check_kind(kind)
    out = meta(m)
    check_room(kind, out)
    made = dispatch("to_memory", [m], [out], scalars=(kinds.code(kind),), pooled=kinds.pooled(kind))[0][0]
    return placed(made, kind)


@TO_MEMORY.kernel()
def _to_memory(call):
    src = call.inputs[0]
    kind = kinds.from_code(call.scalars[0])
    return [new_shard(kinds.copy_for(src, kind), call.entry.out_dists[0], src.dtype, kind)]


def prefetch(m):
    """Start copying a 'host' or 'managed' matrix to the devices (nothing to do on the CPU backend)."""
    if backend.current().is_gpu and m.memory in ("host", "managed"):
        dispatch("prefetch", [m])


@PREFETCH.kernel()
def _prefetch(call):
    kinds.prefetch(call.inputs[0])
    return []
