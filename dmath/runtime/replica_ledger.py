"""The master's ledger of the copies the workers keep in their replica caches.

The GEMM planner prices a strategy lower when the operand copies (or
broadcast panels) it needs are already cached on the workers. The master
answers that from its own account, never from worker 0's cache: the master
records each copy an operation it sends will keep (`store`), and forgets a
matrix's copies when a command writes it or the matrix is freed (the
workers' keys carry the shard version, so a written matrix's copies are
never found there either). Budget and least-recently-used eviction follow
the workers' cache (`dmath.memory.replicas`), so both sides keep the same
entries. A copy the workers dropped early (their pool evicts the cache to
make room) only makes the planner's estimate optimistic: the kernel looks
every copy up and makes it again on a miss, so results never depend on
this ledger.
"""
import collections

from .. import settings


def budget(limit):
    """The workers' cache budget under memory limit `limit` (None: none): at most half of it."""
    most = settings.current.replica_cache_bytes
    return most if limit is None else min(most, limit // 2)


class ReplicaLedger:
    """(handle, form) -> global bytes of the copies the workers hold; form = (layout or (kind, layout), dtype)."""

    def __init__(self, budget):
        self.budget = budget          # a function returning the cache's byte budget now
        self._entries = collections.OrderedDict()
        self._per_handle = collections.Counter()
        self.bytes = 0

    def holds(self, handle, form):
        return (handle, form) in self._entries

    def holds_any(self, handle):
        """Whether any copy of matrix `handle` is recorded (a quick test before asking for forms)."""
        return handle in self._per_handle

    def store(self, handle, form, nbytes):
        """A command keeps a copy of `handle` in `form` (or uses it again: it becomes the most recent)."""
        key = (handle, form)
        if key in self._entries:
            self._entries.move_to_end(key)
            return
        budget = self.budget()
        if nbytes > budget:
            return                    # the workers do not keep a copy larger than the whole budget
        while self._entries and self.bytes + nbytes > budget:
            self._remove(next(iter(self._entries)))
        self._entries[key] = nbytes
        self._per_handle[handle] += 1
        self.bytes += nbytes

    def written(self, handle):
        """Matrix `handle` was written (or freed): its copies are stale."""
        if handle in self._per_handle:
            for key in [k for k in self._entries if k[0] == handle]:
                self._remove(key)

    def clear(self):
        """The workers dropped every copy (dmath.memory.clear)."""
        self._entries.clear()
        self._per_handle.clear()
        self.bytes = 0

    def _remove(self, key):
        self.bytes -= self._entries.pop(key)
        self._per_handle[key[0]] -= 1
        if not self._per_handle[key[0]]:
            del self._per_handle[key[0]]
