"""What the nn families' master halves share: argument checks and the batch's row layout.

A batch is a matrix of shape (N, features), row i sample i. Every nn
function first puts it in a row layout, where each worker holds whole
samples: RowBlock (data parallelism; any group and sizes) and Replicated are
used as they are, anything else is remapped to RowBlock over the same
workers (a Partial batch is summed on the way). Parameters are replicated
over the batch's workers before dispatch. Everything here runs on the
master, before a command is sent; a mistake raises ShapeError, LayoutError,
DTypeError or DMathError and leaves the runtime usable.
"""
import math
import numbers

import numpy as np

from ...errors import DMathError, DTypeError, ShapeError
from ...layout import Partial, Replicated, RowBlock, distribution
from ...runtime import runtime
from ..base import dist_of, is_matrix

#: step and seed travel as float64 scalars: integers up to 2**53 are exact
_F64_EXACT_INT = 2 ** 53


def require(m, what):
    """`m`, which must be a dmath.Matrix."""
    if not is_matrix(m):
        raise DMathError(f"{what} must be a dmath.Matrix, got {type(m).__name__}")
    return m


def flag(value, what):
    """`value` as a bool, which must be True or False (a string such as 'no' is truthy: taken as True, it
    trained a batch norm that was asked not to, and read an NCHW batch as channels-last)."""
    if not isinstance(value, (bool, np.bool_)):
        raise DMathError(f"{what} must be True or False, got {value!r}")
    return bool(value)


def real(value, what):
    """`value` as a float, which must be a finite real number (bool is not)."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real) or not math.isfinite(value):
        raise DMathError(f"{what} must be a finite real number, got {value!r}")
    return float(value)


def counter(value, what):
    """A non-negative integer that travels exactly as a float64 scalar (seed, step)."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real) or not math.isfinite(value) \
            or value != int(value) or not 0 <= value < _F64_EXACT_INT:
        raise DMathError(f"{what} must be an integer in [0, 2**53), got {value!r}")
    return float(value)


def expect_shape(m, shape, what):
    """ShapeError unless Matrix `m` has `shape`."""
    if m.shape != tuple(shape):
        raise ShapeError(f"{what} has shape {m.shape}, expected {tuple(shape)}")


def counter_matrix(m, group, what):
    """A (1, 1) float32/float64 counter replicated on the batch's workers (read on the device)."""
    require(m, what)
    expect_shape(m, (1, 1), what)
    if m.dtype == "float16":
        raise DTypeError(f"{what}: a float16 counter is exact only up to 2048; use float32 or float64")
    return replicated(m, group, what)


def rows(m, what):
    """`m` in a row layout: RowBlock and Replicated as they are, anything else as RowBlock
    over the same workers (a Partial matrix is summed on the way)."""
    require(m, what)
    if type(m.layout) is RowBlock or m.layout.replicated:
        return m
    return m.remap(RowBlock(dist_of(m).group))


def like(m, ref, what):
    """`m` (as many rows as `ref`) with its rows on the same workers as `ref`'s."""
    require(m, what)
    p = runtime().nworkers
    if distribution(m.layout, m.shape, p).same_placement(distribution(ref.layout, m.shape, p)):
        return m
    return m.remap(ref.layout)


def replicated(m, group, what):
    """`m` replicated on (at least) every worker of `group`."""
    require(m, what)
    lay = m.layout
    if lay.replicated and set(group) <= set(lay.members(runtime().nworkers)):
        return m
    return m.remap(Replicated(group))


def group_of(x):
    """The workers of matrix `x`, a tuple of ranks."""
    return tuple(dist_of(x).group)


def sum_layout(x):
    """The layout of a sum over the batch `x`'s samples computed without communication."""
    return Replicated(group_of(x)) if x.layout.replicated else Partial(group_of(x))


def gradient_places(st):
    """(dX, dW, dB)'s places among a backward command's outputs, None for one not made (a pure
    function of its static need_dx, need_dw, need_db): they come in that order, each only where
    its flag asks for it."""
    flags = (st.need_dx, st.need_dw, st.need_db)
    return tuple(sum(flags[:i]) if flags[i] else None for i in range(3))
