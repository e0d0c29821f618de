"""A mapped file that shrinks while its matrix lives (issue 35, item 1): the next command that reads
the matrix raises FileChanged (a WorkerError on the master, the job ends non-zero with the reason)
instead of every rank dying of SIGBUS with no traceback. Own jobs (see tests/test_failures.py)."""
import signal
import subprocess
import sys
import textwrap

import pytest

from _jobs import MPIEXEC, job_env

TIMEOUT_S = 60

pytestmark = pytest.mark.skipif(MPIEXEC is None, reason="no mpiexec found")

SHRINK = """
    import numpy as np
    import dmath
    dmath.init(device="cpu")
    path = {path!r}
    np.save(path, np.arange(4096 * 64, dtype=np.float32).reshape(4096, 64))
    m = dmath.from_file(path, layout=dmath.{layout}(), mapped=True)
    print("SUM", float(m[:2, :].sum()), flush=True)
    with open(path, "r+b") as f:
        f.truncate(4096)
    print("SHRUNK", flush=True)
    print("AFTER", float(m.sum()), flush=True)
"""


@pytest.mark.parametrize("n,layout", [(1, "Replicated"), (2, "Replicated"), (3, "RowBlock")])
def test_a_mapped_file_that_shrinks_raises_instead_of_sigbus(tmp_path, n, layout):
    script = tmp_path / "job.py"
    script.write_text(textwrap.dedent(SHRINK.format(path=str(tmp_path / "x.npy"), layout=layout)))
    cmd = [sys.executable, str(script)] if n == 1 else [MPIEXEC, "-n", str(n), sys.executable, str(script)]
    try:
        p = subprocess.run(cmd, cwd=str(tmp_path), env=job_env(), capture_output=True, text=True,
                           timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"the job hung for {TIMEOUT_S} s:\nstdout:\n{exc.stdout}\nstderr:\n{exc.stderr}")
    out, err = p.stdout, p.stderr
    assert "SHRUNK" in out and "AFTER" not in out, f"{out}\n{err}"
    assert p.returncode not in (0, -signal.SIGBUS, 128 + signal.SIGBUS), f"rc {p.returncode}\n{out}\n{err}"
    assert "FileChanged" in err and "the mapped file shrank to 4,096 bytes" in err, err
