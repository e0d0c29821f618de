"""The master's side of liveness (issue 35, items 4, 6 and 8); each case launches its own job.

4: the master's own computing is never a worker's silence: with DMATH_TIMEOUT_S=1, a master share
   that computes 1.5 s at a time between short waits on healthy workers is no hang (before: "worker 1
   stopped answering ... NO ANSWER for -0 s").
6: a frozen master (SIGSTOP) ends the job non-zero within the timeout: the workers hear its beats no
   more (before: they waited forever).
8: a child forked from the master after init() cannot issue commands, and its exit (atexit, an
   uncaught exception) leaves the master's workers running (before: its finalize shut them down).

Every job runs in a session of its own and is killed whole (a stopped master included) if it
outlives its deadline, so no case can hang the suite or leave processes behind.
"""
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from _jobs import MPIEXEC, job_env

pytestmark = pytest.mark.skipif(MPIEXEC is None, reason="no mpiexec found")


def run_job(tmp_path, source, n, timeout, **env):
    """(returncode or None when it hung, stdout, stderr, seconds) of `source` under mpiexec -n n."""
    script = tmp_path / "job.py"
    script.write_text(textwrap.dedent(source))
    t0 = time.monotonic()
    p = subprocess.Popen([MPIEXEC, "-n", str(n), sys.executable, str(script)], cwd=str(tmp_path),
                         env=job_env(**env), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         start_new_session=True)
    try:
        out, err = p.communicate(timeout=timeout)
        rc = p.returncode
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)        # every rank, stopped ones too
        out, err = p.communicate()
        rc = None
    return rc, out, err, time.monotonic() - t0


MASTER_COMPUTES = """
    import time
    import dmath
    from dmath.runtime import kernel
    from dmath.ops.base import dispatch
    from dmath.comm.control import gather_objects

    @kernel("test_master_computes")
    def _computes(call):
        # the master's share computes 1.5 s (longer than the timeout) between short waits on the
        # workers, which answer at once: as a long GEMM of its own does between its collectives
        for _ in range(4):
            if call.rank == 0:
                t = time.monotonic()
                while time.monotonic() - t < 1.5:
                    sum(range(20000))
            gather_objects(call.world, call.rank)
        return []

    dmath.init(device="cpu")
    a = dmath.ones((6, 4))
    for _ in range(2):
        dispatch("test_master_computes")
        assert a.sum() == 24.0
    print("MASTER DONE", flush=True)
"""


@pytest.mark.parametrize("n", [2, 3])
def test_the_masters_own_computing_is_not_a_workers_silence(tmp_path, n):
    rc, out, err, _ = run_job(tmp_path, MASTER_COMPUTES, n, 90, DMATH_TIMEOUT_S="1")
    assert rc == 0 and "MASTER DONE" in out, f"rc {rc}\n{out}\n{err}"
    assert "stopped answering" not in err, err


FROZEN_MASTER = """
    import os, signal, time
    import dmath
    dmath.init(device="cpu")
    a = dmath.ones((6, 4))
    assert a.sum() == 24.0
    print("FREEZING", flush=True)
    {freeze}
    print("THAWED", flush=True)
"""


@pytest.mark.parametrize("n,freeze", [
    (2, "os.kill(os.getpid(), signal.SIGSTOP)"),
    (3, "os.kill(os.getpid(), signal.SIGSTOP)"),
])
def test_a_frozen_master_ends_the_job(tmp_path, n, freeze):
    rc, out, err, seconds = run_job(tmp_path, FROZEN_MASTER.format(freeze=freeze), n, 60, DMATH_TIMEOUT_S="3")
    assert rc is not None, f"the job hung (killed after 60 s)\n{out}\n{err}"
    assert rc != 0 and "FREEZING" in out and "THAWED" not in out, f"rc {rc}\n{out}\n{err}"
    assert "the master has sent nothing for" in err and "SIGSTOP" in err, err
    assert seconds < 40, f"{seconds:.0f} s\n{err}"


def test_a_master_busy_in_its_own_code_is_not_silent(tmp_path):
    """The beats come from a thread: a master in the user's long computation (no dmath call) is alive."""
    source = FROZEN_MASTER.format(freeze="t = time.monotonic()\n    while time.monotonic() - t < 5: "
                                         "sum(range(10000))\n    assert a.sum() == 24.0")
    rc, out, err, _ = run_job(tmp_path, source, 2, 60, DMATH_TIMEOUT_S="1")
    assert rc == 0 and "THAWED" in out, f"rc {rc}\n{out}\n{err}"


FORKED_CHILD = """
    import os, sys
    import dmath
    dmath.init(device="cpu")
    a = dmath.ones((6, 4), layout=dmath.ColBlock())
    assert a.sum() == 24.0
    pid = os.fork()
    if pid == 0:
        try:
            (a * 2.0).sum()
            print("CHILD ISSUED A COMMAND", flush=True)
        except dmath.RuntimeStateError as exc:
            print("CHILD REFUSED:", exc, flush=True)
        {child_exit}
    _, status = os.waitpid(pid, 0)
    print("CHILD STATUS", os.waitstatus_to_exitcode(status), flush=True)
    b = a * 3.0                          # the workers are still there
    assert b.sum() == 72.0 and (b @ a.T).to_numpy().sum() == 6 * 6 * 12.0
    print("PARENT OK", flush=True)
"""


@pytest.mark.parametrize("child_exit,code", [
    ("sys.exit(0)", 0),                                   # atexit handlers run: dmath's finalize
    ("raise ValueError('child fails')", 1),               # the excepthook ends the child alone
])
def test_a_child_forked_after_init_leaves_the_workers_alone(tmp_path, child_exit, code):
    rc, out, err, _ = run_job(tmp_path, FORKED_CHILD.format(child_exit=child_exit), 3, 60)
    assert rc == 0, f"rc {rc}\n{out}\n{err}"
    assert "CHILD REFUSED: this process" in out and "forked from the dmath master" in out, out
    assert f"CHILD STATUS {code}" in out and "PARENT OK" in out, f"{out}\n{err}"
