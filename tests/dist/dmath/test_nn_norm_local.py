"""dmath.nn.batchnorm(synchronized=False): each worker's rows normalised by their own statistics.

Oracle: NumPy batch norm of each worker's rows apart (PyTorch's BatchNorm on every GPU of DDP); the
running statistics the average of the workers' own updates (unbiased with each worker's own count);
dgamma and dbeta the sums of the workers' own (Partial matrices). On one worker, or a batch every
worker holds whole, it is the synchronised batch norm.
"""
import numpy as np
import pytest

import dmath
import _nn_ref as ref
from _cases import make, tol, values
from dmath.layout import distribution

P = dmath.num_workers()
EPS, MOMENTUM = 1e-5, 0.1
#: kind -> (image_shape or None, channels, channels_last)
KINDS = {"1d": (None, 4, False), "2d": ((3, 2, 2), 3, False), "2d_last": ((3, 2, 2), 3, True)}


def _nchw(x, image, last):
    """Image rows as channel-major (N, C*S) for the oracle (channels-last rows are (N, S*C))."""
    if image is None or not last:
        return x
    c, s = image[0], image[1] * image[2]
    return x.reshape(len(x), s, c).transpose(0, 2, 1).reshape(len(x), -1)


def _back(y, image, last):
    if image is None or not last:
        return y
    c, s = image[0], image[1] * image[2]
    return y.reshape(len(y), c, s).transpose(0, 2, 1).reshape(len(y), -1)


def _oracle(x, dy, gamma, beta, rm, rv, image, c, last, blocks, relu):
    """Per-worker batch norm: (y, dx, dgamma, dbeta, running mean, running var, stats (2 P', C))."""
    xs, dys = _nchw(x, image, last), _nchw(dy, image, last)
    y, dx = np.empty_like(xs), np.empty_like(xs)
    dgamma, dbeta = np.zeros(c), np.zeros(c)
    run_m, run_v, stats = np.zeros(c), np.zeros(c), []
    for r0, r1 in blocks:
        xb = xs[r0:r1].reshape(r1 - r0, c, -1)
        mean, var = xb.mean(axis=(0, 2)), xb.var(axis=(0, 2))
        count = xb.shape[0] * xb.shape[2]
        r = 1 / np.sqrt(var + EPS)
        xhat = (xb - mean[:, None]) * r[:, None]
        yb = xhat * gamma.reshape(-1, 1) + beta.reshape(-1, 1)
        g = dys[r0:r1].reshape(yb.shape)
        if relu:
            g = g * (yb > 0)
            yb = np.maximum(yb, 0)
        y[r0:r1] = yb.reshape(r1 - r0, -1)
        db, dg = g.sum(axis=(0, 2)), (g * xhat).sum(axis=(0, 2))
        dx[r0:r1] = ((gamma.reshape(-1, 1) * r[:, None] / count)
                     * (count * g - db[:, None] - xhat * dg[:, None])).reshape(r1 - r0, -1)
        dgamma += dg
        dbeta += db
        run_m += ((1 - MOMENTUM) * rm.reshape(-1) + MOMENTUM * mean) / len(blocks)
        run_v += ((1 - MOMENTUM) * rv.reshape(-1) + MOMENTUM * var * count / (count - 1)) / len(blocks)
        stats += [mean, r]
    return (_back(y, image, last), _back(dx, image, last), dgamma, dbeta, run_m, run_v, np.stack(stats))


