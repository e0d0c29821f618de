"""Install the `oracle` extra (PyTorch, the tests' oracle) when it costs no surprise download.

    python tools/oracle.py auto|1|0        (tools/env.sh runs it; DMATH_ORACLE picks the mode)

A CPU build of PyTorch is about 200 MB; the build the package index gives on
Linux is a CUDA one that pulls several GB of nvidia-* packages. `auto`
installs it when (a) a CPU wheel of the pinned version lies in pip's local
wheel folders (find-links: found with --no-index, so nothing is downloaded
to decide), (b) DMATH_TORCH_INDEX names an index to take it from (PyTorch's
CPU wheel index), or (c) the platform is not Linux (the index's wheels are CPU
builds there); otherwise it says how to get the CPU build and installs
nothing (the oracle tests then skip). `1` installs whatever pip chooses, `0`
nothing.
"""
import json
import os
import re
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CPU_INDEX = "https://download.pytorch.org/whl/cpu"


def pinned():
    """The requirement of the `oracle` extra in pyproject.toml (one place for the pin)."""
    with open(os.path.join(ROOT, "pyproject.toml"), encoding="utf-8") as f:
        return re.search(r'^oracle = \["([^"]+)"\]', f.read(), re.M).group(1)


def _pip(*args, **kw):
    env = dict(os.environ, PIP_DISABLE_PIP_VERSION_CHECK="1")
    return subprocess.run([sys.executable, "-m", "pip", *args], env=env, **kw)


def local_cpu_wheel(requirement):
    """True when pip finds `requirement` on local disk only and it needs no nvidia-* package."""
    with tempfile.TemporaryDirectory() as tmp:
        report = os.path.join(tmp, "report.json")
        run = _pip("install", "--dry-run", "--no-index", "--no-deps", "--ignore-installed", "-q",
                   "--report", report, requirement, capture_output=True, text=True)
        if run.returncode != 0:
            return False
        with open(report, encoding="utf-8") as f:
            chosen = json.load(f)["install"]
    needs = [r for item in chosen for r in item["metadata"].get("requires_dist", [])]
    return bool(chosen) and not any(r.lower().startswith(("nvidia-", "triton")) for r in needs)


def main(mode):
    if mode not in ("auto", "1", "0"):
        print(f"oracle.py: DMATH_ORACLE must be auto, 1 or 0, got {mode!r}", file=sys.stderr)
        return 2
    requirement, index = pinned(), os.environ.get("DMATH_TORCH_INDEX")
    if mode == "0":
        print("env.sh: DMATH_ORACLE=0: PyTorch not installed; its oracle tests skip", file=sys.stderr)
        return 0
    if mode == "auto" and not (index or not sys.platform.startswith("linux") or local_cpu_wheel(requirement)):
        print(f"env.sh: PyTorch ({requirement}, the oracle of some tests) is not installed: the build the "
              f"package index gives here is a CUDA one of several GB. For the CPU build (about 200 MB) run "
              f"DMATH_TORCH_INDEX={CPU_INDEX} bash tools/test.sh; to take the index's build anyway, "
              f"DMATH_ORACLE=1. Until then the oracle tests skip.", file=sys.stderr)
        return 0
    print(f"env.sh: installing the oracle extra ({requirement}, test-only) ...", file=sys.stderr)
    extra = ["--extra-index-url", index] if index else []
    return _pip("install", "-q", "-e", f"{ROOT}[oracle]", *extra).returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "auto"))
