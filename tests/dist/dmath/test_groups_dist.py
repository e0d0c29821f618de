"""dmath.on_group: layouts made inside take the group, work stays on it, the scope is restored."""
import time

import numpy as np
import pytest

import dmath
from dmath.ops.base import dispatch

P = dmath.num_workers()
LAST = (P - 1,)


def test_layouts_made_inside_take_the_group_and_keep_it():
    assert dmath.current_group() == tuple(range(P))
    with dmath.on_group(LAST) as g:
        assert g == LAST and dmath.current_group() == LAST
        assert dmath.Replicated() == dmath.Replicated(LAST)
        assert dmath.RowBlock(sizes=(5,)).group == LAST
        A = dmath.random.rand((6, 4), dtype="float64")       # creation defaults too
        with dmath.on_group((0,)):                            # blocks nest, the innermost wins
            assert dmath.ColBlock().group == (0,)
        assert dmath.current_group() == LAST
    assert A.layout == dmath.RowBlock(LAST)
    assert dmath.Replicated().group is None and dmath.current_group() == tuple(range(P))
    # a value made outside keeps meaning every worker inside
    everyone = dmath.Replicated()
    with dmath.on_group(LAST):
        B = dmath.zeros((2, 2), layout=everyone)
    assert B.layout == dmath.Replicated(tuple(range(P)))


def test_a_product_on_a_group_is_computed_by_that_group_alone():
    a = np.random.default_rng(0).standard_normal((40, 12))
    w = np.random.default_rng(1).standard_normal((12, 7))
    with dmath.on_group(LAST):
        A = dmath.from_numpy(a)
        W = dmath.from_numpy(w, layout=dmath.Replicated())
        dmath.reset_stats()
        C = A @ W                                   # rows of A times a replicated W: no communication
        G = A.T @ A                                 # a Partial sum over the group's rows
        stats = dmath.stats()
    assert C.layout.members(P) == LAST and G.layout.members(P) == LAST
    for r in range(P):
        assert stats[r]["data_msgs_sent"] == 0 and stats[r]["data_msgs_recv"] == 0, (r, stats[r])
    np.testing.assert_allclose(C.to_numpy(), a @ w, rtol=1e-12)
    np.testing.assert_allclose(G.to_numpy(), a.T @ a, rtol=1e-12)


@pytest.mark.skipif(P < 3, reason="needs a group of two workers that leaves rank 0 out")
def test_a_communicating_product_on_a_group_moves_data_among_its_workers_only():
    group = (1, 2)
    with dmath.on_group(group):
        A = dmath.random.rand((30, 20), dtype="float64")                          # RowBlock over 1, 2
        B = dmath.random.rand((20, 10), dtype="float64", layout=dmath.ColBlock())  # must travel
        dmath.reset_stats()
        C = A @ B
        stats = dmath.stats()
    assert set(C.layout.members(P)) <= set(group)
    for r in range(P):
        moved = stats[r]["data_msgs_sent"] + stats[r]["data_msgs_recv"]
        assert (moved > 0) == (r in group), (r, stats[r])
    np.testing.assert_allclose(C.to_numpy(), A.to_numpy() @ B.to_numpy(), rtol=1e-12)


@pytest.mark.parametrize("ranks, match", [
    ((), "at least one"), ((0, 0), "distinct"), ((P,), r"in \[0, "), ((-1,), r"in \[0, "), ((True,), r"in \[0, "),
    (3, "sequence of worker ranks"),
])
def test_bad_groups_raise_layout_errors_and_leave_no_scope(ranks, match):
    with pytest.raises(dmath.LayoutError, match=match):
        with dmath.on_group(ranks):
            pass
    assert dmath.current_group() == tuple(range(P))


def test_the_scope_is_restored_after_an_exception():
    with pytest.raises(ZeroDivisionError):
        with dmath.on_group(LAST):
            1 / 0
    assert dmath.current_group() == tuple(range(P))
    assert dmath.Replicated().group is None


NAP_S = 2.0


@pytest.mark.skipif(P < 2, reason="needs two groups")
def test_a_read_waits_for_the_group_holding_the_value_only():
    with dmath.on_group((P - 1,)):
        busy = dmath.zeros((1, 1), dtype="float64", layout=dmath.Replicated())
    with dmath.on_group((0,)):
        mine = dmath.full((1, 1), 3.0, dtype="float64", layout=dmath.Replicated())
    dispatch("test_nap", scalars=[NAP_S])    # the other workers are busy for NAP_S seconds
    busy += 1.0                                      # the value read below comes after the nap
    t0 = time.perf_counter()
    assert mine.get((0, 0)) == 3.0 and mine.sum() == 3.0       # worker 0's values: no wait for the others
    fast = time.perf_counter() - t0
    assert busy.get((0, 0)) == 1.0                              # waits for the nap to end
    slow = time.perf_counter() - t0
    print(f"read on worker 0: {fast * 1e3:.2f} ms; behind the other group's nap: {slow * 1e3:.0f} ms")
    # a read that waited for the nap would take NAP_S; a margin of seconds, not a benchmark
    assert fast < NAP_S / 2 <= slow, (fast, slow)


# ---- 4. reshape inside on_group stays on the group -------------------------------------------
def _groups():
    yield list(LAST)
    if P > 2:
        yield [*LAST, 0]


@pytest.mark.parametrize("kind", ["row", "col", "rep", "partial", "b2d"])
def test_reshape_inside_on_group(kind):
    a = np.arange(24.0).reshape(4, 6)
    make = {"row": dmath.RowBlock, "col": dmath.ColBlock, "rep": dmath.Replicated,
            "partial": dmath.Partial, "b2d": dmath.Block2D}[kind]
    for group in _groups():
        with dmath.on_group(group):
            M = dmath.from_numpy(a, layout=make())
            for shape in [(3, 8), (8, 3), (2, 12), (24, 1), (-1, 4)]:
                R = M.reshape(*shape)
                np.testing.assert_array_equal(R.to_numpy(), a.reshape(shape), err_msg=f"{group} {shape}")
                assert set(R.layout.members(P)) <= set(group), R.layout
            R = M.reshape(12, 2, layout=dmath.RowBlock())
            np.testing.assert_array_equal(R.to_numpy(), a.reshape(12, 2))


def test_reshape_of_a_group_matrix_stays_on_its_group_outside_on_group():
    # a layout that does not fit the new shape (sizes=) gives way to row blocks on the same workers
    a = np.arange(24.0).reshape(6, 4)
    M = dmath.from_numpy(a, layout=dmath.RowBlock(group=LAST, sizes=(6,)))
    R = M.reshape(4, 6)
    np.testing.assert_array_equal(R.to_numpy(), a.reshape(4, 6))
    assert R.layout.members(P) == LAST
