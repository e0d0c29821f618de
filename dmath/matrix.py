"""Matrix: the master-side handle of a distributed matrix, and the functions that make them.

Every method validates on the master (raising ShapeError, LayoutError, ...
before anything is sent), aligns operands by remapping where layouts differ,
and dispatches one command per kernel.
"""
import math

import numpy as np

from .backend import canonical_dtype
from .errors import DMathError, DTypeError, LayoutError, NotSupportedError, ShapeError
from .layout import ColBlock, RowBlock, Tiles, distribution
from .layout.indexset import split_even
from . import linalg
from .ops import base, elementwise, movement, reductions, storage
from .ops.base import dispatch, new_meta
from .runtime import Meta, runtime

class _Dtypes(dict):
    """dtype name -> numpy dtype, filled on first use (np.dtype() of a name costs a microsecond,
    and every new Matrix needs one)."""
    def __missing__(self, name):
        d = self[name] = np.dtype(name)
        return d


_DTYPE = _Dtypes()

_ewise = elementwise.apply       # the elementwise op unit's master half (operators below)


class Matrix:
    """A distributed 2-D matrix; its blocks stay on the workers until `to_numpy()`."""

    __slots__ = ("_handle", "_meta", "shape", "_dtype", "layout", "_memory", "_derived", "__weakref__")
    # numpy scalars on the left (np.float32(2) * M) must defer to our reflected
    # operators instead of treating the Matrix as a sequence to convert
    __array_ufunc__ = None

    def __init__(self, handle, m):
        self._handle = handle
        self._meta = m             # the (layout, shape, dtype) commands carry: made once, not per use
        self.layout, self.shape, self._dtype = m.layout, m.shape, _DTYPE[m.dtype]
        self._memory = None        # the backend's default memory kind
        self._derived = None       # "A.T" or "A[r0:r1, c0:c1]": a copy that in-place writes must not touch

    def __del__(self):
        try:
            runtime().release(self._handle)
        except Exception:  # interpreter shutdown or dmath finalized: nothing left to free
            pass

    # ---- metadata (NumPy's names and meanings) -------------------------------
    @property
    def dtype(self):
        """The element type, a numpy dtype (float16, float32 or float64); it compares equal to its name."""
        return self._dtype

    @property
    def itemsize(self):
        """Bytes per element."""
        return self._dtype.itemsize

    @property
    def nbytes(self):
        """Bytes of the whole matrix (one copy; replicated layouts hold one per worker)."""
        return self.size * self._dtype.itemsize

    @property
    def ndim(self):
        return 2

    @property
    def size(self):
        """The number of elements."""
        return self.shape[0] * self.shape[1]

    def __repr__(self):
        return f"dmath.Matrix(shape={self.shape}, dtype={self.dtype}, layout={self.layout})"

    def __len__(self):
        """The number of rows, as len() of a 2-D numpy array."""
        return self.shape[0]

    # ---- Python protocols that would alias or hide a gather ---------------------
    def __copy__(self):
        """copy.copy(M) is M.copy(): a new matrix with its own blocks (a copied handle would be freed twice)."""
        return self.copy()

    def __deepcopy__(self, memo):
        return self.copy()

    def __reduce_ex__(self, protocol):
        raise NotSupportedError(
            "a dmath.Matrix cannot be pickled: it is a handle to blocks held by this run's workers, "
            "meaningless in another process. Save the values with M.to_numpy() (then numpy.save), "
            "or a dnn model with model.save(path)")

    def __array__(self, dtype=None, copy=None):
        raise NotSupportedError(f"a dmath.Matrix {self.shape} is not converted to numpy implicitly (that "
                                f"would gather it from every worker): call M.to_numpy()")

    def __iter__(self):
        raise NotSupportedError(f"a dmath.Matrix {self.shape} is not iterable (each row would be a command): "
                                f"call M.to_numpy() and iterate over that, or slice rows with M[r0:r1]")

    def _check_writable(self, what):
        if self._derived is not None:
            raise NotSupportedError(
                f"{what} on {self._derived}: that is a new matrix (a copy), not a view, so the write would "
                f"leave the original unchanged. Write the result to a name (B = B + 1), or make an "
                f"independent copy first (B = {self._derived}.copy())")

    # ---- memory kinds -------------------------------------------------------
    @property
    def memory(self):
        """Where the local blocks live: 'device', 'host', 'managed' or 'cuda_managed' (see dmath.memory.kinds).

        Creation functions take memory=; results of operations are in the
        default kind ('device' on a GPU, 'host' on the CPU backend).
        """
        return self._memory or storage.check_kind(None)

    def to_memory(self, kind):
        """A new Matrix with this one's layout and values, held in memory `kind`."""
        kind = _check_memory(kind)
        return _placed(storage.to_memory(self, kind), kind)

    def prefetch(self):
        """Start copying a 'host' or 'managed' matrix to the devices in the background; returns self.

        Its next use finds the device copy ready (the compute stream waits for
        the copy, the host does not). Nothing to do for the other kinds or on
        the CPU backend.
        """
        storage.prefetch(self)
        return self

    # ---- movement -----------------------------------------------------------
    def to_numpy(self):
        """Gather the whole matrix on the master as a numpy array."""
        return dispatch("gather", [self])[1]

    def remap(self, layout, dtype=None, background=False):
        """A new Matrix with the same values in `layout` (and `dtype`, converted on the narrower side).

        background: when the remap sums a Partial matrix (an all-reduce: data-parallel gradients),
        run that sum on the GPU's communication stream (in the new dtype), so that the commands
        issued next overlap it; the first command that reads the result waits for it on the
        device (the host never blocks). Elsewhere, and on the CPU, it changes nothing.
        """
        return _remap(self, layout, dtype, background=bool(background))

    def astype(self, dtype):
        return _remap(self, self.layout, dtype)

    def copy(self):
        return _remap(self, self.layout, None)

    def reshape(self, *shape, layout=None):
        """The same elements in row-major (C) order as a matrix of `shape`; one entry may be -1.

        A remap: the elements go to row blocks whose boundaries fall on whole
        rows of both shapes, each worker reshapes its block in place, and the
        result is remapped to `layout` (None: this matrix's layout when it
        fits the new shape, else RowBlock()). Only elements that change owner
        travel.
        """
        return _reshape(self, shape[0] if len(shape) == 1 else shape, layout)

    @property
    def T(self):
        """The transpose; every piece stays on its worker, transposed locally."""
        lay = self.layout.transposed(runtime().nworkers)
        out = dispatch("transpose", [self], [new_meta(lay, self.shape[::-1], self.dtype)])[0][0]
        out._derived = "A.T"
        return out

    def __getitem__(self, key):
        rows, cols = _parse_key(key, self.shape)
        if isinstance(rows, int) and isinstance(cols, int):
            return self.get((rows, cols))
        rows = slice(rows, rows + 1) if isinstance(rows, int) else rows
        cols = slice(cols, cols + 1) if isinstance(cols, int) else cols
        shape = (rows.stop - rows.start, cols.stop - cols.start)
        out = _remap(self, _slice_layout(self.layout), None, offset=(rows.start, cols.start), shape=shape)
        out._derived = f"A[{rows.start}:{rows.stop}, {cols.start}:{cols.stop}]"
        return out

    def get(self, index):
        """The element at (i, j) as a Python float."""
        i, j = _check_index(index, self.shape)
        return dispatch("get", [self], scalars=(i, j))[1]

    def set(self, index, value):
        """Write one element (i, j) = value in place."""
        i, j = _check_index(index, self.shape)
        self._check_writable("set")
        dispatch("set", [self], [0], scalars=(i, j, _check_scalar(value)))

    def assign(self, value):
        """Overwrite every value in place (same handle and buffers, a new version); returns self.

        value: a numpy array of this matrix's shape (scattered from the master,
        converted to this dtype), or a dmath.Matrix of the same shape
        (redistributed into this matrix's layout and dtype). This is how new
        data enters a recorded plan: assign the next batch, then replay.
        """
        self._check_writable("assign")
        if _is_matrix(value):
            if value.shape != self.shape:
                raise ShapeError(f"assign: the source matrix has shape {value.shape}, this matrix {self.shape}")
            dispatch("remap_into", [self, value], [0])
            return self
        if not isinstance(value, np.ndarray):
            raise DMathError(f"assign needs a numpy array or a dmath.Matrix, got {type(value).__name__}")
        if value.shape != self.shape:
            raise ShapeError(f"assign: the array has shape {value.shape}, this matrix {self.shape}")
        if value.dtype.kind not in "iuf":
            raise DTypeError(f"assign needs a real numeric array, got dtype {value.dtype}")
        dispatch("scatter_into", [self], [0], payload=np.ascontiguousarray(value, dtype=self.dtype))
        return self

    # ---- arithmetic ---------------------------------------------------------
    def __add__(self, o): return _ewise("add", self, o)
    def __radd__(self, o): return _ewise("add", o, self)
    def __sub__(self, o): return _ewise("sub", self, o)
    def __rsub__(self, o): return _ewise("sub", o, self)
    def __mul__(self, o): return _ewise("mul", self, o)
    def __rmul__(self, o): return _ewise("mul", o, self)
    def __truediv__(self, o): return _ewise("div", self, o)
    def __rtruediv__(self, o): return _ewise("div", o, self)
    def __pow__(self, o): return _ewise("pow", self, o)
    def __neg__(self): return _ewise("neg", self)
    def __pos__(self): return self
    def __iadd__(self, o): return _ewise("add", self, o, inplace=True)
    def __isub__(self, o): return _ewise("sub", self, o, inplace=True)
    def __imul__(self, o): return _ewise("mul", self, o, inplace=True)
    def __itruediv__(self, o): return _ewise("div", self, o, inplace=True)
    def __abs__(self): return _ewise("abs", self)

    # ---- products -------------------------------------------------------------
    def __matmul__(self, o):
        """self @ o: `dmath.gemm(self, o)` (any layouts; the cost model picks the strategy)."""
        if not _is_matrix(o):
            return _matmul_operand(o)
        return linalg.gemm(self, o)

    def __rmatmul__(self, o):
        return _matmul_operand(o)

    def replicate(self, wait=True):
        """Keep a Replicated copy on every worker (the replica cache); wait=False overlaps it. Returns self."""
        return linalg.replicate(self, wait)

    # ---- reductions ---------------------------------------------------------
    def sum(self, axis=None):
        """Sum over everything (a float) or along axis 0 / 1 (a (1, n) / (m, 1) Matrix)."""
        return reductions.reduce(self, "sum", axis)

    def mean(self, axis=None):
        return reductions.reduce(self, "mean", axis)

    def max(self, axis=None):
        return reductions.reduce(self, "max", axis)

    def min(self, axis=None):
        return reductions.reduce(self, "min", axis)

    def norm(self):
        """The Frobenius norm (a float)."""
        return reductions.reduce(self, "norm", None)


