"""Remap between every pair of layouts, with dtype changes, and the bytes it moves."""
import numpy as np
import pytest

import dmath
from dmath.layout import distribution

from _cases import case_names, expected_recv, layout, make, tol, values
from _harness import Failures

P = dmath.num_workers()
NAMES = case_names(P)
SHAPE = (7, 5)


def _recv_by_worker(stats):
    return [s["data_bytes_recv"] for s in stats]


def _check_bytes(stats, src_m, dst_m, itemsize, offset=(0, 0)):
    """The bytes received, summed and per worker, equal the owner-mask minimum."""
    src = distribution(src_m.layout, src_m.shape, P)
    dst = distribution(dst_m.layout, dst_m.shape, P)
    per, total = expected_recv(src, dst, offset)
    got = _recv_by_worker(stats)
    assert sum(got) == total * itemsize, (got, per, total)
    if per is not None:
        assert got == [e * itemsize for e in per]
    assert sum(s["data_bytes_sent"] for s in stats) == sum(got)


def _check_narrowed_partial_bytes(stats, src_m, dst_m):
    """A Partial narrowed into a Partial (float64 -> float16) is summed before it narrows: a
    reduce-scatter onto row blocks of the source group in float64, then those sums spread into
    the target in float16 (its addends, converted one by one, could overflow or round twice)."""
    src = distribution(src_m.layout, src_m.shape, P)
    dst = distribution(dst_m.layout, dst_m.shape, P)
    g = src.group
    mid = distribution(dmath.RowBlock(g), dst.shape, P)
    summed = sum(int(mid.owner_mask(w).sum()) * (len(g) - 1) for w in g)
    _, spread = expected_recv(mid, dst)
    got = _recv_by_worker(stats)
    assert sum(got) == summed * 8 + spread * 2, (got, summed, spread)
    assert sum(s["data_bytes_sent"] for s in stats) == sum(got)


@pytest.mark.parametrize("dst", NAMES)
@pytest.mark.parametrize("src", NAMES)
def test_remap_every_pair(src, dst):
    x = values(SHAPE, seed=1).astype("float32")
    a = make(x, layout(src, SHAPE, P), "float32")
    target = layout(dst, SHAPE, P)
    dmath.reset_stats()
    b = a.remap(target)
    stats = dmath.stats()
    assert b.layout == target.resolved(P)
    assert (b.shape, b.dtype) == (SHAPE, "float32")
    np.testing.assert_array_equal(b.to_numpy(), x)
    _check_bytes(stats, a, b, 4)
    back = b.remap(a.layout)
    np.testing.assert_array_equal(back.to_numpy(), x)
    # the source is untouched
    np.testing.assert_array_equal(a.to_numpy(), x)


@pytest.mark.parametrize("dst", NAMES)
@pytest.mark.parametrize("src", NAMES)
def test_remap_every_pair_to_half_and_back(src, dst):
    """float64 -> float16 on the way (the wire carries float16; a Partial source's addends travel in
    float64: they are summed before they narrow), then back to float64."""
    x = values(SHAPE, seed=7)
    a = make(x, layout(src, SHAPE, P), "float64")
    dmath.reset_stats()
    b = a.remap(layout(dst, SHAPE, P), dtype="float16")
    stats = dmath.stats()
    assert b.dtype == "float16"
    want = x.astype("float16")
    np.testing.assert_array_equal(b.to_numpy(), want)
    if a.layout.partial and b.layout.partial and len(a.layout.group) > 1:
        _check_narrowed_partial_bytes(stats, a, b)
    else:
        _check_bytes(stats, a, b, 8 if a.layout.partial else 2)
    back = b.remap(a.layout, dtype="float64")
    assert back.dtype == "float64"
    np.testing.assert_array_equal(back.to_numpy(), want.astype("float64"))


DTYPE_PAIRS = [("float16", "float32"), ("float32", "float16"), ("float64", "float16"),
               ("float16", "float64"), ("float32", "float64"), ("float64", "float32")]
SHAPES = [(1, 9), (9, 1), (2, 9), (13, 11), (0, 4)]
LAST = P - 1


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize("d1,d2", DTYPE_PAIRS)
def test_remap_dtype_change(shape, d1, d2):
    """Each layout into another one (a rotation that differs per shape), changing dtype on the way."""
    x = values(shape, seed=2)
    x1 = x.astype(d1)
    x2 = x1.astype(d2)
    narrow = min(np.dtype(d1).itemsize, np.dtype(d2).itemsize)
    k = SHAPES.index(shape) + 1
    failures = Failures()
    for i, src in enumerate(NAMES):
        dst = NAMES[(i * 5 + k) % len(NAMES)]
        a = make(x, layout(src, shape, P), d1)
        dmath.reset_stats()
        b = a.remap(layout(dst, shape, P), dtype=d2)
        stats = dmath.stats()
        with failures.case(f"{src} -> {dst}"):
            assert b.dtype == d2 and b.shape == shape
            np.testing.assert_allclose(b.to_numpy(), x2, **tol(d1, d2))
            # (a Partial source is summed in its own dtype, then narrowed)
            _check_bytes(stats, a, b, np.dtype(d1).itemsize if a.layout.partial else narrow)
            c = b.remap(a.layout, dtype=d1)
            assert c.dtype == d1
            np.testing.assert_allclose(c.to_numpy(), x2.astype(d1), **tol(d1, d2))
    failures.check()


