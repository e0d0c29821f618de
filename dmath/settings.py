"""Every environment variable dmath and dnn read: the one table, read and checked at `dmath.init()`.

`load()` reads every `DMATH_*` variable and raises `SettingError` naming the
variable, its value and what it takes; `init()` calls it on every rank before
any of them starts serving, so a bad value ends the job at once instead of
hanging or crashing later. The modules read the checked values from
`current` (the defaults until `init()`). `python -m dmath.machine` and the
README's table list `VARIABLES`.
"""
import math
import os
from typing import Callable, NamedTuple

from .errors import DMathError


class SettingError(DMathError, ValueError):
    """An environment variable holds a value dmath cannot use."""


class Variable(NamedTuple):
    """One environment variable: `parse(text)` gives its value, or raises ValueError when `text` is
    not `expected`; unset or empty, its value is `unset` (`default` says so in words). `attr` names
    the value in `current` (None: read where it is used, outside dmath, and only listed here)."""
    name: str
    default: str
    meaning: str
    expected: str
    parse: Callable
    unset: object = None
    attr: str = None


def _number(low=0.0, finite=True, above=False):
    def parse(text):
        value = float(text)
        if math.isnan(value) or (finite and math.isinf(value)) or value < low or (above and value <= low):
            raise ValueError(text)
        return value
    return parse


def _count(text):
    value = int(text)
    if value < 0:
        raise ValueError(text)
    return value


def _whole(low, high):
    def parse(text):
        value = int(text)
        if not low <= value <= high:
            raise ValueError(text)
        return value
    return parse


def _bytes(text):
    return int(_number()(text))


def _flag(text):
    if text not in ("0", "1"):
        raise ValueError(text)
    return text == "1"


def _choice(*names):
    def parse(text):
        if text not in names:
            raise ValueError(text)
        return text
    return parse


def _profile_prefix(text):
    # the profiles are written when the job ends: a folder that is not there would turn a good run
    # into exit 1 after all the work, so it is checked when dmath starts
    folder = os.path.dirname(text) or "."
    if not os.path.isdir(folder) or not os.access(folder, os.W_OK):
        raise ValueError(text)
    return text


def _text(text):
    return text


