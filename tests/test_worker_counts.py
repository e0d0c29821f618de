"""Results that must not depend on the number of workers: the same script at 1 and at 3 workers.

Runs once, in the plain `pytest tests` stage: it launches its own jobs (see
_jobs.py for how mpiexec is found).
"""
import subprocess
import sys

import numpy as np
import pytest

from _jobs import MPIEXEC, job_env

SCRIPT = """
import sys
import numpy as np
import dmath
dmath.init(device="cpu")
dmath.random.seed(2024)
u = dmath.random.rand((13, 7), dtype="float64", layout=dmath.BlockCyclic((2, 3)))
n = dmath.random.randn((5, 11), dtype="float32", layout=dmath.ColBlock())
h = dmath.random.rand((6, 6), dtype="float16", layout=dmath.Partial())
m = (u.remap(dmath.Block2D()) * 2.0 - 1.0).T
s = m.sum(axis=1)
out = dict(u=u.to_numpy(), n=n.to_numpy(), h=h.to_numpy(), m=m.to_numpy(), s=s.to_numpy(),
           norm=np.array(m.norm()), P=np.array(dmath.num_workers()))
np.savez(sys.argv[1], **out)
"""


def _run(tmp_path, n):
    script = tmp_path / "job.py"
    script.write_text(SCRIPT)
    out = tmp_path / f"out{n}.npz"
    cmd = [sys.executable, str(script), str(out)]
    if n > 1:
        cmd = [MPIEXEC, "-n", str(n)] + cmd
    env = job_env()
    if n == 1:   # a plain run: no MPI at all
        env = {k: v for k, v in env.items() if not k.startswith(("PMI_", "HYDRA_", "OMPI_"))}
    p = subprocess.run(cmd, cwd=str(tmp_path), env=env, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, f"exit {p.returncode}\n{p.stdout}\n{p.stderr}"
    return np.load(out)


@pytest.mark.skipif(MPIEXEC is None, reason="no mpiexec found")
def test_same_results_at_1_and_3_workers(tmp_path):
    one, three = _run(tmp_path, 1), _run(tmp_path, 3)
    assert int(one["P"]) == 1 and int(three["P"]) == 3
    for key in ("u", "n", "h", "m"):
        np.testing.assert_array_equal(one[key], three[key], err_msg=key)
    # sums may associate differently across workers
    np.testing.assert_allclose(one["s"], three["s"], rtol=1e-12)
    np.testing.assert_allclose(one["norm"], three["norm"], rtol=1e-12)
    u = one["u"]
    assert u.min() >= 0 and u.max() < 1 and len(np.unique(u)) == u.size


GATHER_SCRIPT = """
import sys
import dmath
from dmath.comm.control import gather_objects
from dmath.ops.base import dispatch
from dmath.runtime import kernel


@kernel("test_big_objects")          # registered before init: every rank knows it
def _big(call):
    call.result = gather_objects(call.world, {"rank": call.rank, "text": "x" * (300000 + call.rank)})
    return []


dmath.init(device="cpu")
got = dispatch("test_big_objects")[1]
assert [g["rank"] for g in got] == list(range(dmath.num_workers())), got
assert [len(g["text"]) for g in got] == [300000 + r for r in range(dmath.num_workers())]
print("ok")
"""


@pytest.mark.skipif(MPIEXEC is None, reason="no mpiexec found")
def test_objects_of_any_size_reach_the_master(tmp_path):
    """Per-worker reports (dmath.nn.explain_conv2d's plan lists) can be far larger than MPI's
    eager limit; a receive posted before the size is known truncated them (MPI_ERR_TRUNCATE)."""
    script = tmp_path / "gather.py"
    script.write_text(GATHER_SCRIPT)
    p = subprocess.run([MPIEXEC, "-n", "3", sys.executable, str(script)], cwd=str(tmp_path), env=job_env(),
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0 and "ok" in p.stdout, f"exit {p.returncode}\n{p.stdout}\n{p.stderr}"
