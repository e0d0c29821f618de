"""Sets of global indices along one axis, as sorted disjoint half-open intervals.

An index set is a tuple of (start, stop) pairs: hashable, so plans built from
them can be cached, and compact for block-cyclic layouts (one interval per
block instead of one entry per index).

Local positions (where a subset sits inside a worker's local array) are
described as `Runs`: equal-length runs at a fixed stride, the shape of a
block-cyclic selection. Executors turn a `Runs` into a strided view of the
local array (a slice, a reshape and a slice), never an index array.
"""
from typing import NamedTuple

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


def local_intervals(sub, s):
    """Local positions of the indices of `sub` (a subset of `s`) inside `s`, as merged intervals.

    Position k is the k-th smallest index of `s` (a worker stores its indices
    in increasing order); adjacent runs of positions are merged. One walk
    over both sets (both sorted).
    """
    merged = []
    k = base = 0                    # s[k] is the interval at local position `base`
    for a, b in sub:
        while a < b:
            while s[k][1] <= a:
                base += s[k][1] - s[k][0]
                k += 1
            end = min(b, s[k][1])
            lo = base + a - s[k][0]
            if merged and merged[-1][1] == lo:
                merged[-1][1] = lo + end - a
            else:
                merged.append([lo, lo + end - a])
            a = end
    return tuple((lo, hi) for lo, hi in merged)


def positions(sub, s):
    """Local positions of the indices of `sub` (a subset of `s`) inside `s`.

    Returns a `slice` when they are contiguous (the common case: no copy is
    needed to address them) and an int64 array otherwise.
    """
    merged = local_intervals(sub, s)
    if not merged:
        return slice(0, 0)
    if len(merged) == 1:
        return slice(*merged[0])
    return to_array(merged)


class Runs(NamedTuple):
    """`count` runs of `length` consecutive positions, one run every `stride` positions.

    Run i covers positions base + i * stride + offset + [0, length). The
    window [base, base + count * stride) lies inside the axis and
    offset + length <= stride, so the selection is the view
    `axis[base:base + count * stride].reshape(count, stride)[:, offset:offset + length]`
    (a slice, a reshape that splits one axis, a slice: never a copy).
    """
    base: int
    count: int
    stride: int
    offset: int
    length: int

    @property
    def size(self):
        return self.count * self.length

    def intervals(self):
        """The positions as intervals (for checks and tests)."""
        first = self.base + self.offset
        return tuple((first + i * self.stride, first + i * self.stride + self.length) for i in range(self.count))


def contiguous(start, size):
    """Runs of the single interval [start, start + size)."""
    return Runs(start, 1, size, 0, size)


def strided_runs(intervals, extent):
    """Cover sorted disjoint `intervals` of positions in [0, extent) with few `Runs`, in order.

    Greedy from the left: a group takes the following intervals while they
    have its length and keep its stride (a cyclic selection of blocks of b is
    one group, plus one for a shorter last block). The group's window must
    fit inside the axis; it is aligned to the first run, or shifted left by
    at most the gap between runs, else the last run starts the next group.
    """
    out, i, n = [], 0, len(intervals)
    while i < n:
        lo, hi = intervals[i]
        length = hi - lo
        j = i + 1
        if j < n and intervals[j][1] - intervals[j][0] == length:
            stride = intervals[j][0] - lo
            while (j < n and intervals[j][1] - intervals[j][0] == length
                   and intervals[j][0] - intervals[j - 1][0] == stride):
                j += 1
        count = j - i
        while count > 1:
            base = min(lo, extent - count * stride)
            if base >= max(0, lo - (stride - length)):
                out.append(Runs(base, count, stride, lo - base, length))
                break
            count -= 1
        if count == 1:
            out.append(contiguous(lo, length))
        i += count
    return tuple(out)


def split_like(start, template):
    """The contiguous positions [start, start + total) cut into the runs of `template`, in order.

    Run group g of the result has the count and length of template[g] and
    stride = length, so the two selections pair up view by view (the same
    4-D shapes) for a direct copy from one to the other.
    """
    out = []
    for r in template:
        out.append(Runs(start, r.count, r.length, 0, r.length))
        start += r.size
    return tuple(out)


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
