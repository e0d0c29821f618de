"""The reductions: sum, mean, max, min along an axis or over everything, and the Frobenius norm.

Two op units. `reduce_axis`: along an axis, a layout that keeps the reduced
axis on one worker reduces locally ('local'); otherwise sums come out
Partial ('partial', no communication) and max/min are combined by an
all-reduce ('allreduce'). `reduce_all`: every worker reduces what it holds
and the master combines the values (a float). Float16 data is accumulated
in float32, and float16 Partial sums over several workers are summed in
float32 before they are rounded (one member then holds each sum), so the
result does not depend on the worker count.
"""
import math
from typing import NamedTuple, Optional

import numpy as np

from .. import backend, memory
from ..comm import collectives
from ..comm.control import gather_objects
from ..errors import DMathError, ShapeError
from ..layout import ColBlock, Partial, Replicated, RowBlock
from ..layout import indexset as ix
from ..runtime import Shard, define
from ..runtime.registry import collectives_in_graphs
from ..remap import execute as _remap
from ..remap.execute import sums_wider
from .base import dispatch, dist_of, is_matrix, new_meta
from .movement import resolve_partial


class ReduceAxisArgs(NamedTuple):
    """Static arguments of `reduce_axis`."""
    op: str          # 'sum', 'max' or 'min'
    axis: int        # 0: down the columns, (1, n) result; 1: along the rows, (m, 1)
    mode: str        # 'local', 'partial' or 'allreduce' (see the module's docstring)
    scale: float     # the result is multiplied by it (1/count for a mean)


class ReduceAllArgs(NamedTuple):
    """Static arguments of `reduce_all`."""
    op: str                  # 'sum', 'max', 'min' or 'sumsq'
    finish: Optional[str]    # 'mean', 'sqrt' or None: how the master completes the value


REDUCE_AXIS = define("reduce_axis", ReduceAxisArgs)
REDUCE_ALL = define("reduce_all", ReduceAllArgs)

_NAN = float("nan")     # one object: a signature holding it compares equal to itself (cached)


def reduce(m, op, axis):
    """Master half of M.sum/mean/max/min/norm: a float (axis None) or a (1, n) / (m, 1) Matrix."""
    if not is_matrix(m):
        raise DMathError(f"{op} needs a dmath.Matrix, got {type(m).__name__}")
    # (an integer, not a bool nor a float: 1.0 == 1 and True == 1 would pass a membership test)
    if axis is not None and (isinstance(axis, (bool, np.bool_)) or not isinstance(axis, (int, np.integer))
                             or axis not in (0, 1)):
        raise ShapeError(f"axis must be None, 0 or 1, got {axis!r}")
    if axis is not None:
        axis = int(axis)
    # max/min of nothing has no value; along an axis that is there, a matrix empty only in the
    # other dimension gives an empty result, as NumPy's does
    if op in ("max", "min") and (m.shape[axis] == 0 if axis is not None else m.size == 0):
        what = f"along axis {axis} of" if axis is not None else "of"
        raise ShapeError(f"{op} {what} an empty {m.shape} matrix has no value")
    if op not in ("sum", "mean") and m.layout.partial:
        m = resolve_partial(m)
    if axis is None:
        kind, finish = {"mean": ("sum", "mean"), "norm": ("sumsq", "sqrt")}.get(op, (op, None))
        return dispatch("reduce_all", [m], static=REDUCE_ALL.static(op=kind, finish=finish))[1]
    kind = "sum" if op == "mean" else op
    count = m.shape[axis]
    scale = (1.0 / count if count else _NAN) if op == "mean" else 1.0   # NumPy: the mean of nothing is nan
    shape = (1, m.shape[1]) if axis == 0 else (m.shape[0], 1)
    lay = m.layout
    local = (lay.replicated or (lay.partial and kind == "sum")
             or (axis == 0 and type(lay) is ColBlock) or (axis == 1 and type(lay) is RowBlock))
    if local:
        mode, out_layout = "local", lay
    elif kind == "sum":
        mode, out_layout = "partial", Partial(dist_of(m).group)
    else:
        mode, out_layout = "allreduce", Replicated(dist_of(m).group)
    args = REDUCE_AXIS.static(op=kind, axis=int(axis), mode=mode, scale=scale)
    return dispatch("reduce_axis", [m], [new_meta(out_layout, shape, m.dtype)], static=args)[0][0]

_IDENTITY = {"sum": 0.0, "max": -np.inf, "min": np.inf}
#: the sum's starting part in reduce_all (0.0: the sum of nothing, and the sign of zero as before)
_IDENTITY_PART = (0.0, 0)


def _acc_dtype(dtype):
    return np.float32 if np.dtype(dtype) == np.float16 else dtype