@pytest.mark.parametrize("name", NAMES)
def test_remap_through_partial_sums_addends(name):
    """A Partial matrix whose addends overlap (a Partial matrix added in place to another: a new sum
    of two is summed first) remaps to its value."""
    lay = layout(name, SHAPE, P)
    x, y = values(SHAPE, seed=3), values(SHAPE, seed=4)
    part = dmath.Partial(group=[P - 1] + list(range(P - 1)))
    s = make(x, part, "float64")
    s += make(y, part, "float64")
    assert s.layout.partial
    out = s.remap(lay)
    np.testing.assert_allclose(out.to_numpy(), x + y, **tol("float64"))


@pytest.mark.parametrize("name", ["rep", "row", "col", "b2d", "partial"])
def test_partial_is_summed_before_it_narrows(name):
    """A Partial float64 matrix remapped into float16 is its sum, rounded once: addends too large for
    float16 (1e5 and 1 - 1e5 on different workers) sum to 1, not to inf - inf (a Partial target keeps
    its addends, which float16 cannot hold: not asked here)."""
    K = 2 * P
    x = np.zeros((3, K))
    x[:, 0], x[:, -1] = 1e5, 1.0 - 1e5        # addends on the first and on the last worker
    a = dmath.gemm(dmath.from_numpy(x, dmath.ColBlock(), dtype="float64"),
                   dmath.from_numpy(np.ones((K, 2)), dmath.RowBlock(), dtype="float64"), layout=dmath.Partial())
    assert a.layout.partial
    target = layout(name, (3, 2), P)
    if target.partial:
        target = dmath.Replicated()
    for background in (False, True):
        got = a.remap(target, dtype="float16", background=background)
        assert got.dtype == "float16"
        np.testing.assert_array_equal(got.to_numpy(), np.ones((3, 2), np.float16), err_msg=str(background))
    into = dmath.zeros((3, 2), dtype="float16", layout=target)
    into.assign(a)
    np.testing.assert_array_equal(into.to_numpy(), np.ones((3, 2), np.float16))


def test_remap_chain_through_every_layout():
    """One matrix through every layout in turn, ending where it started."""
    x = values((6, 10), seed=5).astype("float32")
    m = make(x, layout(NAMES[0], (6, 10), P), "float32")
    for name in NAMES[1:] + NAMES[:1]:
        m = m.remap(layout(name, (6, 10), P))
        np.testing.assert_array_equal(m.to_numpy(), x, err_msg=name)


def test_remap_same_layout_moves_nothing():
    x = values(SHAPE, seed=6)
    for name in NAMES:
        a = make(x, layout(name, SHAPE, P), "float64")
        dmath.reset_stats()
        b = a.remap(a.layout)
        assert sum(_recv_by_worker(dmath.stats())) == 0, name
        np.testing.assert_array_equal(b.to_numpy(), x)


