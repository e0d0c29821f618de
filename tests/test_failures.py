"""Failures end the job: each case launches its own 3-worker job with mpiexec.

These run once, in the plain `pytest tests` stage (they are not under
tests/dist), and need an mpiexec: the one next to this Python (the venv's
MPICH) or else one on PATH.
"""
import os
import subprocess
import sys
import textwrap
import time

import pytest

from _jobs import MPIEXEC, job_env

WORKERS = 3
TIMEOUT_S = 60
#: "within seconds": startup of 3 Python ranks plus the failure handling
PROMPT_S = 30

pytestmark = pytest.mark.skipif(MPIEXEC is None, reason="no mpiexec found")


def run_job(tmp_path, source, n=WORKERS, **env):
    """Run `source` as a script under mpiexec -n n; returns (returncode, stdout, stderr, seconds)."""
    script = tmp_path / "job.py"
    script.write_text(textwrap.dedent(source))
    cmd = [MPIEXEC, "-n", str(n), sys.executable, str(script)]
    t0 = time.monotonic()
    try:
        p = subprocess.run(cmd, cwd=str(tmp_path), env=job_env(**env), capture_output=True, text=True,
                           timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"the job hung for {TIMEOUT_S} s:\nstdout:\n{exc.stdout}\nstderr:\n{exc.stderr}")
    return p.returncode, p.stdout, p.stderr, time.monotonic() - t0


FAILING_KERNEL = """
    import sys, time
    import dmath
    from dmath.runtime import kernel
    from dmath.ops.base import dispatch
    from dmath.comm.control import gather_objects

    FAILING = {failing}

    # registered before init, so every rank (workers never return from init) has it
    @kernel("test_fail_on_rank1")
    def _fail(call):
        if call.rank == FAILING:
            raise ValueError(f"injected failure on rank {{FAILING}}")
        if call.entry.static == ("wait",):
            gather_objects(call.world, call.rank)   # the master waits for the failed rank here
        return []

    dmath.init(device="cpu")
    a = dmath.ones((6, 4), layout=dmath.ColBlock())
    assert a.sum() == 24.0
    t0 = time.monotonic()
    try:
        dispatch("test_fail_on_rank1", static=({mode!r},))
        for _ in range(10000):            # the failure surfaces at the next wait at the latest
            a.sum()
        print("NO ERROR RAISED", flush=True)
        sys.exit(3)
    except dmath.WorkerError as e:
        assert e.rank == FAILING, e.rank
        assert f"injected failure on rank {{FAILING}}" in e.traceback, e.traceback
        assert "ValueError" in e.traceback
        assert f"injected failure on rank {{FAILING}}" in str(e)
        print(f"WORKER_ERROR_CAUGHT rank={{e.rank}} after {{time.monotonic() - t0:.2f}}s", flush=True)
    try:
        a.sum()
        print("RUNTIME STILL ACCEPTS COMMANDS", flush=True)
    except dmath.RuntimeStateError:
        print("RUNTIME_REFUSES_OK", flush=True)
    # falling off the end: finalize must end the job with a non-zero status
"""


@pytest.mark.parametrize("mode,failing", [("after", 1), ("wait", 1), ("after", 0)],
                         ids=["fails_between_waits", "fails_while_master_waits", "masters_own_share_fails"])
def test_worker_failure_reaches_master_and_job_exits_nonzero(tmp_path, mode, failing):
    rc, out, err, seconds = run_job(tmp_path, FAILING_KERNEL.format(mode=mode, failing=failing))
    assert f"WORKER_ERROR_CAUGHT rank={failing}" in out, f"stdout:\n{out}\nstderr:\n{err}"
    assert "RUNTIME_REFUSES_OK" in out, out
    assert "NO ERROR RAISED" not in out
    assert rc != 0, f"the job exited 0 after a worker failure\n{out}\n{err}"
    assert seconds < PROMPT_S, f"the job took {seconds:.1f} s to end"


