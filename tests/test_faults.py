"""The fault suite: signals to busy and idle workers, a master interrupted or used from two threads.

Each case launches its own 3-worker job (like test_failures.py) and checks
that it ends non-zero within a bound, with the failure named on the master,
and that no process of the job is left. DMATH_TIMEOUT_S is 3 s here, so a
frozen worker is found in about that time.
"""
import os
import re
import time

import pytest

from _jobs import MPIEXEC
from test_failures import PROMPT_S, run_job

pytestmark = pytest.mark.skipif(MPIEXEC is None, reason="no mpiexec found")

TIMEOUT_S = 3
FAULT_JOB = """
    import os, signal, sys, time, threading
    import dmath
    from dmath.runtime import kernel
    from dmath.ops.base import dispatch
    from dmath.comm.control import gather_objects

    @kernel("test_pids")
    def _pids(call):
        call.result = gather_objects(call.world, os.getpid())
        return []

    @kernel("test_busy")
    def _busy(call):
        # the workers compute for a while; the master's share is nothing, so it goes on and waits
        t0 = time.monotonic()
        while call.rank != 0 and time.monotonic() - t0 < 30:
            time.sleep(0.01)
        return []
{kernels}
    dmath.init(device="cpu")
    pids = dispatch("test_pids")[1]
    print("PIDS", *pids, flush=True)
    a = dmath.ones((6, 4), layout=dmath.ColBlock())
    assert a.sum() == 24.0
{body}
"""

SIGNAL_BODY = """
    if {busy}:
        dispatch("test_busy")
        time.sleep(0.3)
    print("SIGNAL_AT", time.monotonic(), flush=True)
    os.kill(pids[{rank}], signal.{sig})
    if not {busy}:
        time.sleep(0.5)          # the worker is idle when the signal lands
    try:
        a.sum()
        print("NO ERROR RAISED", flush=True)
    except dmath.WorkerError as e:
        print(f"CAUGHT rank={{e.rank}}", str(e).splitlines()[0], flush=True)
"""


def _pids(out):
    m = re.search(r"^PIDS (.*)$", out, re.M)
    return [int(p) for p in m.group(1).split()] if m else []


def _left_over(pids):
    """The job's processes still alive shortly after it ended (zombies not counted)."""
    deadline = time.monotonic() + 5
    while True:
        alive = []
        for p in pids:
            try:
                with open(f"/proc/{p}/stat") as f:
                    if f.read().split(")")[-1].split()[0] != "Z":
                        alive.append(p)
            except OSError:
                pass
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.1)


def _seconds_after_signal(out, ended):
    m = re.search(r"^SIGNAL_AT (\S+)$", out, re.M)
    return ended - float(m.group(1)) if m else None


@pytest.mark.parametrize("sig", ["SIGINT", "SIGKILL", "SIGSTOP", "SIGTERM"])
@pytest.mark.parametrize("busy", [False, True], ids=["idle", "busy"])
def test_signal_to_a_worker_ends_the_job(tmp_path, sig, busy):
    rank = 1 if busy else 2
    rc, out, err, _ = run_job(tmp_path, FAULT_JOB.format(kernels="", body=SIGNAL_BODY.format(busy=busy, rank=rank, sig=sig)),
                              DMATH_TIMEOUT_S=str(TIMEOUT_S))
    ended = time.monotonic()
    pids = _pids(out)
    assert len(pids) == 3, f"stdout:\n{out}\nstderr:\n{err}"
    assert rc != 0, f"the job exited 0 after {sig} to worker {rank}\n{out}\n{err}"
    assert "NO ERROR RAISED" not in out
    if sig in ("SIGINT", "SIGSTOP"):
        # the master names the worker: its KeyboardInterrupt, or its silence past DMATH_TIMEOUT_S
        assert f"CAUGHT rank={rank}" in out, f"stdout:\n{out}\nstderr:\n{err}"
        assert ("KeyboardInterrupt" if sig == "SIGINT" else "stopped answering") in out
    if sig == "SIGSTOP":
        assert "stacks of worker" in err and "stacks of the master" in err, err   # every live rank's stack
    seconds = _seconds_after_signal(out, ended)
    limit = TIMEOUT_S + PROMPT_S / 3 if sig == "SIGSTOP" else PROMPT_S / 3
    assert seconds is not None and seconds < limit, f"{seconds} s from the signal to the end of the job"
    print(f"FAULT {sig} {'busy' if busy else 'idle'} worker: exit {rc} {seconds:.2f} s after the signal")
    assert _left_over(pids) == [], "processes of the job are still running"


