"""Frozen dataclasses that key the dispatch caches, hashed once.

A dataclass's generated `__hash__` hashes every field in Python on every
call; layouts, GEMM strategies and machine figures are hashed on every
operation (they are parts of the signature and plan cache keys), so their
hash is computed on first use and kept. The kept value is left out of a
pickle: a hash may differ between processes (hash(None) does before
Python 3.12).
"""
from dataclasses import dataclass


def frozen(cls):
    """`@dataclass(frozen=True)` whose instances compute their hash once."""
    cls = dataclass(frozen=True)(cls)
    field_hash = cls.__hash__

    def __hash__(self):
        try:
            return self._hash       # an attribute read: no method call on the usual path
        except AttributeError:
            h = field_hash(self)
            object.__setattr__(self, "_hash", h)
            return h

    def __getstate__(self):
        state = dict(self.__dict__)
        state.pop("_hash", None)
        return state

    cls.__hash__ = __hash__
    cls.__getstate__ = __getstate__
    return cls
