"""Assembly: writing into submatrices (`M[a:b, c:d] = X`) and building matrices from pieces
(`concatenate`, `hstack`, `vstack`, `block`, `pad`, `roll`); master halves and kernels.

Everything here is made of three commands:

- `write_window` copies rectangles of a source matrix into rectangles of the
  target (`planning/assembly.window_steps`): an Exchange per rectangle whose
  receiving side is the target's own pieces, so only the pieces that meet a
  rectangle change and each worker receives only its part (a remap
  restricted to the window). The dtype converts on the way (the data
  travels in the narrower one).
- `fill_window` writes a scalar into a window of every piece it meets.
- `rolled` is `write_window` into a new matrix that its rectangles cover
  whole (`roll`), allocated without a fill.

A Partial target holds its value as a sum of addends: a write sets the
window of the first member's addend and zeroes it in the others (so the sum
is the written value), or, from a Partial source over the same members,
writes each addend with the source's addend on the same worker (no
communication). Every other Partial source is summed first.
"""
import dataclasses
import numbers
from typing import NamedTuple

import numpy as np

from .. import memory
from ..comm import collectives
from ..errors import DMathError, DTypeError, NotSupportedError, ShapeError
from ..layout import ColBlock, RowBlock, Tiles
from ..layout import indexset as ix
from ..planning.assembly import Rect, neighbourly, window_steps, zeroed
from ..remap import execute, localize, send_dtype
from ..remap.plan import _segment
from ..runtime import Shard, define, runtime
from ..runtime.registry import collectives_in_graphs
from .base import as_int, check_scalar, dispatch, is_matrix, new_meta
from .creation import zeros
from .data import PARTIAL_ZERO, check_exact_integer_scalar, from_numpy
from .movement import _parse_key, remap


class WriteArgs(NamedTuple):
    """Static arguments of `write_window`: the rectangles (`planning.assembly.Rect`) to copy."""
    rects: tuple


class FillArgs(NamedTuple):
    """Static arguments of `fill_window`: the window's top-left corner and shape (the value is a scalar)."""
    offset: tuple
    shape: tuple


WRITE = define("write_window", WriteArgs)
ROLLED = define("rolled", WriteArgs)
FILL = define("fill_window", FillArgs)


# ---- the in-place commands (master side) ------------------------------------------------------
def _rects(rects):
    """The non-empty rectangles, with Python ints (they are static arguments: hashed, pickled)."""
    return tuple(Rect(tuple(map(int, r.src)), tuple(map(int, r.dst)), tuple(map(int, r.shape)))
                 for r in rects if r.shape[0] and r.shape[1])


def write(target, src, rects):
    """Copy each `Rect` of `src` into `target` in place (one command). A Partial `src` is summed
    first unless it is Partial over the target's own Partial members in a dtype at least as wide
    (its addends converted one by one to a narrower dtype would round, or overflow, before they are
    summed: 1e8 + 1 and -1e8 in float32 sum to 0, not 1)."""
    rects = _rects(rects)
    if not rects:
        return
    piecewise = (target.layout.partial and _members(src) == _members(target)
                 and np.dtype(target.dtype).itemsize >= np.dtype(src.dtype).itemsize)
    if src.layout.partial and not piecewise:
        src = remap(src, RowBlock(_members(src)))
    dispatch("write_window", [target, src], [0], static=WRITE.static(rects=rects))


def fill(target, offset, shape, value):
    """Write the scalar `value` into the window at `offset` of `shape` of `target`, in place."""
    if shape[0] and shape[1]:
        dispatch("fill_window", [target], [0], static=FILL.static(offset=tuple(map(int, offset)),
                                                                   shape=tuple(map(int, shape))),
                 scalars=(value,))


def _members(m):
    return m.layout.members(runtime().nworkers)


