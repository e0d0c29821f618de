"""The GEMM strategy chooser and cost model as pure functions (no MPI, no workers)."""
import dataclasses

import pytest

from dmath.layout import Block2D, BlockCyclic, ColBlock, Partial, Replicated, RowBlock, distribution
from dmath.planning import gemm as gp

M = gp.Machine(bandwidth=10e9, latency=20e-6, rates=(("float16", 1e12), ("float32", 1e12), ("float64", 5e11)),
               budget=1 << 40)


def res(layout, P):
    return layout.resolved(P)


def choose(a, b, want, m, k, n, P, dtype="float32", machine=M, cached=frozenset()):
    a, b = res(a, P), res(b, P)
    want = None if want is None else res(want, P)
    return gp.choose(a, b, want, ((m, k), (k, n)), dtype, P, machine, cached)


def test_row_times_replicated_is_local_without_traffic():
    p = choose(RowBlock(), Replicated(), None, 1000, 200, 300, 4)
    assert p.strategy.name == "local"
    assert p.result == res(RowBlock(), 4)
    assert all(nbytes == 0 for _, nbytes, _ in p.cost.items)


@pytest.mark.parametrize("group", [(1,), (2, 3), (1, 3)])
def test_a_groups_product_stays_on_the_group(group):
    """Operands on a group of workers (a replica in asynchronous SGD): every candidate runs there,
    so the chosen product moves nothing and involves no other worker."""
    a, b = RowBlock(group), Replicated(group)
    for m, k, n in ((64, 784, 528), (4096, 4096, 4096)):
        p = choose(a, b, None, m, k, n, 4)
        assert p.strategy.name == "local" and p.result == res(a, 4)
        assert all(nbytes == 0 for _, nbytes, _ in p.cost.items)
        for strategy, _ in p.considered:
            assert {r for lay in (strategy.a, strategy.b, strategy.c) for r in lay.members(4)} <= set(group)


def test_replicated_times_colblock_is_local():
    p = choose(Replicated(), ColBlock(), None, 100, 200, 3000, 4)
    assert p.strategy.name == "local" and p.result == res(ColBlock(), 4)


def test_col_times_row_gives_partial_with_no_communication():
    p = choose(ColBlock(), RowBlock(), None, 300, 4000, 200, 4)
    assert p.strategy.name == "inner"
    assert p.result == Partial((0, 1, 2, 3))
    assert p.cost.items[-1][0] == "multiply" and len(p.cost.items) == 1


def test_partial_only_when_free():
    # the inner strategy after remaps hands back a plain row-split matrix
    p = choose(RowBlock(), RowBlock(), None, 64, 64, 64, 2)
    assert not p.result.partial


def test_large_square_block2d_uses_summa_on_its_grid():
    p = choose(Block2D(), Block2D(), None, 16384, 16384, 16384, 4)
    assert p.strategy.name == "summa" and p.strategy.grid == (2, 2)
    assert p.result == res(Block2D(), 4)
    assert not any(what.startswith("remap") for what, _, _ in p.cost.items)


def test_row_split_operands_use_a_stationary_1d():
    p = choose(RowBlock(), RowBlock(), None, 16384, 16384, 16384, 4)
    assert p.strategy.name == "summa" and p.strategy.grid == (4, 1)


def test_block_cyclic_operands_stay_block_cyclic():
    bc = BlockCyclic((64, 64))
    p = choose(bc, bc, None, 8192, 8192, 8192, 4)
    assert p.strategy.name == "summa"
    assert isinstance(p.strategy.a, BlockCyclic) and isinstance(p.result, BlockCyclic)


def test_requested_layout_is_honoured():
    p = choose(Block2D(), Block2D(), RowBlock(), 4096, 4096, 4096, 4)
    assert p.result == res(RowBlock(), 4)


def test_cached_replica_is_free():
    P = 4
    cold = choose(RowBlock(), ColBlock(), RowBlock(), 512, 512, 512, P)
    warm = choose(RowBlock(), ColBlock(), RowBlock(), 512, 512, 512, P,
                  cached=frozenset({("B", Replicated((0, 1, 2, 3)))}))
    assert warm.strategy.name == "local" and warm.strategy.b == Replicated((0, 1, 2, 3))
    assert warm.cost.seconds < cold.cost.seconds
    assert sum(nbytes for _, nbytes, _ in warm.cost.items) == 0


