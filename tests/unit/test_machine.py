"""`python -m dmath.machine`, the version, and the one table of environment variables."""
import importlib.metadata
import json
import os
import re
import subprocess
import sys

import dmath
import dnn
from dmath import machine as info, settings

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _sources(*folders):
    for folder in folders:
        for base, _, files in os.walk(os.path.join(ROOT, folder)):
            for name in files:
                if name.endswith(".py"):
                    with open(os.path.join(base, name), encoding="utf-8") as f:
                        yield f.read()


def test_version_is_the_installed_distributions():
    assert dmath.__version__ == dnn.__version__ == importlib.metadata.version("dmath-dnn")
    assert re.fullmatch(r"\d+\.\d+\.\d+\S*", dmath.__version__)


def test_every_variable_read_is_in_the_table_and_the_readme():
    # dmath reads its DMATH_* variables only through dmath/settings.py's table; a variable read
    # elsewhere (dnn's data folder) is listed there too
    read = set()
    for text in _sources("dmath", "dnn"):
        read |= set(re.findall(r"environ(?:\.get\(|\[)\s*[\"']((?:DMATH|DNN)_[A-Z0-9_]+)", text))
    assert not {name for name in read if name.startswith("DMATH_")}, read
    assert read <= set(info.ENVIRONMENT), read - set(info.ENVIRONMENT)
    assert set(info.ENVIRONMENT) == {v.name for v in settings.VARIABLES}
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        rows = set(re.findall(r"^\| `((?:DMATH|DNN)_[A-Z0-9_]+)`", f.read(), re.M))
    assert set(info.ENVIRONMENT) <= rows, set(info.ENVIRONMENT) - rows


def test_report_without_a_launcher(monkeypatch):
    monkeypatch.setenv("DMATH_SPIN_S", "0.01")
    r = info.report()
    assert r["dmath"] == dmath.__version__ and r["numpy"] == __import__("numpy").__version__
    assert r["mpi"]["workers"] == 1 and r["mpi"]["launched_by_mpiexec"] is False
    assert "MPI" in r["mpi"]["library"].upper()
    assert r["environment"]["DMATH_SPIN_S"] == "0.01"


def test_the_command_prints_json_and_text():
    env = {k: v for k, v in os.environ.items() if k not in ("PMI_RANK", "PMI_SIZE", "HYDRA_CONTROL_FD")}
    out = subprocess.run([sys.executable, "-m", "dmath.machine", "--json"], capture_output=True, text=True,
                         env=env, cwd=ROOT, timeout=120, check=True).stdout
    assert json.loads(out)["dmath"] == dmath.__version__
    text = subprocess.run([sys.executable, "-m", "dmath.machine"], capture_output=True, text=True,
                          env=env, cwd=ROOT, timeout=120, check=True).stdout
    assert text.startswith("dmath:") and "workers:" in text
