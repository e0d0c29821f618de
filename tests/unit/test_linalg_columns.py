"""The factorizations' column geometry (dmath/linalg/panels.Columns) agrees with the layout it reads:
BlockCyclic((nb, nb), grid=(1, P)) as the layout module distributes it. Pure: no workers."""
import numpy as np
import pytest

from dmath.layout import distribution, indexset as ix
from dmath.linalg.panels import Columns, work_layout


@pytest.mark.parametrize("n,nb,P", [(1, 1, 1), (10, 3, 1), (10, 3, 2), (23, 4, 3), (7, 8, 4), (64, 16, 4), (5, 2, 4)])
def test_columns_match_the_work_layout(n, nb, P):
    dist = distribution(work_layout(nb, P).resolved(P), (n, n), P)
    for rank in range(P):
        cols = Columns(n, nb, P, rank)
        (piece,) = dist.pieces[rank]
        held = ix.to_array(piece.cols)                 # global columns in local order
        mine = cols.mine(0)
        assert all(cols.owner(t) == rank for t in mine)
        assert sorted(t for t in range(cols.blocks) if cols.owner(t) == rank) == mine
        for t in mine:
            c0, c1 = cols.span(t)
            l0, l1 = cols.local(t)
            np.testing.assert_array_equal(held[l0:l1], np.arange(c0, c1))
        assert cols.local_end() == held.size
        for t in range(cols.blocks + 1):
            later = [s for s in mine if s >= t]
            assert cols.local_from(t) == (cols.local(later[0])[0] if later else held.size)
            ranges = cols.ranges(later)
            covered = [c for lo, hi in ranges for c in held[lo:hi]]
            assert covered == [c for s in later for c in range(*cols.span(s))]
            assert len(ranges) <= 1            # a worker's later blocks are one local range
