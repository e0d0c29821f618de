"""The layout values: immutable, hashable values that say where each block lives.

A layout is independent of the matrix shape (except `Tiles`, whose splits
name global indices): `pieces(shape, nworkers)` gives, for every worker rank,
the rectangular pieces it stores, each a product of a row index set and a
column index set. Everything else (ownership, local indices, shard shapes,
remap plans) is derived from those pieces by pure functions.
"""
import abc
import functools
import math
import operator
from dataclasses import dataclass

from ..errors import LayoutError
from ..frozen import frozen
from . import indexset as ix
from .scope import default_group


@dataclass(frozen=True)
class Piece:
    """A block stored on one worker: global rows x global cols (index sets)."""
    rows: tuple
    cols: tuple

    @functools.cached_property
    def shape(self):
        # kernels ask for it on every command: computed once per piece (pieces are cached with
        # their distribution)
        return (ix.size(self.rows), ix.size(self.cols))


def _int_tuple(value, error):
    """The sequence `value` as a tuple of ints; LayoutError(error) where it is not one (a float or a
    bool in it included: 1.7 workers or rows is a mistake, never rounded)."""
    try:
        return tuple(map(_strict_int, value))
    except TypeError as exc:
        raise LayoutError(error) from exc


def _strict_int(v):
    """v as an int if it is an integer (numpy's too), not a bool; else TypeError."""
    if isinstance(v, bool):
        raise TypeError("a bool is not a count or a rank")
    return operator.index(v)


def _norm_group(group):
    if group is None:
        # inside `dmath.on_group(ranks)` a layout made without a group lives on those ranks
        return default_group()
    g = _int_tuple(group, f"group must be a sequence of worker ranks, got {group!r}")
    if not g:
        raise LayoutError("group must name at least one worker")
    if len(set(g)) != len(g) or min(g) < 0:
        raise LayoutError(f"group must hold distinct non-negative ranks, got {g}")
    return g


def _norm_pair(value, what):
    error = f"{what} must be a pair of positive integers, got {value!r}"
    pair = _int_tuple(value, error)
    if len(pair) != 2 or min(pair) < 1:
        raise LayoutError(error)
    return pair


