"""2-D convolution kernels: im2col + one GEMM per worker on its own samples.

The batch is in a row layout (each worker holds whole samples) and the
kernel matrix W (K, C*kh*kw) and bias (1, K) are replicated, so the forward
pass and the data gradient need no communication. The weight gradients are
each worker's sums over its samples: Partial over a RowBlock batch (the
caller all-reduces them once, for all layers, when it wants), complete on
every member of a Replicated batch. float16 data computes in float32.
"""
from .. import backend, memory
from ..runtime import kernel
from . import nn_rows as rows
from .nn_windows import col2im, im2col


@kernel("nn_conv2d")
def _conv2d(call):
    """static = (Geometry, has_bias); inputs X, W[, b]; output Y (n, K*Ho*Wo).

    Y_k (K, n*Ho*Wo) = W @ im2col(X), then reordered to NCHW rows.
    """
    g, has_bias = call.entry.static
    x = rows.local(call.inputs[0])
    if x is None:
        return rows.nothing_here(call)
    acc = rows.compute_dtype(x.dtype)
    # the GEMM reads the data's dtype (float16 stays half: half the bytes) and accumulates in acc
    w = rows.local(call.inputs[1]).astype(x.dtype, copy=False)
    n, k, length = x.shape[0], w.shape[0], g.out_h * g.out_w
    y = rows.matmul(w, im2col(x, g, x.dtype), memory.empty((k, n * length), acc))
    y = y.reshape(k, n, length).transpose(1, 0, 2)
    (out,) = rows.new_output(call, 0)
    o3 = out.reshape(n, k, length)
    if has_bias:
        o3[...] = y + rows.local(call.inputs[2]).astype(acc, copy=False).reshape(1, k, 1)
    else:
        o3[...] = y
    return [rows.shard(call, 0, [out])]


@kernel("nn_conv2d_backward")
def _conv2d_backward(call):
    """static = (Geometry, need_dx); inputs dY, X, W; outputs [dX,] dW, db.

    With dY_k (K, n*Ho*Wo) the output gradient in GEMM order:
    dW = dY_k @ im2col(X)^T, db = row sums of dY_k (both over this worker's
    samples only), dX = col2im(W^T @ dY_k).
    """
    xp = backend.current().xp
    g, need_dx = call.entry.static
    dy, x = rows.local(call.inputs[0]), rows.local(call.inputs[1])
    if x is None:
        return rows.nothing_here(call)
    acc = rows.compute_dtype(x.dtype)
    w = rows.local(call.inputs[2]).astype(x.dtype, copy=False)
    n, k, length = x.shape[0], w.shape[0], g.out_h * g.out_w
    # (n, K, L) -> (K, n*L): one copy, the layout both GEMMs read
    dy_k = xp.ascontiguousarray(dy.reshape(n, k, length).transpose(1, 0, 2), dtype=x.dtype).reshape(k, n * length)
    first = 1 if need_dx else 0
    (dw,) = rows.new_output(call, first)
    (db,) = rows.new_output(call, first + 1)
    rows.matmul(dy_k, im2col(x, g, x.dtype).T, dw)
    db[...] = dy_k.sum(axis=1, dtype=acc).reshape(1, k)
    shards = [rows.shard(call, first, [dw]), rows.shard(call, first + 1, [db])]
    if need_dx:
        dcols = rows.matmul(w.T, dy_k, memory.empty((w.shape[1], n * length), acc))
        (dx,) = rows.new_output(call, 0)
        dx.reshape(n, g.channels, g.height, g.width)[...] = col2im(dcols, n, g, acc)
        shards.insert(0, rows.shard(call, 0, [dx]))
    return shards
