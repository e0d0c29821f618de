"""planning/assembly: window writes and gathers as pure plans, checked element by element without MPI."""
import pytest

import dmath
from dmath.layout import distribution, indexset as ix
from dmath.planning.assembly import Rect, gather_plan, neighbourly, window_steps

from _cases import layout, layout_cases

P = 3
NAMES = [n for n, _ in layout_cases(P)]


def _written(step, src, dst):
    """{(target rank, piece, i, j): (source rank, i, j)} from an Exchange step's transfers."""
    out = {}
    for t in step.transfers:
        for i in ix.to_array(t.rows):
            for j in ix.to_array(t.cols):
                key = (t.dst, t.dpiece, int(i), int(j))
                assert key not in out, "an element written twice"
                si, sj = int(i) + step.offset[0], int(j) + step.offset[1]
                sp = src.pieces[t.src][t.spiece]
                assert ix.intersect(sp.rows, ((si, si + 1),)) and ix.intersect(sp.cols, ((sj, sj + 1),))
                out[key] = (t.src, si, sj)
    return out


@pytest.mark.parametrize("dst_name", NAMES)
@pytest.mark.parametrize("src_name", ["row", "bc23", "rep_g", "tiles", "col_uneven"])
def test_window_steps_write_each_window_element_once(src_name, dst_name):
    shape, win = (9, 8), (4, 5)
    src = distribution(layout(src_name, (6, 7), P).resolved(P), (6, 7), P)
    dst = distribution(layout(dst_name, shape, P).resolved(P), shape, P)
    rect = Rect((2, 1), (3, 2), win)
    if src.partial:
        return
    (step,) = window_steps(src, dst, (rect,))
    written = _written(step, src, dst)
    # every stored copy of every window element is written (the first member's, for Partial)
    holders = range(P) if not dst.partial else dst.group[:1]
    for r in holders:
        for k, p in enumerate(dst.pieces[r]):
            for i in ix.to_array(p.rows):
                for j in ix.to_array(p.cols):
                    inside = 3 <= i < 7 and 2 <= j < 7
                    assert ((r, k, int(i), int(j)) in written) == inside
                    if inside:
                        _, si, sj = written[(r, k, int(i), int(j))]
                        assert (si, sj) == (i - 1, j - 1)
    # a worker holding the element in the source copies it locally (no traffic for it)
    for t in step.transfers:
        if src.replicated and t.dst in src.group:
            assert t.src == t.dst


def test_window_steps_partial_addends_stay_local():
    src = distribution(dmath.Partial().resolved(P), (4, 4), P)
    dst = distribution(dmath.Partial().resolved(P), (6, 6), P)
    (step,) = window_steps(src, dst, (Rect((0, 0), (1, 2), (4, 4)),))
    assert all(t.src == t.dst for t in step.transfers) and len(step.transfers) == P


@pytest.mark.parametrize("dst_name", ["row", "bc23", "rep", "tiles", "b2d"])
@pytest.mark.parametrize("src_name", ["row", "bc23", "rep_g", "tiles", "col_uneven"])
def test_gather_rows_cover_the_result_once(src_name, dst_name):
    shape = (9, 8)
    rows = (3, 3, 0, 8, 5, 1, 7)
    src = distribution(layout(src_name, shape, P).resolved(P), shape, P)
    dst = distribution(layout(dst_name, (len(rows), 8), P).resolved(P), (len(rows), 8), P)
    seen = {}
    for mv in gather_plan(src, dst, "rows", rows):
        sp, dp = src.pieces[mv.src][mv.spiece], dst.pieces[mv.dst][mv.dpiece]
        s_rows, d_rows = ix.to_array(sp.rows)[mv.src_rows], ix.to_array(dp.rows)[mv.dst_rows]
        s_cols, d_cols = ix.to_array(sp.cols)[mv.src_cols], ix.to_array(dp.cols)[mv.dst_cols]
        assert list(s_cols) == list(d_cols)
        for a, b in zip(s_rows, d_rows):
            assert rows[b] == a
            for c in d_cols:
                key = (mv.dst, mv.dpiece, int(b), int(c))
                assert key not in seen
                seen[key] = True
    assert len(seen) == sum(p.shape[0] * p.shape[1] for ps in dst.pieces for p in ps)


def test_gather_diag_get_and_put():
    src = distribution(dmath.BlockCyclic((2, 2)).resolved(P), (5, 7), P)
    dst = distribution(dmath.RowBlock().resolved(P), (5, 1), P)      # diagonal k = 2 of 5 x 7: 5 elements
    got = {}
    for mv in gather_plan(src, dst, "diag_get", 2):
        sp, dp = src.pieces[mv.src][mv.spiece], dst.pieces[mv.dst][mv.dpiece]
        for a, b, c in zip(ix.to_array(sp.rows)[mv.src_rows], ix.to_array(sp.cols)[mv.src_cols],
                           ix.to_array(dp.rows)[mv.dst_rows]):
            got[int(c)] = (int(a), int(b))
    assert got == {t: (t, t + 2) for t in range(5)}
    vec = distribution(dmath.ColBlock().resolved(P), (1, 4), P)
    sq = distribution(dmath.Block2D().resolved(P), (5, 5), P)
    put = {}
    for mv in gather_plan(vec, sq, "diag_put", (-1, False)):
        sp, dp = vec.pieces[mv.src][mv.spiece], sq.pieces[mv.dst][mv.dpiece]
        for b, i, j in zip(ix.to_array(sp.cols)[mv.src_cols], ix.to_array(dp.rows)[mv.dst_rows],
                           ix.to_array(dp.cols)[mv.dst_cols]):
            put[(int(i), int(j))] = int(b)
    assert put == {(t + 1, t): t for t in range(4)}


def test_halo_steps_are_neighbourly():
    """A roll's rectangles on row blocks exchange with neighbours only (sent point to point); a
    row permutation onto other row blocks is a general exchange (sent as a collective)."""
    p = 4
    dist = distribution(dmath.RowBlock().resolved(p), (16, 5), p)
    rects = (Rect((0, 0), (1, 0), (15, 5)), Rect((15, 0), (0, 0), (1, 5)))
    for step in window_steps(dist, dist, rects):
        assert neighbourly((t.src, t.dst) for t in step.transfers)
    interleave = tuple(4 * (i % 4) + i // 4 for i in range(16))      # every block takes a row of each
    assert not neighbourly((m.src, m.dst) for m in gather_plan(dist, dist, "rows", interleave))
    reverse = tuple(range(15, -1, -1))                                  # blocks swap in pairs
    assert neighbourly((m.src, m.dst) for m in gather_plan(dist, dist, "rows", reverse))
