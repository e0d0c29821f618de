"""Redistribution plans: pure functions of (source, target, window, dtypes).

A plan is a tuple of steps. An `Exchange` step is one all-to-all-v round in
which only elements that change owner travel: each target element is taken
from a copy the receiving worker already holds when there is one (a local
copy), else from exactly one holder (spread over the holders of a replicated
source). An `AllReduce` step sums Partial addends into a Replicated result.
Plans are computed identically on every worker (no communication) and cached
per command signature.
"""
import functools
from dataclasses import dataclass

import numpy as np

from ..layout import RowBlock, distribution, indexset as ix


@dataclass(frozen=True)
class Transfer:
    """Target rows x cols (target coordinates) of dst piece `dpiece` on `dst`, from `src`'s piece `spiece`."""
    src: int
    spiece: int
    dst: int
    dpiece: int
    rows: tuple
    cols: tuple

    @property
    def count(self):
        return ix.size(self.rows) * ix.size(self.cols)


@dataclass(frozen=True)
class Exchange:
    src: object            # source Distribution
    dst: object            # target Distribution
    offset: tuple          # window origin in source coordinates
    transfers: tuple
    accumulate: bool       # sum contributions (a Partial source)
    zero_init: bool        # target starts at zero (a Partial target or accumulation)


@dataclass(frozen=True)
class AllReduce:
    src: object
    dst: object
    offset: tuple


def _window_sets(src, offset, shape):
    return (ix.intersect(ix.interval(offset[0], offset[0] + shape[0]), ix.interval(0, src.shape[0])),
            ix.intersect(ix.interval(offset[1], offset[1] + shape[1]), ix.interval(0, src.shape[1])))


def _to_target(piece, offset, win):
    """A source piece clipped to the window, in target coordinates."""
    return (ix.shift(ix.intersect(piece.rows, win[0]), -offset[0]),
            ix.shift(ix.intersect(piece.cols, win[1]), -offset[1]))


def _transfers(src, dst, offset):
    win = _window_sets(src, offset, dst.shape)
    out = []
    add = out.append
    if src.partial and dst.partial:
        full = (ix.interval(0, dst.shape[0]), ix.interval(0, dst.shape[1]))
        outsiders = [s for s in src.group if s not in dst.group]
        for s in src.group:
            d = s if s in dst.group else dst.group[outsiders.index(s) % len(dst.group)]
            add(Transfer(s, 0, d, 0, *full))
    elif src.partial:
        for d, dpieces in enumerate(dst.pieces):
            for k, dp in enumerate(dpieces):
                for s in src.group:
                    add(Transfer(s, 0, d, k, dp.rows, dp.cols))
    elif dst.partial:
        if src.replicated:
            common = [m for m in src.group if m in dst.group]
            d = common[0] if common else dst.group[0]
            s = d if common else src.group[0]
            add(Transfer(s, 0, d, 0, ix.interval(0, dst.shape[0]), ix.interval(0, dst.shape[1])))
        else:
            outsiders = [s for s in range(src.nworkers) if src.pieces[s] and s not in dst.group]
            for s, spieces in enumerate(src.pieces):
                d = s if s in dst.group or not spieces else dst.group[outsiders.index(s) % len(dst.group)]
                for k, sp in enumerate(spieces):
                    rows, cols = _to_target(sp, offset, win)
                    if rows and cols:
                        add(Transfer(s, k, d, 0, rows, cols))
    else:
        for d, dpieces in enumerate(dst.pieces):
            for k, dp in enumerate(dpieces):
                if src.replicated:
                    s = d if d in src.group else src.group[d % len(src.group)]
                    add(Transfer(s, 0, d, k, dp.rows, dp.cols))
                    continue
                for s, spieces in enumerate(src.pieces):
                    for j, sp in enumerate(spieces):
                        rows, cols = _to_target(sp, offset, win)
                        rows, cols = ix.intersect(rows, dp.rows), ix.intersect(cols, dp.cols)
                        if rows and cols:
                            add(Transfer(s, j, d, k, rows, cols))
    return tuple(t for t in out if t.count)


@functools.lru_cache(maxsize=1024)
def plan(src, dst, offset=(0, 0)):
    """The steps that turn `src` (a Distribution), read from window `offset`, into `dst`."""
    if src.partial and dst.replicated:
        if src.group == dst.group:
            return (AllReduce(src, dst, offset),)
        # reduce-scatter onto the source group, then spread to the target group
        mid = distribution(RowBlock(src.group), dst.shape, src.nworkers)
        return (Exchange(src, mid, offset, _transfers(src, mid, offset), True, True),
                Exchange(mid, dst, (0, 0), _transfers(mid, dst, (0, 0)), False, False))
    return (Exchange(src, dst, offset, _transfers(src, dst, offset), src.partial,
                     src.partial or dst.partial),)


def involved(step):
    """Sorted ranks that send or receive in an Exchange step (the communicator it runs on)."""
    return tuple(sorted({r for t in step.transfers if t.src != t.dst for r in (t.src, t.dst)}))


@dataclass(frozen=True)
class Segment:
    """One transfer as seen from one end: a strided selection of a local piece and its packed form.

    The selection is `rows` x `cols` of piece `piece` (each an `ix.Runs`
    tuple); its packed form is a row-major block of `shape`, as it travels.
    `views` pairs them up 4-D view by 4-D view: ((piece rows, piece cols),
    (packed rows, packed cols)). `flat` is the offset of the selection in the
    piece's flat (row-major) memory when it is one contiguous range there,
    else None: such a segment can travel straight from or into the piece.
    """
    piece: int
    shape: tuple
    rows: tuple
    cols: tuple
    views: tuple
    flat: object


