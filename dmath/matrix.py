"""Matrix: the master-side handle of a distributed matrix, and the functions that make them.

Every method validates on the master (raising ShapeError, LayoutError, ...
before anything is sent), aligns operands by remapping where layouts differ,
and dispatches one command per kernel: the validation and the dispatch are
the op units' master halves (`dmath/ops/<family>.py`), which this module
only names.
"""
import numpy as np

from .errors import DMathError, NotSupportedError
from .layout.distribution import distribution
from .ops import assembly, base, data, elementwise, gemm, movement, reductions, storage
from .ops.creation import eye, full, ones, zeros
from .ops.data import from_numpy
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
        layout, self.shape, dtype = m       # (unpacked: Meta's field names are properties)
        self.layout, self._dtype = layout, _DTYPE[dtype]
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
        """2: a dmath.Matrix is always two-dimensional."""
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

    # comparisons: NumPy's compare elements, Python's default compared identity (A == B False for equal
    # values, silently); neither is taken for the other here
    __hash__ = object.__hash__      # (a matrix stays usable in sets and as a key: by identity)

    def _comparison(self, symbol, name):
        raise NotSupportedError(f"A {symbol} B on dmath matrices: for the element-wise comparison (a 0/1 matrix) "
                                f"call dmath.{name}(A, B); for identity use `A is B`; to compare values, "
                                f"gather them (A.to_numpy()) or reduce: dmath.{name}(A, B).min()")

    def __eq__(self, other):
        self._comparison("==", "equal")

    def __ne__(self, other):
        self._comparison("!=", "not_equal")

    def __lt__(self, other):
        self._comparison("<", "less")

    def __le__(self, other):
        self._comparison("<=", "less_equal")

    def __gt__(self, other):
        self._comparison(">", "greater")

    def __ge__(self, other):
        self._comparison(">=", "greater_equal")

    def __bool__(self):
        raise NotSupportedError(f"the truth value of a dmath.Matrix {self.shape} is ambiguous (as a NumPy "
                                f"array's): test `M is None`, M.size, or a reduction such as M.max() > 0")

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
        return storage.to_memory(self, kind)

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
        return data.to_numpy(self)

    def remap(self, layout, dtype=None, background=False):
        """A new Matrix with the same values in `layout` (and `dtype`, converted on the narrower side).

        background: when the remap sums a Partial matrix (an all-reduce: data-parallel gradients),
        run that sum on the GPU's communication stream (in the new dtype), so that the commands
        issued next overlap it; the first command that reads the result waits for it on the
        device (the host never blocks). Elsewhere, and on the CPU, it changes nothing.
        """
        return _remap(self, layout, dtype, background=bool(background))

    def placed_as(self, other):
        """True when this matrix holds its values where `other` holds its own: the same pieces on the
        same workers, no sum pending (a Partial over one worker counts as summed), dtypes aside. An
        operation that reads both piece by piece needs no remap then."""
        if not isinstance(other, Matrix):
            raise DMathError(f"placed_as: other must be a dmath.Matrix, got {type(other).__name__}")
        p = runtime().nworkers
        return distribution(self.layout, self.shape, p).same_values_placement(
            distribution(other.layout, other.shape, p))

    def astype(self, dtype):
        """A copy in `dtype`, in the same layout (converted on the workers)."""
        return _remap(self, self.layout, dtype)

    def copy(self):
        """An independent copy in the same layout and dtype (writable, also of a derived matrix)."""
        return _remap(self, self.layout, None)

    def reshape(self, *shape, layout=None):
        """The same elements in row-major (C) order as a matrix of `shape`; one entry may be -1.

        A remap: the elements go to row blocks whose boundaries fall on whole
        rows of both shapes, each worker reshapes its block in place, and the
        result is remapped to `layout` (None: this matrix's layout when it
        fits the new shape, else RowBlock()). Only elements that change owner
        travel.
        """
        return movement.reshape(self, shape[0] if len(shape) == 1 else shape, layout)

    @property
    def T(self):
        """The transpose; every piece stays on its worker, transposed locally."""
        return movement.transpose(self)

    def __getitem__(self, key):
        """M[i, j]: the element (a float); M[r0:r1, c0:c1] (or a row, a column): a new matrix. An
        ellipsis stands for the full slices the other indices leave, as in NumPy (M[..., j])."""
        return movement.getitem(self, key)

    def __setitem__(self, key, value):
        """M[r0:r1, c0:c1] = X (rows and columns as slices with step 1, or integers, as NumPy's
        indices; M[...] is the whole matrix): write in place. X: a dmath.Matrix of the window's shape (any layout; converted
        to M's dtype), a numpy array (scattered from the master) or a scalar. Only the pieces of M
        that meet the window change; each worker receives only the part of X that lands in them.
        See dmath.ops.assembly."""
        assembly.setitem(self, key, value)

    def get(self, index):
        """The element at (i, j) as a Python float."""
        return movement.get_element(self, index)

    def set(self, index, value):
        """Write one element (i, j) = value in place."""
        movement.set_element(self, index, value)

    def assign(self, value):
        """Overwrite every value in place (same handle and buffers, a new version); returns self.

        value: a numpy array of this matrix's shape (scattered from the master,
        converted to this dtype), or a dmath.Matrix of the same shape
        (redistributed into this matrix's layout and dtype). This is how new
        data enters a recorded plan: assign the next batch, then replay.
        """
        return data.assign(self, value)

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
    def __rpow__(self, o): return _ewise("pow", o, self)
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
        if not base.is_matrix(o):
            return _matmul_operand(o)
        return gemm.gemm(self, o)

    def __rmatmul__(self, o):
        return _matmul_operand(o)

    def replicate(self, wait=True):
        """Keep a Replicated copy on every worker (the replica cache); wait=False overlaps it. Returns self."""
        return gemm.replicate(self, wait)

    # ---- reductions ---------------------------------------------------------
    def sum(self, axis=None):
        """Sum over everything (a float, accumulated in float64; a worker's sum that overflows where
        the total does not is added without the overflow) or along axis 0 / 1 (a (1, n) / (m, 1)
        Matrix; of a Partial matrix, each addend's, see docs/ARCHITECTURE.md)."""
        return reductions.reduce(self, "sum", axis)

    def mean(self, axis=None):
        """Mean over everything (a float) or along axis 0 / 1 (a (1, n) / (m, 1) Matrix)."""
        return reductions.reduce(self, "mean", axis)

    def max(self, axis=None):
        """Largest value over everything (a float; NaN if any is NaN) or along axis 0 / 1 (a Matrix)."""
        return reductions.reduce(self, "max", axis)

    def min(self, axis=None):
        """Smallest value over everything (a float; NaN if any is NaN) or along axis 0 / 1 (a Matrix)."""
        return reductions.reduce(self, "min", axis)

    def norm(self):
        """The Frobenius norm (a float)."""
        return reductions.reduce(self, "norm", None)


base.set_matrix_class(Matrix)


def _matmul_operand(o):
    """`A @ o` or `o @ A` with `o` not a Matrix: say what to do (NotImplemented for other types)."""
    if isinstance(o, np.ndarray):
        raise NotSupportedError(f"@ between a dmath.Matrix and a numpy array {o.shape}: make the array a "
                                f"Matrix first (dmath.from_numpy(array)), or gather the Matrix (M.to_numpy())")
    return NotImplemented


def _remap(m, layout, dtype, background=False):
    if not base.is_matrix(m):
        raise DMathError(f"remap needs a dmath.Matrix, got {type(m).__name__}")
    return movement.remap(m, layout, dtype, background=background)


# ---- functions of the public API -------------------------------------------------
# the elementwise functions are defined in ops/elementwise.py (one definition each)
for _name in elementwise.PUBLIC:
    globals()[_name] = getattr(elementwise, _name)
del _name


__all__ = ["Matrix", "zeros", "ones", "full", "eye", "from_numpy", "Meta", *elementwise.PUBLIC]
