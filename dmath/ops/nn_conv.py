"""2-D convolution kernels: cuDNN on a GPU, im2col + GEMM everywhere else (and where cuDNN declines).

The batch is in a row layout (each worker holds whole samples) and the
kernel matrix W (K, C/groups*kh*kw) and bias (1, K) are replicated, so the
forward pass and the data gradient need no communication. The weight
gradients are each worker's sums over its samples: Partial over a RowBlock
batch (the caller all-reduces them once, for all layers, when it wants),
complete on every member of a Replicated batch.

Grouped convolution (groups > 1): input channel group q meets only the
kernels of output group q; im2col's rows are channel-major, so group q is
one contiguous band of them and each group is one GEMM. float16 data
computes in float32.
"""
from .. import backend, cudnn, memory
from ..comm.control import gather_objects
from ..runtime import generic, kernel
from . import nn_rows as rows
from .nn_windows import col2im, im2col


def _bands(g, groups, k):
    """Per group: (kernel rows, im2col rows) as slices."""
    cg, kg = g.channels // groups, k // groups
    return [(slice(q * kg, (q + 1) * kg), slice(q * cg * g.taps, (q + 1) * cg * g.taps)) for q in range(groups)]


@kernel("nn_conv2d", capturable=True)
def _conv2d(call):
    """static = (Geometry, has_bias, groups, activation); inputs X, W[, b]; output Y (n, K*Ho*Wo).

    Y_k (K, n*Ho*Wo) = W @ im2col(X), one GEMM per group, then reordered to NCHW rows (plus the
    bias, then the activation: '' or 'relu').
    """
    g, has_bias, groups, activation = call.entry.static
    x = rows.local(call.inputs[0])
    if x is None:
        return rows.nothing_here(call)
    acc = rows.compute_dtype(x.dtype)
    # the GEMM reads the data's dtype (float16 stays half: half the bytes) and accumulates in acc
    w = rows.local(call.inputs[1]).astype(x.dtype, copy=False)
    n, k, length = x.shape[0], w.shape[0], g.out_h * g.out_w
    cols = im2col(x, g, x.dtype)
    y = memory.empty((k, n * length), acc)
    for kr, cr in _bands(g, groups, k):
        rows.matmul(w[kr], cols[cr], y[kr])
    y = y.reshape(k, n, length).transpose(1, 0, 2)
    (out,) = rows.new_output(call, 0)
    o3 = out.reshape(n, k, length)
    if has_bias:
        o3[...] = y + rows.local(call.inputs[2]).astype(acc, copy=False).reshape(1, k, 1)
    else:
        o3[...] = y
    if activation == "relu":
        backend.current().xp.maximum(out, 0, out=out)
    return [rows.shard(call, 0, [out])]


@kernel("nn_conv2d_backward", capturable=True)
def _conv2d_backward(call):
    """static = (Geometry, need_dx, groups); inputs dY, X, W; outputs [dX,] dW, db.

    With dY_k (K, n*Ho*Wo) the output gradient in GEMM order, per group:
    dW = dY_k @ im2col(X)^T, db = row sums of dY_k (both over this worker's
    samples only), dX = col2im(W^T @ dY_k).
    """
    xp = backend.current().xp
    g, need_dx, groups = call.entry.static
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
    cols = im2col(x, g, x.dtype)
    bands = _bands(g, groups, k)
    for kr, cr in bands:
        rows.matmul(dy_k[kr], cols[cr].T, dw[kr])
    db[...] = dy_k.sum(axis=1, dtype=acc).reshape(1, k)
    shards = [rows.shard(call, first, [dw]), rows.shard(call, first + 1, [db])]
    if need_dx:
        dcols = memory.empty((g.channels * g.taps, n * length), acc)
        for kr, cr in bands:
            rows.matmul(w[kr].T, dy_k[kr], dcols[cr])
        (dx,) = rows.new_output(call, 0)
        dx.reshape(n, g.channels, g.height, g.width)[...] = col2im(dcols, n, g, acc)
        shards.insert(0, rows.shard(call, 0, [dx]))
    return shards


def bias_gradient(dy, n, k, acc):
    """The (1, K) sums of an (n, K*L) NCHW gradient over samples and pixels: first along each
    contiguous (sample, channel) row, then over the n samples (a reduction over two strided axes
    at once is several times slower on a GPU)."""
    return dy.reshape(n * k, -1).sum(axis=1, dtype=acc).reshape(n, k).sum(axis=0).reshape(1, k)


