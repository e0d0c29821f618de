"""Master-side helpers shared by the operations: metadata, validation, dispatch."""
import numbers
import operator

import numpy as np

from ..backend import canonical_dtype
from ..errors import DMathError, LayoutError
from ..layout import Layout, RowBlock, distribution, check_shape
from ..runtime import Meta, runtime

_matrix_type = None


def set_matrix_class(cls):
    """matrix.py registers the Matrix class, whose `cls(handle, meta)` makes a Matrix (keeps imports
    one-way)."""
    global _matrix_type
    _matrix_type = cls


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
    outputs = tuple(outputs)
    handles, result = runtime().call(op, [m._handle for m in inputs], tuple([m._meta for m in inputs]), outputs,
                                     static, [float(s) for s in scalars] if scalars else (), payload, pooled)
    return _matrices(handles, outputs), result


_handle_of = operator.attrgetter("_handle")


class Known:
    """The runtime's Entry of the command a cached master-side plan sends, kept in the plan (`dispatch_known`)."""
    __slots__ = ("rt", "entry")

    def __init__(self):
        self.rt = self.entry = None


def dispatch_known(known, op, inputs, metas, outputs, static, scalars):
    """`dispatch` of a command that a master half's cached plan determines whole (op, static, the
    inputs' Metas `metas` as a tuple, `outputs` as a tuple): after its first send the command goes
    by the Entry kept in `known` (a `Known` of that plan), with no signature built or looked up.
    `scalars`: floats already. Pooled, no payload."""
    rt = runtime()
    handles = list(map(_handle_of, inputs))       # (no comprehension frame: Python < 3.12)
    if known.rt is rt and known.entry.sig_id is not None:     # (None: the runtime dropped the signature)
        handles, result = rt.call_entry(known.entry, handles, scalars)
    else:
        handles, result = rt.call(op, handles, metas, outputs, static, scalars)
        known.entry, known.rt = rt.entry_of(op, metas, outputs, static), rt
    return _matrices(handles, outputs), result


def _matrices(handles, outputs):
    """New Matrix objects for a command's new outputs (those given by a Meta)."""
    make = _matrix_type
    if len(outputs) == 1 and type(outputs[0]) is Meta:      # (the usual command: one new matrix)
        return [make(handles[0], outputs[0])]
    return [make(h, o) for h, o in zip(handles, outputs) if type(o) is Meta]


def as_int(value, what):
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise DMathError(f"{what} must be an integer, got {value!r}")
    return int(value)


def as_list(matrices, what):
    """`matrices` (a list, tuple or other iterable of matrices) as a list; DMathError for a single
    Matrix or anything that is not iterable, naming the function `what`."""
    if is_matrix(matrices):
        raise DMathError(f"{what}: pass a list of matrices, got one dmath.Matrix")
    try:
        return list(matrices)
    except TypeError:
        raise DMathError(f"{what}: pass a list of matrices, got {type(matrices).__name__}") from None


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
    try:
        return float(v)
    except OverflowError as exc:         # an int past float64's range (10**400)
        raise DMathError(f"{what} must be a real number within float64's range, got {v!r}") from exc
