"""The memory pool and memory kinds on every worker: kinds keep their values in every layout,
to_memory/prefetch preserve them, the limit refuses on the master and leaves the runtime usable,
and a repeated sequence of operations reuses pooled blocks only."""
import gc
import re

import numpy as np
import pytest

import dmath
from dmath.memory import KINDS

from _cases import case_names, layout, uneven_remap, values

P = dmath.num_workers()
NAMES = case_names(P)
SHAPE = (9, 7)
POOL_KEYS = {"in_use", "cached", "high_water", "new_allocs", "reused_allocs", "limit", "matrices"}


def _default_kind():
    return "device" if dmath.device() == "gpu" else "host"


# ---- kinds hold their values --------------------------------------------------------------
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("name", NAMES)
def test_kinds_round_trip_in_every_layout(name, kind):
    x = values(SHAPE, 60)
    lay = layout(name, SHAPE, P)
    m = dmath.from_numpy(x, lay, memory=kind)
    assert m.memory == kind and m.layout == lay.resolved(P)
    np.testing.assert_array_equal(m.to_numpy(), x)
    # computing on it brings it to the device transparently; results are in the default kind
    r = m * 2.0 + 1.0
    assert r.memory == _default_kind()
    np.testing.assert_allclose(r.to_numpy(), x * 2.0 + 1.0, rtol=1e-12)
    np.testing.assert_array_equal(m.to_numpy(), x)        # reading it left it unchanged


@pytest.mark.parametrize("kind", KINDS)
def test_creation_functions_take_every_kind(kind):
    lay = dmath.Block2D()
    dmath.random.seed(5)
    ref_rand = dmath.random.rand(SHAPE, "float64", lay).to_numpy()
    ref_randn = dmath.random.randn(SHAPE, "float64", lay).to_numpy()
    dmath.random.seed(5)
    made = {
        "rand": (dmath.random.rand(SHAPE, "float64", lay, memory=kind), ref_rand),
        "randn": (dmath.random.randn(SHAPE, "float64", lay, memory=kind), ref_randn),
        "zeros": (dmath.zeros(SHAPE, "float32", lay, memory=kind), np.zeros(SHAPE)),
        "ones": (dmath.ones(SHAPE, "float16", dmath.Partial(), memory=kind), np.ones(SHAPE)),
        "full": (dmath.full(SHAPE, -2.5, "float64", dmath.BlockCyclic((2, 2)), memory=kind), np.full(SHAPE, -2.5)),
        "eye": (dmath.eye(6, "float32", dmath.ColBlock(), memory=kind), np.eye(6)),
    }
    for what, (m, expected) in made.items():
        assert m.memory == kind, what
        np.testing.assert_array_equal(m.to_numpy(), expected.astype(m.dtype), err_msg=what)


def test_bad_memory_kind_is_refused_on_the_master():
    with pytest.raises(dmath.DMathError, match="memory must be one of"):
        dmath.zeros((3, 3), memory="gpu")
    with pytest.raises(dmath.DMathError, match="memory must be one of"):
        dmath.random.rand((3, 3), memory="pinned")
    m = dmath.ones((3, 3))
    with pytest.raises(dmath.DMathError, match="memory must be one of"):
        m.to_memory("HOST")
    with pytest.raises(dmath.DMathError, match="memory must be one of"):     # (NumPy's ValueError before)
        m.to_memory(np.zeros(2))
    with pytest.raises(dmath.DMathError, match="memory must be one of"):
        dmath.zeros((2, 2), memory=np.zeros(2))
    assert m.memory == _default_kind() and m.sum() == 9.0


# ---- to_memory and prefetch --------------------------------------------------------------------
@pytest.mark.parametrize("src", KINDS)
def test_to_memory_keeps_layout_and_values(src):
    x = values(SHAPE, 61)
    for name in ("row", "b2d", "partial", "tiles", "rep_g" if P > 1 else "rep"):
        lay = layout(name, SHAPE, P)
        m = dmath.from_numpy(x, lay, memory=src)
        for dst in KINDS:
            n = m.to_memory(dst)
            assert (n.memory, n.layout, n.dtype, n.shape) == (dst, m.layout, m.dtype, m.shape), (name, dst)
            np.testing.assert_array_equal(n.to_numpy(), x, err_msg=f"{name} {src}->{dst}")
            n *= 2.0                                       # a copy: writing it leaves the source alone
        np.testing.assert_array_equal(m.to_numpy(), x, err_msg=name)


