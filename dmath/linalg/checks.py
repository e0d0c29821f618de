"""Master-side checks and choices shared by dmath.linalg's functions (no kernels here)."""
import contextlib
import functools
import threading

import numpy as np

from .. import backend
from ..errors import DMathError, DTypeError, LinAlgError, PlanError, ShapeError
from ..layout import Layout
from ..ops.base import is_matrix
from ..ops.nn.update import all_finite
from ..runtime import runtime
from . import dense

#: the column-block width of the factorizations when `block=` is not given, per backend (and per
#: factorization where the best differs), measured with benchmarks/linalg_bench.py --blocks: on the
#: CPU 256 beat 128 (n = 2048, 2 workers); on an H200 (n = 16384, float64) 1024 gave Cholesky 0.90
#: and LU 0.48 of one-GPU cuSOLVER's rate against 0.62 and 0.43 at 512, while QR peaked at 512
#: (0.86, 0.66 at 1024): benchmarks/results/linalg_gpu_2026-11-26_065329.json
DEFAULT_BLOCK = {"cpu": 256, "gpu": 1024, "gpu:qr": 512}


_calls = threading.local()


def entry(fn):
    """Mark a public dmath.linalg function: the finiteness of its inputs is checked at the user's
    call only, not again when it runs inside another one (lstsq's qr, svds' qr in every power
    iteration: each check is a collective and a gather, and an intermediate's non-finite value is
    not the user's input)."""
    @functools.wraps(fn)
    def call(*args, **kwargs):
        _calls.depth = getattr(_calls, "depth", 0) + 1
        try:
            return fn(*args, **kwargs)
        finally:
            _calls.depth -= 1
    return call


@contextlib.contextmanager
def user_code():
    """Run the user's code given to a linalg function (cg's operator and callback) as a call of its
    own: a linalg call made there checks its inputs as any top-level call (inside cg it skipped the
    NaN/inf check, and solve(A with inf) returned finite garbage)."""
    saved = getattr(_calls, "depth", 0)
    _calls.depth = 0
    try:
        yield
    finally:
        _calls.depth = saved


def matrix(A, fn, what="A"):
    """A, checked to be a dmath.Matrix of float32 or float64 (and the call outside a record block)."""
    if runtime().recorder is not None:
        # a replay repeats the commands, not the master's checks of their results (the failing
        # minor, a zero pivot, convergence) nor the master's loop of cg or Lanczos's decisions
        raise PlanError(f"{fn}: dmath.linalg functions cannot be recorded into a plan: the master "
                        f"checks their results (a failing minor, a zero pivot, convergence), which a "
                        f"replay would skip; call {fn} outside the record block")
    if not is_matrix(A):
        raise DMathError(f"{fn}: {what} must be a dmath.Matrix, got {type(A).__name__}")
    if not runtime().backend.is_gpu:
        dense.lapack_available()   # on the master, before a worker's kernel could fail for want of it
    if A.dtype == np.float16:
        raise DTypeError(f"{fn}: {what} is float16, which has too few digits for a factorization "
                         f"(3 significant digits: the residual would be larger than the answer for "
                         f"most matrices); convert it with {what}.astype('float32')")
    # as SciPy's check_finite: LAPACK passes NaN through, cuSOLVER may return finite garbage for it
    if getattr(_calls, "depth", 0) <= 1 and float(all_finite([A]).to_numpy()[0, 0]) != 1.0:
        raise LinAlgError(f"{fn}: {what} holds NaN or inf")
    return A


def square(A, fn, what="A"):
    matrix(A, fn, what)
    m, n = A.shape
    if m != n:
        raise ShapeError(f"{fn}: {what} must be square, got {m} x {n}")
    return A


def same_rows(A, B, fn):
    matrix(B, fn, "B")
    if B.shape[0] != A.shape[0]:
        raise ShapeError(f"{fn}: B has {B.shape[0]} rows but A has {A.shape[0]}; they must agree")
    return B


def dtype_of(*ms):
    """The dtype the computation runs in: NumPy's result type of the operands."""
    return np.result_type(*[m.dtype for m in ms]).name


def block(nb, n=None, op=None):
    """The column-block width: `nb` checked, or the backend's default (for factorization `op` where
    it has its own); at most n (when given)."""
    if nb is None:
        where = "gpu" if backend.current().is_gpu else "cpu"
        nb = DEFAULT_BLOCK.get(f"{where}:{op}", DEFAULT_BLOCK[where])
    elif isinstance(nb, (bool, np.bool_)) or not isinstance(nb, (int, np.integer)) or nb < 1:
        raise DMathError(f"block must be a positive integer, got {nb!r}")
    nb = int(nb)
    return max(1, min(nb, n)) if n is not None else nb


def layout(lay, fn):
    if lay is not None and not isinstance(lay, Layout):
        raise DMathError(f"{fn}: layout must be a dmath layout or None, got {lay!r}")
    return lay


def flag(v, fn, what):
    if v is True or v is False or isinstance(v, np.bool_):
        return bool(v)
    raise DMathError(f"{fn}: {what} must be True or False, got {v!r}")


def workers():
    return runtime().nworkers


def placed(M, lay):
    """M in layout `lay` (None: as it is); a remap only when it is elsewhere."""
    if lay is None:
        return M
    return M if M.layout == lay.resolved(workers()) else M.remap(lay)