def test_failed_worker_ends_the_job_when_the_master_never_looks(tmp_path):
    """A master stuck outside dmath: the failed worker ends the job after its grace period."""
    rc, out, err, seconds = run_job(tmp_path, """
        import time
        import dmath
        from dmath.runtime import kernel
        from dmath.ops.base import dispatch

        @kernel("test_fail_quietly")
        def _fail(call):
            if call.rank == 2:
                raise ValueError("injected failure on rank 2")
            return []

        dmath.init(device="cpu")
        dispatch("test_fail_quietly")
        print("DISPATCHED", flush=True)
        time.sleep(45)                    # never calls dmath again
        print("MASTER_WOKE", flush=True)
    """, DMATH_FAILED_WORKER_GRACE_S="2")
    assert "DISPATCHED" in out, f"stdout:\n{out}\nstderr:\n{err}"
    assert "MASTER_WOKE" not in out
    assert rc != 0
    assert "injected failure on rank 2" in err
    assert seconds < PROMPT_S, f"the job took {seconds:.1f} s to end"


def test_uncaught_master_exception_ends_the_job(tmp_path):
    rc, out, err, seconds = run_job(tmp_path, """
        import dmath
        dmath.init(device="cpu")
        a = dmath.random.rand((40, 30), layout=dmath.Block2D())
        b = a.remap(dmath.ColBlock())
        print("WORK_DONE", round((a - b).norm(), 6), flush=True)
        raise RuntimeError("master failure on purpose")
    """)
    assert "WORK_DONE 0.0" in out, f"stdout:\n{out}\nstderr:\n{err}"
    assert "master failure on purpose" in err
    assert rc != 0
    assert seconds < PROMPT_S, f"the job took {seconds:.1f} s to end"


NORMAL = """
    import numpy as np
    import dmath
    dmath.init(device="cpu")
    assert dmath.num_workers() == {n}
    x = np.arange(35.0).reshape(7, 5)
    a = dmath.from_numpy(x, dmath.RowBlock())
    b = (a.remap(dmath.BlockCyclic((2, 2))) * 2.0).remap(dmath.Replicated())
    assert np.array_equal(b.to_numpy(), 2 * x)
    print("NORMAL_DONE", flush=True)
"""


@pytest.mark.parametrize("attempt", [1, 2, 3])
def test_normal_job_exits_zero(tmp_path, attempt):
    # repeated: a clean shutdown must exit 0 every time (the exit path once raced
    # with MPICH's process manager and sometimes ended in SIGKILL)
    rc, out, err, seconds = run_job(tmp_path, NORMAL.format(n=WORKERS))
    assert "NORMAL_DONE" in out, f"stdout:\n{out}\nstderr:\n{err}"
    assert rc == 0, f"exit {rc}\nstdout:\n{out}\nstderr:\n{err}"
    assert "BAD TERMINATION" not in out + err


def test_explicit_finalize_then_exit(tmp_path):
    rc, out, err, _ = run_job(tmp_path, """
        import dmath
        dmath.init(device="cpu")
        s = dmath.ones((5, 5)).sum()
        dmath.finalize()
        dmath.finalize()          # idempotent
        try:
            dmath.ones((2, 2))
        except dmath.RuntimeStateError:
            print("FINALIZED_OK", s, flush=True)
    """)
    assert "FINALIZED_OK 25.0" in out, f"stdout:\n{out}\nstderr:\n{err}"
    assert rc == 0, err


def test_a_worker_exit_handler_that_needs_the_interpreter(tmp_path):
    # Workers leave through the C library's exit(). A C-level exit handler (a C++ destructor of a
    # library a kernel imported: PyTorch's, for one) that calls into Python needs the GIL held by
    # the exiting thread: with it let go, the worker aborted and the job exited 6 after a clean run.
    rc, out, err, _ = run_job(tmp_path, """
        import ctypes
        import dmath
        from dmath.runtime import kernel
        from dmath.ops.base import dispatch

        @kernel("test_exit_handler")
        def _handler(call):
            # PyThreadState_Get ends the process when no thread state is held
            # (registered as a C++ destructor is: __cxa_atexit, what atexit() itself calls), on the
            # workers only: the master leaves through Python's finalisation, whose handlers run after
            # the interpreter is gone, which real libraries check for
            if call.rank != 0:
                ctypes.CDLL(None).__cxa_atexit(ctypes.cast(ctypes.pythonapi.PyThreadState_Get, ctypes.c_void_p),
                                               None, None)
            return []

        dmath.init(device="cpu")
        dispatch("test_exit_handler")
        print("HANDLERS_SET", dmath.ones((4, 4)).sum(), flush=True)
    """)
    assert "HANDLERS_SET 16.0" in out, f"stdout:\n{out}\nstderr:\n{err}"
    assert rc == 0, f"exit {rc}\nstdout:\n{out}\nstderr:\n{err}"
    assert "Fatal Python error" not in err, err