def near_square_grid(p):
    """(pr, pc) with pr * pc == p, pr <= pc and pr as large as possible."""
    pr = int(math.isqrt(p))
    while p % pr:
        pr -= 1
    return (pr, p // pr)


class Layout(abc.ABC):
    """Base of every layout kind (see the subclasses)."""
    #: every member holds every element
    replicated = False
    #: the value is the sum of the members' full-size addends
    partial = False

    def members(self, nworkers):
        """The ranks taking part, in the layout's order."""
        g = self.group if self.group is not None else tuple(range(nworkers))
        if max(g) >= nworkers:
            raise LayoutError(f"{self!r} names worker {max(g)} but there are {nworkers} workers")
        return g

    def resolved(self, nworkers):
        """The same layout with every default (group, grid) made explicit."""
        return self

    @abc.abstractmethod
    def pieces(self, shape, nworkers):
        """For each worker rank, the tuple of `Piece`s it stores."""

    @abc.abstractmethod
    def transposed(self, nworkers):
        """The layout of the transposed matrix with no data moving."""

    def _per_rank(self, nworkers, assign):
        out = [[] for _ in range(nworkers)]
        for rank, piece in assign:
            out[rank].append(piece)
        return tuple(tuple(p) for p in out)


class _WholeOnEachMember(Layout):
    """Every member stores a full-size array (the value or an addend of it)."""

    def __post_init__(self):
        object.__setattr__(self, "group", _norm_group(self.group))

    def resolved(self, nworkers):
        return type(self)(self.members(nworkers))

    def pieces(self, shape, nworkers):
        full = Piece(ix.interval(0, shape[0]), ix.interval(0, shape[1]))
        return self._per_rank(nworkers, ((r, full) for r in self.members(nworkers)))

    def transposed(self, nworkers):
        return self


@frozen
class Replicated(_WholeOnEachMember):
    """Every member holds the whole matrix."""
    group: tuple = None
    replicated = True


@frozen
class Partial(_WholeOnEachMember):
    """The value is the sum of every member's full-size addend."""
    group: tuple = None
    partial = True


def _check_sizes(sizes, n, parts, what):
    if sizes is None:
        return ix.split_even(n, parts)
    if len(sizes) != parts:
        raise LayoutError(f"{what} sizes={sizes} has {len(sizes)} entries for {parts} workers")
    if sum(sizes) != n:
        raise LayoutError(f"{what} sizes={sizes} add up to {sum(sizes)}, expected {n}")
    return sizes


def _norm_sizes(sizes):
    if sizes is None:
        return None
    s = _int_tuple(sizes, f"sizes must be a sequence of integers, got {sizes!r}")
    if any(v < 0 for v in s):
        raise LayoutError(f"sizes must be non-negative, got {s}")
    return s


@frozen
class RowBlock(Layout):
    """Contiguous blocks of rows, one per member in group order (uneven with sizes=)."""
    group: tuple = None
    sizes: tuple = None

    def __post_init__(self):
        object.__setattr__(self, "group", _norm_group(self.group))
        object.__setattr__(self, "sizes", _norm_sizes(self.sizes))
        if self.group is not None and self.sizes is not None and len(self.sizes) != len(self.group):
            raise LayoutError(f"sizes={self.sizes} needs one entry per group member {self.group}")

    def resolved(self, nworkers):
        return type(self)(self.members(nworkers), self.sizes)

    def _blocks(self, shape, nworkers, axis):
        g = self.members(nworkers)
        sizes = _check_sizes(self.sizes, shape[axis], len(g), type(self).__name__)
        return g, ix.blocks_from_sizes(sizes)

    def pieces(self, shape, nworkers):
        g, blocks = self._blocks(shape, nworkers, 0)
        cols = ix.interval(0, shape[1])
        return self._per_rank(nworkers, ((r, Piece(b, cols)) for r, b in zip(g, blocks)))

    def transposed(self, nworkers):
        return ColBlock(self.group, self.sizes)


@frozen
class ColBlock(RowBlock):
    """Contiguous blocks of columns, one per member in group order."""
    group: tuple = None
    sizes: tuple = None

    def pieces(self, shape, nworkers):
        g, blocks = self._blocks(shape, nworkers, 1)
        rows = ix.interval(0, shape[0])
        return self._per_rank(nworkers, ((r, Piece(rows, b)) for r, b in zip(g, blocks)))

    def transposed(self, nworkers):
        return RowBlock(self.group, self.sizes)


def _grid_and_group(layout, nworkers):
    g = layout.members(nworkers)
    grid = layout.grid or near_square_grid(len(g))
    if grid[0] * grid[1] != len(g):
        raise LayoutError(f"{type(layout).__name__} grid {grid} needs {grid[0] * grid[1]} workers, "
                          f"the group has {len(g)}")
    return grid, g


def _transposed_group(grid, g):
    pr, pc = grid
    # the worker at grid position (i, j) moves to (j, i) of a pc x pr grid
    return tuple(g[i * pc + j] for j in range(pc) for i in range(pr))


@frozen
class Block2D(Layout):
    """A pr x pc grid of contiguous blocks; member k sits at (k // pc, k % pc)."""
    grid: tuple = None
    group: tuple = None

    def __post_init__(self):
        object.__setattr__(self, "group", _norm_group(self.group))
        if self.grid is not None:
            object.__setattr__(self, "grid", _norm_pair(self.grid, "grid"))

    def resolved(self, nworkers):
        grid, g = _grid_and_group(self, nworkers)
        return Block2D(grid, g)

    def pieces(self, shape, nworkers):
        (pr, pc), g = _grid_and_group(self, nworkers)
        rb = ix.blocks_from_sizes(ix.split_even(shape[0], pr))
        cb = ix.blocks_from_sizes(ix.split_even(shape[1], pc))
        return self._per_rank(nworkers, ((g[i * pc + j], Piece(rb[i], cb[j]))
                                         for i in range(pr) for j in range(pc)))

    def transposed(self, nworkers):
        grid, g = _grid_and_group(self, nworkers)
        return Block2D((grid[1], grid[0]), _transposed_group(grid, g))


@frozen
class BlockCyclic(Layout):
    """ScaLAPACK's 2D block-cyclic layout: block (mb, nb) at grid position (bi % pr, bj % pc).

    A worker stores its blocks as one local matrix, in global order (the
    ScaLAPACK local layout).
    """
    block: tuple = (64, 64)
    grid: tuple = None
    group: tuple = None

    def __post_init__(self):
        object.__setattr__(self, "block", _norm_pair(self.block, "block"))
        object.__setattr__(self, "group", _norm_group(self.group))
        if self.grid is not None:
            object.__setattr__(self, "grid", _norm_pair(self.grid, "grid"))

    def resolved(self, nworkers):
        grid, g = _grid_and_group(self, nworkers)
        return BlockCyclic(self.block, grid, g)

    def pieces(self, shape, nworkers):
        (pr, pc), g = _grid_and_group(self, nworkers)
        mb, nb = self.block
        return self._per_rank(nworkers, (
            (g[i * pc + j], Piece(ix.cyclic(shape[0], mb, pr, i), ix.cyclic(shape[1], nb, pc, j)))
            for i in range(pr) for j in range(pc)))

    def transposed(self, nworkers):
        grid, g = _grid_and_group(self, nworkers)
        return BlockCyclic((self.block[1], self.block[0]), (grid[1], grid[0]),
                           _transposed_group(grid, g))


def _norm_splits(splits, what):
    s = _int_tuple(splits, f"{what} must be a sequence of integers, got {splits!r}")
    if len(s) < 2 or s[0] != 0 or any(b < a for a, b in zip(s, s[1:])):
        raise LayoutError(f"{what} must start at 0 and not decrease, got {s}")
    return s


@frozen
class Tiles(Layout):
    """Any grid of tiles: rows split at row_splits, columns at col_splits, tile (i, j) on `owners[i][j]`.

    row_splits = (0, r1, ..., m) and col_splits = (0, c1, ..., n); a worker may
    own several tiles and stores each as its own piece, in row-major order.
    """
    row_splits: tuple
    col_splits: tuple
    owners: tuple

    def __post_init__(self):
        rs = _norm_splits(self.row_splits, "row_splits")
        cs = _norm_splits(self.col_splits, "col_splits")
        try:
            # ranks are integers like every other layout field: 0.5 is a mistake, never truncated
            owners = tuple(tuple(_strict_int(o) for o in row) for row in self.owners)
        except (TypeError, ValueError) as exc:
            raise LayoutError(f"owners must be a grid of worker ranks, got {self.owners!r}") from exc
        if len(owners) != len(rs) - 1 or any(len(row) != len(cs) - 1 for row in owners):
            raise LayoutError(f"owners must be a {len(rs) - 1} x {len(cs) - 1} grid for these splits")
        if any(o < 0 for row in owners for o in row):
            raise LayoutError("owners must be non-negative worker ranks")
        object.__setattr__(self, "row_splits", rs)
        object.__setattr__(self, "col_splits", cs)
        object.__setattr__(self, "owners", owners)

    @property
    def group(self):
        return tuple(sorted({o for row in self.owners for o in row}))

    def pieces(self, shape, nworkers):
        if self.row_splits[-1] != shape[0] or self.col_splits[-1] != shape[1]:
            raise LayoutError(f"Tiles splits end at ({self.row_splits[-1]}, {self.col_splits[-1]}), "
                              f"the matrix is {shape[0]} x {shape[1]}")
        self.members(nworkers)
        rs, cs = self.row_splits, self.col_splits
        return self._per_rank(nworkers, (
            (self.owners[i][j], Piece(ix.interval(rs[i], rs[i + 1]), ix.interval(cs[j], cs[j + 1])))
            for i in range(len(rs) - 1) for j in range(len(cs) - 1)))

    def transposed(self, nworkers):
        owners = tuple(tuple(self.owners[i][j] for i in range(len(self.owners)))
                       for j in range(len(self.col_splits) - 1))
        return Tiles(self.col_splits, self.row_splits, owners)
