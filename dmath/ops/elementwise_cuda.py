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

Where every array operand is a whole piece of the result's dtype and every
address is 16-byte aligned, a second loop (`vector_source`) reads and writes
16 bytes per thread and step (8 halves): a scalar loop moves a float16
array at a sixth of the device's bandwidth (a ResNet-50 step's residual
gradient sums took 4 ms of its 50 on an H100), the vector one at its
bandwidth. Compiled per function at its first such call.

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
template <typename T, int V> struct __align__(sizeof(T) * V) dm_ev { T v[V]; };
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


_VECTOR_SOURCE = r"""
__global__ void dm_ewisev_%(fn)s(%(params)s, %(out)s* __restrict__ dm_out, long long dm_n, long long dm_cols) {
    typedef %(compute)s C;
    typedef dm_ev<%(out)s, %(V)d> VT;
    const long long dm_nv = dm_n / %(V)d;
    for (long long w = blockIdx.x * (long long)blockDim.x + threadIdx.x; w < dm_nv;
         w += (long long)gridDim.x * blockDim.x) {
%(vloads)s
        VT dm_o;
#pragma unroll
        for (int k = 0; k < %(V)d; ++k) {
%(eloads)s
            const C dm_r = (C)(%(expr)s);
            dm_o.v[k] = %(store)s;
        }
        reinterpret_cast<VT*>(dm_out)[w] = dm_o;
    }
    // the last dm_n %% V elements: one each for the first threads of block 0
    const long long i = dm_nv * %(V)d + threadIdx.x;
    if (blockIdx.x == 0 && i < dm_n) {
%(loads)s
        const C dm_r = (C)(%(expr)s);
        dm_out[i] = %(store)s;
    }
}
"""

#: the bytes one thread of the vector loop reads from each operand and writes per step
VECTOR_BYTES = 16

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


def vector_width(operands, out_dtype):
    """Elements per step of the vector loop over `operands` (see `source`), or None where it does not
    apply (a pure function): every array operand whole and of the result's dtype."""
    arrays = [o for o in operands if o is not None]
    if not arrays or any(o != (out_dtype, "full") for o in arrays):
        return None
    return VECTOR_BYTES // np.dtype(out_dtype).itemsize


def vector_source(fn, operands, out_dtype):
    """The CUDA C of the kernel dm_ewisev_<fn>: function `fn`'s loop over `operands` (all whole pieces of
    the result's dtype, or scalars), 16 bytes of each array per thread and step, the remainder one
    element per thread (a pure function; the caller checks `vector_width`)."""
    f = FUNCTIONS[fn]
    width = vector_width(operands, out_dtype)
    compute = "double" if out_dtype == "float64" else "float"
    ctype = cuda.C_TYPES[out_dtype]
    params, vloads, eloads, loads = [], [], [], []
    for name, operand in zip(f.params, operands):
        if operand is None:
            params.append(f"{compute} {name}_s")
            eloads.append(f"            const C {name} = {name}_s;")
            loads.append(f"        const C {name} = {name}_s;")
        else:
            params.append(f"const {ctype}* __restrict__ {name}_p")
            vloads.append(f"        const VT {name}_v = reinterpret_cast<const VT*>({name}_p)[w];")
            eloads.append(f"            const C {name} = (C)dm_val({name}_v.v[k]);")
            loads.append(f"        const C {name} = (C)dm_val({name}_p[i]);")
    store = "__float2half(dm_r)" if out_dtype == "float16" else "dm_r"
    return _HELPERS + _VECTOR_SOURCE % {
        "fn": fn, "params": ", ".join(params), "out": ctype, "compute": compute, "V": width,
        "vloads": "\n".join(vloads), "eloads": "\n".join(eloads), "loads": "\n".join(loads),
        "expr": f.cuda, "store": store}