REPLAYED_COLLECTIVES = """
    import numpy as np
    import dmath
    dmath.init()
    P = dmath.num_workers()
    part = dmath.from_numpy(np.ones((64, 32), np.float32), dmath.Partial())
    x = dmath.zeros((64, 32), dtype="float32", layout=dmath.Replicated())
    with dmath.record() as step:
        x += part.remap(dmath.Replicated(), background=True)
        x += part.remap(dmath.Replicated())
    for _ in range(4):          # (recording ran it once too) from the second replay on, a GPU runs the step as one CUDA graph
        step.replay()
    assert np.allclose(x.to_numpy(), 10.0), x.to_numpy()[0, 0]
    print("REPLAYED", dmath.stats()[0]["plan_graphs"], flush=True)
"""


def test_a_job_whose_step_captured_collectives_exits(tmp_path):
    # NCCL's communicator destroy waits for every CUDA graph that captured one of its all-reduces;
    # the runtime destroys its graphs first, or this exit hangs (a GPU-only defect: run the suite
    # with DMATH_JOB_DEVICE=gpu on a GPU machine; on the CPU it checks the same exit path)
    device = os.environ.get("DMATH_JOB_DEVICE", "cpu")
    rc, out, err, seconds = run_job(tmp_path, REPLAYED_COLLECTIVES, n=2, DMATH_DEVICE=device)
    assert "REPLAYED" in out, f"stdout:\n{out}\nstderr:\n{err}"
    assert rc == 0, f"exit {rc}\nstdout:\n{out}\nstderr:\n{err}"
    assert seconds < PROMPT_S, seconds


REFUSALS = """
    import time
    import numpy as np
    import dmath
    from dmath.runtime import kernel
    from dmath.ops.base import dispatch, new_meta
    from dmath.ops.creation import _fill
    from dmath.comm import collectives

    @kernel("test_refuse")
    def _refuse(call):
        # static (who, then): `who` ("all" or a rank) is refused an allocation; the others go on,
        # and with then == "collective" enter an all-reduce over every worker (so they wait there
        # for the refused one), with then == "make" fill the new matrix
        who, then = call.entry.static
        if who == "all" or call.rank == who:
            raise dmath.OutOfMemoryError("injected refusal")
        if then == "collective":
            total = np.ones(4)
            collectives.allreduce(call.world.group(tuple(range(call.world.size))), total)
        if then == "make":
            return _fill(call)
        return []

    dmath.init(device="cpu")
    a = dmath.ones((6, 4), layout=dmath.ColBlock())

    def refused(who, then="none", pause=0.0):
        outs = [new_meta(dmath.RowBlock(), (6, 4), "float64")] if then == "make" else []
        try:
            made = dispatch("test_refuse", outputs=outs, static=(who, then), scalars=(7.0, 0.0))[0]
            time.sleep(pause)               # the worker's report arrives while the master waits
            a.sum()
        except dmath.OutOfMemoryError as e:
            print("UNDONE", str(e).splitlines()[0][:60], flush=True)
            return
        print("NOT REFUSED", made, flush=True)

    def alike():
        # the master's ledger and every worker's pool agree after the undo: no matrix or buffer is left
        stats = dmath.memory.stats()
        return len({{d["matrices"] for d in stats}}) == 1 and len({{d["in_use"] for d in stats}}) == 1

    {body}
"""

