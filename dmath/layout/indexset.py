"""Sets of global indices along one axis, as sorted disjoint half-open intervals.

An index set is a tuple of (start, stop) pairs: hashable, so plans built from
them can be cached, and compact for block-cyclic layouts (one interval per
block instead of one entry per index).
"""
import numpy as np


def interval(start, stop):
    """The set {start, ..., stop - 1} (empty when stop <= start)."""
    return ((int(start), int(stop)),) if stop > start else ()


def size(s):
    return sum(b - a for a, b in s)


def shift(s, offset):
    return tuple((a + offset, b + offset) for a, b in s)


def intersect(s, t):
    """The intersection of two index sets (both sorted, disjoint)."""
    out = []
    i = j = 0
    while i < len(s) and j < len(t):
        a = max(s[i][0], t[j][0])
        b = min(s[i][1], t[j][1])
        if a < b:
            out.append((a, b))
        if s[i][1] < t[j][1]:
            i += 1
        else:
            j += 1
    return tuple(out)


def to_array(s):
    """The indices of `s` as an int64 array, in increasing order."""
    if not s:
        return np.zeros(0, dtype=np.int64)
    return np.concatenate([np.arange(a, b, dtype=np.int64) for a, b in s])


def positions(sub, s):
    """Local positions of the indices of `sub` (a subset of `s`) inside `s`.

    Returns a `slice` when they are contiguous (the common case: no copy is
    needed to address them) and an int64 array otherwise.
    """
    if not sub:
        return slice(0, 0)
    starts = np.array([a for a, _ in s], dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum([b - a for a, b in s])])
    pieces = []
    for a, b in sub:
        k = int(np.searchsorted(starts, a, side="right")) - 1
        lo = int(offsets[k] + (a - starts[k]))
        pieces.append((lo, lo + (b - a)))
    merged = [list(pieces[0])]
    for lo, hi in pieces[1:]:
        if lo == merged[-1][1]:
            merged[-1][1] = hi
        else:
            merged.append([lo, hi])
    if len(merged) == 1:
        return slice(merged[0][0], merged[0][1])
    return np.concatenate([np.arange(lo, hi, dtype=np.int64) for lo, hi in merged])


def split_even(n, parts):
    """Sizes of `parts` contiguous blocks covering n items, the first n % parts one longer."""
    base, extra = divmod(int(n), int(parts))
    return tuple(base + (1 if k < extra else 0) for k in range(parts))


def blocks_from_sizes(sizes):
    """Index sets of consecutive blocks with the given sizes."""
    out, start = [], 0
    for s in sizes:
        out.append(interval(start, start + s))
        start += s
    return out


def cyclic(n, block, parts, part):
    """Indices of `part` in a block-cyclic split of n items over `parts` parts."""
    out = []
    start = part * block
    while start < n:
        out.append((start, min(start + block, n)))
        start += parts * block
    return tuple(out)


def selection(s):
    """`s` as something that indexes a full axis: a slice when contiguous, else an index array."""
    if not s:
        return slice(0, 0)
    if len(s) == 1:
        return slice(s[0][0], s[0][1])
    return to_array(s)
