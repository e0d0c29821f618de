"""Structure of a matrix: triangles (`triu`, `tril`), the diagonal (`diag`, `trace`) and row
gathers (`take_rows`), as NumPy's functions of the same names; master halves and kernels.

- `band` keeps the elements on one side of a diagonal, piece by piece with
  no communication (a Partial matrix addend by addend: it is linear); per
  local row, the kept columns are a prefix or a suffix of the local ones.
- `trace_sum` sums each worker's diagonal elements; the master adds them up.
- `gather_moves` moves single rows or elements whose target is not a window of
  the source (`planning/assembly.gather_plan`): the rows of `take_rows`, the
  diagonal of `diag`. Each worker packs what its pieces hold for each other
  worker (index arrays kept on the device per signature), one exchange, and
  unpacks into the new matrix: the source is never replicated, and only the
  elements that change owner travel.
"""
from typing import NamedTuple

import numpy as np

from .. import backend, memory
from ..comm import collectives
from ..comm.control import gather_objects
from ..errors import DMathError, LayoutError, ShapeError
from ..layout import RowBlock
from ..layout import indexset as ix
from ..planning.assembly import gather_plan, neighbourly
from ..remap import send_dtype
from ..runtime import Shard, define, runtime
from ..runtime.registry import collectives_in_graphs
from .assembly import result_layout
from .base import as_int, dispatch, is_matrix, new_meta
from .movement import resolve_partial


class BandArgs(NamedTuple):
    """Static arguments of `band`: keep j - i >= k (upper) or j - i <= k (lower)."""
    upper: bool
    k: int


class GatherArgs(NamedTuple):
    """Static arguments of `gather`: the kind of move ('rows', 'diag_get', 'diag_put') and its
    argument (the source row of every target row, as int64 little-endian bytes; k; (k, whether the
    vector is a column))."""
    kind: str
    arg: object


BAND = define("band", BandArgs)
TRACE = define("trace_sum")
GATHER = define("gather_moves", GatherArgs)


def _matrix(m, what):
    if not is_matrix(m):
        raise DMathError(f"{what} needs a dmath.Matrix, got {type(m).__name__}")
    return m


# ---- master halves ------------------------------------------------------------------------
def triu(m, k=0):
    """The upper triangle of `m` (elements with j - i >= k; the rest zero), as numpy.triu; same
    layout and dtype. No communication."""
    _matrix(m, "triu")
    k = _clamped(as_int(k, "triu: k"), m.shape)
    return dispatch("band", [m], [new_meta(m.layout, m.shape, m.dtype)], static=BAND.static(upper=True, k=k))[0][0]


def tril(m, k=0):
    """The lower triangle of `m` (elements with j - i <= k; the rest zero), as numpy.tril; same
    layout and dtype. No communication."""
    _matrix(m, "tril")
    k = _clamped(as_int(k, "tril: k"), m.shape)
    return dispatch("band", [m], [new_meta(m.layout, m.shape, m.dtype)], static=BAND.static(upper=False, k=k))[0][0]


def trace(m, offset=0):
    """The sum of the diagonal `offset` of `m` (a float), as numpy.trace of a 2-D array."""
    _matrix(m, "trace")
    offset = as_int(offset, "trace: offset")
    if offset:
        d = _diagonal(m, offset)
        return d.sum() if d.shape[0] else 0.0
    return dispatch("trace_sum", [m])[1]


def diag(m, k=0, layout=None):
    """numpy.diag for dmath matrices: from a vector, a square matrix; from a matrix, its diagonal.

    A matrix with one row or one column (NumPy's 1-D array) is a vector v:
    the result is the (n + |k|) square matrix with v on diagonal k and zeros
    elsewhere (layout: `layout`, else v's kind as `concatenate` chooses it).
    Any other matrix gives its diagonal k as a (d, 1) column (layout:
    `layout`, else RowBlock over the matrix's workers, or Replicated if the
    matrix is). Elements travel straight from the workers holding them to
    those storing the result; a Partial input is summed first.
    """
    _matrix(m, "diag")
    k = as_int(k, "diag: k")
    rows, cols = m.shape
    if rows == 1 or cols == 1:
        n = cols if rows == 1 else rows
        size = n + abs(k)
        lay = result_layout(m.layout) if layout is None else layout
        out = new_meta(lay, (size, size), m.dtype)
        args = GATHER.static(kind="diag_put", arg=(k, cols == 1 and rows != 1))
        return dispatch("gather_moves", [resolve_partial(m)], [out], static=args)[0][0]
    return _diagonal(m, k, layout)


