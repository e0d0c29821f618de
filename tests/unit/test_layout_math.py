"""Layout index math as pure functions, for 1 to 5 workers (no MPI, no runtime)."""
import dataclasses

import numpy as np
import pytest

import dmath
from dmath.layout import Block2D, BlockCyclic, ColBlock, Partial, Replicated, RowBlock, Tiles
from dmath.layout import distribution, indexset as ix, near_square_grid

from _cases import layout_cases

PS = [1, 2, 3, 4, 5]
SHAPES = [(7, 5), (1, 6), (6, 1), (2, 9), (0, 4), (13, 11), (3, 3)]


def _all(p):
    return [(name, f) for name, f in layout_cases(p)]


def _dist(f, shape, p):
    return distribution(f(shape), shape, p)


@pytest.mark.parametrize("p", PS)
def test_pieces_cover_and_masks(p):
    for shape in SHAPES:
        for name, f in _all(p):
            lay = f(shape)
            d = distribution(lay, shape, p)
            masks = np.array([d.owner_mask(r) for r in range(p)]).reshape((p,) + shape)
            members = lay.members(p)
            if lay.replicated or lay.partial:
                for r in range(p):
                    assert masks[r].all() if r in members else not masks[r].any(), (name, shape, r)
            else:
                # every element exactly once
                assert (masks.sum(axis=0) == 1).all(), (name, shape)
                # and only members hold anything
                for r in range(p):
                    if r not in members:
                        assert not d.pieces[r], (name, r)
            for r in range(p):
                shapes = d.shard_shapes(r)
                assert shapes == tuple(pc.shape for pc in d.pieces[r])
                # pieces of one worker do not overlap: their sizes add up to its mask
                assert sum(a * b for a, b in shapes) == masks[r].sum(), (name, shape, r)
                for pc in d.pieces[r]:
                    rows, cols = ix.to_array(pc.rows), ix.to_array(pc.cols)
                    assert ((0 <= rows) & (rows < shape[0])).all() and ((0 <= cols) & (cols < shape[1])).all()
            # the resolved layout (explicit group and grid) places everything the same way
            assert distribution(lay.resolved(p), shape, p).same_placement(d), name


@pytest.mark.parametrize("p", PS)
def test_locate_and_holders(p):
    rng = np.random.default_rng(p)
    for shape in [(7, 5), (2, 9), (13, 11)]:
        x = rng.standard_normal(shape)
        for name, f in _all(p):
            d = _dist(f, shape, p)
            # the local arrays each worker would store
            local = [[x[np.ix_(ix.to_array(pc.rows), ix.to_array(pc.cols))] for pc in d.pieces[r]]
                     for r in range(p)]
            masks = [d.owner_mask(r) for r in range(p)]
            for i in range(shape[0]):
                for j in range(shape[1]):
                    want = tuple(r for r in range(p) if masks[r][i, j])
                    assert d.holders(i, j) == want, (name, i, j)
                    locs = d.locate(i, j)
                    assert tuple(r for r, *_ in locs) == want
                    for r, k, li, lj in locs:
                        assert local[r][k][li, lj] == x[i, j], (name, i, j, r)


@pytest.mark.parametrize("p", PS)
def test_transposed_layouts_keep_pieces_on_their_workers(p):
    for shape in [(7, 5), (2, 9), (1, 6), (13, 11)]:
        for name, f in _all(p):
            lay = f(shape)
            d = distribution(lay, shape, p)
            t = lay.transposed(p)
            dt = distribution(t, shape[::-1], p)
            assert dt.partial == d.partial and dt.replicated == d.replicated
            for r in range(p):
                np.testing.assert_array_equal(dt.owner_mask(r), d.owner_mask(r).T, err_msg=f"{name} {r}")
                # piece by piece: each transposed piece is the transpose of one of the worker's pieces
                mine = {(pc.cols, pc.rows) for pc in d.pieces[r]}
                assert {(pc.rows, pc.cols) for pc in dt.pieces[r]} == mine, (name, r)
            # transposing twice gives back the same placement
            assert distribution(t.transposed(p), shape, p).same_placement(d), name