def _local_reduce(xp, a, op, axis):
    if op == "sum":
        return a.sum(axis=axis, keepdims=True, dtype=_acc_dtype(a.dtype))
    return getattr(xp, "max" if op == "max" else "min")(a, axis=axis, keepdims=True)


def _reduce_axis_capturable(entry):
    """Capturable unless an all-reduce is needed and collectives stay out of graphs. The index
    arrays of the result slots go to the device once, at the signature's first command, which is
    never captured (`_result_slots`), so a capture copies nothing from the host."""
    return not _communicates(entry.static.mode, entry.out_dists[0], entry.outputs[0].dtype) or collectives_in_graphs()


def _communicates(mode, dist, dtype):
    """Whether the kernel runs a collective: an all-reduce, or the sums of float16 Partial addends."""
    return mode == "allreduce" or (mode == "partial" and sums_wider(dist, dtype))


def _result_slots(call):
    """Per local piece of the input, where its reduced values go in the full result vector: a
    (0, sel) or (sel, 0) index, sel a slice or a device index array. Made at the signature's first
    command (always eager: graphs.py captures a plan's second replay at the earliest) and kept in
    the entry, so that no host-to-device copy happens during a capture and the graph's pointers
    stay valid (entries are never dropped)."""
    views = call.entry.cache.get("slots")
    if views is None:
        xp, axis = backend.current().xp, call.entry.static.axis
        views = []
        for p in call.entry.in_dists[0].pieces[call.rank]:
            sel = ix.selection(p.cols if axis == 0 else p.rows)
            sel = sel if isinstance(sel, slice) else xp.asarray(sel)
            views.append((0, sel) if axis == 0 else (sel, 0))
        views = call.entry.cache["slots"] = tuple(views)
    return views


@REDUCE_AXIS.kernel(capturable=_reduce_axis_capturable)
def _reduce_axis(call):
    """`op` along `axis` in `mode`; the result is multiplied by `scale` (1/count for mean)."""
    xp = backend.current().xp
    op, axis, mode, scale = call.entry.static
    src = call.inputs[0]
    dist, dtype = call.entry.out_dists[0], call.entry.outputs[0].dtype
    if mode == "local":
        out = []
        for a in src.pieces:
            r = _local_reduce(xp, a, op, axis)
            o = memory.empty(r.shape, dtype)
            o[...] = r * scale if scale != 1.0 else r
            out.append(o)
        return [Shard(out, dist, dtype)]
    if call.rank not in dist.group:
        return [Shard([], dist, dtype)]
    acc_dtype = _acc_dtype(dtype) if mode == "partial" else dtype
    full = memory.empty(dist.shape, acc_dtype)
    full.fill(_IDENTITY[op])
    for a, view in zip(src.pieces, _result_slots(call)):
        if a.size == 0:
            continue
        r = _local_reduce(xp, a, op, axis).reshape(-1)
        if op == "sum":
            full[view] += r
        else:
            full[view] = getattr(xp, "maximum" if op == "max" else "minimum")(full[view], r)
    if mode == "allreduce":
        flat = full.reshape(-1)
        collectives.allreduce(call.world.group(dist.group), flat, op)
    if scale != 1.0:
        full *= scale
    if mode == "partial" and sums_wider(dist, dtype):
        # float16 addends, each of which alone may overflow where their sum does not: summed in
        # float32 and rounded once (one member holds each sum), as gemm's Partial products are
        out = _remap.run(call.world, call.entry.cache.setdefault("sums", {}), [full], dist, dist, acc_dtype, dtype)
        return [Shard(out, dist, dtype)]
    if full.dtype == np.dtype(dtype):
        out = full
    else:
        out = memory.empty(full.shape, dtype)
        out[...] = full
    return [Shard([out], dist, dtype)]


def _combine(op, values):
    """`op` of the partial results `values` (floats); NaN wins in max and min, as in NumPy (Python's
    max and min drop it: nan > x is false)."""
    if op in ("sum", "sumsq"):
        return sum(values)
    return float(np.max(values) if op == "max" else np.min(values))


def _piece_sum(xp, a):
    """A piece's sum as (s, e), the sum being s * 2**e: (its float64 sum, 0), or, where that sum
    overflowed although every element is finite (a Partial matrix's addend of 1e308s whose partner
    holds -1e308s), the sum of the elements scaled by 2**-e (exact: a power of two), e the exponent
    of the largest magnitude, so that the master can add the workers' sums without the overflow."""
    with np.errstate(over="ignore"):      # (an overflow is handled below, not warned about)
        v = float(a.sum(dtype=np.float64))
    if math.isfinite(v):
        return v, 0
    big = float(xp.abs(a).max())
    if not math.isfinite(big):
        return v, 0                 # an inf or NaN in the data: the IEEE sum is the answer
    e = math.frexp(big)[1]
    return float((a.astype(np.float64) * math.ldexp(1.0, -e)).sum()), e


