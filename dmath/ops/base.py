"""Master-side helpers shared by the operations: metadata, validation, dispatch."""
import numbers

import numpy as np

from ..backend import canonical_dtype
from ..errors import DMathError, LayoutError
from ..layout import Layout, RowBlock, distribution, check_shape
from ..runtime import Meta, runtime

_make_matrix = None
_matrix_type = None


def set_matrix_factory(fn, cls=None):
    """matrix.py registers how a (handle, Meta) pair becomes a Matrix, and the Matrix class (keeps
    imports one-way)."""
    global _make_matrix, _matrix_type
    _make_matrix, _matrix_type = fn, cls


def meta(m):
    """The Meta of Matrix m (kept by the Matrix: a dtype's name costs microseconds to look up)."""
    return m._meta


def new_meta(layout, shape, dtype):
    """Validated metadata for a new matrix: explicit layout defaults, canonical dtype."""
    rt = runtime()
    shape = check_shape(shape)
    if layout is None:
        layout = RowBlock()
    if not isinstance(layout, Layout):
        raise LayoutError(f"layout must be a dmath layout (RowBlock(), Replicated(), ...), got {layout!r}")
    layout = layout.resolved(rt.nworkers)
    distribution(layout, shape, rt.nworkers)   # raises LayoutError if it does not fit
    return Meta(layout, shape, canonical_dtype(dtype))


def dist_of(m):
    return distribution(m.layout, m.shape, runtime().nworkers)


def dispatch(op, inputs=(), outputs=(), static=(), scalars=(), payload=None, pooled=True):
    """Run `op`; returns (new Matrix objects for the Meta outputs, the master's kernel result).

    pooled=False: the new matrices live outside the capped pools (see Runtime.call)."""
    return dispatch_metas(op, inputs, tuple([m._meta for m in inputs]), tuple(outputs), static,
                          [float(s) for s in scalars] if scalars else (), payload, pooled)


def dispatch_metas(op, inputs, metas, outputs, static, scalars, payload=None, pooled=True):
    """`dispatch` for a master half that holds the inputs' Metas already (a tuple), its outputs as a
    tuple and its scalars as floats (an elementwise call: nothing rebuilt per operation)."""
    handles, result = runtime().call(op, [m._handle for m in inputs], metas, outputs, static, scalars, payload,
                                     pooled)
    make = _make_matrix
    return [make(h, o) for h, o in zip(handles, outputs) if type(o) is Meta], result


def as_int(value, what):
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise DMathError(f"{what} must be an integer, got {value!r}")
    return int(value)


def is_matrix(x):
    """Whether x is a dmath.Matrix (duck-typed: this layer sits below matrix.py; the class itself is
    recognised first, which is all that a master half's check costs for a Matrix)."""
    return type(x) is _matrix_type or (hasattr(x, "_handle") and hasattr(x, "layout"))


def check_scalar(v, what="a scalar operand"):
    """v as a float; DMathError unless it is a real number (bool is not)."""
    if type(v) is float:          # the usual case, without the ABC check below (dispatch cost)
        return v
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, numbers.Real):
        raise DMathError(f"{what} must be a real number, got {v!r}")
    return float(v)
