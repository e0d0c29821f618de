"""What dmath would run on here: `python -m dmath.info` (as `cupy.show_config()`).

    python -m dmath.info            # text: versions, MPI library, workers, GPUs, NCCL, cuDNN, settings
    python -m dmath.info --json     # the same as one JSON object
    mpiexec -n 4 python -m dmath.info    # under a launcher: the worker count it gives (rank 0 prints)

Nothing here starts the runtime: no command is sent, no GPU memory is
allocated beyond what CuPy needs to name the devices. Each section that
cannot be filled says why (a package missing, no GPU visible).
"""
import importlib.metadata
import json
import os
import platform
import sys

#: every environment variable dmath and dnn read, with its default and meaning (the README's table)
ENVIRONMENT = {
    "DMATH_DEVICE": ("auto", "'cpu' or 'gpu': the backend when init(device=None); auto picks gpu when CuPy sees one"),
    "DMATH_TIMEOUT_S": ("see README", "seconds of worker silence before the master reports a failure"),
    "DMATH_FAILED_WORKER_GRACE_S": ("120", "how long a failed worker waits for the master to end the job"),
    "DMATH_WATCHDOG_S": ("0 (off)", "every rank prints its stack every N seconds (hang diagnosis)"),
    "DMATH_SPIN_S": ("0.005", "seconds a wait polls without sleeping before it naps (MPI progresses only "
                              "while called)"),
    "DMATH_SPIN_BYTES_PER_S": ("2e8", "a wait for b bytes polls without sleeping for SPIN_S + b / this"),
    "DMATH_REPLICA_CACHE_BYTES": ("4 GiB", "bytes of gathered replicas a worker keeps (the replica cache)"),
    "DMATH_CAREFUL": ("auto", "careful commands (a refusal inside a collective is undone): 'auto' under memory "
                              "pressure, 'always', 'never' (dmath.memory.set_careful)"),
    "DMATH_BATCH_MAX": ("16", "the most queued commands (local, cheap) the master sends in one control "
                              "message; 0: none are queued"),
    "DMATH_BATCH_AGE_US": ("500", "the longest a queued command waits before the master's next command sends it"),
    "DMATH_BATCH_SHARE_US": ("50", "a local command is queued only when the master's own share of it last took "
                                   "at most this"),
    "DMATH_PROFILE": ("0", "1: time every kernel (dmath.stats()[r]['profile']); turns CUDA graphs off"),
    "DMATH_CPROFILE": ("", "a path prefix: every rank profiles its Python code and writes PREFIX.<rank>.prof at exit"),
    "DMATH_CUDA_GRAPHS": ("1", "0: replay recorded plans kernel by kernel, never as CUDA graphs"),
    "DMATH_GRAPH_COLLECTIVES": ("1", "0: never capture NCCL collectives into a CUDA graph"),
    "DMATH_CUDNN": ("1", "0: convolutions by im2col and cuBLAS even when cuDNN is there"),
    "DMATH_CUBLASLT": ("1", "0: a prepared local product calls cuBLAS's GemmEx/Dgemm instead of cuBLASLt with "
                            "its algorithm chosen once"),
    "DMATH_TF32": ("1", "float32 cuDNN convolutions may use TF32 tensor cores (as PyTorch's); 0: float32 "
                        "throughout"),
    "DNN_DATA_DIR": ("~/.cache/dmath-dnn", "where dnn.data downloads and finds data sets"),
}


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
        "optional": {name: _version(name) for name in ("tqdm", "matplotlib", "torch", "scipy")},
        "environment": {name: os.environ[name] for name in ENVIRONMENT if name in os.environ},
        "threads": {name: os.environ.get(name) for name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS")},
    }


def _text(info, indent=""):
    lines = []
    for key, value in info.items():
        if isinstance(value, dict):
            lines.append(f"{indent}{key}:")
            lines.extend(_text(value, indent + "  "))
        else:
            lines.append(f"{indent}{key + ':':<22}{'-' if value is None else value}")
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
