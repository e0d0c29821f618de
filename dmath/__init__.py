"""dmath: distributed dense linear algebra with a master-worker runtime over MPI.

    import dmath
    dmath.init()                       # on ranks > 0 this never returns: they serve commands
    A = dmath.random.rand((1000, 500), layout=dmath.RowBlock())
    B = A.remap(dmath.ColBlock(), dtype='float16')
    print((B.astype('float32') - A).norm())

See docs/ARCHITECTURE.md for the layers and how to add an operation;
`python -m dmath.info` reports what dmath finds on this machine.
"""
__version__ = "0.1.0"   # the package's version (pyproject.toml reads it from here)

from . import memory, random
from .backend import DTYPES
from .errors import (DMathError, DTypeError, LayoutError, LinAlgError, NotSupportedError, OutOfMemoryError,
                     PlanError, RuntimeStateError, ShapeError, WorkerError)
from .ops.files import from_file
from .groups import current_group, on_group
from .ops.gemm import explain_gemm, gemm
from .layout import Block2D, BlockCyclic, ColBlock, Layout, Partial, Replicated, RowBlock, Tiles
from .matrix import Matrix, eye, from_numpy, full, ones, zeros
# every elementwise function (arithmetic, comparisons, logic): one definition each in ops/elementwise.py
from .ops.elementwise import (abs, equal, exp, greater, greater_equal, isfinite, isnan, less, less_equal,
                              log, logical_and, logical_not, logical_or, maximum, minimum, not_equal, pow,
                              relu, sigmoid, sqrt, tanh, where)
from .runtime import Plan, finalize, init, is_initialized, record
from .runtime import runtime as _runtime
from .ops.info import reset_stats, stats, synchronize
from . import nn  # noqa: E402  (the neural-network operations: dmath.nn.conv2d, ...)
from . import linalg  # noqa: E402  (factorizations and solvers: dmath.linalg.cholesky, ...)


def num_workers():
    """P, the number of workers (the MPI world size; 1 without mpiexec)."""
    return _runtime().nworkers


def device():
    """'cpu' or 'gpu': the backend chosen by init."""
    return _runtime().backend.name


__all__ = ["__version__", "init", "finalize", "is_initialized", "num_workers", "device", "stats", "reset_stats", "synchronize",
           "Matrix", "gemm", "explain_gemm", "zeros", "ones", "full", "eye", "from_numpy", "from_file", "random", "memory",
           "exp", "log", "sqrt", "abs", "tanh", "sigmoid", "relu", "pow", "maximum", "minimum", "where",
           "equal", "not_equal", "greater", "greater_equal", "less", "less_equal", "isfinite", "isnan",
           "logical_and", "logical_or", "logical_not",
           "Layout", "Replicated", "Partial", "RowBlock", "ColBlock", "Block2D", "BlockCyclic", "Tiles",
           "DMathError", "ShapeError", "LayoutError", "DTypeError", "WorkerError", "OutOfMemoryError",
           "RuntimeStateError", "PlanError", "LinAlgError", "linalg", "NotSupportedError", "record", "Plan", "DTYPES", "on_group",
           "current_group"]