@pytest.mark.parametrize("p", [3, 4, 5])
def test_more_workers_than_rows(p):
    d = distribution(RowBlock(), (2, 9), p)
    assert [d.shard_shapes(r) for r in range(p)] == [((1, 9),), ((1, 9),)] + [((0, 9),)] * (p - 2)
    d = distribution(ColBlock(), (4, 1), p)
    assert d.shard_shapes(0) == ((4, 1),) and all(d.shard_shapes(r) == ((4, 0),) for r in range(1, p))
    d = distribution(Block2D(grid=(p, 1)), (1, 3), p)
    assert d.shard_shapes(0) == ((1, 3),)
    assert all(d.shard_shapes(r) == ((0, 3),) for r in range(1, p))
    d = distribution(BlockCyclic((4, 4)), (3, 3), p)
    assert sum(a * b for r in range(p) for a, b in d.shard_shapes(r)) == 9


def test_block_layouts_match_brute_force():
    for p in PS:
        for shape in [(7, 5), (13, 11), (2, 9)]:
            g = tuple(reversed(range(p)))
            pr, pc = near_square_grid(p)
            rb, cb = ix.split_even(shape[0], pr), ix.split_even(shape[1], pc)
            rstart, cstart = np.cumsum((0,) + rb), np.cumsum((0,) + cb)
            d = distribution(Block2D(group=g), shape, p)
            for i in range(shape[0]):
                for j in range(shape[1]):
                    bi = np.searchsorted(rstart, i, side="right") - 1
                    bj = np.searchsorted(cstart, j, side="right") - 1
                    assert d.holders(i, j) == (g[bi * pc + bj],)
            for mb, nb in [(2, 3), (1, 1), (4, 2)]:
                for grid in [(1, p), (p, 1), near_square_grid(p)]:
                    d = distribution(BlockCyclic((mb, nb), grid=grid), shape, p)
                    for i in range(shape[0]):
                        for j in range(shape[1]):
                            owner = ((i // mb) % grid[0]) * grid[1] + (j // nb) % grid[1]
                            assert d.holders(i, j) == (owner,), (p, shape, mb, nb, grid, i, j)


def test_uneven_sizes_and_groups():
    d = distribution(RowBlock(sizes=(0, 0, 7)), (7, 5), 3)
    assert [d.shard_shapes(r) for r in range(3)] == [((0, 5),), ((0, 5),), ((7, 5),)]
    d = distribution(ColBlock(group=[2, 0], sizes=(1, 4)), (3, 5), 3)
    assert d.pieces[2][0].cols == ((0, 1),) and d.pieces[0][0].cols == ((1, 5),) and d.pieces[1] == ()
    d = distribution(Replicated(group=[0, 3]), (2, 2), 4)
    assert d.holders(1, 1) == (0, 3)
    d = distribution(Partial(group=[3]), (2, 2), 4)
    assert d.partial and d.group == (3,)
    t = Tiles((0, 2, 4), (0, 3), [[1], [1]])
    assert t.group == (1,)
    d = distribution(t, (4, 3), 2)
    assert len(d.pieces[1]) == 2 and d.pieces[0] == ()


def test_near_square_grid():
    for p in range(1, 25):
        pr, pc = near_square_grid(p)
        assert pr * pc == p and pr <= pc
        assert not any(p % q == 0 and q <= p // q for q in range(pr + 1, p + 1))
    assert distribution(Block2D(), (4, 4), 4).layout.resolved(4) == Block2D((2, 2), (0, 1, 2, 3))


def test_layouts_are_values():
    assert RowBlock() == RowBlock() and hash(RowBlock()) == hash(RowBlock())
    assert RowBlock(group=[0, 1]) == RowBlock(group=(0, 1))
    assert hash(RowBlock(group=[0, 1])) == hash(RowBlock(group=(0, 1)))
    assert RowBlock() != ColBlock() and Replicated() != Partial()
    assert BlockCyclic([2, 3]) == BlockCyclic((2, 3)) and BlockCyclic((2, 3)) != BlockCyclic((3, 2))
    assert Tiles([0, 1], [0, 2], [[0]]) == Tiles((0, 1), (0, 2), ((0,),))
    assert len({RowBlock(), RowBlock(), ColBlock(), Block2D(), Block2D((1, 2))}) == 4
    with pytest.raises(dataclasses.FrozenInstanceError):
        RowBlock().group = (0,)
    assert RowBlock(sizes=[1, 2]).transposed(2) == ColBlock(sizes=(1, 2))


BAD = [
    # (what, make the layout, shape, p): LayoutError at construction or at distribution
    ("sizes_sum", lambda: RowBlock(sizes=(1, 2)), (7, 5), 2),
    ("sizes_count", lambda: ColBlock(sizes=(5,)), (7, 5), 2),
    # a fraction of a row, a worker or a block is a mistake, never rounded; a bool is not a count
    ("sizes_float", lambda: RowBlock(sizes=(1.7, 5.3)), (7, 5), 2),
    ("group_float", lambda: RowBlock(group=(0.5,)), (7, 5), 2),
    ("group_bool", lambda: ColBlock(group=(True, False)), (7, 5), 2),
    ("block_float", lambda: BlockCyclic((1.9, 2.9)), (7, 5), 2),
    ("tiles_float", lambda: Tiles((0, 1.5, 7), (0, 5), [[0], [1]]), (7, 5), 2),
    ("sizes_negative", lambda: RowBlock(sizes=(8, -1)), (7, 5), 2),
    ("sizes_not_ints", lambda: RowBlock(sizes=("a", 2)), (7, 5), 2),
    ("group_sizes", lambda: RowBlock(group=[0], sizes=(3, 4)), (7, 5), 2),
    ("group_range", lambda: RowBlock(group=[3]), (7, 5), 3),
    ("group_repeated", lambda: Replicated(group=[1, 1]), (7, 5), 3),
    ("group_empty", lambda: Partial(group=()), (7, 5), 3),
    ("group_negative", lambda: Block2D(group=[-1, 0]), (7, 5), 3),
    ("group_not_seq", lambda: RowBlock(group=3), (7, 5), 3),
    ("grid_mismatch", lambda: Block2D(grid=(2, 2)), (7, 5), 3),
    ("grid_zero", lambda: Block2D(grid=(0, 3)), (7, 5), 3),
    ("grid_not_pair", lambda: Block2D(grid=(1, 2, 3)), (7, 5), 6),
    ("bc_block", lambda: BlockCyclic((2, 0)), (7, 5), 2),
    ("bc_grid", lambda: BlockCyclic((2, 2), grid=(3, 1), group=[0, 1]), (7, 5), 3),
    ("tiles_extent", lambda: Tiles((0, 3, 6), (0, 5), [[0], [1]]), (7, 5), 2),
    ("tiles_owner_range", lambda: Tiles((0, 7), (0, 5), [[2]]), (7, 5), 2),
    ("tiles_owner_negative", lambda: Tiles((0, 7), (0, 5), [[-1]]), (7, 5), 2),
    ("tiles_owners_grid", lambda: Tiles((0, 3, 7), (0, 5), [[0, 1]]), (7, 5), 2),
    ("tiles_start", lambda: Tiles((1, 7), (0, 5), [[0]]), (7, 5), 2),
    ("tiles_decreasing", lambda: Tiles((0, 5, 3, 7), (0, 5), [[0], [0], [0]]), (7, 5), 2),
    ("bad_shape", lambda: RowBlock(), (-1, 5), 2),
    ("bad_shape_arity", lambda: RowBlock(), (7,), 2),
]


@pytest.mark.parametrize("what,make,shape,p", BAD, ids=[b[0] for b in BAD])
def test_validation_raises_layout_error(what, make, shape, p):
    with pytest.raises(dmath.LayoutError):
        distribution(make(), shape, p)


def test_numpy_integers_are_integers():
    assert RowBlock(sizes=np.array([3, 4])) == RowBlock(sizes=(3, 4))
    assert BlockCyclic((np.int32(2), np.int64(3)), grid=(np.int64(1), 2)) == BlockCyclic((2, 3), grid=(1, 2))
    assert ColBlock(group=[np.int64(1), 0]).group == (1, 0)


def test_not_a_layout():
    with pytest.raises(dmath.LayoutError):
        distribution("RowBlock", (2, 2), 2)