def test_master_interrupted_inside_a_command_refuses_to_go_on(tmp_path):
    """Ctrl-C on the master while it waits on busy workers, caught by the program: no hang later."""
    rc, out, err, seconds = run_job(tmp_path, FAULT_JOB.format(kernels="", body="""
    dispatch("test_busy")
    signal.setitimer(signal.ITIMER_REAL, 0.5)
    signal.signal(signal.SIGALRM, lambda *_: os.kill(os.getpid(), signal.SIGINT))
    try:
        a.sum()                          # waits for the busy workers; interrupted there
    except KeyboardInterrupt:
        print("INTERRUPTED", flush=True)
    try:
        a.sum()
    except dmath.RuntimeStateError as e:
        print("REFUSED", "interrupted" in str(e), flush=True)
    print("SIGNAL_AT", time.monotonic(), flush=True)
    """), DMATH_TIMEOUT_S=str(TIMEOUT_S))
    ended = time.monotonic()
    assert "INTERRUPTED" in out and "REFUSED True" in out, f"stdout:\n{out}\nstderr:\n{err}"
    assert rc != 0
    assert _seconds_after_signal(out, ended) < PROMPT_S / 3
    assert _left_over(_pids(out)) == []


def test_a_second_master_thread_is_refused_and_the_runtime_goes_on(tmp_path):
    rc, out, err, _ = run_job(tmp_path, FAULT_JOB.format(kernels="", body="""
    def _refused(fn):
        try:
            fn()
        except dmath.RuntimeStateError as e:
            return str(e)
        return "NOT REFUSED"
    seen = []
    def other():
        try:
            (a * 2.0).sum()
        except dmath.RuntimeStateError as e:
            seen.append(str(e))
    for _ in range(3):
        t = threading.Thread(target=other, name="helper")
        t.start()
        a.sum()                          # the main thread keeps working meanwhile
        t.join()
    assert len(seen) == 3 and "thread that called dmath.init()" in seen[0] and "helper" in seen[0], seen
    # finalize too: another thread's shutdown crossed the owner's command (a hostile-use probe)
    t = threading.Thread(target=lambda: seen.append(_refused(dmath.finalize)), name="closer")
    t.start()
    a.sum()
    t.join()
    assert "thread that called dmath.init()" in seen[-1] and "closer" in seen[-1], seen
    assert (a * 3.0).sum() == 72.0
    print("THREADS_OK", flush=True)
    """))
    assert "THREADS_OK" in out, f"stdout:\n{out}\nstderr:\n{err}"
    assert rc == 0, err


def test_bad_timeout_setting_is_refused_on_every_rank(tmp_path):
    rc, out, err, seconds = run_job(tmp_path, "import dmath\ndmath.init(device='cpu')\nprint('STARTED')\n",
                                    DMATH_TIMEOUT_S="soon")
    assert rc != 0 and "STARTED" not in out
    assert "DMATH_TIMEOUT_S must be a number of seconds" in err
    assert seconds < PROMPT_S



CRASH_KERNEL = """
    import ctypes

    @kernel("test_native_crash")
    def _native_crash(call):
        if call.rank == 1:
            ctypes.string_at(0)          # a read of address 0 in native code: SIGSEGV, as a crashing library
        return []
"""

CRASH_BODY = """
    print("SIGNAL_AT", time.monotonic(), flush=True)
    try:
        dispatch("test_native_crash")
        a.sum()
        print("NO ERROR RAISED", flush=True)
    except dmath.WorkerError as e:
        print(f"CAUGHT rank={e.rank}", flush=True)
"""


def test_a_crash_in_native_code_prints_the_rank_s_python_stack(tmp_path):
    """A worker killed by SIGSEGV inside a kernel (as cuDNN, NCCL or the driver would crash): the job ends
    non-zero within the bound, and the dead rank's stderr names the Python call that was running
    (faulthandler, which dmath.init enables), not only mpiexec's "exited on signal 11"."""
    rc, out, err, _ = run_job(tmp_path, FAULT_JOB.format(kernels=CRASH_KERNEL, body=CRASH_BODY), DMATH_TIMEOUT_S=str(TIMEOUT_S))
    ended = time.monotonic()
    assert rc != 0, f"the job exited 0 after a worker's crash\n{out}\n{err}"
    assert "NO ERROR RAISED" not in out
    assert "Segmentation fault" in err and "_native_crash" in err, f"stdout:\n{out}\nstderr:\n{err}"
    seconds = _seconds_after_signal(out, ended)
    assert seconds is not None and seconds < PROMPT_S / 3 + TIMEOUT_S, f"{seconds} s from the crash to the end"
    assert _left_over(_pids(out)) == [], "processes of the job are still running"
