"""What a worker stores for one matrix: its local pieces and their metadata."""


class Shard:
    """The local part of a matrix on one worker.

    pieces: one array per piece of `dist.pieces[rank]` (often exactly one),
        always device arrays on a GPU (see below).
    version: bumped on every write, so caches keyed on it stay correct.
    memory: the memory kind ('device', 'host', 'managed', 'cuda_managed';
        None: the backend's default).
    home: for a shard held in host memory on a GPU, its `memory.kinds.HostCopies`:
        reading `pieces` brings the data to the device (the one place this
        happens), and the runtime settles it when the command ends.
    pending: None, or a list of objects with a wait(): a collectives.Pending
        while the pieces are still being written on the side stream (a
        background all-reduce), or the take_rows read-ahead thread still
        reading them (its wait joins it); the runtime makes the next command
        that reads, writes in place or frees the shard wait for them
        (`settle`).
    """
    __slots__ = ("_pieces", "dist", "dtype", "version", "memory", "home", "pending")
    #: whether the pieces are read from their source at each use (a mapped file rewritten in place is
    #: seen), so that no cache may keep a copy of them under the version (the replica cache)
    read_on_use = False

    def __init__(self, pieces, dist, dtype, memory=None, home=None):
        self._pieces = pieces
        self.dist = dist
        self.dtype = dtype
        self.version = 0
        self.memory = memory
        self.home = home
        self.pending = None

    def settle(self):
        """Make the compute stream wait for the side-stream work still writing this shard (if any)."""
        pending, self.pending = self.pending, None
        for p in pending or ():
            p.wait()

    @property
    def pieces(self):
        home = self.home
        return self._pieces if home is None else home.device()

    @pieces.setter
    def pieces(self, arrays):
        if self.home is not None:
            raise AttributeError("the pieces of a shard held in host memory are replaced through its home")
        self._pieces = arrays


class Meta(tuple):
    """(layout, shape, dtype) of a matrix, as it appears in a command signature."""
    __slots__ = ()

    def __new__(cls, layout, shape, dtype):
        # the dtype's name, so that a Meta made from Matrix.dtype (a numpy dtype) hashes
        # and pickles like one made from a string: Metas key the command caches
        return tuple.__new__(cls, (layout, tuple(shape), dtype if type(dtype) is str else dtype.name))

    def __getnewargs__(self):
        return tuple(self)

    layout = property(lambda self: self[0])
    shape = property(lambda self: self[1])
    dtype = property(lambda self: self[2])
