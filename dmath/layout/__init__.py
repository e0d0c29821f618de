"""Layouts: immutable, hashable values, and the pure index math derived from them."""
from .values import (Layout, Piece, Replicated, Partial, RowBlock, ColBlock, Block2D,
                    BlockCyclic, Tiles, near_square_grid)
from .distribution import Distribution, distribution, check_shape

__all__ = ["Layout", "Piece", "Replicated", "Partial", "RowBlock", "ColBlock", "Block2D",
           "BlockCyclic", "Tiles", "near_square_grid", "Distribution", "distribution",
           "check_shape"]