def _clamped(k, shape):
    """Diagonal k within [-rows, cols]: every diagonal beyond is empty (the same triangles, an empty
    diagonal), and the kernels' index arithmetic stays within int64."""
    return max(-shape[0], min(k, shape[1]))


def _diagonal(m, k, layout=None):
    """Diagonal k of matrix m as a (d, 1) column (see `diag`)."""
    k = _clamped(k, m.shape)
    rows, cols = m.shape
    d = max(0, min(rows, cols - k)) if k >= 0 else max(0, min(rows + k, cols))
    if layout is None:
        members = m.layout.members(runtime().nworkers)
        layout = m.layout if m.layout.replicated else RowBlock(members)
    out = new_meta(layout, (d, 1), m.dtype)
    args = GATHER.static(kind="diag_get", arg=k)
    return dispatch("gather_moves", [resolve_partial(m)], [out], static=args)[0][0]


def take_rows(m, rows, layout=None):
    """The rows `rows` of `m` in that order, as numpy.take(m, rows, axis=0) (`M[perm]`).

    rows: a 1-D sequence or numpy array of integers (negative ones count
    from the end; repeats allowed). Any layout of m: each worker sends the
    rows it holds straight to the workers storing them in the result, so a
    distributed row permutation never replicates the source. The result has
    m's dtype and `layout`, else m's kind (as `concatenate` chooses it; a
    Partial m is summed first into RowBlock).
    """
    _matrix(m, "take_rows")
    idx = np.asarray(rows)
    if idx.ndim != 1 or (idx.size and idx.dtype.kind not in "iu"):
        raise ShapeError(f"take_rows: rows must be a 1-D sequence of integers, got {rows!r:.80}")
    idx = idx.astype(np.int64)
    n = m.shape[0]
    if idx.size and (idx.min() < -n or idx.max() >= n):
        bad = idx[(idx < -n) | (idx >= n)][0]
        raise ShapeError(f"take_rows: row {bad} is out of bounds for a matrix of {n} rows")
    idx = np.where(idx < 0, idx + n, idx)
    src = resolve_partial(m)
    lay = result_layout(src.layout) if layout is None else layout
    out = new_meta(lay, (idx.size, m.shape[1]), m.dtype)
    if out.layout.partial:
        raise LayoutError("take_rows: the result cannot be Partial (its rows are values, not addends); "
                          "ask for another layout")
    # the row list travels in the signature as little-endian int64 bytes: a tuple of Python ints held
    # 36 bytes a row on the master for as long as the signature lived (5 MB per 100,000 rows)
    rows_bytes = idx.astype("<i8").tobytes()
    return dispatch("gather_moves", [src], [out], static=GATHER.static(kind="rows", arg=rows_bytes))[0][0]


# ---- kernels --------------------------------------------------------------------------------
def _bounds(call, src):
    """Per local piece, (the first kept local column of each local row as a column vector, the local
    column positions as a row) on the device, cached per signature: O(rows + cols), not a mask.

    A worker stores its columns in increasing global order, so the columns a triangle keeps in a
    row are a suffix (triu: global column >= row + k) or a prefix (tril: <= row + k) of them.
    """
    bounds = call.entry.cache.get("bounds")
    if bounds is None:
        xp = backend.current().xp
        upper, k = call.entry.static.upper, call.entry.static.k
        bounds = []
        for p in src.dist.pieces[call.rank]:
            rows, cols = ix.to_array(p.rows), ix.to_array(p.cols)
            edge = np.searchsorted(cols, rows + k, side="left" if upper else "right")
            bounds.append((xp.asarray(edge[:, None]), xp.arange(len(cols))[None, :]))
        call.entry.cache["bounds"] = bounds
    return bounds


@BAND.kernel(capturable=True)
def _band(call):
    xp = backend.current().xp
    src = call.inputs[0]
    upper = call.entry.static.upper
    out = []
    for a, (edge, positions) in zip(src.pieces, _bounds(call, src)):
        b = memory.zeros(a.shape, src.dtype)
        keep = positions >= edge if upper else positions < edge
        xp.copyto(b, a, where=keep)      # NumPy's triu: zeros elsewhere, even where a is inf or NaN
        out.append(b)
    return [Shard(out, call.entry.out_dists[0], src.dtype)]


def _diagonal_positions(dist, rank):
    """Per local piece, (local rows, local cols) of the diagonal elements it holds."""
    out = []
    for p in dist.pieces[rank]:
        d = ix.intersect(p.rows, p.cols)
        out.append((ix.to_array(ix.local_intervals(d, p.rows)), ix.to_array(ix.local_intervals(d, p.cols))))
    return out


