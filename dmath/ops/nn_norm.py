"""Batch normalisation kernels (BatchNorm1d over features, BatchNorm2d over channels).

Statistics are over the whole batch: each member of a RowBlock batch sums its
samples and the sums are all-reduced over the batch's group, so every worker
normalises with the statistics a single worker would compute (up to the
order of the additions). The mean and the variance take two passes (and two
all-reduces of C numbers): the variance is a sum of squared deviations,
never E[x^2] - E[x]^2, which cancels badly in float32. float16 data computes
in float32.

A batch of N samples with C channels of S = H*W pixels (S = 1 for 1d) is
viewed as (n, C, S); per-channel statistics run over n and S.
"""
from .. import backend
from ..runtime import kernel
from ..runtime.registry import COLLECTIVES_IN_GRAPHS
from . import nn_rows as rows


def _channels(x, channels, dtype):
    # explicit sizes: a worker may hold no samples, and -1 cannot be inferred from an empty array
    return x.reshape(x.shape[0], channels, x.shape[1] // channels).astype(dtype, copy=False)


def _channel_sums(a3):
    """Sums over samples and pixels of an (n, C, S) array: along each contiguous row of pixels first
    (one strided reduction over two axes at once is several times slower on a GPU)."""
    return a3.sum(axis=2).sum(axis=0)


def _vec(a, dtype):
    """A replicated (1, C) or (2, C) parameter row as a (C, 1) column that broadcasts over (n, C, S)."""
    return a.reshape(-1, 1).astype(dtype, copy=False)


@kernel("nn_batchnorm", capturable=lambda entry: COLLECTIVES_IN_GRAPHS or entry.in_dists[0].replicated)
def _batchnorm(call):
    """static = (channels, training); inputs X, gamma, beta, running_mean, running_var;
    outputs Y, stats (2, C) = [mean; 1/sqrt(var + eps)], and, when training, running_mean
    and running_var updated in place. scalars = (momentum, eps, M / (M - 1)), M = N * S.
    """
    xp = backend.current().xp
    channels, training = call.entry.static
    momentum, eps, unbias = call.scalars
    src = call.inputs[0]
    x = rows.local(src)
    if x is None:
        return rows.nothing_here(call)
    (stats,) = rows.new_output(call, 1)
    cdt = stats.dtype
    x3 = _channels(x, channels, cdt)
    rm, rv = rows.local(call.inputs[3]), rows.local(call.inputs[4])
    if training:
        count = src.dist.shape[0] * x3.shape[2]
        mean = _channel_sums(x3)
        rows.sum_over_batch(call, src.dist, mean)
        mean *= 1.0 / count
        dev = x3 - mean.reshape(-1, 1)
        var = _channel_sums(dev * dev)
        rows.sum_over_batch(call, src.dist, var)
        var *= 1.0 / count
        # PyTorch's convention: the running variance is the unbiased estimate
        rm[...] = (1.0 - momentum) * rm + momentum * mean.reshape(rm.shape)
        rv[...] = (1.0 - momentum) * rv + (momentum * unbias) * var.reshape(rv.shape)
    else:
        mean, var = rm.reshape(-1).astype(cdt), rv.reshape(-1).astype(cdt)
        dev = x3 - mean.reshape(-1, 1)
    stats[0] = mean
    stats[1] = 1.0 / xp.sqrt(var + eps)
    gamma, beta = rows.local(call.inputs[1]), rows.local(call.inputs[2])
    (out,) = rows.new_output(call, 0)
    scale = stats[1].reshape(-1, 1) * _vec(gamma, cdt)
    out.reshape(x3.shape)[...] = dev * scale + _vec(beta, cdt)
    shards = [rows.shard(call, 0, [out]), rows.shard(call, 1, [stats])]
    if training:
        shards += [call.inputs[3], call.inputs[4]]
    return shards


@kernel("nn_batchnorm_backward", capturable=lambda entry: COLLECTIVES_IN_GRAPHS or entry.in_dists[1].replicated)
def _batchnorm_backward(call):
    """static = (channels, training); inputs dY, X, gamma, stats; outputs dX, dgamma, dbeta.

    With x_hat = (x - mean) * r (r = 1/sqrt(var + eps)), over the M values of a channel:
      dbeta = sum(dy), dgamma = sum(dy * x_hat),
      training: dx = gamma * r / M * (M * dy - dbeta - x_hat * dgamma)
      eval:     dx = gamma * r * dy   (the running statistics are constants)
    """
    xp = backend.current().xp
    channels, training = call.entry.static
    src = call.inputs[1]
    dy, x = rows.local(call.inputs[0]), rows.local(src)
    if x is None:
        return rows.nothing_here(call)
    stats = rows.local(call.inputs[3])
    cdt = stats.dtype
    x3, dy3 = _channels(x, channels, cdt), _channels(dy, channels, cdt)
    mean, r = stats[0].reshape(-1, 1), stats[1].reshape(-1, 1)
    xhat = (x3 - mean) * r
    sums = xp.empty(2 * channels, dtype=cdt)
    sums[:channels] = _channel_sums(dy3)
    sums[channels:] = _channel_sums(dy3 * xhat)
    rows.sum_over_batch(call, src.dist, sums)
    dbeta, dgamma = sums[:channels].reshape(-1, 1), sums[channels:].reshape(-1, 1)
    g = _vec(rows.local(call.inputs[2]), cdt)
    (dx,) = rows.new_output(call, 0)
    if training:
        count = src.dist.shape[0] * x3.shape[2]
        dx.reshape(x3.shape)[...] = (g * r * (1.0 / count)) * (count * dy3 - dbeta - xhat * dgamma)
    else:
        dx.reshape(x3.shape)[...] = (g * r) * dy3
    (dg,) = rows.new_output(call, 1)
    (db,) = rows.new_output(call, 2)
    dg[...] = dgamma.reshape(dg.shape)
    db[...] = dbeta.reshape(db.shape)
    return [rows.shard(call, 0, [dx]), rows.shard(call, 1, [dg]), rows.shard(call, 2, [db])]