@pytest.mark.parametrize("kind", KINDS)
def test_prefetch_then_use(kind):
    x = values(SHAPE, 62)
    m = dmath.from_numpy(x, dmath.RowBlock(), memory=kind)
    assert m.prefetch() is m
    np.testing.assert_allclose((m - 1.0).to_numpy(), x - 1.0)
    m.prefetch()
    m.prefetch()                                           # twice: the second finds the copy there
    np.testing.assert_allclose(dmath.exp(m).sum(), np.exp(x).sum(), rtol=1e-12)
    np.testing.assert_array_equal(m.to_numpy(), x)
    assert m.memory == kind


@pytest.mark.parametrize("kind", KINDS)
def test_writes_to_a_kind_are_kept(kind):
    x = values(SHAPE, 63)
    m = dmath.from_numpy(x, dmath.ColBlock(), memory=kind)
    m += 2.0                                               # in place: the kernel writes the device copy
    m.set((1, 2), 100.0)
    expected = x + 2.0
    expected[1, 2] = 100.0
    np.testing.assert_array_equal(m.to_numpy(), expected)  # ... and the host side sees it
    assert m.get((1, 2)) == 100.0 and m.memory == kind
    m.prefetch()
    m *= 0.5
    np.testing.assert_array_equal(m.to_numpy(), expected * 0.5)
    np.testing.assert_array_equal(m.T.to_numpy(), (expected * 0.5).T)
    np.testing.assert_array_equal(m[2:7, 1:4].to_numpy(), (expected * 0.5)[2:7, 1:4])


def test_training_set_in_host_memory_with_prefetched_batches():
    """The data set lives in host memory, batch by batch; the next batch is prefetched while the
    current one is used (a no-op copy on the CPU backend, the same program on GPUs)."""
    rng = np.random.default_rng(64)
    data = rng.standard_normal((40, 6))
    batch = 8
    batches = [dmath.from_numpy(data[i:i + batch], dmath.RowBlock(), memory="host")
               for i in range(0, len(data), batch)]
    w = dmath.from_numpy(np.linspace(-1.0, 1.0, 6)[None, :], dmath.Replicated())
    acc = dmath.zeros((1, 6), "float64", dmath.Replicated())
    batches[0].prefetch()
    for k, b in enumerate(batches):
        if k + 1 < len(batches):
            batches[k + 1].prefetch()                      # overlaps the work on batch k
        acc += dmath.tanh(b * w).sum(axis=0)
    expected = np.tanh(data * np.linspace(-1.0, 1.0, 6)[None, :]).sum(axis=0, keepdims=True)
    np.testing.assert_allclose(acc.to_numpy(), expected, rtol=1e-12)
    assert all(b.memory == "host" for b in batches)


# ---- statistics and the limit -------------------------------------------------------------------
def test_memory_stats_per_worker():
    st = dmath.memory.stats()
    assert len(st) == P
    for d in st:
        assert POOL_KEYS <= set(d)
        assert d["in_use"] >= d["matrices"] >= 0
    pool = dmath.stats()[0]["pool"]
    assert {"in_use", "cached", "high_water", "new_allocs", "reused_allocs"} <= set(pool)


def test_clear_returns_cached_blocks():
    # cleared first: what earlier tests left cached is gone, so on a GPU these 8 MB blocks take
    # fresh device allocations of their own (CuPy carves a request from a larger free block, whose
    # other parts may stay in use and keep it, when one is cached)
    dmath.memory.clear()
    tmp = [dmath.ones((1024, 2048), layout=dmath.Replicated()) for _ in range(3)]
    del tmp
    dmath.ones((1, 1)).sum()                               # the frees reach the workers with a command
    released = dmath.memory.clear()
    assert len(released) == P and all(r >= 3 * 1024 * 2048 * 4 for r in released)
    if dmath.device() == "cpu":
        # (CuPy's pool keeps the free parts of blocks it split, so on a GPU some may stay cached)
        assert all(d["cached"] == 0 for d in dmath.memory.stats())


def test_clear_keeping_graphs_releases_cached_blocks_and_keeps_matrices():
    dmath.memory.clear()                                   # as above: fresh blocks for the 4 MB ones
    keep = dmath.from_numpy(np.arange(12.0).reshape(3, 4), layout=dmath.RowBlock())
    tmp = [dmath.ones((1024, 1024), layout=dmath.Replicated()) for _ in range(2)]
    del tmp
    dmath.ones((1, 1)).sum()
    released = dmath.memory.clear(graphs=False)
    assert len(released) == P and all(r >= 2 * 1024 * 1024 * 4 for r in released)
    np.testing.assert_array_equal(keep.to_numpy(), np.arange(12.0).reshape(3, 4))


