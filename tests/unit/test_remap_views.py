"""Strided selections (ix.Runs), their views, and the remap executor run without MPI.

The executor test runs every worker's part of a plan in one process: each
worker packs (`prepare`), a NumPy emulation of the all-to-all-v moves the
counts at the offsets each side chose, each worker finishes (`finish`). The
target pieces must equal the source matrix read through owner masks, for
every pair of layouts, several worker counts and dtype changes, and every
execution path (packed or direct send and receive, direct or staged local
copy, accumulation) must have been taken.
"""
from collections import Counter

import numpy as np
import pytest

from dmath.layout import distribution, indexset as ix
from dmath.remap import AllReduce, finish, localize, plan, prepare, send_dtype, view
from dmath.remap.execute import new_pieces

from _cases import layout_cases


def _random_set(rng, n, k):
    """A sorted disjoint interval tuple inside [0, n) with up to k intervals."""
    cuts = sorted(set(rng.integers(0, n + 1, size=2 * k).tolist()))
    pairs = [(cuts[i], cuts[i + 1]) for i in range(0, len(cuts) - 1, 2)]
    return tuple((a, b) for a, b in pairs if b > a)


def _positions(runs):
    return [p for r in runs for a, b in r.intervals() for p in range(a, b)]


def _view_1d(a, r):
    """Positions selected by one Runs on a 1-D axis, through the 4-D view of a (1, n) matrix."""
    return view(a.reshape(1, -1), ix.contiguous(0, 1), r).reshape(-1)


def test_local_intervals_match_positions():
    rng = np.random.default_rng(2)
    for _ in range(300):
        s = _random_set(rng, 60, 6)
        sub = ix.intersect(s, _random_set(rng, 60, 5))
        full = ix.to_array(s)
        want = np.searchsorted(full, ix.to_array(sub))
        got = ix.local_intervals(sub, s)
        np.testing.assert_array_equal(ix.to_array(got), want)
        # merged: no two intervals touch
        assert all(got[k][1] < got[k + 1][0] for k in range(len(got) - 1))


def test_strided_runs_cover_the_intervals_inside_the_axis():
    rng = np.random.default_rng(3)
    for _ in range(500):
        extent = int(rng.integers(1, 80))
        iv = _random_set(rng, extent, 8)
        runs = ix.strided_runs(iv, extent)
        assert _positions(runs) == list(ix.to_array(iv))
        for r in runs:
            assert 0 <= r.base and r.base + r.count * r.stride <= extent, (iv, r)
            assert 0 <= r.offset and r.offset + r.length <= r.stride and r.length > 0, (iv, r)
        a = np.arange(extent) * 10
        got = np.concatenate([_view_1d(a, r) for r in runs]) if runs else np.zeros(0)
        np.testing.assert_array_equal(got, ix.to_array(iv) * 10)


@pytest.mark.parametrize("n,b,p,groups", [(2048, 64, 2, 1), (4096, 64, 4, 1), (1000, 64, 3, 2), (17, 2, 3, 3)])
def test_block_cyclic_selection_is_few_run_groups(n, b, p, groups):
    """A cyclic part of a contiguous local axis is one group of full blocks when its window fits the axis;
    a short last block, or a last block whose period would overrun the axis, is a group of its own."""
    local = ix.interval(0, n)
    for part in range(p):
        runs = ix.strided_runs(ix.local_intervals(ix.cyclic(n, b, p, part), local), n)
        assert len(runs) <= groups, runs
        assert runs[0].length == b and (runs[0].count == 1 or runs[0].stride == b * p)
        assert _positions(runs) == list(ix.to_array(ix.cyclic(n, b, p, part)))


def test_split_like_pairs_view_shapes():
    template = (ix.Runs(0, 3, 10, 2, 4), ix.Runs(30, 1, 5, 0, 5))
    cut = ix.split_like(7, template)
    assert [(r.count, r.length) for r in cut] == [(3, 4), (1, 5)]
    assert _positions(cut) == list(range(7, 7 + 17))


def test_view_reads_and_writes_through_a_strided_array():
    """A view of a non-contiguous array (a piece that is itself a view) aliases it, both ways."""
    rng = np.random.default_rng(4)
    big = rng.standard_normal((40, 50))
    a = big[3:33, 5:45:2]                         # non-contiguous on both axes, 30 x 20
    for _ in range(50):
        ri = _random_set(rng, 30, 4)
        ci = _random_set(rng, 20, 4)
        if not ri or not ci:
            continue
        rr, cr = ix.strided_runs(ri, 30), ix.strided_runs(ci, 20)
        sel = np.ix_(ix.to_array(ri), ix.to_array(ci))
        got = np.concatenate([np.concatenate([view(a, r, c).reshape(r.size, c.size) for c in cr], axis=1)
                              for r in rr], axis=0)
        np.testing.assert_array_equal(got, a[sel])
        before = big.copy()
        for r in rr:
            for c in cr:
                view(a, r, c)[...] = -1.0
        assert (a[sel] == -1.0).all()
        changed = big != before
        expect = np.zeros_like(changed)
        expect[3:33, 5:45:2][sel] = True
        np.testing.assert_array_equal(changed & (before != -1.0), expect & (before != -1.0))


# ---- the executor over every worker, the exchange emulated -------------------------------------

