"""The host memory pool, its size classes and limit, the memory kinds' validation and the master's
ledger: pure, in one process, without MPI and without dmath.init()."""
import gc

import numpy as np
import pytest

import dmath
from dmath import backend
from dmath.errors import DMathError, OutOfMemoryError
from dmath.memory import kinds
from dmath.memory.pool import MIN_CLASS, HostPool, size_class
from dmath.runtime import Meta
from dmath.runtime.ledger import Ledger


# ---- size classes ----------------------------------------------------------------------
def test_size_classes_cover_requests_with_bounded_waste():
    sizes = sorted(set(range(1, 5000)) | {2 ** k + d for k in range(12, 40, 3) for d in (-1, 0, 1)})
    prev = 0
    for n in sizes:
        c = size_class(n)
        assert c >= n and c >= MIN_CLASS
        assert c >= prev                              # monotone: a larger request never gets a smaller block
        prev = c
        assert c % 64 == 0
        if n > MIN_CLASS:
            assert c - n < n / 4                      # less than a quarter wasted
        assert size_class(c) == c                     # a class serves itself exactly


def test_size_classes_are_few():
    # quarter-octave steps: four classes per power of two above MIN_CLASS
    classes = {size_class(n) for n in range(1, 1 << 20)}
    assert len(classes) == 1 + 4 * (20 - 8)


# ---- the host pool --------------------------------------------------------------------
def test_the_peak_in_use_stays_until_reset():
    pool = HostPool()
    a, b = pool.empty((100,), "float64"), pool.empty((100,), "float64")     # 800 bytes each: 896
    del a, b
    c = pool.empty((10,), "float64")
    st = pool.stats()
    assert st["peak_in_use"] == 2 * 896 and st["in_use"] == size_class(80)
    pool.reset_stats()
    assert pool.stats()["peak_in_use"] == size_class(80)
    del c


def test_a_freed_block_is_reused_by_the_same_class():
    pool = HostPool()
    a = pool.empty((10, 10), "float64")             # 800 bytes -> the 896-byte class
    assert a.shape == (10, 10) and a.dtype == np.float64 and a.flags.c_contiguous and a.flags.writeable
    assert pool.stats()["new_allocs"] == 1 and pool.stats()["in_use"] == size_class(800) == 896
    del a
    st = pool.stats()
    assert st["in_use"] == 0 and st["cached"] == 896
    b = pool.empty((7, 32), "float32")              # 896 bytes: another shape and dtype, same class
    st = pool.stats()
    assert (st["new_allocs"], st["reused_allocs"], st["in_use"], st["cached"]) == (1, 1, 896, 0)
    b[...] = 3.0
    assert float(b.sum()) == 3.0 * b.size


def test_a_view_keeps_its_block_until_it_dies():
    pool = HostPool()
    a = pool.empty((16, 16), "float64")
    a[...] = 1.0
    v = a[2:5].T                                    # views of views keep the block too
    del a
    gc.collect()
    b = pool.empty((16, 16), "float64")             # the first block is still referenced: a new one
    b[...] = 2.0
    assert pool.stats()["new_allocs"] == 2
    np.testing.assert_array_equal(v, 1.0)
    del v
    c = pool.empty((16, 16), "float64")             # now the first block comes back
    assert pool.stats()["reused_allocs"] == 1
    c[...] = 5.0
    np.testing.assert_array_equal(b, 2.0)           # a live array is never handed out twice


def test_zero_size_arrays_take_no_block():
    pool = HostPool()
    a = pool.empty((0, 7), "float32")
    assert a.shape == (0, 7)
    assert pool.stats()["new_allocs"] == 0 and pool.stats()["in_use"] == 0


def test_int_shape_and_high_water():
    pool = HostPool()
    a = pool.empty(100, "float64")
    b = pool.empty(100, "float64")
    assert a.shape == (100,)
    del a, b
    st = pool.stats()
    assert st["high_water"] == 2 * size_class(800) and st["cached"] == st["high_water"]
    pool.reset_stats()
    assert pool.stats()["new_allocs"] == 0 and pool.stats()["high_water"] == st["cached"]
    assert pool.release_cached() == st["cached"]
    assert pool.stats()["cached"] == 0


def test_limit_releases_cached_blocks_before_refusing():
    pool = HostPool()
    pool.set_limit(4096)
    a = pool.empty(2048, "uint8")
    del a                                           # 2048 cached
    b = pool.empty(3072, "uint8")                   # 2048 + 3072 > 4096: the cache goes first
    st = pool.stats()
    assert (st["in_use"], st["cached"], st["new_allocs"]) == (3072, 0, 2)
    with pytest.raises(OutOfMemoryError) as err:
        pool.empty((16, 16), "float64")             # 2048 more: 5120 in use would pass the limit
    msg = str(err.value)
    assert "2,048 bytes" in msg and "3,072 bytes are in use" in msg and "limit of 4,096 bytes" in msg
    assert "(16, 16) float64" in msg
    del b
    c = pool.empty(4096, "uint8")                   # the pool goes on after a refusal
    assert c.nbytes == 4096


def test_lowering_the_limit_drops_the_cache():
    pool = HostPool()
    a = pool.empty(8192, "uint8")
    del a
    pool.set_limit(4096)
    assert pool.stats()["cached"] == 0 and pool.stats()["limit"] == 4096
    pool.set_limit(None)
    pool.empty(8192, "uint8")