@pytest.fixture
def limit():
    """Every worker's pool statistics once garbage, replica copies and cached blocks are gone;
    a limit set by the test is lifted afterwards, whatever happens."""
    gc.collect()           # matrices of earlier tests caught in reference cycles go now, not midway
    dmath.memory.set_limit(1)      # a replica budget of 0: every worker's replica cache empties
    dmath.memory.set_limit(None)
    dmath.memory.clear()
    yield dmath.memory.stats()
    dmath.memory.set_limit(None)
    gc.collect()           # pytest.raises keeps the test's frame (and its matrices) in a cycle


def test_limit_refuses_on_the_master_and_the_runtime_goes_on(limit):
    cap = max(d["in_use"] for d in limit) + (1 << 20)
    dmath.memory.set_limit(cap)
    assert all(d["limit"] == cap for d in dmath.memory.stats())
    n = int(np.sqrt(cap / 4)) + 64                         # one worker's share alone exceeds the cap
    for make in (lambda: dmath.zeros((n, n), layout=dmath.Replicated()),
                 lambda: dmath.random.rand((n, n), layout=dmath.Replicated(group=[P - 1])),
                 lambda: dmath.ones((P * n, n), layout=dmath.RowBlock())):
        with pytest.raises(dmath.OutOfMemoryError) as err:
            make()
        msg = str(err.value)
        assert "bytes on worker" in msg and f"memory limit is {cap:,} bytes" in msg and "in use" in msg
    # the runtime is usable, and allocations under the limit go on
    x = values((30, 20), 65)
    m = dmath.from_numpy(x, dmath.Block2D())
    np.testing.assert_allclose((m * m).sum(), (x * x).sum(), rtol=1e-12)
    dmath.memory.set_limit(None)
    big = dmath.zeros((n, n), layout=dmath.RowBlock())
    assert big.sum() == 0.0


def test_limit_counts_live_matrices(limit):
    # a Replicated 2048 x 2048 float32, 16 MiB each: far above what kernels keep per signature
    # (device index arrays, remap buffers), which grows with the commands a session has run
    side = 2048
    each = side * side * 4
    held = [d["matrices"] for d in limit]
    # what the pools hold besides live matrices (kernels' cached buffers): the master does not see it
    slack = max(d["in_use"] - d["matrices"] for d in limit)
    assert 0 <= slack < each // 2, limit
    # room for two more on every worker (master and pools agree), not for a third
    cap = max(held) + 2 * each + each // 2 + slack
    dmath.memory.set_limit(cap)
    a = dmath.zeros((side, side), layout=dmath.Replicated())
    b = dmath.zeros((side, side), layout=dmath.Replicated())
    assert [d["matrices"] for d in dmath.memory.stats()] == [h + 2 * each for h in held]
    with pytest.raises(dmath.OutOfMemoryError) as err:
        dmath.zeros((side, side), layout=dmath.Replicated())
    rank, holds = re.search(r"on worker (\d+), which holds ([\d,]+) bytes of live matrices", str(err.value)).groups()
    assert int(holds.replace(",", "")) == held[int(rank)] + 2 * each
    del a
    c = dmath.zeros((side, side), layout=dmath.Replicated())   # room again once a is gone
    assert b.sum() == 0.0 and c.sum() == 0.0