# ---- M[key] = value ------------------------------------------------------------------------
def setitem(m, key, value):
    """Master half of `M[key] = value` (see Matrix.__setitem__)."""
    m._check_writable("M[...] = value")
    rows, cols = _parse_key(key, m.shape)
    r0, h = (rows, 1) if isinstance(rows, int) else (rows.start, rows.stop - rows.start)
    c0, w = (cols, 1) if isinstance(cols, int) else (cols.start, cols.stop - cols.start)
    if is_matrix(value):
        if value.shape != (h, w):
            raise ShapeError(f"M[...] = X: the window has shape {(h, w)}, X has shape {value.shape} (a Matrix "
                             f"is written only into a window of its own shape)")
        write(m, value, (Rect((0, 0), (r0, c0), (h, w)),))
        return
    if isinstance(value, np.ndarray) and value.ndim == 0:
        value = value.item()            # a 0-d array is its scalar, as NumPy broadcasts it
    if isinstance(value, np.ndarray):
        if value.dtype.kind not in "iuf":
            raise DTypeError(f"M[...] = array needs a real numeric array, got dtype {value.dtype}")
        if value.shape != (h, w) and not (value.ndim == 1 and value.size == h * w and 1 in (h, w)):
            raise ShapeError(f"M[...] = array: the window has shape {(h, w)}, the array {value.shape}")
        if h * w:
            # scattered from the master (the window's size), then written like a Matrix
            write(m, from_numpy(value.reshape(h, w), dtype=m.dtype), (Rect((0, 0), (r0, c0), (h, w)),))
        return
    if isinstance(value, (numbers.Real, np.floating, np.integer)) and not isinstance(value, (bool, np.bool_)):
        check_exact_integer_scalar(value, m.dtype, "M[...] = value")     # as an integer array's values are
        fill(m, (r0, c0), (h, w), check_scalar(value, "the value"))
        return
    raise DMathError(f"M[...] = value needs a dmath.Matrix, a numpy array or a real scalar, "
                     f"got {type(value).__name__}")


# ---- building matrices -----------------------------------------------------------------------
def result_layout(lay):
    """The layout a built matrix takes from its first operand's: the same kind over the same
    workers, without sizes or tiles that refer to the operand's shape (RowBlock and ColBlock drop
    their sizes, Tiles becomes RowBlock over its workers)."""
    if isinstance(lay, (RowBlock, ColBlock)):
        return type(lay)(lay.group)
    if isinstance(lay, Tiles):
        return RowBlock(lay.members(runtime().nworkers))
    return lay


def _matrices(ms, what):
    if is_matrix(ms) or not isinstance(ms, (list, tuple)):
        raise DMathError(f"{what} needs a list or tuple of dmath matrices, got {type(ms).__name__}")
    if not ms:
        raise ShapeError(f"{what} needs at least one matrix")
    for k, x in enumerate(ms):
        if not is_matrix(x):
            raise DMathError(f"{what}: item {k} is a {type(x).__name__}, not a dmath.Matrix")
    return list(ms)


def _result_dtype(ms, dtype):
    if dtype is not None:
        return dtype
    return np.result_type(*[x.dtype for x in ms]).name


def concatenate(ms, axis=0, layout=None, dtype=None):
    """The matrices `ms` joined along `axis` (0: one under the other, 1: side by side), as
    numpy.concatenate.

    The result's dtype is NumPy's promotion of theirs (or `dtype`); its layout
    is `layout`, else the first matrix's kind (`result_layout`: a RowBlock
    stays RowBlock over the same workers, Tiles becomes RowBlock). Each
    matrix is written into its window of the result: only elements that land
    on another worker travel.
    """
    ms = _matrices(ms, "concatenate")
    axis = _axis(axis, "concatenate")
    other = 1 - axis
    for k, x in enumerate(ms):
        if x.shape[other] != ms[0].shape[other]:
            raise ShapeError(f"concatenate along axis {axis}: matrix {k} has shape {x.shape}, matrix 0 "
                             f"{ms[0].shape} (the sizes along axis {other} must agree)")
    sizes = [x.shape[axis] for x in ms]
    shape = (sum(sizes), ms[0].shape[1]) if axis == 0 else (ms[0].shape[0], sum(sizes))
    return _assemble(ms, shape, [(o, 0) if axis == 0 else (0, o) for o in np.cumsum([0] + sizes[:-1])],
                     layout, dtype)


def hstack(ms, layout=None, dtype=None):
    """concatenate(ms, axis=1): side by side (numpy.hstack of 2-D arrays)."""
    return concatenate(ms, 1, layout, dtype)


def vstack(ms, layout=None, dtype=None):
    """concatenate(ms, axis=0): one under the other (numpy.vstack of 2-D arrays)."""
    return concatenate(ms, 0, layout, dtype)


