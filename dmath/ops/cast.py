"""Many matrices converted to one dtype in few commands (`astype_many`).

A mixed-precision training step reads every float32 master weight through a
float16 copy made at the start of the step: GoogLeNet's 174 weights were 174
`astype` commands and 174 GPU kernels of a few microseconds each, so the
copies cost more in launches than in bytes. Here one command per group of
workers (and chunk of protocol.MAX_OPERANDS operands) converts them all, and
its GPU kernel converts a whole table of arrays per launch (the table kernels
of dmath.nn's optimizer updates). The values are exactly `astype`'s: one
rounding from the source dtype to the target (round to nearest even).
"""
from typing import NamedTuple

from .. import backend
from ..backend import canonical_dtype
from ..errors import DMathError, DTypeError, LayoutError
from ..gpu import launcher as cuda
from ..runtime import define, protocol
from .base import as_list, dispatch, dist_of, is_matrix, new_meta
from .nn import rows


class CastManyArgs(NamedTuple):
    """Static argument of `cast_many`: the dtype every output has."""
    dtype: str


CAST_MANY = define("cast_many", CastManyArgs)
#: the most matrices one command converts: its inputs and outputs together name at most
#: protocol.MAX_OPERANDS handles
CHUNK = protocol.MAX_OPERANDS // 2
_FLOATS = ("float16", "float32", "float64")


def astype_many(matrices, dtype):
    """[m.astype(dtype) for m in matrices], in one command per group of workers and chunk of
    CHUNK matrices (a GPU converts a table of arrays per kernel launch). Each result has its
    matrix's shape and layout. The matrices must not be Partial (a sum of addends: remap it to a
    plain layout first); dtype is 'float16', 'float32' or 'float64'."""
    mats = as_list(matrices, "astype_many")
    for i, m in enumerate(mats):
        if not is_matrix(m):
            raise DMathError(f"astype_many: matrices[{i}] must be a dmath.Matrix, got {type(m).__name__}")
        if m.layout.partial:
            raise LayoutError(f"astype_many: matrices[{i}] is Partial (a sum of addends): remap it to a "
                              "plain layout first")
    static = CAST_MANY.static(dtype=_target(dtype))
    by_group = {}
    for i, m in enumerate(mats):
        by_group.setdefault(tuple(dist_of(m).group), []).append(i)
    out = [None] * len(mats)
    for members in by_group.values():
        for lo in range(0, len(members), CHUNK):
            part = members[lo:lo + CHUNK]
            metas = [new_meta(mats[i].layout, mats[i].shape, static.dtype) for i in part]
            for i, r in zip(part, dispatch("cast_many", [mats[i] for i in part], metas, static=static)[0]):
                out[i] = r
    return out


def _target(dtype):
    """The target dtype's name; DTypeError (a DMathError) naming astype_many for any other."""
    try:
        return canonical_dtype(dtype)
    except DTypeError as exc:
        raise DTypeError(f"astype_many: {exc}") from None


@CAST_MANY.kernel(capturable=True)
def _cast_many(call):
    """Each input's pieces converted into its output's (the CPU path, and a GPU's strided pieces)."""
    shards = []
    for k, src in enumerate(call.inputs):
        outs = rows.new_output(call, k)
        for o, p in zip(outs, src.pieces):
            o[...] = p
        shards.append(rows.shard(call, k, outs))
    return shards


# ---- the GPU kernel: a table of (source, destination, length) per launch -----------------------------
_CONVERT = r"""
// one rounding from S to D, as astype rounds (a half widens exactly; double narrows to half directly)
template <typename S, typename D> __device__ __forceinline__ D dm_convert(S v) { return (D)v; }
template <> __device__ __forceinline__ float dm_convert<half, float>(half v) { return __half2float(v); }
template <> __device__ __forceinline__ double dm_convert<half, double>(half v) { return (double)__half2float(v); }
template <> __device__ __forceinline__ half dm_convert<float, half>(float v) { return __float2half(v); }
template <> __device__ __forceinline__ half dm_convert<double, half>(double v) { return __double2half(v); }
"""
_SOURCE = cuda.TABLE_STRUCT + _CONVERT + r"""
template <typename S, typename D>
__global__ void dm_cast_many(const DmTable tab, int count) {
    long long lb, nb;
    const int y = dm_table_entry(tab, count, 4, &lb, &nb);
    const S* s = reinterpret_cast<const S*>(tab.w[4 * y]);
    D* d = reinterpret_cast<D*>(tab.w[4 * y + 1]);
    const long long n = (long long)tab.w[4 * y + 2];
    for (long long i = lb * blockDim.x + threadIdx.x; i < n; i += nb * blockDim.x)
        d[i] = dm_convert<S, D>(s[i]);
}
"""
#: (source, destination) dtypes of the table kernel
_PAIRS = [(s, d) for s in _FLOATS for d in _FLOATS if s != d]
_NAMES = [f"dm_cast_many<{cuda.C_TYPES[s]}, {cuda.C_TYPES[d]}>" for s, d in _PAIRS]
_LAUNCHERS = {}