def test_replica_budget_follows_the_limit(limit):
    from dmath.memory import replicas
    before = replicas.cache.budget
    cap = max(d["in_use"] for d in limit) + (1 << 20)
    dmath.memory.set_limit(cap)
    assert replicas.cache.budget == min(before, cap // 2)
    dmath.memory.set_limit(None)
    assert replicas.cache.budget == before


@pytest.mark.skipif(P == 1, reason="one worker: nobody waits for another")
def test_a_remap_refused_on_one_worker_only_is_undone_and_dmath_goes_on(limit):
    x, a, cap = uneven_remap(P)
    before = dmath.memory.stats()
    dmath.memory.set_limit(cap)
    mode = dmath.memory.careful()
    dmath.memory.set_careful("auto")            # (whatever DMATH_CAREFUL says): the pressure decides
    # the last worker's live matrices are past half the limit: the next command is careful
    assert dmath._runtime().ledger.pressed()
    try:
        with pytest.raises(dmath.OutOfMemoryError) as err:
            a.remap(dmath.ColBlock())
    finally:
        dmath.memory.set_careful(mode)
    # the last worker alone (its pool's refusal); careful, the others left the exchange's agreement
    # instead of waiting in the exchange for it (which would have broken the runtime: test_failures.py)
    assert re.match(rf"remap: worker {P - 1} could not allocate .* exceed its memory limit", str(err.value)), err.value
    # usable, nothing left behind: every pool holds what it held before, the values are intact
    np.testing.assert_allclose(a.sum(), x.sum(), rtol=1e-12)
    assert [d["in_use"] for d in dmath.memory.stats()] == [d["in_use"] for d in before]
    dmath.memory.set_limit(None)
    np.testing.assert_array_equal(a.remap(dmath.ColBlock()).to_numpy(), x)


# ---- zero new allocations after a warm-up -------------------------------------------------------
def _sequence(a, b, v, x):
    c = a + b * 2.0
    d = dmath.exp(c) - a
    d += 1.0
    e = c.remap(dmath.ColBlock())
    f = e.astype("float64").remap(dmath.Block2D())
    g = c[3:20, 5:17]
    h = a + v                                               # a broadcast row vector
    t = c.T
    s = d.sum() + f.max() + g.norm()
    r = c.sum(axis=0)
    q = d.max(axis=1)
    p = dmath.from_numpy(x, dmath.BlockCyclic((3, 2)))
    back = (p * 0.5).to_numpy()
    return s + float(r.sum()) + float(q.sum()) + float(h.sum()) + float(t.sum()) + float(back.sum())


def test_repeating_a_sequence_makes_no_new_allocations():
    a = dmath.random.rand((24, 18), "float32", dmath.RowBlock())
    b = dmath.random.rand((24, 18), "float32", dmath.RowBlock())
    v = dmath.random.rand((1, 18), "float32", dmath.Replicated())
    x = values((10, 11), 66)
    first = _sequence(a, b, v, x)
    for _ in range(2):                                      # warm-up: caches, free lists, pending frees
        assert _sequence(a, b, v, x) == first
    dmath.reset_stats()
    for _ in range(2):
        assert _sequence(a, b, v, x) == first
    st = dmath.memory.stats()
    assert [d["new_allocs"] for d in st] == [0] * P, st
    assert all(d["reused_allocs"] > 0 for d in st), st


def test_available_is_each_workers_share():
    """memory.available() per worker: on the CPU backend its share of the machine's free memory (the
    job's ranks share this machine), as the master's account counts it; a probe saw each of 3
    workers offered the whole machine's. A limit caps it."""
    free = dmath.memory.available()
    assert len(free) == P and all(isinstance(f, int) and f >= 0 for f in free)
    if _default_kind() == "host":
        share = dmath.memory.host_available() // P
        cached = [s["cached"] for s in dmath.memory.stats()]
        assert all(f <= share + c + (share >> 4) for f, c in zip(free, cached)), (free, share, cached)
    dmath.memory.set_limit(64 << 20)
    try:
        assert all(f <= 64 << 20 for f in dmath.memory.available())
    finally:
        dmath.memory.set_limit(None)


def test_assigning_a_partial_matrix_to_one_of_its_layout_needs_no_scratch():
    """`a.assign(b)` of two Partial matrices of one layout copies each worker's addend into place: it
    went through the remap's scratch buffer, which an in-place command could be refused under a tight
    limit, ending the job (dnn's metrics reset at every epoch; a hostile-use probe)."""
    import numpy as np
    a = dmath.zeros((3, 2), "float64", layout=dmath.Partial())
    b = dmath.from_numpy(np.arange(6.0).reshape(3, 2), layout=dmath.Partial())
    held = max(d["matrices"] for d in dmath.memory.stats())
    dmath.memory.clear()
    try:
        dmath.memory.set_limit(held + 128)
        a.assign(b)
    finally:
        dmath.memory.set_limit(None)
    np.testing.assert_array_equal(a.to_numpy(), np.arange(6.0).reshape(3, 2))
    # the bits of every addend too: -0.0 stays -0.0 (the remap added each addend to a -0.0 buffer)
    z = dmath.from_numpy(np.full((3, 2), -0.0), layout=dmath.Partial())
    a.assign(z)
    assert np.signbit(a.to_numpy()).all()