def _make(handle, m):
    return Matrix(handle, m)


base.set_matrix_factory(_make)


# ---- validation helpers ------------------------------------------------------
def _check_scalar(v):
    return base.check_scalar(v, "the value")


def _check_index(index, shape):
    try:
        i, j = index
    except (TypeError, ValueError) as exc:
        raise ShapeError(f"an element index is a pair (i, j), got {index!r}") from exc
    i, j = base.as_int(i, "row index"), base.as_int(j, "column index")
    if i < 0:
        i += shape[0]
    if j < 0:
        j += shape[1]
    if not (0 <= i < shape[0] and 0 <= j < shape[1]):
        raise ShapeError(f"index {index} is out of bounds for a matrix of shape {shape}")
    return i, j


def _parse_axis_key(k, n, what):
    if isinstance(k, slice):
        start, stop, step = k.indices(n)
        if step != 1:
            raise ShapeError(f"{what} slice step must be 1, got {k.step}")
        return slice(start, max(start, stop))
    i = base.as_int(k, f"{what} index")
    if i < 0:
        i += n
    if not 0 <= i < n:
        raise ShapeError(f"{what} index {k} is out of bounds for size {n}")
    return i


def _parse_key(key, shape):
    if not isinstance(key, tuple):
        key = (key, slice(None))
    if len(key) != 2:
        raise ShapeError(f"a Matrix takes two indices (rows, cols), got {len(key)}")
    return _parse_axis_key(key[0], shape[0], "row"), _parse_axis_key(key[1], shape[1], "column")


