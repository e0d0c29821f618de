"""The elementwise family's GPU kernel: one generated CUDA kernel per function and operand types.

An eager elementwise operation on a GPU is mostly host time: a CuPy ufunc
call converts and checks every argument before its launch (8 us of an H200
host's time for a tanh, against 3 us for the launch itself). For the usual
command, one new piece of contiguous operands and scalars, of a function that
gives its value as a CUDA expression (`Function.cuda`), this kernel generates
that function's loop once per operand types and shapes, compiles it once per
process, and starts it through `cuda.Launcher`, which writes the operands'
pointers and the scalars into a kept argument block. An operand is a whole
piece, a (1, 1) matrix, or a row or column vector whose local piece holds the
result piece's columns or rows as one contiguous run (a bias row beside a
batch, a RowBlock column beside RowBlock rows): the loop reads element
i % cols or i / cols of it. Everything else (vector positions that are not
one run, in-place writes, views with gaps, functions without an expression)
goes to the generic kernel, CuPy's ufuncs.

The generated code computes as CuPy's ufuncs do, so that both paths give
the same bits: operands converted to the result's type (float for float16),
scalars rounded to the result's dtype on the host, float16 results rounded
once at the end.
"""
import numpy as np

from .. import memory
from ..runtime import Shard
from ..runtime.registry import generic
from ..gpu import launcher as cuda
from .elementwise import EWISE, FUNCTIONS, holding_piece

_HELPERS = r"""
template <typename C> __device__ C dm_nan();
template <> __device__ float dm_nan<float>() { return __int_as_float(0x7fffffff); }
template <> __device__ double dm_nan<double>() { return __longlong_as_double(0x7ff8000000000000LL); }
"""

_SOURCE = r"""
__global__ void dm_ewise_%(fn)s(%(params)s, %(out)s* __restrict__ dm_out, long long dm_n, long long dm_cols) {
    typedef %(compute)s C;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < dm_n;
         i += (long long)gridDim.x * blockDim.x) {
%(loads)s
        const C dm_r = (C)(%(expr)s);
        dm_out[i] = %(store)s;
    }
}
"""


#: an operand's form -> the element of it that result element i (of a row of dm_cols) reads
_INDEX = {"full": "i", "row": "i % dm_cols", "col": "i / dm_cols", "one": "0"}


def source(fn, operands, out_dtype):
    """The CUDA C of function `fn`'s loop, the kernel dm_ewise_<fn> (a pure function).

    operands: per operand, None for a scalar, else (its dtype name, its form): 'full' (the result's
    shape), 'row' (one row: broadcast down the rows), 'col' (one column) or 'one' (one value).
    """
    f = FUNCTIONS[fn]
    compute = "double" if out_dtype == "float64" else "float"
    params, loads = [], []
    for name, operand in zip(f.params, operands):
        if operand is None:
            params.append(f"{compute} {name}_s")
            loads.append(f"        const C {name} = {name}_s;")
        else:
            dtype, form = operand
            params.append(f"const {cuda.C_TYPES[dtype]}* __restrict__ {name}_p")
            loads.append(f"        const C {name} = (C)dm_val({name}_p[{_INDEX[form]}]);")
    store = "__float2half(dm_r)" if out_dtype == "float16" else "dm_r"
    return _SOURCE % {"fn": fn, "params": ", ".join(params), "out": cuda.C_TYPES[out_dtype], "compute": compute,
                      "loads": "\n".join(loads), "expr": f.cuda, "store": store}


def module_source(operands, out_dtype):
    """The CUDA C of every function of len(operands) operands over these operands (see `source`):
    one module, so that a process compiles once per operand types, not once per function and types."""
    names = [fn for fn, f in FUNCTIONS.items() if f.cuda is not None and len(f.params) == len(operands)]
    return _HELPERS + "".join(source(fn, operands, out_dtype) for fn in names), [f"dm_ewise_{fn}" for fn in names]


#: (fn, operand dtypes or None, result dtype) -> its Launcher
_LAUNCHERS = {}


def launcher(fn, operands, out_dtype):
    """The `cuda.Launcher` of function `fn` over `operands` ((dtype name, form), None for a scalar:
    see `source`); its arguments: per operand a pointer or a float, the result's pointer, its size
    and its number of columns."""
    key = (fn, operands, out_dtype)
    found = _LAUNCHERS.get(key)
    if found is None:
        scalar_kind = "d" if out_dtype == "float64" else "f"
        kinds = "".join("p" if d is not None else scalar_kind for d in operands) + "pqq"
        text, names = module_source(operands, out_dtype)
        found = _LAUNCHERS[key] = cuda.Launcher(cuda.function(text, f"dm_ewise_{fn}", names), kinds)
    return found


