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


@dataclass
class LocalExchange:
    """One worker's part of an Exchange: what it copies, sends and receives."""
    group: tuple            # involved ranks (sorted)
    local: list             # (spiece, srows, scols, dpiece, drows, dcols)
    sends: list             # per group index: [(spiece, srows, scols, shape)]
    recvs: list             # per group index: [(dpiece, drows, dcols, shape)]
    send_counts: list
    recv_counts: list


def localize(step, rank):
    """This rank's `LocalExchange` for an Exchange step (selections are slices or index arrays)."""
    group = involved(step)
    pos = {r: k for k, r in enumerate(group)}
    local, sends, recvs = [], [[] for _ in group], [[] for _ in group]
    off = step.offset
    for t in step.transfers:
        if t.src != rank and t.dst != rank:
            continue
        shape = (ix.size(t.rows), ix.size(t.cols))
        if t.src == rank:
            sp = step.src.pieces[rank][t.spiece]
            ssel = (ix.positions(ix.shift(t.rows, off[0]), sp.rows), ix.positions(ix.shift(t.cols, off[1]), sp.cols))
        if t.dst == rank:
            dp = step.dst.pieces[rank][t.dpiece]
            dsel = (ix.positions(t.rows, dp.rows), ix.positions(t.cols, dp.cols))
        if t.src == rank and t.dst == rank:
            local.append((t.spiece, *ssel, t.dpiece, *dsel))
        elif t.src == rank:
            sends[pos[t.dst]].append((t.spiece, *ssel, shape))
        else:
            recvs[pos[t.src]].append((t.dpiece, *dsel, shape))
    count = lambda segs: sum(s[-1][0] * s[-1][1] for s in segs)
    return LocalExchange(group, local, sends, recvs, [count(s) for s in sends], [count(r) for r in recvs])


def moved_elements(step, rank):
    """(elements sent, elements received) by `rank` in an Exchange step (for tests and explain)."""
    sent = sum(t.count for t in step.transfers if t.src == rank and t.dst != rank)
    recv = sum(t.count for t in step.transfers if t.dst == rank and t.src != rank)
    return sent, recv


def send_dtype(src_dtype, dst_dtype):
    """Convert on the side that moves fewer bytes: travel in the narrower dtype."""
    return src_dtype if np.dtype(src_dtype).itemsize <= np.dtype(dst_dtype).itemsize else dst_dtype
