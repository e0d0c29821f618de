"""Worker-side allocation: every shard, temporary and communication buffer comes from here.

This module is the single place allocations go through, so that accounting
(and the limit) covers all of them.
"""
import weakref

import numpy as np

from .. import backend
from ..errors import OutOfMemoryError

_stats = {"in_use": 0, "cached": 0, "high_water": 0, "new_allocs": 0, "reused_allocs": 0}
_limit = None


def _release(nbytes):
    _stats["in_use"] -= nbytes


def empty(shape, dtype):
    """An uninitialised array of the current backend, counted against the limit."""
    nbytes = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
    if _limit is not None and _stats["in_use"] + nbytes > _limit:
        raise OutOfMemoryError(f"allocating {nbytes} bytes would exceed the limit of {_limit} bytes "
                               f"({_stats['in_use']} bytes in use)")
    a = backend.current().xp.empty(shape, dtype=dtype)
    if nbytes:
        _stats["in_use"] += nbytes
        _stats["new_allocs"] += 1
        _stats["high_water"] = max(_stats["high_water"], _stats["in_use"])
        weakref.finalize(a, _release, nbytes)
    return a


def zeros(shape, dtype):
    a = empty(shape, dtype)
    a.fill(0)
    return a


def stats():
    """This process's allocation statistics (bytes and counts)."""
    return dict(_stats)


def reset_stats():
    _stats["new_allocs"] = _stats["reused_allocs"] = 0
    _stats["high_water"] = _stats["in_use"]


def set_limit(nbytes):
    """Cap the bytes a worker may hold (None: no cap); past it allocations raise OutOfMemoryError."""
    global _limit
    _limit = None if nbytes is None else int(nbytes)