def block(blocks, layout=None, dtype=None):
    """A matrix assembled from a nested list of matrices, as numpy.block: [[A, B], [C, D]] puts A
    and B side by side over C and D (the heights in a row of blocks agree, and the rows' total
    widths); a flat list [A, B] is one row of blocks. Layout and dtype as `concatenate`."""
    if is_matrix(blocks) or not isinstance(blocks, (list, tuple)) or not blocks:
        raise DMathError(f"block needs a non-empty (nested) list of dmath matrices, got {blocks!r}")
    nested = [isinstance(b, (list, tuple)) for b in blocks]
    if any(nested) and not all(nested):
        raise ShapeError("block: the list mixes matrices and lists of matrices (every item of the outer "
                         "list must be a list, as in numpy.block's equal nesting depth)")
    grid = [list(b) for b in blocks] if all(nested) else [list(blocks)]
    rows_of = [_matrices(row, f"block row {i}") for i, row in enumerate(grid)]
    ms, offsets, top, width = [], [], 0, None
    for i, row in enumerate(rows_of):
        h = row[0].shape[0]
        left = 0
        for j, x in enumerate(row):
            if x.shape[0] != h:
                raise ShapeError(f"block: in row {i}, block {j} has {x.shape[0]} rows, block 0 has {h}")
            ms.append(x)
            offsets.append((top, left))
            left += x.shape[1]
        if width is not None and left != width:
            raise ShapeError(f"block: row {i} of blocks is {left} columns wide, row 0 is {width}")
        width = left
        top += h
    return _assemble(ms, (top, width), offsets, layout, dtype)


def _assemble(ms, shape, offsets, layout, dtype):
    out = zeros(shape, _result_dtype(ms, dtype), result_layout(ms[0].layout) if layout is None else layout)
    for x, (r, c) in zip(ms, offsets):
        write(out, x, (Rect((0, 0), (int(r), int(c)), x.shape),))
    return out


def _axis(axis, what):
    axis = as_int(axis, f"{what}: axis")
    if axis not in (0, 1, -1, -2):
        raise ShapeError(f"{what}: axis must be 0 or 1 (or -2, -1) for a 2-D matrix, got {axis}")
    return axis % 2


# ---- pad --------------------------------------------------------------------------------------
PAD_MODES = ("constant", "edge", "wrap", "reflect", "symmetric")


def _pairs(value, what, integer):
    """NumPy's pad_width / constant_values forms (a number, (before, after), ((b0, a0), (b1, a1)))
    broadcast to a 2 x 2 array."""
    try:
        a = np.asarray(value)
        if a.dtype == object or a.dtype.kind not in ("iu" if integer else "iuf"):
            raise TypeError
        return np.broadcast_to(a, (2, 2))
    except (TypeError, ValueError) as exc:
        raise ShapeError(f"pad: {what} must be {'an integer' if integer else 'a number'}, a pair "
                         f"(before, after) or a pair of such pairs (one per axis), got {value!r}") from exc


def pad(m, pad_width, mode="constant", constant_values=0, layout=None):
    """`m` padded as numpy.pad(a, pad_width, mode, constant_values=...) for a 2-D array.

    pad_width: n, (before, after) or ((top, bottom), (left, right)).
    mode: 'constant' (constant_values in the same forms), 'edge', 'wrap',
    'reflect' or 'symmetric'. The result has m's dtype and the layout
    `layout`, else m's kind (`result_layout`). m is written into the middle
    (only the elements that land on another worker travel), then the border:
    constants are filled in place, the other modes copy strips of m, one
    command per run of consecutive source rows (NumPy's order: rows first,
    then columns, so the corners come from the padded rows).
    """
    if not is_matrix(m):
        raise DMathError(f"pad needs a dmath.Matrix, got {type(m).__name__}")
    pw = _pairs(pad_width, "pad_width", True)
    if (pw < 0).any():
        raise ShapeError(f"pad: pad_width must not be negative, got {pad_width!r}")
    if not isinstance(mode, str) or mode not in PAD_MODES:
        raise NotSupportedError(f"pad: mode {mode!r:.40} is not supported; use one of {', '.join(PAD_MODES)}")
    if mode != "constant" and not _is_zero(constant_values):
        raise DMathError(f"pad: constant_values applies to mode='constant' only, not {mode!r}")
    cv = _pairs(constant_values, "constant_values", False).astype(np.float64)
    (t, b), (left, right) = (tuple(int(v) for v in row) for row in pw)
    mrows, ncols = m.shape
    # the source index of every padded row and column, from numpy.pad itself: its semantics exactly
    row_src = col_src = None
    if mode != "constant":
        try:
            row_src = np.pad(np.arange(mrows), (t, b), mode=mode)
            col_src = np.pad(np.arange(ncols), (left, right), mode=mode)
        except ValueError as exc:
            raise ShapeError(f"pad: mode {mode!r} cannot pad an empty axis of a {m.shape} matrix: {exc}") from exc
    shape = (mrows + t + b, ncols + left + right)
    out = zeros(shape, m.dtype, result_layout(m.layout) if layout is None else layout)
    write(out, m, (Rect((0, 0), (t, left), m.shape),))
    if mode == "constant":
        # `out` starts as +0.0: a fill is skipped only where it would write +0.0 over +0.0 (a zero
        # column constant over nonzero row constants sets the corners, as NumPy's; -0.0 keeps its sign)
        def plus_zero(v):
            return v == 0 and not np.signbit(v)
        rows = (((0, t), cv[0, 0]), ((t + mrows, b), cv[0, 1]))
        for (r0, h), v in rows:
            if h and not plus_zero(v):
                fill(out, (r0, 0), (h, shape[1]), float(v))
        corners_zero = all(plus_zero(v) for (_, h), v in rows if h)
        for (c0, w), v in (((0, left), cv[1, 0]), ((left + ncols, right), cv[1, 1])):
            if w and not (plus_zero(v) and corners_zero):
                fill(out, (0, c0), (shape[0], w), float(v))
        return out
    # rows from m into the middle columns, then whole columns of `out` from its own middle columns
    write(out, m, [Rect((s, 0), (d, left), (n, ncols)) for d, s, n in _runs(row_src, (0, t), (t + mrows, b))])
    write(out, out, [Rect((0, left + s), (0, d), (shape[0], n))
                     for d, s, n in _runs(col_src, (0, left), (left + ncols, right))])
    return out