@dataclass(frozen=True)
class LocalCopy:
    """A transfer that stays on this worker: source segment -> target segment.

    `direct` pairs source views with target views of the same 4-D shapes (one
    copy each); it is None when the two selections do not pair up (both
    irregular in different ways), and the copy goes through the packed form.
    """
    src: Segment
    dst: Segment
    direct: object


@dataclass
class LocalExchange:
    """One worker's part of an Exchange: what it copies, sends and receives.

    `send_displs` / `recv_displs` are the element offsets of each member's
    part inside one local piece (`send_piece` / `recv_piece`) when every part
    is one contiguous range of it: the piece itself is then the send or
    receive buffer, with no packing. Else they are None and parts are packed
    in group order into one buffer.
    """
    group: tuple            # involved ranks (sorted)
    local: list             # [LocalCopy]
    sends: list             # per group index: [Segment]
    recvs: list             # per group index: [Segment]
    send_counts: list
    recv_counts: list
    send_piece: object = None
    send_displs: object = None
    recv_piece: object = None
    recv_displs: object = None


def _segment(piece_index, piece, rows, cols):
    """The Segment of global rows x cols inside `piece` (a layout Piece)."""
    rl, cl = ix.local_intervals(rows, piece.rows), ix.local_intervals(cols, piece.cols)
    rr, cr = ix.strided_runs(rl, ix.size(piece.rows)), ix.strided_runs(cl, ix.size(piece.cols))
    h, w = ix.size(rows), ix.size(cols)
    width = ix.size(piece.cols)
    flat = None
    if len(rl) == 1 and len(cl) == 1 and (h == 1 or w == width):
        flat = rl[0][0] * width + cl[0][0]
    views = tuple(((r, c), (pr, pc)) for r, pr in zip(rr, ix.split_like(0, rr))
                  for c, pc in zip(cr, ix.split_like(0, cr)))
    return Segment(piece_index, (h, w), rr, cr, views, flat)


def _pair_axis(a, b):
    """Pair two selections of one axis (Runs tuples, same total) group by group, or None.

    Equal run shapes pair as they are; a contiguous selection is cut like the
    other one; two irregular selections of different shapes do not pair.
    """
    shape = lambda runs: tuple((r.count, r.length) for r in runs)
    if shape(a) == shape(b):
        return tuple(zip(a, b))
    if len(a) == 1 and a[0].count == 1:
        return tuple(zip(ix.split_like(a[0].base + a[0].offset, b), b))
    if len(b) == 1 and b[0].count == 1:
        return tuple(zip(a, ix.split_like(b[0].base + b[0].offset, a)))
    return None


def _local_copy(src_seg, dst_seg):
    rows = _pair_axis(src_seg.rows, dst_seg.rows)
    cols = _pair_axis(src_seg.cols, dst_seg.cols)
    direct = None
    if rows is not None and cols is not None:
        direct = tuple(((sr, sc), (dr, dc)) for sr, dr in rows for sc, dc in cols)
    return LocalCopy(src_seg, dst_seg, direct)


def _direct_displs(segs_per_member):
    """(piece, element offset per member) when each member's segments are one contiguous range of one piece."""
    piece, displs = None, []
    for segs in segs_per_member:
        if not segs:
            displs.append(0)
            continue
        for k, seg in enumerate(segs):
            if seg.flat is None or (piece is not None and seg.piece != piece):
                return None, None
            piece = seg.piece
            if k and seg.flat != segs[k - 1].flat + segs[k - 1].shape[0] * segs[k - 1].shape[1]:
                return None, None
        displs.append(segs[0].flat)
    return (piece, displs) if piece is not None else (None, None)


def localize(step, rank):
    """This rank's `LocalExchange` for an Exchange step: every selection as strided views."""
    group = involved(step)
    pos = {r: k for k, r in enumerate(group)}
    local, sends, recvs = [], [[] for _ in group], [[] for _ in group]
    off = step.offset
    for t in step.transfers:
        if t.src != rank and t.dst != rank:
            continue
        if t.src == rank:
            ss = _segment(t.spiece, step.src.pieces[rank][t.spiece], ix.shift(t.rows, off[0]), ix.shift(t.cols, off[1]))
        if t.dst == rank:
            ds = _segment(t.dpiece, step.dst.pieces[rank][t.dpiece], t.rows, t.cols)
        if t.src == rank and t.dst == rank:
            local.append(_local_copy(ss, ds))
        elif t.src == rank:
            sends[pos[t.dst]].append(ss)
        else:
            recvs[pos[t.src]].append(ds)
    count = lambda segs: sum(s.shape[0] * s.shape[1] for s in segs)
    send_piece, send_displs = _direct_displs(sends)
    recv_piece, recv_displs = _direct_displs(recvs)
    return LocalExchange(group, local, sends, recvs, [count(s) for s in sends], [count(r) for r in recvs],
                         send_piece, send_displs, recv_piece, recv_displs)


def moved_elements(step, rank):
    """(elements sent, elements received) by `rank` in an Exchange step (for tests and explain)."""
    sent = sum(t.count for t in step.transfers if t.src == rank and t.dst != rank)
    recv = sum(t.count for t in step.transfers if t.dst == rank and t.src != rank)
    return sent, recv


def send_dtype(src_dtype, dst_dtype):
    """Convert on the side that moves fewer bytes: travel in the narrower dtype."""
    return src_dtype if np.dtype(src_dtype).itemsize <= np.dtype(dst_dtype).itemsize else dst_dtype
