"""Pure planning of the QDWH spectral divide and conquer (dmath/linalg/qdwh.py): the iteration's
weights, the split points, the projector's rank, and which worker solves which leaf. No workers,
no matrices: numbers in, numbers out (unit-tested in tests/unit/test_linalg_dc_plan.py).

QDWH (Nakatsukasa, Bai, Gygi 2010; Nakatsukasa & Higham 2013): X_0 = A / alpha
with alpha >= ||A||_2, so A's singular values lie in [l, 1] after scaling;
each step X_{k+1} = X_k (a I + b X_k^T X_k)(I + c X_k^T X_k)^-1 maps that
interval to [l_{k+1}, 1] with (a, b, c) chosen (dynamically) to make l_{k+1}
as large as a rational function of degree (3, 2) can.
"""
import math

import numpy as np


def weights(l):
    """(a, b, c, l_next) of the dynamically weighted Halley step for the lower bound l in (0, 1]
    of the iterate's singular values (Nakatsukasa, Bai, Gygi 2010, eq. (3.11)), computed in
    float64 whatever the matrix's dtype."""
    l = min(max(float(l), 1e-300 ** 0.25), 1.0)
    l2 = l * l
    d = (4.0 * (1.0 - l2) / (l2 * l2)) ** (1.0 / 3.0)
    s = math.sqrt(1.0 + d)
    a = s + 0.5 * math.sqrt(max(8.0 - 4.0 * d + 8.0 * (2.0 - l2) / (l2 * s), 0.0))
    b = (a - 1.0) ** 2 / 4.0
    c = a + b - 1.0
    l_next = min(l * (a + b * l2) / (1.0 + c * l2), 1.0)
    return a, b, c, l_next


def schedule(l, eps, limit=20):
    """The c of every step from lower bound l until l is within 10 eps of 1 (at most `limit` steps):
    what the iteration will do, for planning and tests (c > 100: the QR form, else Cholesky)."""
    cs = []
    while 1.0 - l > 10 * eps and len(cs) < limit:
        _, _, c, l = weights(l)
        cs.append(c)
    return cs


#: the QR form of a step while c exceeds this (the Cholesky factor of I + c X^T X would lose
#: digits: its condition number is up to 1 + c; Nakatsukasa & Higham 2013, section 4)
QR_ABOVE = 100.0


def split_candidates(diagonal, spread):
    """Split points to try, best first, for a symmetric matrix with `diagonal` (its diagonal
    elements) and `spread` (the RMS deviation of its eigenvalues from their mean,
    ||A - mean I||_F / sqrt(n)).

    The median of the diagonal splits the spectrum near its middle for most matrices (JAX's
    choice); the mean of the eigenvalues (= of the diagonal) has eigenvalues on both sides
    unless all are equal. Either may coincide with an eigenvalue (a diagonal matrix: every
    diagonal element is one), which leaves the polar factor undefined there: the next points
    are the mean moved by a fraction of the spread, irrational multiples so that they do not
    fall on a structured spectrum."""
    d = np.asarray(diagonal, dtype=np.float64).reshape(-1)
    mean = float(d.mean())
    out = [float(np.median(d)), mean]
    for f in (0.1 * math.sqrt(2), -0.1 * math.sqrt(3), 0.3 * math.sqrt(5), -0.3 * math.sqrt(7)):
        out.append(mean + f * spread)
    return out


def projector_rank(trace_u, n, slack=0.1):
    """The number of eigenvalues above the split, from the trace of the polar factor U of
    A - sigma I (U = V sign(Lambda - sigma) V^T: trace = above - below), or None when the trace
    is not within `slack` of an integer of n's parity (an eigenvalue at sigma, or QDWH not
    converged on one close to it): that split point is refused."""
    k = (float(trace_u) + n) / 2.0
    if not math.isfinite(k):
        return None
    r = int(round(k))
    if abs(k - r) > slack or r < 0 or r > n:
        return None
    return r


def default_leaf(n, workers, least):
    """The leaf size when none is given: a quarter above n / workers, so that the tree has about
    one leaf per worker (all solved at the same time, one per worker), but at least `least`.

    The splits are there to spread the local solver's work over the workers, and each costs
    several times the flops of solving its node locally: more levels than that make the tree
    dearer, not faster. (One worker: the whole matrix is one leaf, the local solver alone.) The
    quarter: the median of the diagonal halves a node only roughly, and a node just above the
    leaf size would cost a whole split for two small leaves."""
    return max(int(least), -(-5 * int(n) // (4 * max(1, int(workers)))))


def assign_leaves(sizes, workers):
    """The worker of each leaf (a list parallel to `sizes`): the largest leaves first, each to the
    worker with the least work so far (the eigensolver's n^3), ties to the lower rank
    (longest-processing-time scheduling: within 4/3 of the best makespan)."""
    load = [0.0] * workers
    out = [0] * len(sizes)
    for i in sorted(range(len(sizes)), key=lambda i: (-sizes[i], i)):
        w = min(range(workers), key=lambda r: (load[r], r))
        out[i] = w
        load[w] += float(sizes[i]) ** 3
    return out
