"""A layout applied to a shape and a worker count: the pure index math.

`distribution(layout, shape, nworkers)` is cached; everything that plans
(remap, elementwise alignment, reductions) works from it, on the master and
on the workers alike, without communication.
"""
import functools
import operator
from dataclasses import dataclass

import numpy as np

from ..errors import LayoutError
from . import indexset as ix
from .values import Layout


@dataclass(frozen=True)
class Distribution:
    """Where every element of a (rows x cols) matrix lives among `nworkers` workers.

    pieces[r] is the tuple of pieces worker r stores (empty for non-members).
    """
    layout: Layout
    shape: tuple
    nworkers: int
    pieces: tuple

    @property
    def group(self):
        return self.layout.members(self.nworkers)

    @property
    def replicated(self):
        return self.layout.replicated

    @property
    def partial(self):
        return self.layout.partial

    def shard_shapes(self, rank):
        """Shapes of the local arrays worker `rank` stores, one per piece."""
        return tuple(p.shape for p in self.pieces[rank])

    def holders(self, i, j):
        """Ranks that store element (i, j)."""
        return tuple(r for r, ps in enumerate(self.pieces) for p in ps
                     if _contains(p.rows, i) and _contains(p.cols, j))

    def locate(self, i, j):
        """[(rank, piece index, local row, local col)] for every stored copy of (i, j)."""
        out = []
        for r, ps in enumerate(self.pieces):
            for k, p in enumerate(ps):
                if _contains(p.rows, i) and _contains(p.cols, j):
                    li = ix.positions(((i, i + 1),), p.rows)
                    lj = ix.positions(((j, j + 1),), p.cols)
                    out.append((r, k, li.start, lj.start))
        return out

    def owner_mask(self, rank):
        """Boolean (rows x cols) mask of the elements worker `rank` stores (for tests and planning checks)."""
        mask = np.zeros(self.shape, dtype=bool)
        for p in self.pieces[rank]:
            mask[np.ix_(ix.to_array(p.rows), ix.to_array(p.cols))] = True
        return mask

    def same_placement(self, other):
        """True when both store the same pieces on the same workers (layouts may be spelled differently)."""
        return (self.shape == other.shape and self.pieces == other.pieces
                and self.partial == other.partial)

    @property
    def pending_sum(self):
        """True when the pieces are addends still to be summed: Partial over two or more workers (over
        one worker, the only addend is the sum)."""
        return self.partial and len(self.group) > 1

    def same_values_placement(self, other):
        """same_placement, except that a Partial over one worker matches its non-Partial twin: both hold
        the matrix's values in the same pieces on the same worker."""
        return (self.shape == other.shape and self.pieces == other.pieces
                and self.pending_sum == other.pending_sum)


def _contains(s, i):
    return any(a <= i < b for a, b in s)


def check_shape(shape):
    try:
        # operator.index, not int(): a shape of (2.7, 3) is a mistake, not a (2, 3) matrix
        m, n = (operator.index(v) for v in shape)
    except (TypeError, ValueError) as exc:
        raise LayoutError(f"a matrix shape is a pair of non-negative integers, got {shape!r}") from exc
    if any(isinstance(v, (bool, np.bool_)) for v in shape):
        # operator.index(True) is 1: (True, 2) is a mistake, not a (1, 2) matrix
        raise LayoutError(f"a matrix shape is a pair of non-negative integers, got the booleans in {shape!r}")
    if m < 0 or n < 0:
        raise LayoutError(f"a matrix shape is a pair of non-negative integers, got {shape!r}")
    return (m, n)


@functools.lru_cache(maxsize=4096)
def _distribution(layout, shape, nworkers):
    pieces = layout.pieces(shape, nworkers)
    if not layout.replicated and not layout.partial:
        _check_cover(layout, shape, pieces)
    return Distribution(layout, shape, nworkers, pieces)


def distribution(layout, shape, nworkers):
    """The `Distribution` of `layout` for a matrix of `shape` over `nworkers` workers (cached)."""
    if not isinstance(layout, Layout):
        raise LayoutError(f"expected a dmath layout, got {layout!r}")
    return _distribution(layout, check_shape(shape), int(nworkers))


def _check_cover(layout, shape, pieces):
    # a distributed layout must store every element exactly once
    total = sum(p.shape[0] * p.shape[1] for ps in pieces for p in ps)
    if total != shape[0] * shape[1]:
        raise LayoutError(f"{layout!r} does not cover a {shape[0]} x {shape[1]} matrix exactly once")