def test_memory_budget_excludes_strategies_that_do_not_fit():
    tested = 0
    for a, b in [(RowBlock(), RowBlock()), (RowBlock(), ColBlock()), (RowBlock(), Block2D())]:
        free = choose(a, b, None, 1024, 1024, 1024, 4)
        leanest = min(c.memory for _, c in free.considered)
        if leanest == free.cost.memory:
            continue                           # the unconstrained choice is already the leanest
        small = dataclasses.replace(M, budget=leanest)
        p = choose(a, b, None, 1024, 1024, 1024, 4, machine=small)
        assert p.cost.feasible and p.cost.memory <= leanest
        assert p.cost.seconds >= free.cost.seconds
        tested += 1
    assert tested
    # with every budget too small, the cheapest strategy is still returned
    tiny = dataclasses.replace(M, budget=1)
    assert choose(RowBlock(), RowBlock(), None, 1024, 1024, 1024, 4, machine=tiny).cost.feasible is False


def test_choice_is_cached():
    a = choose(Block2D(), Block2D(), None, 2048, 2048, 2048, 4)
    b = choose(Block2D(), Block2D(), None, 2048, 2048, 2048, 4)
    assert a is b


@pytest.mark.parametrize("layout,grid", [(Block2D(), (2, 2)), (BlockCyclic((3, 5)), (2, 2)),
                                         (RowBlock(), (4, 1)), (ColBlock(), (1, 4))])
def test_grid_sets_recognise_aligned_layouts(layout, grid):
    lay = layout.resolved(4)
    sets = gp.grid_sets(distribution(lay, (37, 23), 4), grid, (0, 1, 2, 3))
    assert sets is not None
    rows, cols = sets
    assert len(rows) == grid[0] and len(cols) == grid[1]


def test_grid_sets_reject_misaligned():
    lay = Replicated().resolved(4)
    assert gp.grid_sets(distribution(lay, (8, 8), 4), (2, 2), (0, 1, 2, 3)) is None
    assert gp.grid_sets(distribution(RowBlock().resolved(4), (8, 8), 4), (2, 2), (0, 1, 2, 3)) is None


def test_describe_mentions_strategy_remaps_and_bytes():
    p = choose(RowBlock(), RowBlock(), Block2D(), 300, 200, 100, 4)
    text = gp.describe(p, ((300, 200), (200, 100)), "float32")
    assert p.strategy.name in text and "bytes" in text


def _summa_layouts(P):
    from dmath.layout import Block2D, BlockCyclic, ColBlock, RowBlock
    group = tuple(range(P))
    grids = {(1, P), (P, 1)} | ({(2, P // 2)} if P % 2 == 0 and P > 2 else set())
    out = [RowBlock(group), ColBlock(group)]
    for g in sorted(grids):
        out += [Block2D(g, group)] + [BlockCyclic(b, g, group) for b in ((64, 64), (128, 128), (32, 96))]
    return out


@pytest.mark.parametrize("P", [2, 4])
def test_every_summa_candidate_makes_the_rows_and_columns_it_labels(P):
    # C-stationary SUMMA: worker (i, j) makes C[R_i, C_j] from op(A)'s rows R_i and op(B)'s columns
    # C_j, so those must be the result layout's; a wanted BlockCyclic result with another block than
    # an operand's once kept the operand's block (wrong products at n >= 1024 on 2 workers)
    from dmath.layout import distribution
    from dmath.planning.gemm import candidates, grid_sets
    m, k, n = 300, 200, 260
    lays = _summa_layouts(P)
    checked = 0
    for a in lays:
        for b in lays:
            for want in [None] + lays:
                for s in candidates(a, b, want, P, ((m, k), (k, n))):
                    if s.name != "summa":
                        continue
                    group = s.a.members(P)
                    ra, _ = grid_sets(distribution(s.a, (m, k), P), s.grid, group)
                    _, cb = grid_sets(distribution(s.b, (k, n), P), s.grid, group)
                    rc, cc = grid_sets(distribution(s.c, (m, n), P), s.grid, group)
                    assert [_ix(r) for r in ra] == [_ix(r) for r in rc], (a, b, want, s)
                    assert [_ix(c) for c in cb] == [_ix(c) for c in cc], (a, b, want, s)
                    checked += 1
    assert checked > 100



def _ix(s):
    from dmath.layout import indexset
    return tuple(int(v) for v in indexset.to_array(s))