def _scalar_rounding(out_dtype):
    """Python float -> the value the kernel receives: rounded to the result's dtype first (CuPy
    types a Python scalar by the arrays' dtype), then exact in the computing type."""
    if out_dtype == "float16":
        return lambda v: float(np.float16(v))
    return None         # float32: ctypes' float rounds as NumPy does; float64: exact


def form(shape, out_shape):
    """How an operand of `shape` is read beside a result of `out_shape` (a pure function): 'full',
    'one' (1, 1), 'row' (1, n) or 'col' (m, 1)."""
    if tuple(shape) == tuple(out_shape):
        return "full"
    if shape[0] == 1 and shape[1] == 1:
        return "one"
    return "row" if shape[0] == 1 else "col"


def run(fn, operands, out):
    """Function `fn` of `operands` (contiguous device arrays of out's shape, a row, a column or one
    value of it, or Python floats) into the contiguous 2-d array `out` by the one-launch path: what
    the kernel does per command, for tests and diagnostics that compare it with CuPy's ufunc."""
    dtype = str(out.dtype)
    kinds = tuple((str(a.dtype), form(a.shape, out.shape)) if hasattr(a, "dtype") else None for a in operands)
    rounding = _scalar_rounding(dtype)
    values = [a.data.ptr if hasattr(a, "dtype") else (a if rounding is None else rounding(a)) for a in operands]
    launcher(fn, kinds, dtype)(out.size, *values, out.data.ptr, out.size, out.shape[1])
    return out


def reads(pattern, in_dists, in_dtypes, piece, rank):
    """How the one-launch loop reads each operand for result `piece` on worker `rank`, or None when
    it cannot (a pure function): (per operand None for a scalar or (dtype, form), per operand
    (True, input index, (its piece's index, the byte offset of the run read, the strides that
    piece has when contiguous)) or (False, scalar index, None)).

    pattern: the ewise signature's (kind, index) per operand; in_dists, in_dtypes: the inputs'
    distributions and dtype names."""
    operands, plan = [], []
    for kind, idx in pattern:
        if kind == "scalar":
            plan.append((False, idx, None))
            operands.append(None)
            continue
        d = in_dtypes[idx]
        isz = np.dtype(d).itemsize
        mine = in_dists[idx].pieces[rank]
        j, start = 0, 0
        if kind in ("row", "col"):      # the local piece holding this piece's columns (rows): one run?
            held = holding_piece(mine, piece, kind)
            if held is None:
                return None
            j, at = held
            if not isinstance(at, slice):
                return None
            start = at.start
        plan.append((True, idx, (j, start * isz, (mine[j].shape[1] * isz, isz))))
        operands.append((d, kind))
    return tuple(operands), tuple(plan)


def _prepare(call):
    """(launcher, result shape, dtype, distribution, `reads`' plan, scalar rounding or None) for
    this signature, or None when the one-launch path does not apply."""
    args = call.entry.static
    f = FUNCTIONS[args.fn]
    if f.cuda is None or args.out_index is not None:
        return None
    dist = call.entry.out_dists[0]
    pieces = dist.pieces[call.rank]
    if len(pieces) != 1:
        return None
    found = reads(args.pattern, call.entry.in_dists, [m.dtype for m in call.entry.inputs], pieces[0], call.rank)
    if found is None:
        return None
    operands, plan = found
    dtype = call.entry.outputs[0].dtype
    return launcher(args.fn, operands, dtype), pieces[0].shape, dtype, dist, plan, _scalar_rounding(dtype)


@EWISE.kernel(backend="gpu", capturable=True, local=True)
def _ewise_gpu(call):
    """`ewise` on a GPU: the one-launch path where it applies (see the module), else the generic
    kernel. Local: the master half aligned every operand before this command."""
    cache = call.entry.cache
    prep = cache.get("gpu")
    if prep is None:
        prep = cache["gpu"] = _prepare(call) or False
    if prep is False:
        return generic("ewise")(call)
    launch, shape, dtype, dist, plan, rounding = prep
    ins, scalars = call.inputs, call.scalars
    values = []
    for is_piece, idx, read in plan:
        if is_piece:
            j, offset, strides = read
            a = ins[idx].pieces[j]
            if a.strides != strides and a.size > 1:
                return generic("ewise")(call)      # a view with gaps: CuPy's strided loop
            values.append(a.data.ptr + offset)
        else:
            v = scalars[idx]
            values.append(v if rounding is None else rounding(v))
    out = memory.empty(shape, dtype)
    values.append(out.data.ptr)
    values.append(out.size)
    values.append(shape[1])
    launch(out.size, *values)
    return [Shard([out], dist, dtype)]