def _total(parts):
    """The sum of the (s, e) parts of `_piece_sum` (pure): the plain sum where no part was scaled and
    that sum is finite, or where an inf or NaN is in the data (the IEEE sum is then the answer); else
    the parts added after scaling to the largest one's exponent (each term at most 1 in magnitude),
    so that the sum overflows only where the total itself does."""
    finite = all(math.isfinite(s) for s, _ in parts)
    if not any(e for _, e in parts):
        plain = _combine("sum", [s for s, _ in parts])
        if math.isfinite(plain) or not finite:
            return plain
    elif not finite:            # the scaled parts as the values they stand for (an overflow: +-inf)
        return _combine("sum", [_ldexp(s, e) for s, e in parts])
    scale = max((math.frexp(s)[1] + e for s, e in parts if s), default=0)
    return _ldexp(sum(math.ldexp(s, e - scale) for s, e in parts), scale)


#: a piece's plain float64 sum of squares at least this large lost nothing that matters to underflow
#: (a square below 2**-1074 is under 2**-174 of it); below it, or past float64, the piece is scaled
_SUMSQ_FLOOR = 2.0 ** -900


def _piece_sumsq(xp, a):
    """A piece's sum of squares as (s, e), the sum being s * 2**e (e even): its plain float64 sum,
    or, where that under- or overflowed with every element finite, the sum of the squares of the
    elements scaled by 2**-k (exact), k the exponent of the largest magnitude, and e = 2k (LAPACK's
    scaled sum of squares: a Frobenius norm of 1e-300s is not 0, one of 1e300s not inf)."""
    with np.errstate(over="ignore", under="ignore"):
        v = float(xp.square(a.astype(np.float64)).sum())
    if _SUMSQ_FLOOR <= v < math.inf or v == 0.0 and not bool(xp.any(a)):
        return v, 0
    big = float(xp.abs(a).max())
    if not math.isfinite(big) or big == 0.0:
        return v, 0                 # an inf or NaN in the data: the IEEE result is the answer
    k = math.frexp(big)[1]
    scaled = a.astype(np.float64) * math.ldexp(1.0, -k)
    return float(xp.square(scaled).sum()), 2 * k


def _root_sum_squares(parts):
    """sqrt of the total of `_piece_sumsq`'s (s, e) parts (pure): the parts added at the largest
    exponent (each term then at most the count of its elements), the root taken before scaling back,
    so that the norm overflows only where it is itself past float64."""
    if not all(math.isfinite(s) for s, _ in parts):
        return float(np.sqrt(sum(s for s, _ in parts)))      # inf or NaN in the data
    top = max((e for s, e in parts if s), default=0)
    total = sum(math.ldexp(s, e - top) for s, e in parts if s)
    return _ldexp(math.sqrt(total), top // 2)


def _ldexp(s, e):
    """s * 2**e as a float: +-inf where it overflows (math.ldexp raises there)."""
    try:
        return math.ldexp(s, e)
    except OverflowError:
        return math.copysign(math.inf, s)


@REDUCE_ALL.kernel()
def _reduce_all(call):
    """`op` (sum, max, min, sumsq) over everything; the master gets a float.

    finish ('mean', 'sqrt' or None) completes the value on the master inside
    the kernel, so that the kernel's result is what the user sees (a
    recorded plan's replay returns kernel results).
    """
    xp = backend.current().xp
    op, finish = call.entry.static.op, call.entry.static.finish
    src = call.inputs[0]
    dist = src.dist
    # one member of a replicated matrix speaks for it; only contributors answer the master, so a
    # reduction of a worker group's matrix waits for that group alone
    contributors = sorted(dist.group[:1] if dist.replicated else dist.group)
    contributes = call.rank in contributors
    value = _IDENTITY["sum" if op == "sumsq" else op]
    if op == "sum":             # (s, e) parts, added by the master without an overflow the total lacks
        value = [_piece_sum(xp, a) for a in src.pieces if a.size] if contributes else []
    elif op == "sumsq":         # (s, e) parts alike, scaled where the squares under- or overflow
        value = [_piece_sumsq(xp, a) for a in src.pieces if a.size] if contributes else []
    elif contributes:
        for a in src.pieces:
            if a.size == 0:
                continue
            v = float(a.max() if op == "max" else a.min())
            value = _combine(op, (value, v))
    values = gather_objects(call.world, value, contributors)
    if call.rank == 0:
        if op == "sum":
            value = _total([_IDENTITY_PART] + [p for ps in values for p in ps])
        elif op == "sumsq":             # (asked with finish 'sqrt' only: the Frobenius norm)
            value = _root_sum_squares([p for ps in values for p in ps])
        else:
            value = _combine(op, values)
        if finish == "mean":
            size = dist.shape[0] * dist.shape[1]
            value = value / size if size else float("nan")
        call.result = value
    return []
