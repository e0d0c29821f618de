"""Planning of assembly: writes into windows of a matrix, and row / element gathers.

Pure functions of metadata (Distributions, offsets, index tuples), computed
alike on every worker and cached, like the remap's plans:

- `window_step(src, dst, rects)`: the Exchange steps that copy rectangles of
  a source matrix into rectangles of the same size of a target matrix,
  written in place. Only the target's pieces that meet a rectangle receive,
  and each receives only its part of it (a remap restricted to the window).
- `gather_plan(src, dst, kind, arg)`: element moves that are not a window,
  as (source rank, source piece, target rank, target piece, local index
  arrays) items: the rows of `take_rows`, the diagonal of `diag`.
"""
import functools
from typing import NamedTuple

import numpy as np

from ..layout import indexset as ix
from ..remap.plan import Exchange, Transfer


class Rect(NamedTuple):
    """A rectangle of `shape` read at `src` (top-left, source coordinates) and written at `dst`."""
    src: tuple
    dst: tuple
    shape: tuple


def receivers(dst):
    """The target pieces a write lands in: every piece, except that a Partial target's value is
    written into its first member's addend (the others' window is zeroed: `zeroed`)."""
    if dst.partial:
        return [(d, dst.pieces[d]) for d in dst.group[:1]]
    return list(enumerate(dst.pieces))


def zeroed(src, dst, rank):
    """Whether `rank` zeroes its addend's window in a write into a Partial target: a member other
    than the first, unless the source is Partial over the same members (then each addend is
    written with the source's addend of the same member, and their sum is the source's value)."""
    return dst.partial and rank in dst.group[1:] and not same_addends(src, dst)


def same_addends(src, dst):
    """A Partial source written into a Partial target over the same members, addend by addend."""
    return src.partial and dst.partial and src.group == dst.group


def _window_transfers(src, dst, rect):
    (sr, sc), (dr, dc), (h, w) = rect
    win = (ix.interval(dr, dr + h), ix.interval(dc, dc + w))
    shift = (dr - sr, dc - sc)           # target coordinate = source coordinate + shift
    out = []
    if same_addends(src, dst):
        return tuple(Transfer(s, 0, s, 0, *win) for s in src.group)
    for d, dpieces in receivers(dst):
        for k, dp in enumerate(dpieces):
            rows, cols = ix.intersect(dp.rows, win[0]), ix.intersect(dp.cols, win[1])
            if not (rows and cols):
                continue
            if src.replicated:
                # from this worker's own copy when it holds one, else spread over the holders
                s = d if d in src.group else src.group[d % len(src.group)]
                out.append(Transfer(s, 0, d, k, rows, cols))
                continue
            for s, spieces in enumerate(src.pieces):
                for j, sp in enumerate(spieces):
                    r = ix.intersect(ix.shift(sp.rows, shift[0]), rows)
                    c = ix.intersect(ix.shift(sp.cols, shift[1]), cols)
                    if r and c:
                        out.append(Transfer(s, j, d, k, r, c))
    return tuple(out)


@functools.lru_cache(maxsize=1024)
def window_steps(src, dst, rects):
    """One Exchange per rectangle: `src`'s window at rect.src into `dst`'s window at rect.dst.

    The steps' `dst` is the target's own distribution: a worker's part of a
    step writes straight into the target's existing pieces. `src` must not be
    a Partial matrix unless `same_addends` holds (the master sums it first).
    """
    steps = []
    for rect in rects:
        offset = (rect.src[0] - rect.dst[0], rect.src[1] - rect.dst[1])
        steps.append(Exchange(src, dst, offset, _window_transfers(src, dst, rect), False, False))
    return tuple(steps)


def neighbourly(pairs):
    """True when every worker exchanges with at most two others in these (source, target) rank
    pairs: a halo exchange, sent point to point rather than as a collective over the group. Every
    rank decides it from the same plan, so all of them call the same collective or none."""
    peers = {}
    for s, d in pairs:
        if s != d:
            peers.setdefault(s, set()).add(d)
            peers.setdefault(d, set()).add(s)
    return all(len(p) <= 2 for p in peers.values())


# ---- gathers -------------------------------------------------------------------------------
class Move(NamedTuple):
    """Elements from piece `spiece` of rank `src` to piece `dpiece` of rank `dst`.

    Rows mode (`cols` given): the block src_rows x cols of the source piece
    goes to dst_rows x dst_cols of the target piece (local positions; the
    rows as index arrays, the columns as a slice). Element mode (`cols`
    None): the elements (src_rows[t], src_cols[t]) go to (dst_rows[t],
    dst_cols[t]).
    """
    src: int
    spiece: int
    dst: int
    dpiece: int
    src_rows: np.ndarray
    src_cols: object
    dst_rows: np.ndarray
    dst_cols: object
    cols: bool

    @property
    def count(self):
        if self.cols:
            return len(self.src_rows) * (self.src_cols.stop - self.src_cols.start)
        return len(self.src_rows)