VARIABLES = (
    Variable("DMATH_DEVICE", "auto", "'cpu' or 'gpu': the backend when init(device=None); auto picks gpu "
             "when CuPy sees one", "'cpu' or 'gpu' (unset: auto)", _choice("cpu", "gpu"), None, "device"),
    Variable("DMATH_TIMEOUT_S", "120", "seconds of worker silence before the master reports a failure",
             "a number of seconds >= 0 (0: no limit)", _number(finite=False), 120.0, "timeout_s"),
    Variable("DMATH_FAILED_WORKER_GRACE_S", "120", "how long a failed worker waits for the master to end "
             "the job", "a number of seconds >= 0", _number(), 120.0, "failed_worker_grace_s"),
    Variable("DMATH_WATCHDOG_S", "0 (off)", "every rank prints its stack every N seconds (hang diagnosis)",
             "a number of seconds >= 0 (0: off)", _number(), 0.0, "watchdog_s"),
    Variable("DMATH_SPIN_S", "0.005", "seconds a wait polls without sleeping before it naps (MPI progresses "
             "only while called)", "a number of seconds >= 0", _number(), 0.005, "spin_s"),
    Variable("DMATH_SPIN_BYTES_PER_S", "2e8", "a wait for b bytes polls without sleeping for SPIN_S + b / this",
             "a number of bytes per second > 0", _number(above=True, finite=False), 2e8, "spin_bytes_per_s"),
    Variable("DMATH_REPLICA_CACHE_BYTES", "4 GiB", "bytes of gathered replicas a worker keeps (the replica "
             "cache)", "a number of bytes >= 0", _bytes, 4 << 30, "replica_cache_bytes"),
    Variable("DMATH_CAREFUL", "auto", "careful commands (a refusal inside a collective is undone): 'auto' "
             "under memory pressure, 'always', 'never' (dmath.memory.set_careful)",
             "'auto', 'always' or 'never'", _choice("auto", "always", "never"), "auto", "careful"),
    Variable("DMATH_BATCH_MAX", "16", "the most queued commands (local, cheap) the master sends in one "
             "control message; 0: none are queued", "a whole number >= 0", _count, 16, "batch_max"),
    Variable("DMATH_BATCH_AGE_US", "500", "the longest a queued command waits before the master's next "
             "command sends it", "a finite number of microseconds >= 0", _number(), 500.0, "batch_age_us"),
    Variable("DMATH_BATCH_SHARE_US", "50", "a local command is queued only when the master's own share of "
             "it last took at most this", "a finite number of microseconds >= 0", _number(), 50.0,
             "batch_share_us"),
    Variable("DMATH_PROFILE", "0", "1: time every kernel (dmath.stats()[r]['profile']); turns CUDA graphs off",
             "0 or 1", _flag, False, "profile"),
    Variable("DMATH_CPROFILE", "", "a path prefix: every rank profiles its Python code and writes "
             "PREFIX.<rank>.prof at exit", "a path prefix in a folder that exists and is writable",
             _profile_prefix, "", "cprofile"),
    Variable("DMATH_CUDA_GRAPHS", "1", "0: replay recorded plans kernel by kernel, never as CUDA graphs",
             "0 or 1", _flag, True, "cuda_graphs"),
    Variable("DMATH_GRAPH_COLLECTIVES", "1", "0: never capture NCCL collectives into a CUDA graph",
             "0 or 1", _flag, True, "graph_collectives"),
    Variable("DMATH_GRAPH_STREAMS", "4", "the most CUDA streams a captured plan runs its independent steps "
             "on (branches of a network side by side); 1: one stream",
             "a whole number from 1 to 8", _whole(1, 8),
             4, "graph_streams"),
    Variable("DMATH_GRAPH_STREAMS_MEMORY", "shared", "where the streams of a captured plan take their memory: "
             "'shared' (one free list: the graph holds about one stream's memory; a stream that takes memory "
             "another used waits for that use) or 'own' (a free list per stream: no such waits between "
             "branches, up to one stream's free blocks more per stream)",
             "'shared' or 'own'", _choice("shared", "own"), "shared", "graph_streams_memory"),
    Variable("DMATH_GPU_DECODE_ORDER", "overlap", "image folders decoded on the GPU (nvImageCodec): 'overlap' "
             "(a batch decoded on the read-ahead thread beside the running step) or 'serial' (decoded on the "
             "device between the previous step and the batch's own kernels, the host waiting for neither; "
             "the decoder's host work is then on the step's path)",
             "'overlap' or 'serial'", _choice("overlap", "serial"), "overlap", "gpu_decode_order"),
    Variable("DMATH_READ_AHEAD", "1", "batches whose host stage (reading, decoding) runs ahead of the step "
             "at once, each on its own thread into its own staging buffer (2: one batch read and parsed while "
             "the one before it is decoded)", "a whole number from 1 to 4", _whole(1, 4), 1, "read_ahead"),
    Variable("DMATH_CUDNN", "1", "0: convolutions by im2col and cuBLAS even when cuDNN is there",
             "0 or 1", _flag, True, "cudnn"),
    Variable("DMATH_CUBLASLT", "1", "0: a prepared local product calls cuBLAS's GemmEx/Dgemm instead of "
             "cuBLASLt with its algorithm chosen once", "0 or 1", _flag, True, "cublaslt"),
    Variable("DMATH_CUDNN_WORKSPACE_KEEP", "67108864 (64 MiB)", "a chosen cuDNN plan's workspace up to this many "
             "bytes is the worker's one shared buffer, kept between calls; a larger one is allocated for its call "
             "and freed after it (inside a captured step: from the graph's own pool, held only while that "
             "convolution runs), as PyTorch does", "a number of bytes >= 0", _bytes, 64 << 20,
             "cudnn_workspace_keep"),
    Variable("DMATH_TF32", "1", "float32 cuDNN convolutions may use TF32 tensor cores (as PyTorch's); 0: "
             "float32 throughout", "0 or 1", _flag, True, "tf32"),
    Variable("DMATH_DETERMINISTIC", "0", "1: the same bits from run to run on the same GPUs: cuDNN plans "
             "marked non-deterministic (atomic sums) are never built, and every tuned choice is the "
             "heuristics' (as DMATH_TUNE=off: a timing never picks it)", "0 or 1", _flag, False, "deterministic"),
    Variable("DMATH_TUNE", "fast", "how cuDNN plans and cuBLASLt algorithms are chosen: 'off' (heuristics' "
             "first), 'fast' (cached, else a few timed), 'full' (all timed); see docs/tuning.md",
             "'off', 'fast' or 'full'", _choice("off", "fast", "full"), "fast", "tune"),
    Variable("DMATH_TUNE_BUDGET_MS", "300", "'fast' tuning: the milliseconds one shape's candidates may take "
             "(building them included) before the fastest timed so far is kept; smaller starts sooner",
             "a finite number of milliseconds > 0", _number(above=True), 300.0, "tune_budget_ms"),
    Variable("DMATH_TUNE_AMORTIZE", "1000", "'fast' tuning of an expensive shape: past its first candidates, "
             "more are timed (up to 16) while the time spent on the shape stays below this many runs of its "
             "fastest plan so far (when that outlasts DMATH_TUNE_BUDGET_MS); 0: the first few only",
             "a whole number of runs >= 0", _count, 1000, "tune_amortize"),
    # read where they are used (dmath.tuning's cache path: empty means none, unlike the others;
    # dnn/data when it downloads, before or without init): listed here for the table only
    Variable("DMATH_TUNE_CACHE", "~/.cache/dmath/tune.json", "the tuning cache file (a directory: "
             "DIR/tune.json); empty: none read or written", "a file or folder path, or empty", _text),
    # read by dnn/data when it downloads (before or without init): listed here for the table only
    Variable("DNN_DATA_DIR", "~/.cache/dmath-dnn", "where dnn.data downloads and finds data sets",
             "a folder", _text),
)

