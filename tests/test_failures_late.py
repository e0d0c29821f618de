"""A worker failure in the last command of a program: the master, at shutdown, waits for every worker
(a drain), so it reports the failure and the job ends non-zero within seconds, not after the failed
worker's grace period. Each case launches its own job with mpiexec (see tests/test_failures.py)."""
import subprocess
import sys
import textwrap
import time

import pytest

from _jobs import MPIEXEC, job_env

TIMEOUT_S = 90
#: "within seconds": startup of the ranks plus the failure handling, far below the grace period
PROMPT_S = 30
#: the failed worker's own deadline for the master (DMATH_FAILED_WORKER_GRACE_S): the default
GRACE_S = 120

pytestmark = pytest.mark.skipif(MPIEXEC is None, reason="no mpiexec found")

LATE_FAILURE = """
    import time
    import dmath
    from dmath.runtime import kernel
    from dmath.ops.base import dispatch

    # registered before init, so every rank (workers never return from init) has it
    @kernel("test_fail_late")
    def _fail(call):
        if call.rank == {failing}:
            time.sleep(0.5)              # the master has long left the command: nobody waits for it
            raise ValueError("injected late failure on rank {failing}")
        return []

    dmath.init(device="cpu")
    a = dmath.ones((6, 4), layout=dmath.RowBlock())
    assert a.sum() == 24.0
    {last}
    print("MASTER DONE", flush=True)
"""


@pytest.mark.parametrize("n,failing,last,env", [
    (2, 1, 'dispatch("test_fail_late")', {}),
    (3, 2, 'dispatch("test_fail_late")', {}),
    # a local command, sent at once (nothing is queued) and not waited for
    (3, 1, 'dispatch("test_fail_late"); b = a * 2.0', {"DMATH_BATCH_MAX": "0"}),
], ids=["p2", "p3", "p3_then_unqueued_local_command"])
def test_a_failure_in_the_last_command_ends_the_job_promptly(tmp_path, n, failing, last, env):
    script = tmp_path / "job.py"
    script.write_text(textwrap.dedent(LATE_FAILURE.format(failing=failing, last=last)))
    cmd = [MPIEXEC, "-n", str(n), sys.executable, str(script)]
    t0 = time.monotonic()
    try:
        p = subprocess.run(cmd, cwd=str(tmp_path), capture_output=True, text=True, timeout=TIMEOUT_S,
                           env=job_env(DMATH_FAILED_WORKER_GRACE_S=str(GRACE_S), **env))
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"the job hung for {TIMEOUT_S} s:\nstdout:\n{exc.stdout}\nstderr:\n{exc.stderr}")
    seconds = time.monotonic() - t0
    out, err = p.stdout, p.stderr
    assert "MASTER DONE" in out, f"stdout:\n{out}\nstderr:\n{err}"
    assert p.returncode != 0, f"the job exited 0 after a worker failure\n{out}\n{err}"
    # the master's report (WorkerError: the rank, then the worker's traceback), not the worker's own
    assert f"worker {failing} failed: ValueError: injected late failure on rank {failing}" in err, err
    assert f"--- worker {failing} traceback ---" in err and "Traceback (most recent call last)" in err, err
    assert "the master did not end the job" not in err, err
    assert seconds < PROMPT_S, f"the job took {seconds:.1f} s to end\n{err}"