def _blocks(lay, n):
    """(first, stop) of each worker's rows, in the group's order."""
    dist = distribution(lay, (n, 1), P)
    rows = [np.flatnonzero(dist.owner_mask(r)[:, 0]) for r in dist.group]
    return [(int(r[0]), int(r[-1]) + 1) for r in rows if len(r)]


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("relu", [False, True])
@pytest.mark.parametrize("kind", list(KINDS))
def test_each_worker_normalises_with_its_own_statistics(kind, relu, dtype):
    image, c, last = KINDS[kind]
    f = c * (image[1] * image[2] if image else 1)
    n = 2 * P + 1                       # uneven blocks of two or three samples
    x, dy = values((n, f), 1, -1.0, 3.0), values((n, f), 2)
    gamma, beta = values((1, c), 3, 0.5, 1.5), values((1, c), 4)
    rm, rv = values((1, c), 5), values((1, c), 6, 0.5, 2.0)
    lay = dmath.RowBlock()
    rep = dmath.Replicated()
    xm = make(x, lay, dtype)
    mats = [make(a, rep, dtype) for a in (gamma, beta, rm, rv)]
    y, saved = dmath.nn.batchnorm(xm, *mats, image_shape=image, momentum=MOMENTUM, eps=EPS,
                                  channels_last=last, activation="relu" if relu else None, synchronized=False)
    dx, dg, db = dmath.nn.batchnorm_backward(make(dy, lay, dtype), xm, mats[0], saved, image_shape=image,
                                             channels_last=last, y=y if relu else None)
    blocks = _blocks(lay, n)
    want = _oracle(x, dy, gamma, beta, rm, rv, image, c, last, blocks, relu)
    t = tol(dtype) if dtype == "float64" else dict(rtol=1e-5, atol=2e-5)   # (dx cancels in float32)
    for got, exp in zip((y, dx, dg, db), want[:4]):
        np.testing.assert_allclose(got.to_numpy().reshape(exp.shape), exp, **t)
    if P == 1:                          # one worker: the synchronised batch norm, updated in place
        assert saved.running is None
        running = [mats[2].to_numpy(), mats[3].to_numpy()]
    else:
        assert saved.stats.layout.resolved(P) == dmath.RowBlock(tuple(range(P)), (2,) * P)
        assert all(m.layout.partial for m in saved.running + (dg, db))
        np.testing.assert_array_equal(mats[2].to_numpy(), rm.astype(dtype))   # as they were: the terms carry
        np.testing.assert_array_equal(mats[3].to_numpy(), rv.astype(dtype))
        running = [m.to_numpy() for m in dmath.sum_partials(list(saved.running))]
        np.testing.assert_allclose(saved.stats.to_numpy(), want[6], **t)
    np.testing.assert_allclose(running[0].reshape(-1), want[4], **t)
    np.testing.assert_allclose(running[1].reshape(-1), want[5], **t)


def test_a_batch_every_worker_holds_is_the_synchronised_one():
    """Replicated rows: every worker's own statistics are the whole batch's; nothing changes."""
    x, gamma, beta = values((5, 4), 7), values((1, 4), 8, 0.5, 1.5), values((1, 4), 9)
    got = []
    for sync in (True, False):
        rm, rv = make(np.zeros((1, 4)), dmath.Replicated(), "float64"), make(np.ones((1, 4)), dmath.Replicated(),
                                                                             "float64")
        y, saved = dmath.nn.batchnorm(make(x, dmath.Replicated(), "float64"), make(gamma, dmath.Replicated(),
                                      "float64"), make(beta, dmath.Replicated(), "float64"), rm, rv,
                                      synchronized=sync)
        assert saved.running is None
        got.append((y.to_numpy(), rm.to_numpy(), rv.to_numpy()))
    for a, b in zip(*got):
        np.testing.assert_array_equal(a, b)


def test_bad_arguments_are_refused():
    x = make(values((2 * P, 4), 10), dmath.RowBlock(), "float64")
    params = [make(a, dmath.Replicated(), "float64") for a in (np.ones((1, 4)), np.zeros((1, 4)),
                                                                 np.zeros((1, 4)), np.ones((1, 4)))]
    with pytest.raises(dmath.DMathError, match="synchronized must be True or False"):
        dmath.nn.batchnorm(x, *params, synchronized="no")
    if P == 1:
        return
    one_each = make(values((P, 4), 11), dmath.RowBlock(), "float64")     # one value per channel a worker
    with pytest.raises(dmath.ShapeError, match="worker 0 holds 1"):
        dmath.nn.batchnorm(one_each, *params, synchronized=False)
    y, saved = dmath.nn.batchnorm(x, *params, synchronized=False)
    with pytest.raises(dmath.LayoutError, match="own statistics"):
        dmath.nn.batchnorm_backward(y.remap(dmath.Replicated()), x.remap(dmath.Replicated()), params[0], saved)
    other = dmath.RowBlock(sizes=(3,) + (2,) * (P - 2) + (1,))      # the same workers, other rows each
    with pytest.raises(dmath.LayoutError, match="own statistics"):
        dmath.nn.batchnorm_backward(y.remap(other), x.remap(other), params[0], saved)