def _is_zero(v):
    try:
        return not np.any(np.asarray(v, dtype=np.float64))
    except (TypeError, ValueError):
        return False


def _runs(src_index, *ranges):
    """(target start, source start, length) of the runs of consecutive source indices in `ranges`
    ((start, length) of padded positions) of the index map `src_index`."""
    out = []
    for start, length in ranges:
        p = start
        while p < start + length:
            q = p + 1
            while q < start + length and src_index[q] == src_index[q - 1] + 1:
                q += 1
            out.append((p, int(src_index[p]), q - p))
            p = q
    return out


# ---- roll -----------------------------------------------------------------------------------
def roll(m, shift, axis=None):
    """numpy.roll for a matrix: elements shifted by `shift` along `axis` (0, 1, or a tuple; None:
    the row-major flattened matrix), those leaving one end entering at the other.

    The result has m's layout and dtype. It is one command of at most four
    rectangle copies into a new matrix, each moving only the elements that change owner: on
    RowBlock, ColBlock or Block2D a shift smaller than a block sends each
    worker's boundary strip (a halo of |shift| rows or columns) to its
    neighbour and copies the rest in place. A Partial matrix rolls addend by
    addend, without communication.
    """
    if not is_matrix(m):
        raise DMathError(f"roll needs a dmath.Matrix, got {type(m).__name__}")
    rows, cols = m.shape
    if axis is None:
        s = as_int(shift, "roll: shift")
        total = rows * cols
        if total == 0:
            return m.copy()
        # the flattened roll by s: rows roll by q where the column index does not wrap, by q + 1 where it does
        q, r = divmod(s % total, cols)
        rects = _roll_rects(rows, 0, cols - r, r, q) + _roll_rects(rows, cols - r, r, 0, q + 1)
    else:
        axes = axis if isinstance(axis, (tuple, list)) else (axis,)
        shifts = shift if isinstance(shift, (tuple, list)) else (shift,) * len(axes)
        if len(shifts) != len(axes):
            raise ShapeError(f"roll: shift and axis must have the same length, got {shift!r} and {axis!r}")
        by = [0, 0]
        for s, a in zip(shifts, axes):
            by[_axis(a, "roll")] += as_int(s, "roll: shift")
        by = [by[0] % rows if rows else 0, by[1] % cols if cols else 0]
        rects = []
        for (sc, w), dc in _split(cols, by[1]):
            rects += _roll_rects(rows, sc, w, dc, by[0])
    # the rectangles cover the result whole: a new matrix written once (no zeros first)
    out = new_meta(m.layout, m.shape, m.dtype)
    return dispatch("rolled", [m], [out], static=ROLLED.static(rects=_rects(rects)))[0][0]


def _split(n, s):
    """((source start, length), target start) of the two parts of an axis of n rolled by s (0 <= s < n)."""
    return [p for p in (((0, n - s), s), ((n - s, s), 0)) if p[0][1]]