def _local(global_idx, s):
    """Local positions inside index set `s` of the global indices `global_idx` (all members of s)."""
    starts = np.array([a for a, _ in s], dtype=np.int64)
    ends = np.array([b for _, b in s], dtype=np.int64)
    base = np.concatenate([[0], np.cumsum(ends - starts)[:-1]]).astype(np.int64)
    k = np.searchsorted(starts, global_idx, side="right") - 1
    return base[k] + (global_idx - starts[k])


def _members(idx, s):
    """Boolean mask: which of the global indices `idx` lie in index set `s`."""
    if not s:
        return np.zeros(len(idx), dtype=bool)
    starts = np.array([a for a, _ in s], dtype=np.int64)
    ends = np.array([b for _, b in s], dtype=np.int64)
    k = np.searchsorted(starts, idx, side="right") - 1
    return (k >= 0) & (idx < ends[np.maximum(k, 0)])


def _holder(src, d):
    """The member of a replicated source that serves receiver d (its own copy when it has one)."""
    return d if d in src.group else src.group[d % len(src.group)]


def _slice_of(sub, s):
    """Local positions of the contiguous global interval set `sub` (one interval) inside `s`, as a slice."""
    lo = ix.local_intervals(sub, s)
    return slice(lo[0][0], lo[0][1])


def _row_moves(src, dst, rows):
    """take_rows: target row i is source row rows[i] (a sequence, or int64 little-endian bytes);
    columns map to themselves."""
    rows = np.frombuffer(rows, dtype="<i8") if isinstance(rows, bytes) else np.asarray(rows, dtype=np.int64)
    out = []
    for d, dpieces in enumerate(dst.pieces):
        for k, dp in enumerate(dpieces):
            out_rows = ix.to_array(dp.rows)
            want = rows[out_rows]
            sources = ([(_holder(src, d), 0, src.pieces[_holder(src, d)][0])] if src.replicated else
                       [(s, j, sp) for s, sp_ in enumerate(src.pieces) for j, sp in enumerate(sp_)])
            for s, j, sp in sources:
                sel = _members(want, sp.rows)
                if not sel.any():
                    continue
                for a, b in dp.cols:     # each column interval of the target piece: slices on both sides
                    for ca, cb in ix.intersect(((a, b),), sp.cols):
                        out.append(Move(s, j, d, k, _local(want[sel], sp.rows),
                                        _slice_of(((ca, cb),), sp.cols), _local(out_rows[sel], dp.rows),
                                        _slice_of(((ca, cb),), dp.cols), True))
    return out


def _element_moves(src, dst, src_of):
    """Element mode: target element (i, j) listed by `src_of(dst_piece)` -> (i, j, si, sj) arrays."""
    out = []
    for d, dpieces in receivers(dst):
        for k, dp in enumerate(dpieces):
            ti, tj, si, sj = src_of(dp)
            if not len(ti):
                continue
            sources = ([(_holder(src, d), 0, src.pieces[_holder(src, d)][0])] if src.replicated else
                       [(s, j, sp) for s, sp_ in enumerate(src.pieces) for j, sp in enumerate(sp_)])
            for s, j, sp in sources:
                sel = _members(si, sp.rows) & _members(sj, sp.cols)
                if sel.any():
                    out.append(Move(s, j, d, k, _local(si[sel], sp.rows), _local(sj[sel], sp.cols),
                                    _local(ti[sel], dp.rows), _local(tj[sel], dp.cols), False))
    return out


def _diag_get(k):
    """diag of a matrix: target (t, 0) of a (d, 1) column is source (t, t + k) (or (t - k, t))."""
    def src_of(dp):
        t = ix.to_array(dp.rows) if dp.cols else np.zeros(0, dtype=np.int64)   # (the one column 0)
        zero = np.zeros_like(t)
        return (t, zero, t, t + k) if k >= 0 else (t, zero, t - k, t)
    return src_of


def _diag_put(k, vertical):
    """diag of a vector: target (t, t + k) (or (t - k, t)) is the vector's element t."""
    def src_of(dp):
        rows = ix.to_array(dp.rows)
        i = rows if k >= 0 else rows[rows >= -k]
        j = i + k
        keep = _members(j, dp.cols)
        i, j = i[keep], j[keep]
        t = i if k >= 0 else j
        zero = np.zeros_like(t)
        return (i, j, t, zero) if vertical else (i, j, zero, t)
    return src_of


@functools.lru_cache(maxsize=256)
def gather_plan(src, dst, kind, arg):
    """The `Move`s of a gather: kind 'rows' (arg: the source row of every target row, as int64
    little-endian bytes or a sequence), 'diag_get' (arg: k) or 'diag_put' (arg: (k, whether the
    vector is a column)). `src` is not Partial (the master sums it first)."""
    if kind == "rows":
        moves = _row_moves(src, dst, arg)
    elif kind == "diag_get":
        moves = _element_moves(src, dst, _diag_get(arg))
    else:
        moves = _element_moves(src, dst, _diag_put(*arg))
    return tuple(m for m in moves if m.count)