ONE_WORKER_AT_A_TIME = """
    refused("all")
    print("SUM", a.sum(), flush=True)
    refused(1, pause=0.5)               # found at the next command, before it is sent
    print("SUM", a.sum(), flush=True)
    made, _ = dispatch("test_refuse", outputs=[new_meta(dmath.RowBlock(), (6, 4), "float64")],
                       static=(2, "make"), scalars=(7.0, 0.0))
    time.sleep(0.5)
    try:
        a.sum()
    except dmath.OutOfMemoryError as e:
        print("UNDONE", str(e).splitlines()[0][:60], flush=True)
    try:
        made[0].sum()
    except dmath.OutOfMemoryError as e:
        print("POISONED", str(e)[:60], flush=True)
    print("SUM", a.sum(), dmath.memory.stats()[2]["matrices"] == dmath.memory.stats()[1]["matrices"], flush=True)
    print("END", flush=True)
"""


def test_a_refused_allocation_is_undone_when_every_worker_is_out_of_the_command(tmp_path):
    rc, out, err, _ = run_job(tmp_path, REFUSALS.format(body=ONE_WORKER_AT_A_TIME.strip()))
    assert out.count("UNDONE test_refuse: worker") == 3, f"stdout:\n{out}\nstderr:\n{err}"
    assert "UNDONE test_refuse: worker 0, 1, 2 could not allocate" in out
    assert "UNDONE test_refuse: worker 1 could not allocate" in out
    assert "UNDONE test_refuse: worker 2 could not allocate" in out
    assert "POISONED reduce_all: an operand was never computed" in out
    assert out.count("SUM 24.0") == 3 and "SUM 24.0 True" in out and "END" in out
    assert "NOT REFUSED" not in out
    assert rc == 0, f"exit {rc}\nstdout:\n{out}\nstderr:\n{err}"


INSIDE_A_COLLECTIVE = """
    dmath.memory.set_careful({mode!r})
    for who in {whos}:
        # `who` is refused while every other rank, the master included, is inside the all-reduce
        t0 = time.monotonic()
        try:
            dispatch("test_refuse", static=(who, "collective"))
            print("NO ERROR", flush=True)
        except dmath.OutOfMemoryError as e:
            print("UNDONE", str(e).splitlines()[0][:60], f"{{time.monotonic() - t0:.1f}}s", flush=True)
        except dmath.WorkerError as e:
            print("BROKEN", e.rank, flush=True)
            break
        print("SUM", a.sum(), alike(), flush=True)
    print("END", dmath.stats()[1]["careful_commands"] > 0, flush=True)
"""


def test_a_refusal_inside_a_collective_is_undone_in_a_careful_command(tmp_path):
    # the others wait in the all-reduce's agreement, see that the refused rank left, leave too and
    # answer the master's check: undone, every time, and the job ends normally
    rc, out, err, seconds = run_job(tmp_path, REFUSALS.format(
        body=INSIDE_A_COLLECTIVE.format(mode="always", whos=[1, 2, 0, 1]).strip()))
    assert out.count("UNDONE test_refuse: worker 1 could not allocate") == 2, f"stdout:\n{out}\nstderr:\n{err}"
    assert "UNDONE test_refuse: worker 2 could not allocate" in out
    assert "UNDONE test_refuse: worker 0 could not allocate" in out
    assert out.count("SUM 24.0 True") == 4 and "END True" in out
    assert "NO ERROR" not in out and "BROKEN" not in out
    undo_s = [float(w[:-1]) for line in out.splitlines() if line.startswith("UNDONE") for w in line.split()[-1:]]
    assert max(undo_s) < 5, undo_s          # left at the agreement, not found by a timeout
    assert rc == 0, f"exit {rc}\nstdout:\n{out}\nstderr:\n{err}"
    assert seconds < PROMPT_S


def test_a_refusal_inside_a_collective_breaks_the_runtime_outside_careful_commands(tmp_path):
    # careful commands turned off: rank 1 is refused while the others wait for it in the all-reduce's
    # exchange, which nothing can bring them out of; the runtime is broken and the job ends non-zero
    rc, out, err, seconds = run_job(tmp_path, REFUSALS.format(
        body=INSIDE_A_COLLECTIVE.format(mode="never", whos=[1]).strip()))
    assert "BROKEN 1" in out, f"stdout:\n{out}\nstderr:\n{err}"
    assert "UNDONE" not in out and "NO ERROR" not in out
    assert rc != 0 and seconds < PROMPT_S


