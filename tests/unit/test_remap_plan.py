"""Remap plans as pure functions, for 1 to 5 workers.

Each plan is checked two ways, independently of its implementation:
- executed by a small NumPy simulator (transfers read from and write to
  per-worker arrays in global coordinates): the target pieces get the values;
- the elements it moves equal the minimum computed from owner masks
  (tests/_cases.py: expected_recv).
"""
import numpy as np
import pytest

from dmath.layout import distribution, indexset as ix
from dmath.remap import AllReduce, Exchange, moved_elements, plan, send_dtype

from _cases import expected_recv, layout_cases

PS = [1, 2, 3, 4, 5]


def _addends(dist, x, rng):
    """Per-worker data of `x` held in `dist`: the value where stored (NaN elsewhere), or addends."""
    p = dist.nworkers
    if dist.partial:
        out = [None] * p
        g = dist.group
        rest = x.copy()
        for r in g[:-1]:
            out[r] = rng.standard_normal(x.shape)
            rest = rest - out[r]
        out[g[-1]] = rest
        return out
    return [np.where(dist.owner_mask(r), x, np.nan) if dist.pieces[r] else None for r in range(p)]


def _subset(a, b):
    return ix.intersect(a, b) == a


def _simulate_exchange(step, data):
    src, dst = step.src, step.dst
    out = [None] * dst.nworkers
    written = [None] * dst.nworkers
    for r in range(dst.nworkers):
        if dst.pieces[r]:
            out[r] = np.zeros(dst.shape) if step.zero_init else np.full(dst.shape, np.nan)
            written[r] = np.zeros(dst.shape, dtype=int)
    r0, c0 = step.offset
    for t in step.transfers:
        assert t.count > 0
        sp = src.pieces[t.src][t.spiece]
        dp = dst.pieces[t.dst][t.dpiece]
        srows, scols = ix.shift(t.rows, r0), ix.shift(t.cols, c0)
        # a transfer reads inside its source piece and writes inside its target piece
        assert _subset(srows, sp.rows) and _subset(scols, sp.cols), t
        assert _subset(t.rows, dp.rows) and _subset(t.cols, dp.cols), t
        block = data[t.src][np.ix_(ix.to_array(srows), ix.to_array(scols))]
        sel = np.ix_(ix.to_array(t.rows), ix.to_array(t.cols))
        if step.accumulate:
            out[t.dst][sel] += block
        else:
            out[t.dst][sel] = block
        written[t.dst][sel] += 1
    if not step.accumulate and not dst.partial:
        # a distributed or replicated target: every stored element written exactly once
        for r in range(dst.nworkers):
            if dst.pieces[r]:
                np.testing.assert_array_equal(written[r], dst.owner_mask(r).astype(int))
    return out


def _simulate_allreduce(step, data):
    m, n = step.dst.shape
    r0, c0 = step.offset
    total = sum(data[r][r0:r0 + m, c0:c0 + n] for r in step.src.group)
    return [total.copy() if r in step.dst.group else None for r in range(step.dst.nworkers)]


def _check_result(dst, data, want):
    if dst.partial:
        np.testing.assert_allclose(sum(data[r] for r in dst.group), want, atol=1e-12)
        assert all(data[r] is None for r in range(dst.nworkers) if r not in dst.group)
        return
    for r in range(dst.nworkers):
        mask = dst.owner_mask(r)
        if dst.pieces[r]:
            np.testing.assert_allclose(data[r][mask], want[mask], atol=1e-12)


def check_plan(src, dst, offset=(0, 0), rng=None):
    rng = rng or np.random.default_rng(0)
    x = rng.standard_normal(src.shape)
    m, n = dst.shape
    want = x[offset[0]:offset[0] + m, offset[1]:offset[1] + n]
    steps = plan(src, dst, offset)
    assert plan(src, dst, offset) is steps          # cached
    data = _addends(src, x, rng)
    recv = [0] * src.nworkers
    sent = [0] * src.nworkers
    for step in steps:
        if isinstance(step, AllReduce):
            assert src.partial and dst.replicated and len(steps) == 1
            data = _simulate_allreduce(step, data)
            continue
        assert isinstance(step, Exchange)
        data = _simulate_exchange(step, data)
        for w in range(src.nworkers):
            s, r = moved_elements(step, w)
            sent[w] += s
            recv[w] += r
    _check_result(dst, data, want)
    assert sum(sent) == sum(recv)
    if any(isinstance(s, AllReduce) for s in steps):
        return
    per, total = expected_recv(src, dst, offset)
    assert sum(recv) == total, (recv, per, total)
    if per is not None:
        assert recv == per


@pytest.mark.parametrize("p", PS)
def test_every_pair_of_layouts(p):
    shape = (7, 5)
    cases = layout_cases(p)
    failures = []
    for sname, sf in cases:
        for dname, df in cases:
            src = distribution(sf(shape), shape, p)
            dst = distribution(df(shape), shape, p)
            try:
                check_plan(src, dst)
            except AssertionError as exc:
                failures.append(f"{sname} -> {dname}: {exc}")
    assert not failures, "\n".join(failures[:10])


@pytest.mark.parametrize("p", PS)
@pytest.mark.parametrize("shape", [(1, 9), (9, 1), (2, 9), (0, 4), (13, 11)], ids=lambda s: f"{s[0]}x{s[1]}")
def test_other_shapes(p, shape):
    cases = layout_cases(p)
    k = len(cases)
    for i, (sname, sf) in enumerate(cases):
        for step in (1, 3, 7):
            dname, df = cases[(i * step + 1) % k]
            check_plan(distribution(sf(shape), shape, p), distribution(df(shape), shape, p))


@pytest.mark.parametrize("p", PS)
def test_windows(p):
    """Reading a submatrix (offset window) into a layout of the window's shape."""
    shape = (9, 8)
    windows = [((1, 2), (5, 4)), ((0, 0), (1, 8)), ((8, 0), (1, 8)), ((0, 7), (9, 1)), ((3, 3), (0, 2)),
               ((0, 0), (9, 8))]
    cases = layout_cases(p)
    for sname, sf in cases:
        src = distribution(sf(shape), shape, p)
        for (r0, c0), wshape in windows:
            for dname, df in cases[::3]:
                dst = distribution(df(wshape), wshape, p)
                check_plan(src, dst, (r0, c0))


def test_replicated_source_reads_locally():
    """A worker that already holds a replicated value never receives it."""
    for p in PS:
        src = distribution(layout_cases(p)[0][1]((7, 5)), (7, 5), p)      # Replicated()
        for name, f in layout_cases(p):
            dst = distribution(f((7, 5)), (7, 5), p)
            steps = plan(src, dst)
            assert all(moved_elements(s, w) == (0, 0) for s in steps for w in range(p)), name


def test_partial_to_replicated_same_group_is_one_allreduce():
    for p in PS:
        src = distribution(layout_cases(p)[1][1]((4, 4)), (4, 4), p)       # Partial()
        dst = distribution(layout_cases(p)[0][1]((4, 4)), (4, 4), p)       # Replicated()
        steps = plan(src, dst)
        assert len(steps) == 1 and isinstance(steps[0], AllReduce)


def test_send_dtype_is_the_narrower():
    assert send_dtype("float16", "float64") == "float16"
    assert send_dtype("float64", "float32") == "float32"
    assert send_dtype("float32", "float32") == "float32"
