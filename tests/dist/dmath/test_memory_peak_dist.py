"""dmath.memory.peak(): each worker's peak memory, as PyTorch's max_memory_allocated / max_memory_reserved."""
import gc

import numpy as np

import dmath

P = dmath.num_workers()


def test_peak_holds_the_largest_footprint_until_reset():
    gc.collect()
    dmath.reset_stats()
    before = dmath.memory.peak()
    assert len(before) == P and all(set(p) == {"allocated", "reserved"} for p in before)
    n = 512
    a = dmath.from_numpy(np.ones((n, n)), layout=dmath.Replicated())       # n^2 doubles on every worker
    b = (a * 2.0 + 1.0).sum()                                              # temporaries of a's size
    assert float(b) == 3.0 * n * n
    del a
    gc.collect()
    dmath.synchronize()
    after = dmath.memory.peak()
    for p, q in zip(before, after):
        assert q["allocated"] >= p["allocated"] + 8 * n * n      # the matrix was in use at once
        assert q["allocated"] <= q["reserved"]
    # the peak stays after the matrix is gone; reset_stats starts it again from what is in use now
    dmath.reset_stats()
    again = dmath.memory.peak()
    in_use = [s["in_use"] for s in dmath.memory.stats()]
    for p, used in zip(again, in_use):
        assert p["allocated"] < after[0]["allocated"] and p["allocated"] >= used