UNEVEN_REMAP = """
    import sys
    import numpy as np
    import dmath
    sys.path.insert(0, {tests!r})
    from _cases import uneven_remap

    dmath.init(device="cpu")
    dmath.memory.set_careful({mode!r})
    x, a, cap = uneven_remap(dmath.num_workers())
    dmath.memory.set_limit(cap)
    try:
        a.remap(dmath.ColBlock())
        print("NO ERROR", flush=True)
    except dmath.OutOfMemoryError as e:
        print("UNDONE", str(e).splitlines()[0][:40], flush=True)
    except dmath.WorkerError as e:
        print("BROKEN", e.rank, "OutOfMemoryError" in e.traceback, flush=True)
        raise SystemExit(1)
    dmath.memory.set_limit(None)
    print("VALUES", np.array_equal(a.remap(dmath.ColBlock()).to_numpy(), x), flush=True)
"""


@pytest.mark.parametrize("mode", ["auto", "never"])
def test_a_remap_whose_pack_buffer_one_worker_cannot_hold(tmp_path, mode):
    # a real operation: the last worker's pool refuses its pack buffer while the others are already
    # at the exchange with it. The memory pressure makes the remap careful ('auto'): undone, and the
    # job goes on. Without careful commands the others wait in the exchange: the runtime is broken
    tests = os.path.dirname(os.path.abspath(__file__))
    rc, out, err, seconds = run_job(tmp_path, UNEVEN_REMAP.format(tests=tests, mode=mode))
    if mode == "auto":
        assert "UNDONE remap: worker 2 could not allocate" in out, f"stdout:\n{out}\nstderr:\n{err}"
        assert "VALUES True" in out and rc == 0, f"exit {rc}\nstdout:\n{out}\nstderr:\n{err}"
    else:
        assert "BROKEN 2 True" in out, f"stdout:\n{out}\nstderr:\n{err}"
        assert rc != 0
    assert seconds < PROMPT_S


QUEUED = """
    import os, sys, time
    # the master queues every local command here, however long its share took (init reads these: a
    # loaded machine otherwise finds a share too slow to queue, and the failure arrives a command early)
    os.environ["DMATH_BATCH_AGE_US"] = os.environ["DMATH_BATCH_SHARE_US"] = "1e9"
    import dmath
    from dmath.runtime import kernel
    from dmath.ops.base import dispatch, new_meta
    from dmath.ops.creation import _fill

    @kernel("test_queued", local=True)
    def _queued(call):
        # scalars (rank, how, value, kind): `rank` fails in this command (-1: nobody) by raising
        # ValueError (how 1) or being refused an allocation (how 2); else the new matrix is filled
        rank, how = int(call.scalars[0]), call.scalars[1]
        if call.rank == rank and how == 1:
            raise ValueError(f"injected failure in a queued command on rank {{rank}}")
        if call.rank == rank and how == 2:
            raise dmath.OutOfMemoryError("injected refusal in a queued command")
        with open(os.path.join({out!r}, f"ran.{{call.rank}}"), "a") as f:
            f.write("x")
        return _fill(call)

    def queued(rank=-1, how=0):
        return dispatch("test_queued", outputs=[new_meta(dmath.RowBlock(), (6, 4), "float64")],
                        scalars=(rank, how, 7.0, 0.0))[0][0]

    dmath.init(device="cpu")
    a = dmath.ones((6, 4), layout=dmath.ColBlock())
    queued()                      # registered and timed: sent alone
    {body}
"""


def _ran(tmp_path):
    """How many times each rank ran test_queued."""
    return [len((tmp_path / f"ran.{r}").read_text()) if (tmp_path / f"ran.{r}").exists() else 0
            for r in range(WORKERS)]


def test_a_failure_in_a_queued_command_reaches_the_master_at_the_next_read(tmp_path):
    rc, out, err, seconds = run_job(tmp_path, QUEUED.format(out=str(tmp_path), body="""
    queued(1, 1)                  # queued: rank 1 fails when the sum sends the queue
    b = a * 2.0                   # queued too
    try:
        b.sum()
        print("NO ERROR RAISED", flush=True)
    except dmath.WorkerError as e:
        print("WORKER_ERROR_CAUGHT", e.rank, "injected failure in a queued command" in e.traceback, flush=True)
    try:
        a.sum()
    except dmath.RuntimeStateError:
        print("RUNTIME_REFUSES_OK", flush=True)
    """.strip()))
    assert "WORKER_ERROR_CAUGHT 1 True" in out, f"stdout:\n{out}\nstderr:\n{err}"
    assert "RUNTIME_REFUSES_OK" in out and "NO ERROR RAISED" not in out
    assert rc != 0 and seconds < PROMPT_S, (rc, seconds)


