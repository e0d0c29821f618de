"""Row-wise softmax, log-softmax and the fused softmax cross-entropy, on each worker's rows.

A row is one sample, held whole by one worker, so the normalisation needs no
communication; only the batch-mean loss is summed over the batch's members
(one all-reduce of a single number). float16 data computes in float32.
"""
from typing import NamedTuple

from ... import backend
from ...errors import ShapeError
from ...layout import Replicated
from ...runtime import define
from ...runtime.registry import collectives_in_graphs
from . import args, rows
from ..base import dispatch, new_meta


class SoftmaxArgs(NamedTuple):
    """Static arguments of `nn_softmax`."""
    log: bool        # log_softmax instead of softmax


SOFTMAX = define("nn_softmax", SoftmaxArgs)
# the loss's 1 / N and the backward's scale / N travel as scalars: no static arguments
SOFTMAX_CROSS_ENTROPY = define("nn_softmax_cross_entropy")
SOFTMAX_CROSS_ENTROPY_BACKWARD = define("nn_softmax_cross_entropy_backward")


# ---- master halves ----------------------------------------------------------------------
def _dispatch_softmax(x, log, what):
    x = args.rows(x, what)
    if x.shape[1] == 0:
        raise ShapeError(f"{what} needs at least one column, got shape {x.shape}")
    return dispatch("nn_softmax", [x], [new_meta(x.layout, x.shape, x.dtype)],
                    static=SOFTMAX.static(log=log))[0][0]


def softmax(x):
    """Row-wise softmax of the batch `x` (N, classes); float16 computes in float32."""
    return _dispatch_softmax(x, False, "softmax")


def log_softmax(x):
    """Row-wise log-softmax of the batch `x` (N, classes), without overflow for large logits."""
    return _dispatch_softmax(x, True, "log_softmax")


def softmax_cross_entropy(logits, labels):
    """The fused softmax and cross-entropy of a batch: (loss, probs).

    logits (N, classes); labels (N, classes), one-hot or any rows of
    probabilities (each summing to 1). loss is the batch mean of
    -sum(labels * log_softmax(logits)), a (1, 1) Matrix replicated over the
    batch's workers, float64 for float64 logits and float32 otherwise;
    probs = softmax(logits) in the logits' row layout and dtype, kept for
    softmax_cross_entropy_backward.
    """
    logits = args.rows(logits, "softmax_cross_entropy: logits")
    args.require(labels, "softmax_cross_entropy: labels")
    args.expect_shape(labels, logits.shape, "softmax_cross_entropy: labels")
    if logits.shape[0] == 0 or logits.shape[1] == 0:
        raise ShapeError(f"softmax_cross_entropy needs at least one sample and one class, got {logits.shape}")
    labels = args.like(labels, logits, "softmax_cross_entropy: labels")
    loss_dtype = "float64" if logits.dtype == "float64" else "float32"
    outs = [new_meta(Replicated(args.group_of(logits)), (1, 1), loss_dtype),
            new_meta(logits.layout, logits.shape, logits.dtype)]
    (loss, probs), _ = dispatch("nn_softmax_cross_entropy", [logits, labels], outs,
                                scalars=(1.0 / logits.shape[0],))
    return loss, probs


def softmax_cross_entropy_backward(probs, labels, scale=1.0):
    """d loss / d logits = (probs - labels) * scale / N, one fused pass (scale: e.g. a loss scale)."""
    probs = args.rows(probs, "softmax_cross_entropy_backward: probs")
    args.require(labels, "softmax_cross_entropy_backward: labels")
    args.expect_shape(labels, probs.shape, "softmax_cross_entropy_backward: labels")
    if probs.shape[0] == 0:
        raise ShapeError("softmax_cross_entropy_backward needs at least one sample")
    labels = args.like(labels, probs, "softmax_cross_entropy_backward: labels")
    scale = args.real(scale, "softmax_cross_entropy_backward: scale")
    out = new_meta(probs.layout, probs.shape, probs.dtype)
    return dispatch("nn_softmax_cross_entropy_backward", [probs, labels], [out],
                    scalars=(scale / probs.shape[0],))[0][0]


# ---- kernels -------------------------------------------------------------------------------


def log_softmax_rows(x, dtype):
    """log softmax of every row of `x`, computed in `dtype` (max-shifted: no overflow)."""
    xp = backend.current().xp
    z = x.astype(dtype, copy=True)
    z -= z.max(axis=1, keepdims=True)
    z -= xp.log(xp.exp(z).sum(axis=1, keepdims=True))
    return z


@SOFTMAX.kernel(capturable=True)
def _softmax(call):
    """Input X; output softmax(X) or log_softmax(X) (static.log), row-wise."""
    xp = backend.current().xp
    log = call.entry.static.log
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
    return d.replicated or len(d.group) == 1 or collectives_in_graphs()


@SOFTMAX_CROSS_ENTROPY.kernel(capturable=_batch_on_each_member)
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
    # 0 * log 0 is 0: a class whose probability underflowed to 0 adds nothing where its label is 0.
    # The product 0 * -inf made the loss NaN for finite logits (1e308 and -1e308 in a row; a hostile-
    # use probe); a NaN logit still gives NaN
    xp.copyto(z, 0, where=(z == -xp.inf) & (t == 0))
    z *= t
    loss[...] = -z.sum(dtype=loss.dtype)
    # summed over the batch's workers in the background (a GPU's communication stream): the backward
    # pass, which reads probs and never the loss, need not wait here for the slowest worker
    scale = call.scalars[0]

    def mean(total):
        total *= scale
    pending = rows.sum_over_batch_start(call, call.inputs[0].dist, loss.reshape(-1), mean)
    out = rows.shard(call, 0, [loss])
    if pending is not None:
        out.pending = [pending]
    return [out, rows.shard(call, 1, [probs])]


@SOFTMAX_CROSS_ENTROPY_BACKWARD.kernel(capturable=True)
def _softmax_cross_entropy_backward(call):
    """inputs probs, labels; output (probs - labels) * scalars[0] (scale / N), fused in one pass."""
    p, t = rows.local(call.inputs[0]), rows.local(call.inputs[1])
    if p is None:
        return rows.nothing_here(call)
    (out,) = rows.new_output(call, 0)
    cdt = rows.compute_dtype(out.dtype)
    out[...] = (p.astype(cdt, copy=False) - t.astype(cdt, copy=False)) * call.scalars[0]
    return [rows.shard(call, 0, [out])]