# ---- cuDNN -------------------------------------------------------------------------------------
def _key(direction, g, n, k, groups, dtype, epilogue=""):
    return cudnn.ConvKey(direction, n, g.channels, g.height, g.width, k, g.kh, g.kw, g.sh, g.sw, g.ph, g.pw,
                         g.dh, g.dw, groups, str(dtype), epilogue)


def _dense(a, dtype):
    """`a` as a C-contiguous array of `dtype` (cuDNN is given packed NCHW strides)."""
    return backend.current().xp.ascontiguousarray(a, dtype=dtype)


@kernel("nn_conv2d", backend="gpu", capturable=True)
def _conv2d_cudnn(call):
    """nn_conv2d through cuDNN's chosen plan (see dmath.cudnn), the bias and the activation fused
    into it (the graph's epilogue) where cuDNN can; im2col where cuDNN declines the convolution."""
    xp = backend.current().xp
    g, has_bias, groups, activation = call.entry.static
    x = rows.local(call.inputs[0])
    if x is None or x.shape[0] == 0 or not cudnn.available():
        return generic("nn_conv2d")(call)
    x = _dense(x, x.dtype)
    w = _dense(rows.local(call.inputs[1]), x.dtype)
    n, k = x.shape[0], w.shape[0]
    b = _dense(rows.local(call.inputs[2]), x.dtype) if has_bias else None
    (out,) = rows.new_output(call, 0)
    fused = ("bias" if has_bias else "") + ("_" if has_bias and activation else "") + activation
    if fused:
        ptrs = (x.data.ptr, w.data.ptr) + ((b.data.ptr,) if has_bias else ()) + (out.data.ptr,)
        try:
            cudnn.conv(_key("fprop", g, n, k, groups, x.dtype, fused), ptrs)
            return [rows.shard(call, 0, [out])]
        except cudnn.Refused:
            pass                     # the convolution alone, then the epilogue as separate passes
    try:
        cudnn.conv(_key("fprop", g, n, k, groups, x.dtype), (x.data.ptr, w.data.ptr, out.data.ptr))
    except cudnn.Refused:
        return generic("nn_conv2d")(call)
    if has_bias:
        o3 = out.reshape(n, k, g.out_h * g.out_w)
        o3 += b.reshape(1, k, 1)
    if activation == "relu":
        xp.maximum(out, 0, out=out)
    return [rows.shard(call, 0, [out])]


@kernel("nn_conv2d_backward", backend="gpu", capturable=True)
def _conv2d_backward_cudnn(call):
    """nn_conv2d_backward through cuDNN: the weight gradient (wgrad) and the data gradient (dgrad)."""
    g, need_dx, groups = call.entry.static
    dy, x = rows.local(call.inputs[0]), rows.local(call.inputs[1])
    if x is None or x.shape[0] == 0 or not cudnn.available():
        return generic("nn_conv2d_backward")(call)
    dtype = x.dtype
    x, dy = _dense(x, dtype), _dense(dy, dtype)
    w = _dense(rows.local(call.inputs[2]), dtype)
    n, k = x.shape[0], w.shape[0]
    first = 1 if need_dx else 0
    (dw,) = rows.new_output(call, first)
    (db,) = rows.new_output(call, first + 1)
    dw_io = dw if dw.dtype == dtype else memory.empty(dw.shape, dtype)
    dx = rows.new_output(call, 0)[0] if need_dx else None
    try:
        cudnn.conv(_key("wgrad", g, n, k, groups, dtype), (x.data.ptr, dy.data.ptr, dw_io.data.ptr))
        if need_dx:
            cudnn.conv(_key("dgrad", g, n, k, groups, dtype), (dy.data.ptr, w.data.ptr, dx.data.ptr))
    except cudnn.Refused:
        return generic("nn_conv2d_backward")(call)
    if dw_io is not dw:
        dw[...] = dw_io
    db[...] = bias_gradient(dy, n, k, rows.compute_dtype(dtype))
    shards = [rows.shard(call, first, [dw]), rows.shard(call, first + 1, [db])]
    if need_dx:
        shards.insert(0, rows.shard(call, 0, [dx]))
    return shards


@kernel("nn_explain_conv")
def _explain_conv(call):
    """Every worker's cuDNN status and plan choices, gathered on the master (a list by rank)."""
    call.result = gather_objects(call.world, {"status": cudnn.status(), "shapes": cudnn.explain()})
    return []
