"""Gradient buckets: the data-parallel all-reduces of a training step, several weights at a time.

The backward pass completes the weight gradients from the last layer to the
first. Each one that must be summed over the workers (a Partial gradient of
a Replicated weight) joins the open bucket; the bucket is summed by one
`dmath.sum_partials` in the background (the communication stream on a GPU,
inside the step's CUDA graph) as soon as it holds `cap` bytes, while the
backward of the layers below goes on. What remains after the last full
bucket is cut so that the final bucket, the one the update must wait for
after the backward pass ends, holds at most `last` bytes (the `tail` rule).
Gradients that need no sum (one worker) or another move (a model-parallel
weight) go at once, as before. In float16 training the float16 gradients
are summed in float16 (`half`): half the bytes, and a sum that overflows
is an inf that the loss scale's finiteness check turns into a skipped step,
as PyTorch's float16 compression hook for DDP relies on.

The rule is pure (`cut`), in bytes of the weights' dtype, and decided
while the step is recorded: replays repeat the same buckets.
"""
import numpy as np

import dmath

from ..optim.base import to_layout_of

#: bytes per bucket: DDP's bucket_cap_mb (25 MB)
CAP_BYTES = 25 << 20
#: the final bucket at most (DDP's first bucket is 1 MB for the same reason: a short wait)
LAST_BYTES = 1 << 20


def cut(bucket_bytes, remaining_bytes, cap, last, tail_cut):
    """Whether to sum the open bucket now: it holds `bucket_bytes`, the gradients still to come hold
    `remaining_bytes`. Yes when nothing remains and when the bucket is full; and once (`tail_cut`
    False), as soon as what remains fits the final bucket (`last`) but would not together with the
    open one, so that the final bucket holds only what remains (pure)."""
    if bucket_bytes <= 0:
        return False
    if remaining_bytes <= 0 or bucket_bytes >= cap:
        return True
    return not tail_cut and remaining_bytes <= last < bucket_bytes + remaining_bytes


def bucketable(g, p, dtype):
    """Whether gradient g of parameter matrix p is a sum over two or more workers of p's group
    (Partial over the members of p's Replicated layout) that may be summed in `dtype`."""
    return (g.layout.partial and p.layout.replicated and len(g.layout.group) > 1
            and tuple(g.layout.group) == tuple(p.layout.group)
            and np.dtype(dtype).itemsize >= np.dtype(g.dtype).itemsize)


def move(g, p, dtype):
    """Gradient g in parameter p's layout, a sum made in `dtype` (Buckets.sum_dtype)."""
    return to_layout_of(g, p, keep_dtype=True, background=True, dtype=dtype)


class Buckets:
    """The buckets of one recorded backward pass (`ready` is graph.backward's hook).

    params: the parameter matrices, in the order of the gradients; cap,
    last: bytes (see the module docstring); cap 0 sums each gradient alone.
    half: float16 gradients are summed in float16 (half the bytes on the
    wire; a sum that overflows is an inf that the loss scale's check skips,
    as an overflowing backward pass), else in their weights' dtype.
    """

    def __init__(self, params, cap=CAP_BYTES, last=LAST_BYTES, half=False):
        self.params, self.cap, self.last, self.half = params, cap, min(last, cap), half
        self.remaining = sum(p.nbytes for p in params)
        self.open, self.open_bytes, self.tail_cut = [], 0, False
        self.done = {}
        #: the buckets summed, as lists of parameter indices (for tests and explain)
        self.summed = []

    def ready(self, k, g):
        """Gradient k is complete: move it now, or keep it for its bucket (then None: backward
        drops its own reference, and the bucket's sum replaces it in `gradients`)."""
        p = self.params[k]
        self.remaining -= p.nbytes
        dtype = self.sum_dtype(g, p)
        if self.cap <= 0 or not bucketable(g, p, dtype):
            moved = move(g, p, dtype)
            self._maybe_sum()
            return moved
        if self.open:
            k0, g0 = self.open[0]
            if self.sum_dtype(g0, self.params[k0]) != dtype or g0.layout.group != g.layout.group:
                self.sum_open()         # one buffer holds one dtype, one all-reduce one group
        self.open.append((k, g))
        self.open_bytes += p.nbytes
        self._maybe_sum()
        return None

    def sum_dtype(self, g, p):
        """The dtype gradient g of p is summed in (p's, unless a float16 sum is kept in float16)."""
        return g.dtype if self.half and g.dtype == "float16" and g.layout.partial else p.dtype

    def _maybe_sum(self):
        if cut(self.open_bytes, self.remaining, self.cap, self.last, self.tail_cut):
            if 0 < self.remaining <= self.last:
                self.tail_cut = True
            self.sum_open()

    def sum_open(self):
        """Sum the open bucket (one all-reduce in the background)."""
        if not self.open:
            return
        ks = [k for k, _ in self.open]
        k0, g0 = self.open[0]
        dtype = self.sum_dtype(g0, self.params[k0])
        if len(ks) == 1:
            self.done[k0] = move(g0, self.params[k0], dtype)
        else:
            sums = dmath.sum_partials([g for _, g in self.open], dtype=dtype, background=True)
            self.done.update(zip(ks, sums))
        self.summed.append(ks)
        self.open, self.open_bytes = [], 0

    def gradients(self, grads):
        """backward's gradients with the buckets' sums in place of the gradients they took."""
        self.sum_open()
        return [self.done.get(k, g) for k, g in enumerate(grads)]