@pytest.mark.parametrize("blocks", [((2, 2), (3, 3)), ((3, 1), (2, 4))], ids=str)
def test_remap_between_block_cyclic_block_sizes(blocks):
    """Block sizes that do not divide each other: a worker's own part meets in packed form."""
    grid = (2, P // 2) if P % 2 == 0 else (P, 1)
    shape = (13, 11)
    x = values(shape, seed=8)
    a = make(x, dmath.BlockCyclic(blocks[0], grid=grid), "float64")
    dmath.reset_stats()
    b = a.remap(dmath.BlockCyclic(blocks[1], grid=grid), dtype="float32")
    _check_bytes(dmath.stats(), a, b, 4)
    np.testing.assert_array_equal(b.to_numpy(), x.astype("float32"))
    np.testing.assert_array_equal(b.remap(a.layout, dtype="float64").to_numpy(), x.astype("float32"))


@pytest.mark.parametrize("dtype", [None, "float64"])
def test_background_sum_equals_the_blocking_one(dtype):
    """remap(background=True) of a Partial matrix: the same values, whether read next, freed unread, or
    replayed in a recorded plan (on a GPU the sum runs on the communication stream; here it blocks)."""
    rng = np.random.default_rng(7)
    a = rng.normal(size=(9, 5)).astype(np.float32)
    part = dmath.from_numpy(a, layout=dmath.Partial())
    want = part.remap(dmath.Replicated(), dtype=dtype).to_numpy()
    got = part.remap(dmath.Replicated(), dtype=dtype, background=True)
    assert got.dtype == (dtype or "float32")
    np.testing.assert_array_equal((got * 2.0).to_numpy(), want * 2.0)     # read by the next command
    part.remap(dmath.Replicated(), background=True)                        # dropped without a reader
    x = dmath.zeros((9, 5), dtype="float32", layout=dmath.Replicated())
    with dmath.record() as plan:
        g = part.remap(dmath.Replicated(), background=True)
        x += g
    for _ in range(2):
        plan.replay()
    np.testing.assert_allclose(x.to_numpy(), 3 * want.astype(np.float32), rtol=1e-6)
    # not a sum: nothing runs in the background, the flag changes nothing
    np.testing.assert_array_equal(got.remap(dmath.ColBlock(), background=True).to_numpy(), want)


def _partial(columns, dtype):
    """A (rows, 1) Partial over every worker whose addend on worker w is columns[:, w] (P columns),
    made by a test kernel (tests/dist/_kernels.py): dmath's own float16 Partial results (row sums
    of a ColBlock matrix, say) hold their sums rounded once, not such addends (issue 35)."""
    from dmath.ops.base import dispatch, new_meta
    C = dmath.from_numpy(columns, layout=dmath.ColBlock(), dtype=dtype)
    S = dispatch("test_partial_addends", [C], [new_meta(dmath.Partial(), (columns.shape[0], 1), dtype)])[0][0]
    assert S.layout.partial
    return S


def _cancelling(big, dtype="float64"):
    """(1, 1) Partial: addend `big` on worker 0 and `1 - big` on the last (1 at P = 1)."""
    cols = np.zeros((1, P))
    cols[0, 0] = big
    cols[0, LAST] += 1 - big
    return _partial(cols, dtype)


# ---- 1. a Partial narrowed to a Partial is summed first, then rounded once ------------------
def _narrowed_partials(S, dtype):
    """S converted to a narrower Partial every way the API offers."""
    T = dmath.zeros(S.shape, dtype=dtype, layout=dmath.Partial())
    T.assign(S)
    out = {"astype": S.astype(dtype), "remap": S.remap(dmath.Partial(), dtype), "assign": T}
    if P > 1:
        out["remap onto another group"] = S.remap(dmath.Partial(group=[LAST]), dtype)
        out["remap onto a permuted group"] = S.remap(dmath.Partial(group=list(reversed(range(P)))), dtype)
    return out


def test_partial_to_narrower_partial_does_not_overflow_an_addend():
    # 1e5 and 1 - 1e5 overflow float16 one by one (inf - inf = nan); their sum is 1
    S = _cancelling(1e5)
    for how, R in _narrowed_partials(S, "float16").items():
        assert R.layout.partial and R.dtype == "float16"
        np.testing.assert_array_equal(R.to_numpy(), [[1.0]], err_msg=how)


def test_partial_to_narrower_partial_rounds_once():
    # 2049 and -1: converted one by one 2049 rounds (to even) to 2048 and the sum is 2047;
    # the sum 2048 is exact in float16
    cols = np.zeros((1, P))
    cols[0, 0] = 2049.0
    cols[0, LAST] -= 1.0
    S = _partial(cols, "float64")
    for how, R in _narrowed_partials(S, "float16").items():
        np.testing.assert_array_equal(R.to_numpy(), [[2048.0]], err_msg=how)


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_partial_to_narrower_partial_equals_the_sum_rounded_once(dtype):
    rng = np.random.default_rng(11)
    cols = rng.standard_normal((37, P)) * 3000.0
    S = _partial(cols, "float64")
    expected = S.to_numpy().astype(dtype)          # the float64 sum, rounded once
    for how, R in _narrowed_partials(S, dtype).items():
        np.testing.assert_array_equal(R.to_numpy(), expected, err_msg=how)


def test_partial_widened_to_partial_keeps_its_value():
    # widening converts addend by addend (exact); the sum is then made in the wide dtype
    S = _partial(np.full((3, P), 60000.0), "float16")
    R = S.astype("float32")
    assert R.layout.partial
    np.testing.assert_array_equal(R.to_numpy(), np.full((3, 1), 60000.0 * P))


# ---- 2. a narrow Partial going to a wider dtype is summed in the wider one --------------------
def _wide_targets():
    yield "Replicated", dmath.Replicated(), False
    yield "Replicated in the background", dmath.Replicated(), True
    yield "RowBlock", dmath.RowBlock(), False
    yield "Replicated on worker 0", dmath.Replicated(group=[0]), False
    if P > 1:
        yield "Replicated on the last worker", dmath.Replicated(group=[LAST]), False


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_float16_partial_sums_in_the_wider_target_dtype(dtype):
    # 60000 per worker: the sum overflows float16 from P = 2 on, never float32
    S = _partial(np.full((4, P), 60000.0), "float16")
    expected = np.full((4, 1), 60000.0 * P)
    for how, layout, background in _wide_targets():
        R = S.remap(layout, dtype, background=background)
        assert R.dtype == dtype
        np.testing.assert_array_equal(R.to_numpy(), expected, err_msg=how)


def test_float16_partial_sum_keeps_the_digits_float16_would_round():
    # 2048 + 1 + ... : in float16 every + 1 past 2048 is lost; in float32 it is kept
    cols = np.ones((1, P))
    cols[0, 0] = 2048.0
    S = _partial(cols, "float16")
    for how, layout, background in _wide_targets():
        R = S.remap(layout, "float32", background=background)
        np.testing.assert_array_equal(R.to_numpy(), [[2047.0 + P]], err_msg=how)
