"""The replica cache ("keep what you've seen"): copies of matrices an operation gathered.

An entry is keyed by (handle, version, layout, dtype): the matrix, which
write of it, and the form it was gathered into. Any write gives the matrix a
new version, so a stale copy can never be found; storing a newer version
drops the older ones at once. Entries are evicted least-recently-used when
the cache budget (or the memory pool) needs room, and a copy larger than the
whole budget is not kept. A cached value may still be in flight (a
background replication): `lookup` waits for it before handing it out.
"""
import collections

from .. import settings


class _Entry:
    __slots__ = ("pieces", "nbytes", "pending")

    def __init__(self, pieces, nbytes, pending):
        self.pieces, self.nbytes, self.pending = pieces, nbytes, pending


class ReplicaCache:
    """LRU store of gathered copies with a byte budget; one per process."""

    def __init__(self, budget=None):
        # (init sets the process's cache to DMATH_REPLICA_CACHE_BYTES once the settings are read)
        self.budget = settings.current.replica_cache_bytes if budget is None else budget
        self._entries = collections.OrderedDict()
        self._per_handle = collections.Counter()   # entries per matrix handle (a quick "anything cached?")
        self.bytes = 0
        self.hits = self.misses = self.bytes_saved = self.evictions = 0

    def lookup(self, key):
        """The cached pieces for `key` (waiting for a background fill), or None (a miss)."""
        e = self._entries.get(key)
        if e is None:
            self.misses += 1
            return None
        self._entries.move_to_end(key)
        if e.pending is not None:
            pending, e.pending = e.pending, None
            pending()
        self.hits += 1
        self.bytes_saved += e.nbytes
        return e.pieces

    def holds(self, handle):
        """True when some copy of matrix `handle` is cached."""
        return handle in self._per_handle

    def peek(self, key):
        """True when `key` is cached (no statistics, no waiting)."""
        return key in self._entries

    def store(self, key, pieces, nbytes, pending=None):
        """Keep `pieces` under `key` unless they exceed the budget; returns whether kept.

        `pending`, when given, is called once before the pieces are first used
        from the cache, or before they are evicted (it completes a background
        transfer into them).
        """
        self.drop(key[0], keep_version=key[1])
        if nbytes > self.budget:
            return False          # the caller still owns (and completes) what it gathered
        self.evict(self.bytes + nbytes - self.budget)
        self._entries[key] = _Entry(pieces, nbytes, pending)
        self._per_handle[key[0]] += 1
        self.bytes += nbytes
        return True

    def drop(self, handle, keep_version=None):
        """Forget every copy of `handle` (except those of `keep_version`)."""
        if handle not in self._per_handle:
            return
        stale = [k for k in self._entries if k[0] == handle and k[1] != keep_version]
        for k in stale:
            self._remove(k)

    def evict(self, nbytes):
        """Evict least-recently-used entries until `nbytes` are freed; returns the bytes freed."""
        freed = 0
        while freed < nbytes and self._entries:
            key = next(iter(self._entries))
            freed += self._remove(key)
            self.evictions += 1
        return freed

    def clear(self):
        for k in list(self._entries):
            self._remove(k)

    def _remove(self, key):
        e = self._entries.pop(key)
        self._per_handle[key[0]] -= 1
        if not self._per_handle[key[0]]:
            del self._per_handle[key[0]]
        if e.pending is not None:
            e.pending()           # never drop a buffer a transfer is still writing into
        self.bytes -= e.nbytes
        return e.nbytes

    def local_bytes(self, block_bytes):
        """The bytes this worker's copies take in its pool (`block_bytes(n)`: the pool's block for n)."""
        return sum(block_bytes(a.nbytes) for e in self._entries.values() for a in e.pieces)

    def stats(self):
        return {"cache_hits": self.hits, "cache_misses": self.misses, "cache_bytes_saved": self.bytes_saved,
                "cache_bytes": self.bytes, "cache_entries": len(self._entries),
                "cache_evictions": self.evictions}

    def reset_stats(self):
        self.hits = self.misses = self.bytes_saved = self.evictions = 0


#: the process's cache (workers each hold their own)
cache = ReplicaCache()


def set_budget(nbytes):
    """Bytes the replica cache may hold on each worker (evicts at once if over)."""
    cache.budget = int(nbytes)
    cache.evict(cache.bytes - cache.budget)