def module_source(operands, out_dtype):
    """The CUDA C of every function of len(operands) operands over these operands (see `source`):
    one module, so that a process compiles once per operand types, not once per function and types."""
    names = [fn for fn, f in FUNCTIONS.items() if f.cuda is not None and len(f.params) == len(operands)]
    return _HELPERS + "".join(source(fn, operands, out_dtype) for fn in names), [f"dm_ewise_{fn}" for fn in names]


def _arg_kinds(operands, out_dtype):
    """The `cuda.Launcher` argument kinds of a loop over `operands`: a pointer or a scalar of the
    computing type each, then the result's pointer, its size and its number of columns."""
    scalar_kind = "d" if out_dtype == "float64" else "f"
    return "".join("p" if d is not None else scalar_kind for d in operands) + "pqq"


#: (fn, operand dtypes or None, result dtype) -> its Launcher
_LAUNCHERS = {}


def launcher(fn, operands, out_dtype):
    """The `cuda.Launcher` of function `fn` over `operands` ((dtype name, form), None for a scalar:
    see `source`); its arguments: per operand a pointer or a float, the result's pointer, its size
    and its number of columns."""
    key = (fn, operands, out_dtype)
    found = _LAUNCHERS.get(key)
    if found is None:
        text, names = module_source(operands, out_dtype)
        found = _LAUNCHERS[key] = cuda.Launcher(cuda.function(text, f"dm_ewise_{fn}", names),
                                                _arg_kinds(operands, out_dtype))
    return found


def vector_launcher(fn, operands, out_dtype):
    """(the `cuda.Launcher` of dm_ewisev_<fn>, its elements per step), or None where the vector loop does
    not apply; its arguments as `launcher`'s, its total the number of vector steps (at least 1)."""
    width = vector_width(operands, out_dtype)
    if width is None:
        return None
    key = ("vector", fn, operands, out_dtype)
    found = _LAUNCHERS.get(key)
    if found is None:
        name = f"dm_ewisev_{fn}"
        found = _LAUNCHERS[key] = (cuda.Launcher(cuda.function(vector_source(fn, operands, out_dtype), name, [name]),
                                                 _arg_kinds(operands, out_dtype)), width)
    return found


def _start(scalar, vector, n, values, pointers):
    """Launch the vector loop where it applies and every pointer is aligned to its 16 bytes, else the
    scalar loop (values: the kernel's arguments; pointers: the device addresses among them)."""
    if not n:
        return
    if vector is not None and not any(p % VECTOR_BYTES for p in pointers):
        launch, width = vector
        launch(max(n // width, 1), *values)
    else:
        scalar(n, *values)


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
    pointers = [a.data.ptr for a in operands if hasattr(a, "dtype")] + [out.data.ptr]
    _start(launcher(fn, kinds, dtype), vector_launcher(fn, kinds, dtype), out.size,
           values + [out.data.ptr, out.size, out.shape[1]], pointers)
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
    return ((launcher(args.fn, operands, dtype), vector_launcher(args.fn, operands, dtype)), pieces[0].shape, dtype,
            dist, plan, _scalar_rounding(dtype))


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
    (launch, vector), shape, dtype, dist, plan, rounding = prep
    ins, scalars = call.inputs, call.scalars
    values, pointers = [], []
    for is_piece, idx, read in plan:
        if is_piece:
            j, offset, strides = read
            a = ins[idx].pieces[j]
            if a.strides != strides and a.size > 1:
                return generic("ewise")(call)      # a view with gaps: CuPy's strided loop
            values.append(a.data.ptr + offset)
            pointers.append(values[-1])
        else:
            v = scalars[idx]
            values.append(v if rounding is None else rounding(v))
    out = memory.empty(shape, dtype)
    pointers.append(out.data.ptr)
    values.append(out.data.ptr)
    values.append(out.size)
    values.append(shape[1])
    _start(launch, vector, out.size, values, pointers)
    return [Shard([out], dist, dtype)]