def _source_pieces(dist, x, rng):
    """Each worker's local pieces of `x` in `dist` (addends that sum to x for a Partial layout)."""
    out = [[] for _ in range(dist.nworkers)]
    if dist.partial:
        rest = x.copy()
        for r in dist.group[:-1]:
            out[r] = [rng.integers(-4, 5, size=x.shape).astype(x.dtype)]
            rest = rest - out[r][0]
        out[dist.group[-1]] = [rest]
        return out
    for r in range(dist.nworkers):
        out[r] = [np.ascontiguousarray(x[np.ix_(ix.to_array(p.rows), ix.to_array(p.cols))])
                  for p in dist.pieces[r]]
    return out


def _emulated_exchange(locs, bufs):
    """Move every (sender, receiver) part between the buffers, at the offsets each side chose."""
    def displs(counts, given):
        return list(given) if given is not None else list(np.concatenate([[0], np.cumsum(counts)[:-1]]))
    group = next(loc.group for loc in locs if loc is not None)
    for ks, s in enumerate(group):
        sd = displs(locs[s].send_counts, bufs[s].send_displs)
        for kd, d in enumerate(group):
            n = locs[s].send_counts[kd]
            assert n == locs[d].recv_counts[ks]
            if n:
                rd = displs(locs[d].recv_counts, bufs[d].recv_displs)
                bufs[d].recv[rd[ks]:rd[ks] + n] = bufs[s].send[sd[kd]:sd[kd] + n]


def _run_everywhere(src, dst, offset, pieces, src_dtype, dst_dtype, seen):
    wire = send_dtype(src_dtype, dst_dtype)
    for step in plan(src, dst, offset):
        assert not isinstance(step, AllReduce)
        p = step.src.nworkers
        dtype = dst_dtype if step.dst is dst else wire
        locs = [localize(step, r) for r in range(p)]
        outs = [new_pieces(step.dst, r, dtype, step.zero_init) for r in range(p)]
        bufs = [prepare(locs[r], pieces[r], outs[r], wire, step.accumulate) if r in locs[r].group else None
                for r in range(p)]
        if locs[0].group:
            _emulated_exchange(locs, bufs)
        for r in range(p):
            finish(locs[r], pieces[r], outs[r], bufs[r], step.accumulate)
            if bufs[r] is not None:
                seen["send direct" if bufs[r].send_displs is not None else "send packed"] += 1
                seen["recv direct" if bufs[r].recv_displs is not None else "recv packed"] += 1
            for lc in locs[r].local:
                seen["local direct" if lc.direct is not None else "local staged"] += 1
            seen["accumulate"] += step.accumulate
        pieces = outs
    return pieces


def _check(dst, pieces, want):
    if dst.partial:
        total = sum(pieces[r][0].astype(np.float64) for r in dst.group)
        np.testing.assert_array_equal(total, want.astype(np.float64))
        return
    for r in range(dst.nworkers):
        for p, got in zip(dst.pieces[r], pieces[r]):
            np.testing.assert_array_equal(got, want[np.ix_(ix.to_array(p.rows), ix.to_array(p.cols))])


def _block_cyclic_pairs(p):
    """Block-cyclic layouts with block sizes that do not divide each other (local copies are staged)."""
    import dmath
    grid = (2, 1) if p < 4 else (2, 2)
    g = tuple(range(grid[0] * grid[1])) if p >= 2 else None
    if g is None:
        return []
    return [(dmath.BlockCyclic((2, 2), grid=grid, group=g), dmath.BlockCyclic((3, 3), grid=grid, group=g)),
            (dmath.BlockCyclic((3, 1), grid=grid, group=g), dmath.BlockCyclic((2, 4), grid=grid, group=g))]


DTYPES = [("float64", "float64"), ("float64", "float16"), ("float16", "float32")]


@pytest.mark.parametrize("src_dtype,dst_dtype", DTYPES)
def test_executor_every_pair_every_worker(src_dtype, dst_dtype):
    """Pieces produced by the executor equal the source matrix, for every layout pair and 1-5 workers."""
    rng = np.random.default_rng(5)
    seen = Counter()
    failures = []
    for p in (1, 2, 3, 4, 5):
        for shape, offset, wshape in [((7, 5), (0, 0), (7, 5)), ((13, 11), (2, 1), (9, 10))]:
            x = rng.integers(-50, 50, size=shape).astype(src_dtype)
            want = x[offset[0]:offset[0] + wshape[0], offset[1]:offset[1] + wshape[1]].astype(dst_dtype)
            cases = [(f(shape), g(wshape), f"{a}->{b}") for a, f in layout_cases(p) for b, g in layout_cases(p)]
            cases += [(a, b, f"{a}->{b}") for a, b in _block_cyclic_pairs(p)]
            for slay, dlay, name in cases:
                src, dst = distribution(slay, shape, p), distribution(dlay, wshape, p)
                if any(isinstance(s, AllReduce) for s in plan(src, dst, offset)):
                    continue                      # one MPI all-reduce, nothing to pack
                try:
                    out = _run_everywhere(src, dst, offset, _source_pieces(src, x, rng), src_dtype, dst_dtype, seen)
                    assert all(a.dtype == np.dtype(dst_dtype) for ps in out for a in ps)
                    _check(dst, out, want)
                except AssertionError as exc:
                    failures.append(f"P={p} {shape}+{offset} {name}: {exc}")
    assert not failures, "\n".join(failures[:5])
    # a piece is the buffer only when it is in the wire dtype
    wire = send_dtype(src_dtype, dst_dtype)
    paths = {"send packed", "recv packed", "local direct", "local staged", "accumulate"}
    paths |= {"send direct"} if src_dtype == wire else set()
    paths |= {"recv direct"} if dst_dtype == wire else set()
    assert paths <= set(seen), seen