def test_the_queue_is_run_at_exit_and_a_failure_there_ends_the_job(tmp_path):
    # commands still queued when the program ends run on every worker before they exit
    rc, out, err, seconds = run_job(tmp_path, QUEUED.format(out=str(tmp_path), body="""
    for _ in range(3):
        queued()
    print("QUEUED", flush=True)
    """.strip()))
    assert "QUEUED" in out and rc == 0, f"exit {rc}\nstdout:\n{out}\nstderr:\n{err}"
    assert _ran(tmp_path) == [4] * WORKERS
    # ... and a failure in one of them ends the job non-zero, within seconds
    failing = tmp_path / "failing"
    failing.mkdir()
    rc, out, err, seconds = run_job(failing, QUEUED.format(out=str(failing), body="""
    queued()
    queued(2, 1)
    print("QUEUED", flush=True)
    """.strip()))
    assert "QUEUED" in out, f"stdout:\n{out}\nstderr:\n{err}"
    assert rc != 0 and seconds < PROMPT_S, (rc, seconds)
    assert "injected failure in a queued command on rank 2" in err


def test_refusals_in_queued_commands(tmp_path):
    # the master's own refusal in a queued command: the queue is sent with it, and it is undone as a
    # sent command is; a worker's refusal in a queued command that is not the last of its message:
    # the master ran on past it, nothing can be undone
    rc, out, err, seconds = run_job(tmp_path, QUEUED.format(out=str(tmp_path), body="""
    b = a * 2.0                   # queued before the refused command: runs everywhere
    try:
        made = queued(0, 2)
        print("NOT REFUSED", flush=True)
    except dmath.OutOfMemoryError as e:
        print("UNDONE", str(e).splitlines()[0][:60], flush=True)
    print("SUM", b.sum(), flush=True)
    queued(1, 2)
    try:
        a.sum()
        print("NO ERROR RAISED", flush=True)
    except dmath.WorkerError as e:
        print("BROKEN", e.rank, "injected refusal" in e.traceback, flush=True)
    """.strip()))
    assert "UNDONE test_queued: worker 0 could not allocate" in out, f"stdout:\n{out}\nstderr:\n{err}"
    assert "SUM 48.0" in out and "BROKEN 1 True" in out
    assert "NOT REFUSED" not in out and "NO ERROR RAISED" not in out
    assert rc != 0 and seconds < PROMPT_S, (rc, seconds)


@pytest.mark.parametrize("name, value, expected", [
    # queued every command, collectives included: the workers waited in one the master never sent
    ("DMATH_BATCH_SHARE_US", "inf", "a finite number of microseconds >= 0"),
    # a ZeroDivisionError in the first wait, before the excepthook that ends the job: a hang
    ("DMATH_SPIN_BYTES_PER_S", "0", "a number of bytes per second > 0"),
    # the profiles were written at exit: a good run then ended with exit 1
    ("DMATH_CPROFILE", "/nonexistent/p", "a path prefix in a folder that exists and is writable"),
])
def test_a_bad_setting_is_refused_at_init_on_every_rank(tmp_path, name, value, expected):
    rc, out, err, seconds = run_job(tmp_path, INIT_JOB.format(prelude=""), **{name: value})
    assert rc != 0 and "STARTED" not in out, f"stdout:\n{out}\nstderr:\n{err}"
    assert out.count(f"REFUSED SettingError: {name} must be {expected}, got {value!r}\n") == WORKERS, out
    assert seconds < PROMPT_S


#: a job that starts dmath and says whether init() refused: `prelude` runs first on every rank
INIT_JOB = """
    import os
    import sys
    {prelude}
    import dmath
    try:
        dmath.init(device="cpu")
    except dmath.DMathError as exc:
        # one write per rank: the three ranks share the pipe
        sys.stdout.write(f"REFUSED {{type(exc).__name__}}: {{exc}}\\n")
        sys.stdout.flush()
        raise
    print("STARTED", flush=True)
"""


