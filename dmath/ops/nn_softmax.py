"""Row-wise softmax, log-softmax and the fused softmax cross-entropy, on each worker's rows.

A row is one sample, held whole by one worker, so the normalisation needs no
communication; only the batch-mean loss is summed over the batch's members
(one all-reduce of a single number). float16 data computes in float32.
"""
from .. import backend
from ..runtime import kernel
from ..runtime.registry import COLLECTIVES_IN_GRAPHS
from . import nn_rows as rows


def log_softmax_rows(x, dtype):
    """log softmax of every row of `x`, computed in `dtype` (max-shifted: no overflow)."""
    xp = backend.current().xp
    z = x.astype(dtype, copy=True)
    z -= z.max(axis=1, keepdims=True)
    z -= xp.log(xp.exp(z).sum(axis=1, keepdims=True))
    return z


@kernel("nn_softmax", capturable=True)
def _softmax(call):
    """static = (log,); input X; output softmax(X) or log_softmax(X), row-wise."""
    xp = backend.current().xp
    (log,) = call.entry.static
    x = rows.local(call.inputs[0])
    if x is None:
        return rows.nothing_here(call)
    z = log_softmax_rows(x, rows.compute_dtype(x.dtype))
    (out,) = rows.new_output(call, 0)
    out[...] = z if log else xp.exp(z)
    return [rows.shard(call, 0, [out])]


def _batch_on_each_member(entry):
    """Capturable when the loss needs no sum over workers (one member, or a replicated batch),
    or when the NCCL all-reduce of that sum may be captured."""
    d = entry.in_dists[0]
    return d.replicated or len(d.group) == 1 or COLLECTIVES_IN_GRAPHS


@kernel("nn_softmax_cross_entropy", capturable=_batch_on_each_member)
def _softmax_cross_entropy(call):
    """inputs logits, labels (same rows); outputs loss (1, 1) replicated over the batch's group, probs.

    loss = -sum(labels * log_softmax(logits)) / N, N the global batch size
    (scalars[0] = 1 / N).
    """
    xp = backend.current().xp
    x, t = rows.local(call.inputs[0]), rows.local(call.inputs[1])
    if x is None:
        return rows.nothing_here(call)
    (loss,) = rows.new_output(call, 0)
    (probs,) = rows.new_output(call, 1)
    z = log_softmax_rows(x, rows.compute_dtype(x.dtype))
    probs[...] = xp.exp(z)
    z *= t
    loss[...] = -z.sum(dtype=loss.dtype)
    rows.sum_over_batch(call, call.inputs[0].dist, loss.reshape(-1))
    loss *= call.scalars[0]
    return [rows.shard(call, 0, [loss]), rows.shard(call, 1, [probs])]


@kernel("nn_softmax_cross_entropy_backward", capturable=True)
def _softmax_cross_entropy_backward(call):
    """inputs probs, labels; output (probs - labels) * scalars[0] (scale / N), fused in one pass."""
    p, t = rows.local(call.inputs[0]), rows.local(call.inputs[1])
    if p is None:
        return rows.nothing_here(call)
    (out,) = rows.new_output(call, 0)
    cdt = rows.compute_dtype(out.dtype)
    out[...] = (p.astype(cdt, copy=False) - t.astype(cdt, copy=False)) * call.scalars[0]
    return [rows.shard(call, 0, [out])]
