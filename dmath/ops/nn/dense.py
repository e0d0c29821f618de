"""Gradients of a dense layer y = x @ w (+ b) over a batch in a row layout (`dense_backward`).

`dmath.gemm(x, dy, trans_a=True)` of a RowBlock batch is a Partial product,
and in float16 gemm sums the workers' float32 addends before its one
rounding (so that its value is the same at any worker count): an exchange
on the compute stream, in the middle of a training step's backward pass,
where every worker waits for the slowest, after which the data-parallel
gradient bucket sums the result over the workers once more. Here the
weight and bias gradients are what conv2d_backward's are: each worker's sum
over its own samples (float32 accumulation for float16 data, one rounding to
w's dtype), Partial over the batch's workers, with no communication; the
caller sums them when it wants (a gradient bucket, all layers at once).
dX = dy @ w.T stays in the batch's row layout. For float32 and float64 the
values are the gemm and column-sum path's, bit for bit.
"""
from typing import NamedTuple

from ...errors import DTypeError
from ...runtime import define
from . import args, rows
from ..base import dispatch, new_meta


class DenseBackwardArgs(NamedTuple):
    """Static arguments of `nn_dense_backward`: which gradients are made."""
    need_dx: bool   # the data gradient (not for a first layer)
    need_dw: bool   # the weight gradient (not for a frozen layer)
    need_db: bool   # the bias gradient (not for a layer without a bias)


DENSE_BACKWARD = define("nn_dense_backward", DenseBackwardArgs)


def dense_backward(dy, x, w, need_dx=True, need_dw=True, need_db=True):
    """Gradients of y = x @ w (+ b): (dX or None, dW or None, dB or None).

    x (N, in) and dy (N, out) are rows of one batch (dy is put in x's row
    layout); w (in, out) is replicated over the batch's workers; the three
    share a dtype. dX = dy @ w.T in x's row layout; dW = x.T @ dy (in, out)
    and dB (1, out), the column sums of dy, are sums over the samples in w's
    dtype: Partial over the batch's workers for a RowBlock batch (each
    worker's addend over its own samples, accumulated in float32 for
    float16 data and rounded once: no communication), Replicated for a
    Replicated batch. A gradient not asked for is None and costs nothing.
    In float16 an addend may overflow where the whole sum would not (rows
    that cancel only across workers): an inf that a loss scale's finiteness
    check turns into a skipped step, as for conv2d_backward's gradients and
    PyTorch's float16 gradients under DDP.
    """
    x = args.rows(x, "dense_backward: x")
    args.require(dy, "dense_backward: dy")
    args.require(w, "dense_backward: w")
    n, features = x.shape
    args.expect_shape(w, (features, w.shape[1]), "dense_backward: w")
    out = w.shape[1]
    args.expect_shape(dy, (n, out), "dense_backward: dy")
    if not (x.dtype == dy.dtype == w.dtype):
        raise DTypeError(f"dense_backward: dy, x and w must share a dtype, got {dy.dtype}, {x.dtype} and {w.dtype}")
    flags = {name: args.flag(v, f"dense_backward: {name}")
             for name, v in (("need_dx", need_dx), ("need_dw", need_dw), ("need_db", need_db))}
    static = DENSE_BACKWARD.static(**flags)
    dy = args.like(dy, x, "dense_backward: dy")
    w = args.replicated(w, args.group_of(x), "dense_backward: w")
    sums = args.sum_layout(x)
    metas = (new_meta(x.layout, x.shape, x.dtype), new_meta(sums, w.shape, w.dtype), new_meta(sums, (1, out), w.dtype))
    places = args.gradient_places(static)
    outs = [m for m, at in zip(metas, places) if at is not None]
    if not outs:                    # nothing wanted: no command
        return None, None, None
    made, _ = dispatch("nn_dense_backward", [dy, x, w], outs, static=static)
    return tuple(None if at is None else made[at] for at in places)


@DENSE_BACKWARD.kernel(capturable=True)
def _dense_backward(call):
    """Inputs dY, X, W; outputs [dX,] [dW,] [dB] (`args.gradient_places`), from this worker's rows only."""
    dy, x = rows.local(call.inputs[0]), rows.local(call.inputs[1])
    if x is None:
        return rows.nothing_here(call)
    w = rows.local(call.inputs[2])
    at_dx, at_dw, at_db = args.gradient_places(call.entry.static)
    shards = []
    if at_dx is not None:
        (dx,) = rows.new_output(call, at_dx)
        rows.matmul(dy, w.T, dx)
        shards.append(rows.shard(call, at_dx, [dx]))
    if at_dw is not None:
        (dw,) = rows.new_output(call, at_dw)
        rows.matmul(x.T, dy, dw)            # (no rows here: BLAS writes zeros for an empty inner dimension)
        shards.append(rows.shard(call, at_dw, [dw]))
    if at_db is not None:
        (db,) = rows.new_output(call, at_db)
        db[...] = dy.sum(axis=0, dtype=rows.compute_dtype(dy.dtype)).reshape(db.shape)
        shards.append(rows.shard(call, at_db, [db]))
    return shards
