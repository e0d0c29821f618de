"""Test helpers shared by tests/unit and tests/dist: the layout catalog and NumPy-side oracles.

Nothing here talks to workers; it only builds layouts and computes expected
values from `Distribution.owner_mask`, independently of the remap planner.
"""
import os

import numpy as np

import dmath
from dmath.layout import distribution

#: assert_allclose tolerances per dtype (values of order 1)
TOL = {
    "float16": dict(rtol=2e-3, atol=2e-3),
    "float32": dict(rtol=2e-6, atol=1e-6),
    "float64": dict(rtol=1e-12, atol=1e-12),
}


def tol(*dtypes):
    """The loosest tolerance among `dtypes` (the result of mixing them is at most that precise)."""
    order = ["float64", "float32", "float16"]
    worst = max((np.dtype(d).name for d in dtypes), key=order.index)
    return TOL[worst]


def runs_may_differ():
    """Whether two identical training runs may differ in their last bits: on GPUs, unless
    DMATH_DETERMINISTIC=1, cuDNN's plans include kernels whose sums' order varies from run to run
    (atomic split reductions), so tests that train twice compare at a tolerance there."""
    return os.environ.get("DMATH_DEVICE", "cpu") == "gpu" and os.environ.get("DMATH_DETERMINISTIC", "0") != "1"


def _uneven(n, p):
    """Uneven split sizes with a zero: (0, q, ..., q, rest)."""
    if p == 1:
        return (n,)
    q = n // p
    return (0,) + (q,) * (p - 2) + (n - q * (p - 2),)