def _run_tables(kernel, source, names, tables):
    """Launch `kernel`<S, D> of `source` (whose instances are `names`) once per DmTable of each (S, D)
    pair's entries in `tables`; an entry's words are its arguments, the last one the element count
    that sizes its share of the grid (`Launcher.table`)."""
    for (s, d), entries in tables.items():
        name = f"{kernel}<{cuda.C_TYPES[s]}, {cuda.C_TYPES[d]}>"
        run = _LAUNCHERS.get(name)
        if run is None:
            run = _LAUNCHERS[name] = cuda.Launcher(cuda.function(source, name, names), "ti")
        run.table(entries)


# ---- packing many arrays into one buffer (dmath.sum_partials' bucket) in one launch per dtype pair ------
_PACK_SOURCE = cuda.TABLE_STRUCT + _CONVERT + r"""
template <typename S, typename D>
__global__ void dm_pack_many(const DmTable tab, int count) {
    long long lb, nb;
    const int y = dm_table_entry(tab, count, 5, &lb, &nb);
    const S* s = reinterpret_cast<const S*>(tab.w[5 * y]);
    D* d = reinterpret_cast<D*>(tab.w[5 * y + 1]);
    const long long n = (long long)tab.w[5 * y + 2], stop = (long long)tab.w[5 * y + 3];
    for (long long i = lb * blockDim.x + threadIdx.x; i < stop; i += nb * blockDim.x)
        d[i] = i < n ? dm_convert<S, D>(s[i]) : dm_convert<float, D>(0.0f);
}
"""
_PACK_PAIRS = [(s, d) for s in _FLOATS for d in _FLOATS]
_PACK_NAMES = [f"dm_pack_many<{cuda.C_TYPES[s]}, {cuda.C_TYPES[d]}>" for s, d in _PACK_PAIRS]


def pack(parts, buf):
    """Copy each (source array, start, stop) of `parts` into buf[start:stop], converted to buf's dtype,
    the part after the source's elements zeroed (an alignment gap). On a GPU one launch per table of
    parts of a source dtype, where a copy and a fill each were a launch; a source that is not
    contiguous, of a dtype the kernel lacks, or on the CPU is copied by the array module."""
    gpu, target = backend.current().is_gpu, str(buf.dtype)
    tables = {}
    for src, start, stop in parts:
        key = (str(src.dtype), target)
        if gpu and key in _PACK_PAIRS and src.flags.c_contiguous and stop > start:
            tables.setdefault(key, []).append([src.data.ptr, buf[start:].data.ptr, src.size, stop - start])
        else:
            buf[start:start + src.size].reshape(src.shape)[...] = src
            if stop > start + src.size:
                buf[start + src.size:stop] = 0
    _run_tables("dm_pack_many", _PACK_SOURCE, _PACK_NAMES, tables)


def copy_many(pairs):
    """dst[...] = src for each (source, destination) array pair of `pairs` (same shape; the destination's
    dtype: converted on the way): on a GPU one launch per table of contiguous pairs of a dtype pair,
    other pairs (strided, or on the CPU) by the array module."""
    gpu, tables = backend.current().is_gpu, {}
    for src, dst in pairs:
        key = (str(src.dtype), str(dst.dtype))
        if gpu and key in _PACK_PAIRS and src.flags.c_contiguous and dst.flags.c_contiguous:
            if src.size:
                tables.setdefault(key, []).append([src.data.ptr, dst.data.ptr, src.size, src.size])
        else:
            dst[...] = src
    _run_tables("dm_pack_many", _PACK_SOURCE, _PACK_NAMES, tables)


@CAST_MANY.kernel(backend="gpu", capturable=True)
def _cast_many_cuda(call):
    """cast_many on a GPU: contiguous pieces by (source, destination) dtype, a launch per table of them;
    other pieces (strided, or of one dtype on both sides) are copied by the array module."""
    target = call.entry.static.dtype
    tables, shards = {}, []
    for k, src in enumerate(call.inputs):
        outs = rows.new_output(call, k)
        for o, p in zip(outs, src.pieces):
            key = (str(p.dtype), target)
            if key in _PAIRS and p.flags.c_contiguous and o.flags.c_contiguous:
                if p.size:
                    tables.setdefault(key, []).append([p.data.ptr, o.data.ptr, p.size])
            else:
                o[...] = p
        shards.append(rows.shard(call, k, outs))
    _run_tables("dm_cast_many", _SOURCE, _NAMES, tables)
    return shards