def rank_setting(name, value):
    """INIT_JOB with `name` set to `value` on rank 1 alone (Open MPI without -x on another host)."""
    return INIT_JOB.format(prelude=f"""
    if (os.environ.get("PMI_RANK") or os.environ.get("OMPI_COMM_WORLD_RANK")) == "1":
        os.environ[{name!r}] = {value!r}""")


@pytest.mark.parametrize("name, value, says", [
    # a replica cache of another size on one rank: its keep/evict decision differed, the ranks entered
    # different collectives and the job hung (found by a hostile-use probe)
    ("DMATH_REPLICA_CACHE_BYTES", "1000", "DMATH_REPLICA_CACHE_BYTES differ between ranks"),
    # a bad value on one rank raised there alone; the others waited in init() for ever
    ("DMATH_SPIN_BYTES_PER_S", "0", "on rank 1: DMATH_SPIN_BYTES_PER_S must be"),
])
def test_a_setting_of_one_rank_alone_is_refused_on_every_rank(tmp_path, name, value, says):
    rc, out, err, seconds = run_job(tmp_path, rank_setting(name, value))
    assert rc != 0 and "STARTED" not in out, f"stdout:\n{out}\nstderr:\n{err}"
    assert out.count("REFUSED SettingError: ") == WORKERS and out.count(says) == WORKERS, out
    assert seconds < PROMPT_S


def test_a_per_rank_diagnostic_setting_may_differ(tmp_path):
    """DMATH_WATCHDOG_S changes what one rank reports, never what the ranks do together."""
    rc, out, err, _ = run_job(tmp_path, rank_setting("DMATH_WATCHDOG_S", "600"))
    assert rc == 0 and "STARTED" in out, f"stdout:\n{out}\nstderr:\n{err}"


SLEEPY_SOURCE = """
import os
import time

import numpy as np


def _rank():
    return os.environ.get("PMI_RANK") or os.environ.get("OMPI_COMM_WORLD_RANK")


class Source:
    '''A host_source whose factory or sample() blocks on one worker, as the description says.'''

    def __init__(self, description):
        self.where = description.decode()
        self.labels = np.arange(16) % 3
        if self.where == "factory" and _rank() == "1":
            time.sleep(1000)

    def sample(self, index, stream, random, seed, out):
        if self.where == "sample" and _rank() == "1":
            time.sleep(1000)
        out[...] = index
"""


@pytest.mark.parametrize("where", ["factory", "sample"])
def test_a_user_function_that_blocks_on_a_worker_ends_the_job(tmp_path, where):
    """A source's factory or sample() that never returns hung the job for good: the heartbeat thread
    kept answering the master's pings (a hostile-use probe). Past DMATH_TIMEOUT_S the worker fails,
    and the master reports a WorkerError naming it."""
    (tmp_path / "sleepy_source.py").write_text(SLEEPY_SOURCE)
    rc, out, err, seconds = run_job(tmp_path, f"""
        import numpy as np
        import dmath
        from dmath.ops import host_batches as hb
        dmath.init(device="cpu")
        try:
            src = hb.host_source("sleepy_source:Source", {where!r}.encode(), 16)
            order = dmath.from_numpy(np.arange(16.0).reshape(1, -1), layout=dmath.Replicated())
            pos = dmath.zeros((1, 1), dtype="float64", layout=dmath.Replicated())
            out = dmath.zeros((8, 48), layout=dmath.RowBlock())
            hb.host_batch(src, order, pos, out, image=(3, 4, 4), random=False, mean=(0, 0, 0), std=(1, 1, 1),
                          places=("host",))
            out.to_numpy()
            print("NOT REPORTED", flush=True)
        except dmath.WorkerError as e:
            print("REPORTED", e.rank, "did not finish within DMATH_TIMEOUT_S" in str(e), flush=True)
            raise
    """, DMATH_TIMEOUT_S="4")
    assert "REPORTED 1 True" in out and rc != 0, f"stdout:\n{out}\nstderr:\n{err}"
    assert seconds < PROMPT_S