@TRACE.kernel()
def _trace(call):
    """The diagonal's sum: each contributor its own elements (one member of a replicated matrix,
    every addend of a Partial one), summed in float64 on the master."""
    xp = backend.current().xp
    src = call.inputs[0]
    dist = src.dist
    contributors = sorted(dist.group[:1] if dist.replicated else dist.group)
    value = 0.0
    if call.rank in contributors:
        pos = call.entry.cache.get("diagonal")
        if pos is None:
            pos = call.entry.cache["diagonal"] = [(xp.asarray(r), xp.asarray(c))
                                                  for r, c in _diagonal_positions(dist, call.rank)]
        for a, (r, c) in zip(src.pieces, pos):
            if r.size:
                value += float(a[r, c].sum(dtype=np.float64))
    values = gather_objects(call.world, value, contributors)
    if call.rank == 0:
        call.result = float(sum(values))
    return []


class _Local(NamedTuple):
    """One worker's part of a gather: moves as (source piece, take indices, target piece, put indices,
    count), grouped per peer in the exchange's group order."""
    group: tuple
    local: list
    sends: list
    recvs: list
    halo: bool       # few peers each: sent point to point (collectives.exchange's point_to_point)


def _device(move, xp):
    """The move's index arrays on the device: (take index, put index, block shape or None)."""
    dev = lambda a: a if isinstance(a, slice) else xp.asarray(a)
    take = (dev(move.src_rows), dev(move.src_cols))
    put = (dev(move.dst_rows), dev(move.dst_cols))
    shape = (len(move.dst_rows), move.dst_cols.stop - move.dst_cols.start) if move.cols else None
    return move.spiece, take, move.dpiece, put, move.count, shape


def _localize(moves, rank, xp):
    group = tuple(sorted({r for mv in moves if mv.src != mv.dst for r in (mv.src, mv.dst)}))
    halo = neighbourly((mv.src, mv.dst) for mv in moves)
    pos = {r: k for k, r in enumerate(group)}
    local, sends, recvs = [], [[] for _ in group], [[] for _ in group]
    for mv in moves:
        if mv.src == rank and mv.dst == rank:
            local.append(_device(mv, xp))
        elif mv.src == rank:
            sends[pos[mv.dst]].append(_device(mv, xp))
        elif mv.dst == rank:
            recvs[pos[mv.src]].append(_device(mv, xp))
    return _Local(group, local, sends, recvs, halo)


def _gather_capturable(entry):
    if collectives_in_graphs():
        return True
    st = entry.static
    return all(mv.src == mv.dst for mv in gather_plan(entry.in_dists[0], entry.out_dists[0], st.kind, st.arg))


@GATHER.kernel(capturable=_gather_capturable)
def _gather(call):
    xp = backend.current().xp
    src = call.inputs[0]
    dst, dtype = call.entry.out_dists[0], call.entry.outputs[0].dtype
    st = call.entry.static
    loc = call.entry.cache.get("local")
    if loc is None:
        moves = gather_plan(src.dist, dst, st.kind, st.arg)
        loc = call.entry.cache["local"] = _localize(moves, call.rank, xp)
    # rows and a matrix's diagonal are written whole; diag of a vector (and a Partial target's
    # other addends) keeps zeros off the diagonal
    alloc = memory.zeros if (st.kind == "diag_put" or dst.partial) else memory.empty
    out = [alloc(shape, dtype) for shape in dst.shard_shapes(call.rank)]
    for spiece, take, dpiece, put, _, _ in loc.local:
        out[dpiece][put] = src.pieces[spiece][take]
    if call.rank in loc.group:
        wire = send_dtype(src.dtype, dtype)
        counts = lambda parts: [sum(p[4] for p in member) for member in parts]
        send_counts, recv_counts = counts(loc.sends), counts(loc.recvs)
        send = memory.empty((sum(send_counts),), wire)
        recv = memory.empty((sum(recv_counts),), wire)
        o = 0
        for member in loc.sends:
            for spiece, take, _, _, c, _ in member:
                send[o:o + c] = src.pieces[spiece][take].reshape(-1)
                o += c
        collectives.exchange(call.world.group(loc.group), send, send_counts, recv, recv_counts,
                             point_to_point=loc.halo)
        o = 0
        for member in loc.recvs:
            for _, _, dpiece, put, c, shape in member:
                block = recv[o:o + c]
                out[dpiece][put] = block if shape is None else block.reshape(shape)
                o += c
    return [Shard(out, dst, dtype)]

