"""What dmath would run on here: `python -m dmath.machine` (as `cupy.show_config()`).

    python -m dmath.machine         # text: versions, MPI library, workers, GPUs, NCCL, cuDNN, settings
    python -m dmath.machine --json  # the same as one JSON object
    mpiexec -n 4 python -m dmath.machine    # under a launcher: the worker count it gives (rank 0 prints)

Nothing here starts the runtime: no command is sent, no GPU memory is
allocated beyond what CuPy needs to name the devices. Each section that
cannot be filled says why (a package missing, no GPU visible).
"""
import importlib.metadata
import json
import os
import platform
import sys

from . import settings

#: every environment variable dmath and dnn read, with its default and meaning (the README's table)
ENVIRONMENT = {v.name: (v.default, v.meaning) for v in settings.VARIABLES}


def _settings():
    """The checked value of every setting, or the error `dmath.init()` would raise."""
    try:
        values = settings.read()
    except settings.SettingError as exc:
        return {"error": str(exc)}
    return {v.name: getattr(values, v.attr) for v in settings.VARIABLES if v.attr}


def _version(distribution):
    """The installed version, read from its metadata: nothing is imported (torch takes seconds)."""
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def _mpi():
    from .comm.world import launched_by_mpi
    try:
        import mpi4py
    except ImportError:
        return {"mpi4py": None, "note": "no mpi4py: one worker only (pip install -e '.[mpi]')"}
    launched = launched_by_mpi()
    if not launched:
        mpi4py.rc.initialize = False     # the library's name needs no MPI_Init (MPI-3)
    from mpi4py import MPI
    out = {"mpi4py": mpi4py.__version__, "library": " ".join(MPI.Get_library_version().split("\n")[0].split()),
           "standard": "%d.%d" % MPI.Get_version(), "launched_by_mpiexec": launched}
    out["workers"] = MPI.COMM_WORLD.Get_size() if launched else 1
    if launched:
        out["rank"] = MPI.COMM_WORLD.Get_rank()
    return out


def _gpu():
    try:
        import cupy
    except ImportError:
        return {"cupy": None, "note": "no CuPy: the CPU backend only (pip install -e '.[gpu]')"}
    out = {"cupy": cupy.__version__}
    try:
        rt = cupy.cuda.runtime
        out["cuda_runtime"] = rt.runtimeGetVersion()
        out["cuda_driver"] = rt.driverGetVersion()
        n = rt.getDeviceCount()
        out["devices"] = [rt.getDeviceProperties(i)["name"].decode() for i in range(n)]
    except Exception as exc:
        out["devices"] = []
        out["note"] = f"CuPy sees no GPU: {exc}"
    try:
        from cupy.cuda import nccl
        out["nccl"] = nccl.get_version()
    except Exception as exc:
        out["nccl"] = f"unavailable: {exc}"
    try:
        import cudnn
        out["cudnn_frontend"] = getattr(cudnn, "__version__", "installed")
        out["cudnn"] = cudnn.backend_version()
    except Exception as exc:
        out["cudnn"] = f"unavailable ({exc}); convolutions use im2col and cuBLAS"
    return out


def _tuning():
    """DMATH_TUNE, the tuning cache's path and how many choices it holds (dmath.tuning)."""
    from . import tuning
    try:
        mode = tuning.mode()
    except settings.SettingError as exc:
        mode = f"invalid: {exc}"
    cache = tuning.shared()
    if cache is None:
        return {"mode": mode, "cache": "off (DMATH_TUNE_CACHE is empty)"}
    return {"mode": mode, "cache": cache.path, "entries": cache.count()}


def report():
    """A dict of what dmath finds on this machine (see the module docstring)."""
    from . import __version__
    return {
        "dmath": __version__,
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "numpy": _version("numpy"),
        "mpi": _mpi(),
        "gpu": _gpu(),
        "tuning": _tuning(),
        "optional": {name: _version(name) for name in ("tqdm", "matplotlib", "torch", "scipy")},
        "environment": {name: os.environ[name] for name in ENVIRONMENT if name in os.environ},
        "settings": _settings(),
        "threads": {name: os.environ.get(name) for name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS")},
    }


def _text(info, indent=""):
    lines = []
    for key, value in info.items():
        if isinstance(value, dict):
            lines.append(f"{indent}{key}:")
            lines.extend(_text(value, indent + "  "))
        else:
            lines.append(f"{indent}{key + ':':<30}{'-' if value is None else value}")
    return lines


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    info = report()
    if info["mpi"].get("rank", 0) != 0:
        return 0
    print(json.dumps(info, indent=1) if "--json" in argv else "\n".join(_text(info)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