# ---- memory kinds -------------------------------------------------------------------------
def test_kind_validation_and_codes():
    for k in kinds.KINDS:
        assert kinds.check(k) == k
        assert kinds.from_code(kinds.code(k)) == k
    assert kinds.check(None) == ("device" if backend.current().is_gpu else "host")
    for bad in ("gpu", "Device", 1, ""):
        with pytest.raises(DMathError, match="memory must be one of"):
            kinds.check(bad)


def test_set_limit_validates_before_anything():
    for bad in (0, -5, 1.5, True, "1GB"):
        with pytest.raises(DMathError, match="positive number of bytes"):
            dmath.memory.set_limit(bad)


# ---- the master's ledger -------------------------------------------------------------------
def test_ledger_refuses_past_the_limit_and_counts_releases():
    ledger = Ledger(2)
    row = Meta(dmath.RowBlock().resolved(2), (64, 16), "float32")       # 32 x 16 x 4 = 2048 per worker
    rep = Meta(dmath.Replicated().resolved(2), (64, 16), "float32")     # 4096 on each worker
    assert ledger.worker_bytes(row) == (2048, 2048)
    assert ledger.worker_bytes(rep) == (4096, 4096)
    ledger.add([1], ledger.admit("fill", None, [row]))
    ledger.set_limit(8192)
    ledger.add([2], ledger.admit("fill", 7, [rep]))                     # 6144 per worker
    with pytest.raises(OutOfMemoryError, match=r"fill: the new matrix \(\(64, 16\) float32\) needs "
                                               r"4,096 bytes on worker 0, which holds 6,144 bytes"):
        ledger.admit("fill", 7, [rep])
    ledger.release(2)
    ledger.add([3], ledger.admit("fill", 7, [rep]))
    assert ledger.per_worker() == [6144, 6144]
    ledger.release(3)
    assert ledger.per_worker() == [2048, 2048] == ledger.held
    # without a limit, each worker's capacity as measured at init is the ceiling
    ledger.set_limit(None)
    ledger.set_capacity([(4096, 10 ** 9), (10 ** 9, 10 ** 9)])
    with pytest.raises(OutOfMemoryError, match=r"on worker 0, which holds 2,048 bytes of live matrices; the memory "
                                               r"it computes in had 4,096 bytes for matrices when dmath.init"):
        ledger.admit("fill", 7, [rep])
    assert ledger.admit("fill", None, [row]) == ((2048, 2048),)        # 2048 + 2048 fits in 4096


def test_ledger_says_when_commands_are_careful():
    """A command is careful once some worker's live matrices pass half its ceiling ('auto'); the
    pressure follows matrices as they come and go, and the modes 'always' and 'never' force it."""
    from dmath.runtime.ledger import CAREFUL_FRACTION
    assert CAREFUL_FRACTION == 0.5
    ledger = Ledger(2)
    assert ledger.careful == "auto" and not ledger.pressed()     # no ceiling known: never careful
    ledger.set_capacity([(8192, 10 ** 9), (16384, 10 ** 9)])     # marks at 4096 and 8192
    one = Meta(dmath.RowBlock().resolved(2), (64, 16), "float32")      # 2048 per worker
    rep = Meta(dmath.Replicated().resolved(2), (64, 16), "float32")    # 4096 per worker
    sub = Meta(dmath.Replicated(group=[1]).resolved(2), (64, 16), "float32")   # 4096 on worker 1 only
    ledger.add([1], ledger.admit("fill", None, [one]))
    ledger.add([2], ledger.admit("fill", None, [one]))          # 4096: at worker 0's mark, not past it
    assert not ledger.pressed()
    ledger.add([3], ledger.admit("fill", None, [rep]))          # 8192 on both: past worker 0's mark
    assert ledger.pressed()
    ledger.release(3)
    assert not ledger.pressed() and ledger.held == [4096, 4096]
    # many matrices on one worker only: the bound drifts down and is made exact again, never wrong
    for h in range(10, 13):
        ledger.add([h], ledger.admit("fill", None, [sub]))
        assert ledger.pressed() == (ledger.held[1] > 8192), ledger.held
    for h in range(10, 13):
        ledger.release(h)
        assert ledger.pressed() == (ledger.held[1] > 8192), ledger.held
    assert not ledger.pressed()
    ledger.set_limit(6000)                                      # marks drop to 3000: both are past
    assert ledger.pressed()
    ledger.set_limit(None)
    ledger.set_careful("always")
    assert ledger.pressed()
    ledger.add([4], ledger.admit("fill", None, [rep]))
    ledger.release(4)
    assert ledger.pressed()
    ledger.set_careful("never")
    ledger.add([5], ledger.admit("fill", None, [rep]))
    assert not ledger.pressed() and ledger.pressure is None
    with pytest.raises(DMathError, match="dmath.memory.set_careful takes one of 'auto', 'always', 'never'"):
        ledger.set_careful("sometimes")
    # one worker alone has nobody to wait for: never careful
    assert not Ledger(1, "always").pressed()


def test_set_careful_validates_before_anything():
    for bad in ("Always", None, 1, True):
        with pytest.raises(DMathError, match="set_careful takes one of"):
            dmath.memory.set_careful(bad)


def test_ledger_subset_layouts_count_only_their_workers():
    ledger = Ledger(3)
    m = Meta(dmath.RowBlock(group=[2]).resolved(3), (10, 10), "float64")
    assert ledger.worker_bytes(m) == (0, 0, dmath.memory.block_bytes(800))
