"""dmath: distributed dense linear algebra with a master-worker runtime over MPI.

    import dmath
    dmath.init()                       # on ranks > 0 this never returns: they serve commands
    A = dmath.random.rand((1000, 500), layout=dmath.RowBlock())
    B = A.remap(dmath.ColBlock(), dtype='float16')
    print((B.astype('float32') - A).norm())

See docs/ARCHITECTURE.md for the design and docs/adding.md for how to add an operation;
`python -m dmath.machine` reports what dmath finds on this machine.
"""
__version__ = "0.1.0"   # the package's version (pyproject.toml reads it from here)

import types as _types

from . import memory, random
from .backend import DTYPES
from .errors import (DMathError, DTypeError, LayoutError, LinAlgError, NotSupportedError, OutOfMemoryError,
                     PlanError, RuntimeStateError, ShapeError, WorkerError)
from .ops.files import from_file
from .groups import current_group, on_group
from .ops.gemm import explain_gemm, gemm
from .ops.buckets import sum_partials
from .ops.cast import astype_many
from .ops.elementwise import add_n
from .layout import Block2D, BlockCyclic, ColBlock, Layout, Partial, Replicated, RowBlock, Tiles
from .matrix import Matrix, eye, from_numpy, full, ones, zeros
from .ops import elementwise as _elementwise
# assembly and structure (HPC codes): writing into windows, building, triangles, diagonals, row gathers
from .ops.assembly import block, concatenate, hstack, pad, roll, vstack
from .ops.structure import diag, take_rows, trace, tril, triu
from .runtime import Plan, finalize, init, is_initialized, record
from .runtime import runtime as _runtime
from .ops.stats import reset_stats, stats, synchronize
from . import nn  # noqa: E402  (the neural-network operations: dmath.nn.conv2d, ...)
from . import linalg  # noqa: E402  (factorizations and solvers: dmath.linalg.cholesky, ...)


def num_workers():
    """P, the number of workers (the MPI world size; 1 without mpiexec)."""
    return _runtime().nworkers


def device():
    """'cpu' or 'gpu': the backend chosen by init."""
    return _runtime().backend.name


# every elementwise function (arithmetic, comparisons, logic), named once: in its definition
# (ops/elementwise.py), which lists it in PUBLIC
globals().update({_name: getattr(_elementwise, _name) for _name in _elementwise.PUBLIC})

#: the public API: the functions, classes and constants above and the public modules, read from the
#: definitions (no list to keep in step with them)
__all__ = (["__version__"] + sorted(_name for _name, _value in globals().items()
                                    if not _name.startswith("_") and not isinstance(_value, _types.ModuleType))
           + [_module.__name__.rpartition(".")[2] for _module in (linalg, memory, nn, random)])