def _slice_layout(lay):
    """The layout of a submatrix: the source's kind; split sizes and tile grids refer to the old shape."""
    if isinstance(lay, (RowBlock, ColBlock)):
        return type(lay)(lay.group)
    if isinstance(lay, Tiles):
        return RowBlock()
    return lay


_is_matrix = base.is_matrix


def _matmul_operand(o):
    """`A @ o` or `o @ A` with `o` not a Matrix: say what to do (NotImplemented for other types)."""
    if isinstance(o, np.ndarray):
        raise NotSupportedError(f"@ between a dmath.Matrix and a numpy array {o.shape}: make the array a "
                                f"Matrix first (dmath.from_numpy(array)), or gather the Matrix (M.to_numpy())")
    return NotImplemented


# ---- remap --------------------------------------------------------------------
def _remap(m, layout, dtype, offset=(0, 0), shape=None, background=False):
    _require_matrix(m, "remap")
    return movement.remap(m, layout, dtype, offset, shape, background)


def _reshape(m, shape, layout):
    shape = _reshape_target(shape, m.shape)
    if layout is None:
        layout = m.layout if _fits(m.layout, shape) else RowBlock()
    if shape == m.shape:
        return _remap(m, layout, None)
    if m.size == 0:
        return zeros(shape, m.dtype, layout)
    # a block of whole rows of both shapes holds a multiple of lcm(n, n2) elements
    (_, n), (_, n2) = m.shape, shape
    unit = math.lcm(n, n2)
    chunks = split_even(m.size // unit, runtime().nworkers)
    src = _remap(m, RowBlock(sizes=[c * unit // n for c in chunks]), None)
    out = new_meta(RowBlock(sizes=[c * unit // n2 for c in chunks]), shape, m.dtype)
    flat = dispatch("reshape_rows", [src], [out])[0][0]
    return flat if _same_layout(flat, layout) else _remap(flat, layout, None)


def _reshape_target(shape, old):
    if not isinstance(shape, (tuple, list)) or len(shape) != 2:
        raise ShapeError(f"a Matrix is 2-D: reshape needs two sizes (one may be -1), got {shape!r}")
    shape = tuple(base.as_int(v, "reshape size") for v in shape)
    if shape.count(-1) > 1 or any(v < -1 for v in shape):
        raise ShapeError(f"reshape needs two sizes (one may be -1), got {shape}")
    count = old[0] * old[1]
    if -1 in shape:
        other = shape[1 - shape.index(-1)]
        if other == 0 or count % other:
            raise ShapeError(f"cannot reshape a {old} matrix into {shape}")
        shape = tuple(count // other if v == -1 else v for v in shape)
    if shape[0] * shape[1] != count:
        raise ShapeError(f"cannot reshape a {old} matrix ({count} elements) into {shape}")
    return shape


def _fits(layout, shape):
    try:
        distribution(layout, shape, runtime().nworkers)
    except LayoutError:
        return False
    return True


def _same_layout(m, layout):
    return m.layout == layout.resolved(runtime().nworkers)


def _require_matrix(m, what):
    if not _is_matrix(m):
        raise DMathError(f"{what} needs a dmath.Matrix, got {type(m).__name__}")


# ---- functions of the public API -------------------------------------------------
# the elementwise functions are defined in ops/elementwise.py (one definition each)
for _name in elementwise.PUBLIC:
    globals()[_name] = getattr(elementwise, _name)
del _name


def _creation(op, shape, dtype, layout, memory, static=(), scalars=()):
    return _create(new_meta(layout, shape, dtype), op, memory, static, scalars)


def _create(out, op, memory, static=(), scalars=(), payload=None):
    """Run creation kernel `op` for a new matrix `out` (a Meta) in the validated memory kind `memory`.

    The kind travels as the command's last scalar, never in its signature.
    """
    storage.check_room(memory, out)
    scalars = tuple(scalars) + (storage.kind_scalar(memory),)
    made = dispatch(op, [], [out], static=static, scalars=scalars, payload=payload, pooled=storage.pooled(memory))
    return _placed(made[0][0], memory)


def _placed(m, kind):
    m._memory = kind
    return m


def zeros(shape, dtype="float32", layout=None, memory=None):
    """A matrix of zeros (layout None means RowBlock())."""
    return full(shape, 0.0, dtype, layout, memory)


def ones(shape, dtype="float32", layout=None, memory=None):
    return full(shape, 1.0, dtype, layout, memory)


def full(shape, value, dtype="float32", layout=None, memory=None):
    memory = _check_memory(memory)
    return _creation("fill", shape, dtype, layout, memory, scalars=(_check_scalar(value),))


def eye(n, dtype="float32", layout=None, memory=None):
    memory = _check_memory(memory)
    n = base.as_int(n, "n")
    return _creation("eye", (n, n), dtype, layout, memory)


def _check_memory(memory):
    """The memory kind validated: 'device', 'host', 'managed', 'cuda_managed' (None: the backend's default)."""
    return storage.check_kind(memory)


def from_numpy(array, layout=None, dtype=None, memory=None):
    """Scatter a 2-D numpy array (1-D arrays become one row) from the master."""
    memory = _check_memory(memory)
    a = np.asarray(array)
    if a.ndim == 1:
        a = a[None, :]
    if a.ndim != 2:
        raise ShapeError(f"from_numpy needs a 1-D or 2-D array, got {a.ndim}-D of shape {a.shape}")
    if not np.issubdtype(a.dtype, np.number):
        raise DTypeError(f"from_numpy needs a numeric array, got dtype {a.dtype}")
    if a.dtype.kind == "c":
        raise DTypeError(f"from_numpy: dmath matrices are real; the array is {a.dtype}. Pass a.real and "
                         f"a.imag as two matrices (converting would drop the imaginary part)")
    dtype = canonical_dtype(dtype if dtype is not None else
                            (a.dtype if a.dtype.name in ("float16", "float32", "float64") else "float64"))
    out = new_meta(layout, a.shape, dtype)
    return _create(out, "scatter", memory, payload=np.ascontiguousarray(a, dtype=dtype))


__all__ = ["Matrix", "zeros", "ones", "full", "eye", "from_numpy", "Meta", *elementwise.PUBLIC]
