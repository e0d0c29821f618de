"""The pure planning of the QDWH spectral divide and conquer (dmath/linalg/dc_plan.py): the
dynamically weighted Halley weights against their defining properties, the iteration counts the
literature states, the split points, the projector's rank, and the leaves' workers. No workers."""
import math

import numpy as np
import pytest

from dmath.linalg import dc_plan


def _step(sigma, a, b, c):
    """The scalar map of one QDWH step applied to a singular value."""
    return sigma * (a + b * sigma ** 2) / (1 + c * sigma ** 2)


@pytest.mark.parametrize("l", [1e-16, 1e-8, 1e-3, 0.1, 0.5, 0.9, 0.999999])
def test_weights_map_the_interval_into_itself_and_raise_the_lower_bound(l):
    a, b, c, l_next = dc_plan.weights(l)
    assert c == pytest.approx(a + b - 1) and b == pytest.approx((a - 1) ** 2 / 4)
    assert l < l_next <= 1
    assert _step(l, a, b, c) == pytest.approx(l_next, rel=1e-12)
    sigmas = np.linspace(l, 1, 2001)
    images = _step(sigmas, a, b, c)
    # every singular value in [l, 1] lands in [l_next, 1]: the bound is a lower bound again
    assert images.min() >= l_next * (1 - 1e-12) and images.max() <= 1 + 1e-12


def test_weights_at_one_are_halley():
    a, b, c, l_next = dc_plan.weights(1.0)
    assert (a, b, c, l_next) == pytest.approx((3.0, 1.0, 3.0, 1.0))


def test_the_iteration_counts_from_eps():
    # Nakatsukasa & Higham 2013: from l = eps, six steps in double precision; two of them through QR
    e64 = float(np.finfo(np.float64).eps)
    cs = dc_plan.schedule(e64, e64)
    assert len(cs) == 6
    assert sum(c > dc_plan.QR_ABOVE for c in cs) == 2
    e32 = float(np.finfo(np.float32).eps)
    assert len(dc_plan.schedule(e32, e32)) <= 5
    assert dc_plan.schedule(1.0, e64) == []


def test_split_candidates():
    d = np.array([3.0, -1.0, 7.0, 0.5, 2.0])
    out = dc_plan.split_candidates(d, spread=2.0)
    assert out[0] == 2.0 and out[1] == pytest.approx(d.mean())
    assert len(set(out)) == len(out)
    # the later points stay within the spectrum's spread of its mean
    assert all(abs(x - d.mean()) < 2.0 for x in out[1:])


@pytest.mark.parametrize("trace,n,want", [(0.0, 10, 5), (4.0, 10, 7), (-10.0, 10, 0), (10.0, 10, 10),
                                          (3.02, 9, 6), (-2.97, 9, 3)])
def test_projector_rank(trace, n, want):
    assert dc_plan.projector_rank(trace, n) == want


@pytest.mark.parametrize("trace,n", [(1.0, 10), (0.5, 9), (math.nan, 4), (12.0, 10), (-11.0, 10)])
def test_projector_rank_refuses(trace, n):
    # off parity (an eigenvalue at the split point halves a projector eigenvalue), NaN, out of range
    assert dc_plan.projector_rank(trace, n) is None


def test_assign_leaves_balances_cubes():
    sizes = [100, 10, 100, 50, 50, 10]
    owners = dc_plan.assign_leaves(sizes, 2)
    assert owners[0] != owners[2]                   # the two large ones on different workers
    load = np.zeros(2)
    for s, w in zip(sizes, owners):
        load[w] += s ** 3
    assert load.max() <= 4 / 3 * max(np.sum(np.array(sizes) ** 3) / 2, max(sizes) ** 3)


@pytest.mark.parametrize("P", [1, 2, 3, 4])
def test_assign_leaves_uses_every_worker(P):
    sizes = [7, 7, 6, 5, 7, 3, 2]
    owners = dc_plan.assign_leaves(sizes, P)
    assert len(owners) == len(sizes) and set(owners) == set(range(min(P, len(sizes))))
    assert dc_plan.assign_leaves([], P) == []


@pytest.mark.parametrize("n,P,least,want", [(16384, 4, 2560, 5120), (16384, 2, 2560, 10240), (16384, 1, 2560, 20480),
                                            (1000, 8, 640, 640), (37, 3, 1, 16)])
def test_default_leaf(n, P, least, want):
    # about one leaf per worker (n / P and a quarter), never below the backend's least
    assert dc_plan.default_leaf(n, P, least) == want
