"""Launching separate dmath jobs from the tests (tests/test_failures.py, tests/test_worker_counts.py)."""
import os
import shutil
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def find_mpiexec():
    """The mpiexec next to this Python (the venv's MPICH), else one on PATH, else None."""
    here = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    if os.access(here, os.X_OK):
        return here
    return shutil.which("mpiexec")


MPIEXEC = find_mpiexec()


def job_env(**extra):
    """The environment of a launched job: the repository importable, CPU backend, one thread."""
    env = dict(os.environ)
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    env.setdefault("HYDRA_LAUNCHER", "fork")         # MPICH: no ssh in containers
    env.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")     # Open MPI as root (device machines)
    env.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
    env["DMATH_DEVICE"] = "cpu"
    env["OMP_NUM_THREADS"] = "1"
    env["PYTHONUNBUFFERED"] = "1"
    # a failed worker ends the job itself if the master never does: keep that short
    env["DMATH_FAILED_WORKER_GRACE_S"] = "20"
    env.update(extra)
    return env


def run_python(args, n, cwd, timeout=240):
    """Run `python *args` in a job of n workers (n == 1: plain python, no mpiexec); assert it exits 0."""
    cmd = [sys.executable] + [str(a) for a in args]
    env = job_env()
    if n > 1:
        cmd = [MPIEXEC, "-n", str(n)] + cmd
    else:
        env = {k: v for k, v in env.items() if not k.startswith(("PMI_", "HYDRA_", "OMPI_"))}
    p = subprocess.run(cmd, cwd=str(cwd), env=env, capture_output=True, text=True, timeout=timeout)
    assert p.returncode == 0, f"exit {p.returncode}\n{p.stdout}\n{p.stderr}"
    return p