def _roll_rects(rows, sc, w, dc, row_shift):
    """Rects moving source columns [sc, sc + w) to columns [dc, dc + w), the rows rolled by row_shift."""
    if not w or not rows:
        return []
    row_shift %= rows
    return [Rect((sr, sc), (dr, dc), (h, w)) for (sr, h), dr in _split(rows, row_shift)]


# ---- kernels --------------------------------------------------------------------------------
def _steps(cache, src, dst, rects, rank):
    """This rank's (step, LocalExchange, whether it is a halo exchange) of every rectangle, cached in
    the command's entry."""
    steps = cache.get("steps")
    if steps is None:
        steps = cache["steps"] = [(s, localize(s, rank), neighbourly((t.src, t.dst) for t in s.transfers))
                                  for s in window_steps(src, dst, rects)]
    return steps


def _copy_rects(call, src, dst_dist, dst_pieces, dst_dtype, itself=False):
    """Copy the command's rectangles of shard `src` into `dst_pieces` (of `dst_dist`; `itself`: they
    are src's own): per rectangle, one exchange among the workers involved and local copies."""
    rank = call.rank
    wire = send_dtype(src.dtype, dst_dtype)
    for step, loc, halo in _steps(call.entry.cache, src.dist, dst_dist, call.entry.static.rects, rank):
        if itself and loc.send_displs is not None:
            # written from itself (pad's columns): the send comes from a packed copy, since MPI
            # refuses a send buffer that is also the receive buffer (other parts of one piece)
            loc = dataclasses.replace(loc, send_piece=None, send_displs=None)
        bufs = None
        if rank in loc.group:
            bufs = execute.prepare(loc, src.pieces, dst_pieces, wire, False)
            collectives.exchange(call.world.group(loc.group), bufs.send, loc.send_counts, bufs.recv,
                                 loc.recv_counts, bufs.send_displs, bufs.recv_displs, point_to_point=halo)
        execute.finish(loc, src.pieces, dst_pieces, bufs, False)


def _capturable(src, dst, rects):
    # local copies always; exchanges (NCCL on the compute stream) when collectives may be captured
    if collectives_in_graphs():
        return True
    return not any(t.src != t.dst for step in window_steps(src, dst, rects) for t in step.transfers)


@WRITE.kernel(capturable=lambda e: _capturable(e.in_dists[1], e.in_dists[0], e.static.rects))
def _write(call):
    """Input 0 (the target) overwritten in place, in every rectangle, with input 1's rectangle."""
    target, src = call.inputs
    if zeroed(src.dist, target.dist, call.rank):
        for r in call.entry.static.rects:
            _fill_pieces(target, r.dst, r.shape, 0.0, call.rank)
    _copy_rects(call, src, target.dist, target.pieces, target.dtype, itself=src is target)
    return [target]


@ROLLED.kernel(capturable=lambda e: _capturable(e.in_dists[0], e.out_dists[0], e.static.rects))
def _rolled(call):
    """A new matrix in the source's layout whose rectangles cover it whole (roll): no fill first."""
    src = call.inputs[0]
    dst = call.entry.out_dists[0]
    pieces = [memory.empty(shape, src.dtype) for shape in dst.shard_shapes(call.rank)]
    _copy_rects(call, src, dst, pieces, src.dtype)
    return [Shard(pieces, dst, src.dtype)]


def _fill_pieces(shard, offset, shape, value, rank):
    win = (ix.interval(offset[0], offset[0] + shape[0]), ix.interval(offset[1], offset[1] + shape[1]))
    for k, (piece, p) in enumerate(zip(shard.pieces, shard.dist.pieces[rank])):
        rows, cols = ix.intersect(p.rows, win[0]), ix.intersect(p.cols, win[1])
        if rows and cols:
            for (pr, pc), _ in _segment(k, p, rows, cols).views:
                memory.fill(execute.view(piece, pr, pc), value)


@FILL.kernel(capturable=True)
def _fill(call):
    """Input 0 overwritten in place with scalars[0] in the window (a Partial matrix: in its first
    member's addend, zeros in the others')."""
    target = call.inputs[0]
    dist = target.dist
    value = PARTIAL_ZERO if dist.partial and call.rank != dist.group[0] else call.scalars[0]
    _fill_pieces(target, call.entry.static.offset, call.entry.static.shape, value, call.rank)
    return [target]