def _tiles(shape, p):
    m, n = shape
    rows = (0, m // 2, m)
    cols = (0, n // 3, (2 * n) // 3, n)
    # six tiles over p workers: below 6 workers some worker owns several tiles
    owners = [[(p - 1 - (i * 3 + j)) % p for j in range(3)] for i in range(2)]
    return dmath.Tiles(rows, cols, owners)


def _tiles_subset(shape, p):
    m, n = shape
    return dmath.Tiles((0, (m + 1) // 2, m), (0, n // 2, n), [[p - 1, 0], [0, p - 1]])


def layout_cases(p):
    """[(name, factory)] with factory(shape) -> layout: every kind at worker count p."""
    last = p - 1
    cases = [
        ("rep", lambda s: dmath.Replicated()),
        ("partial", lambda s: dmath.Partial()),
        ("row", lambda s: dmath.RowBlock()),
        ("col", lambda s: dmath.ColBlock()),
        ("row_all_last", lambda s: dmath.RowBlock(sizes=(0,) * last + (s[0],))),
        ("col_uneven", lambda s: dmath.ColBlock(sizes=_uneven(s[1], p))),
        ("b2d", lambda s: dmath.Block2D()),
        ("b2d_px1", lambda s: dmath.Block2D(grid=(p, 1))),
        ("bc23", lambda s: dmath.BlockCyclic((2, 3))),
        ("bc_grid", lambda s: dmath.BlockCyclic((1, 2), grid=(1, p))),
        ("tiles", lambda s: _tiles(s, p)),
        ("row_g_last", lambda s: dmath.RowBlock(group=[last])),
        ("b2d_g_rev", lambda s: dmath.Block2D(group=list(reversed(range(p))))),
    ]
    if p > 1:
        cases += [
            ("rep_g", lambda s: dmath.Replicated(group=[0, last])),
            ("rep_last", lambda s: dmath.Replicated(group=[last])),
            ("partial_g", lambda s: dmath.Partial(group=[last, 0])),
            ("col_g", lambda s: dmath.ColBlock(group=[last, 0], sizes=None)),
            ("tiles_g", lambda s: _tiles_subset(s, p)),
        ]
    return cases


def case_names(p):
    return [name for name, _ in layout_cases(p)]


def layout(name, shape, p):
    return dict(layout_cases(p))[name](shape)


# ---- expected traffic, from owner masks ----------------------------------------------
def _masks(dist, offset=(0, 0), shape=None):
    """Owner masks of `dist`, cropped to the window at `offset` of size `shape`."""
    shape = shape or dist.shape
    r0, c0 = offset
    return [dist.owner_mask(r)[r0:r0 + shape[0], c0:c0 + shape[1]] for r in range(dist.nworkers)]


def expected_recv(src, dst, offset=(0, 0)):
    """(per-worker elements received or None, total) for remapping `src` (read at window
    `offset`) into `dst`, the minimum from owner masks.

    - neither Partial: worker w receives |dst mask(w) AND NOT src mask(w)|;
    - Partial source (addends), distributed target: w receives its target
      elements once from every other source member;
    - Partial source into Replicated over the same group: an all-reduce,
      2 (p - 1) m n over the members (reduce-scatter then all-gather); over
      another group: a reduce-scatter onto RowBlock(source group), then its
      blocks spread to the target;
    - Partial target: only what is held outside the target group moves (its
      placement among the target members is the planner's choice, so only the
      total is given).
    """
    m, n = dst.shape
    p = dst.nworkers
    if not src.partial and not dst.partial:
        sm, dm = _masks(src, offset, dst.shape), _masks(dst)
        per = [int((dm[w] & ~sm[w]).sum()) for w in range(p)]
        return per, sum(per)
    if src.partial and dst.replicated:
        g = src.group
        if tuple(g) == tuple(dst.group):
            total = 2 * (len(g) - 1) * m * n
            return None, total
        mid = distribution(dmath.RowBlock(g), (m, n), p)
        step1 = [int(mid.owner_mask(w).sum()) * (len(g) - 1) if w in g else 0 for w in range(p)]
        step2, _ = expected_recv(mid, dst)
        per = [a + b for a, b in zip(step1, step2)]
        return per, sum(per)
    if src.partial and not dst.partial:
        g = src.group
        per = [int(dst.owner_mask(w).sum()) * (len(g) - (1 if w in g else 0)) for w in range(p)]
        return per, sum(per)
    if src.partial and dst.partial:
        outsiders = [s for s in src.group if s not in dst.group]
        return None, len(outsiders) * m * n
    # distributed or replicated source into a Partial target
    if src.replicated:
        common = set(src.group) & set(dst.group)
        return None, 0 if common else m * n
    sm = _masks(src, offset, dst.shape)
    return None, sum(int(sm[s].sum()) for s in range(p) if s not in dst.group)


# ---- building matrices (needs dmath.init) ------------------------------------------------
def make(x, lay, dtype=None):
    """A Matrix holding `x` in layout `lay`.

    A Partial matrix is made from a RowBlock one, so that its addends are
    really spread over the members (each holds its rows, zeros elsewhere)
    rather than sitting on one member.
    """
    if lay.partial:
        return dmath.from_numpy(x, dmath.RowBlock(), dtype=dtype).remap(lay)
    return dmath.from_numpy(x, lay, dtype=dtype)


def shard_state(m):
    """(version, buffers) of the master's own shard of `m` (the master is worker 0): what an in-place
    write must keep (the buffers) and change (the version)."""
    shard = dmath._runtime().table[m._handle]
    return shard.version, list(shard.pieces)


def values(shape, seed=0, lo=-1.0, hi=1.0):
    """Reproducible float64 test values in [lo, hi)."""
    return np.random.default_rng(seed).uniform(lo, hi, size=shape)


def uneven_remap(p):
    """A RowBlock matrix whose last worker holds nearly every row, and a memory limit under which
    remapping it to ColBlock is refused on that worker alone, inside the command: (numpy values,
    Matrix, limit in bytes). Call with no other limit set.

    The ledger admits the result (each worker's ColBlock piece fits), but the last worker's pack
    buffer (its rows of every other worker's columns) takes it past the limit, while the others'
    small buffers fit and they go on into the exchange with it; its live matrices are past half of
    the limit, so the remap is careful (dmath.memory.set_careful('auto')).
    """
    from dmath.memory import block_bytes
    rows, n = [8] * (p - 1) + [9600], 240      # large beside what kernels keep per signature
    x = values((sum(rows), n), 97)
    a = dmath.from_numpy(x, dmath.RowBlock(sizes=rows))
    cols = n // p                                           # the last worker's ColBlock columns
    out = block_bytes(sum(rows) * cols * 8)
    pack = block_bytes(rows[-1] * (n - cols) * 8)
    return x, a, dmath.memory.stats()[p - 1]["in_use"] + out + pack // 2


def shuffled_digits():
    """The 5,000 real MNIST digits of dnn.data.load_mnist_5k in a fixed shuffled order (x, y); the
    calling test is skipped where the subset cannot be had."""
    import pytest

    import dnn
    try:
        x, y = dnn.data.load_mnist_5k()
    except dnn.data.DataError as exc:
        pytest.skip(f"the MNIST 5k subset is not available here: {exc}")
    perm = np.random.default_rng(0).permutation(len(y))
    return x[perm], y[perm]
