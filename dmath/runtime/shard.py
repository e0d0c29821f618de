"""What a worker stores for one matrix: its local pieces and their metadata."""


class Shard:
    """The local part of a matrix on one worker.

    pieces: one array per piece of `dist.pieces[rank]` (often exactly one).
    version: bumped on every write, so caches keyed on it stay correct.
    """
    __slots__ = ("pieces", "dist", "dtype", "version")

    def __init__(self, pieces, dist, dtype):
        self.pieces = pieces
        self.dist = dist
        self.dtype = dtype
        self.version = 0


class Meta(tuple):
    """(layout, shape, dtype) of a matrix, as it appears in a command signature."""
    __slots__ = ()

    def __new__(cls, layout, shape, dtype):
        return tuple.__new__(cls, (layout, tuple(shape), dtype))

    def __getnewargs__(self):
        return tuple(self)

    layout = property(lambda self: self[0])
    shape = property(lambda self: self[1])
    dtype = property(lambda self: self[2])