#: name -> Variable
BY_NAME = {v.name: v for v in VARIABLES}


class Settings:
    """The checked values, one attribute per variable (`Variable.attr`)."""

    def __init__(self, values):
        self.__dict__.update(values)

    def __repr__(self):
        return f"Settings({', '.join(f'{k}={v!r}' for k, v in self.__dict__.items())})"


def _value(var, text):
    if text == "":
        return var.unset
    try:
        return var.parse(text)
    except (ValueError, OverflowError):
        raise SettingError(f"{var.name} must be {var.expected}, got {text!r}") from None


def read(environ=None):
    """The Settings the environment (`os.environ` by default) gives; SettingError on the first bad value."""
    environ = os.environ if environ is None else environ
    return Settings({v.attr: _value(v, environ.get(v.name, "")) for v in VARIABLES if v.attr})


def value(name, environ=None):
    """One variable's checked value, for code that may run before or without `init()`."""
    environ = os.environ if environ is None else environ
    return _value(BY_NAME[name], environ.get(name, ""))


def raw(name):
    """A listed variable's text as set (None when unset), for one whose empty value means something."""
    return os.environ.get(BY_NAME[name].name)


#: variables a rank may set alone: they change what that rank reports (stack dumps, profiles), never
#: what the ranks do together; every other one must have the same value on every rank (agreed())
PER_RANK = ("DMATH_WATCHDOG_S", "DMATH_PROFILE", "DMATH_CPROFILE")


def differing(every):
    """The names of the variables whose values differ among `every` rank's Settings (a list), but for
    PER_RANK's: a pure function of the values."""
    first = vars(every[0])
    return [v.name for v in VARIABLES if v.attr and v.name not in PER_RANK
            and any(vars(other)[v.attr] != first[v.attr] for other in every[1:])]


def load():
    """Read and check every variable now (`dmath.init()`), and make the result `current`."""
    global current
    current = read()
    return current


#: the values in force: the defaults until `load()` runs at `dmath.init()`
current = read({})
