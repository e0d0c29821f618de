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

The master halves (`conv2d`, `conv2d_backward`, `explain_conv2d`) check the
window with dmath/planning/conv.py, the geometry every caller shares.
"""
from typing import NamedTuple

from ... import backend, memory, settings, tuning
from ...comm.control import gather_objects
from ...errors import DMathError
from ...gpu import cudnn
from ...planning import conv as window
from ...planning.conv import Geometry
from ...runtime import define, generic
from ...runtime.registry import capture_hook
from . import args, rows
from ..base import dispatch, new_meta
from .windows import channels_first, channels_last_into, col2im, im2col

# the side streams' cuDNN workspaces are made before a capture on several streams, never inside it
capture_hook(cudnn.prepare_lanes)


class Conv2dArgs(NamedTuple):
    """Static arguments of `nn_conv2d`."""
    geometry: Geometry
    has_bias: bool       # a (1, K) bias is the third input
    groups: int          # channel groups, each convolved on its own
    activation: str      # '' or 'relu', applied in the same kernel
    channels_last: bool  # x and Y are channels-last rows (N, H*W*C) (format.py)


class Conv2dBackwardArgs(NamedTuple):
    """Static arguments of `nn_conv2d_backward`."""
    geometry: Geometry
    need_dx: bool        # the data gradient is wanted (not for a first layer)
    groups: int
    channels_last: bool  # dY, X and dX are channels-last rows
    need_db: bool = True  # the bias gradient is wanted (not for a convolution without a bias)
    need_dw: bool = True  # the weight gradient is wanted (not for a frozen layer)


CONV2D = define("nn_conv2d", Conv2dArgs)
CONV2D_BACKWARD = define("nn_conv2d_backward", Conv2dBackwardArgs)
EXPLAIN_CONV = define("nn_explain_conv")


# ---- master halves ----------------------------------------------------------------------
def conv2d_output_shape(image_shape, kernel_hw, K, stride=(1, 1), padding=(0, 0), dilation=(1, 1)):
    """(K, Ho, Wo) of a convolution of (C, H, W) images with K kernels of kernel_hw (pure).

    Ho = (H + 2 ph - dh (kh - 1) - 1) // sh + 1, and likewise Wo; raises
    ShapeError when the (dilated) kernel does not fit the padded image.
    """
    g = window.geometry(image_shape, kernel_hw, stride, padding, dilation, "conv2d")
    return (window.integer(K, "conv2d: number of kernels K", 1), g.out_h, g.out_w)


def _checked(x, w, image_shape, kernel_hw, stride, padding, dilation, groups, what):
    """(Geometry, groups) of a convolution of the row batch `x` with the kernel matrix `w`."""
    args.require(w, f"{what}: w")
    image = window.image(image_shape, x.shape[1], what)
    groups = window.groups(groups, image[0], w.shape[0], what)
    kernel_hw = window.kernel_from_weights(w.shape[1], image[0] // groups, kernel_hw, what)
    return window.geometry(image, kernel_hw, stride, padding, dilation, what), groups


def conv2d(x, w, b, image_shape, stride=(1, 1), padding=(0, 0), dilation=(1, 1), kernel_hw=None, groups=1,
           activation=None, channels_last=False):
    """2-D convolution (cross-correlation, as PyTorch's conv2d) of an image batch.

    x (N, C*H*W); w (K, C/groups*kh*kw), the (K, C/groups, kh, kw) kernel
    flattened; b (1, K) or None. stride, padding, dilation: an int or an
    (h, w) pair. kernel_hw defaults to a square kernel. groups: input and
    output channels in that many groups, each convolved on its own (PyTorch's
    groups). activation: None or 'relu', applied in the same kernel where
    cuDNN fuses it (the values before the activation are never stored; its
    backward needs only Y: pass where(Y, dY, 0) to conv2d_backward).
    channels_last: x is (N, H*W*C) and Y (N, Ho*Wo*K) in channels-last
    order (dmath.nn.to_channels_last; cuDNN runs without converting); w
    keeps its (K, C/groups*kh*kw) form either way.
    Returns Y (N, K*Ho*Wo) in x's row layout and dtype. Each worker
    convolves its own samples: cuDNN on a GPU (the fastest plan timed at the
    first use of a shape, see dmath.nn.explain_conv2d), im2col and GEMMs
    otherwise.
    """
    x = args.rows(x, "conv2d: x")
    g, groups = _checked(x, w, image_shape, kernel_hw, stride, padding, dilation, groups, "conv2d")
    k = w.shape[0]
    group = args.group_of(x)
    inputs = [x, args.replicated(w, group, "conv2d: w")]
    if b is not None:
        args.require(b, "conv2d: b")
        args.expect_shape(b, (1, k), "conv2d: b")
        inputs.append(args.replicated(b, group, "conv2d: b"))
    if activation not in (None, "relu"):
        raise DMathError(f"conv2d: activation must be None or 'relu', got {activation!r}")
    out = new_meta(x.layout, (x.shape[0], k * g.out_h * g.out_w), x.dtype)
    static = CONV2D.static(geometry=g, has_bias=b is not None, groups=groups, activation=activation or "",
                           channels_last=args.flag(channels_last, "conv2d: channels_last"))
    return dispatch("nn_conv2d", inputs, [out], static=static)[0][0]


def conv2d_backward(dy, x, w, image_shape, kernel_hw, stride=(1, 1), padding=(0, 0), dilation=(1, 1),
                    need_dx=True, groups=1, channels_last=False, need_db=True, need_dw=True):
    """Gradients of conv2d: (dX or None, dW or None, dB or None).

    dX (N, C*H*W) in x's row layout (None when need_dx is False, e.g. for the
    first layer); dW (K, C*kh*kw) and dB (1, K) in w's dtype are sums over
    the samples: Partial over the batch's workers for a RowBlock batch,
    Replicated for a Replicated batch (see dmath.nn's docstring); dB is None
    when need_db is False (a convolution without a bias: its sums over every
    output pixel are a pass over dY that nothing would read), dW when need_dw
    is False (a frozen layer: no weight-gradient convolution runs).
    channels_last: dy, x and dX are channels-last rows (as conv2d's).
    """
    x = args.rows(x, "conv2d_backward: x")
    args.require(dy, "conv2d_backward: dy")
    g, groups = _checked(x, w, image_shape, kernel_hw, stride, padding, dilation, groups, "conv2d_backward")
    k = w.shape[0]
    args.expect_shape(dy, (x.shape[0], k * g.out_h * g.out_w), "conv2d_backward: dy")
    dy = args.like(dy, x, "conv2d_backward: dy")
    inputs = [dy, x, args.replicated(w, args.group_of(x), "conv2d_backward: w")]
    sums = args.sum_layout(x)
    flags = {name: args.flag(v, f"conv2d_backward: {name}") for name, v in
             (("need_dx", need_dx), ("need_db", need_db), ("need_dw", need_dw), ("channels_last", channels_last))}
    static = CONV2D_BACKWARD.static(geometry=g, groups=groups, **flags)
    metas = (new_meta(x.layout, x.shape, x.dtype), new_meta(sums, w.shape, w.dtype), new_meta(sums, (1, k), w.dtype))
    places = args.gradient_places(static)
    outs = [m for m, at in zip(metas, places) if at is not None]
    if not outs:                    # nothing wanted: no command
        return None, None, None
    made, _ = dispatch("nn_conv2d_backward", inputs, outs, static=static)
    return tuple(None if at is None else made[at] for at in places)


def explain_conv2d(print_fn=print):
    """What each worker's convolutions run on: cuDNN's chosen plan per shape (with its time, its
    workspace and why it won), or im2col + GEMM (CPU backend, no cuDNN, or a case cuDNN declined).

    Plans are chosen by timing at the first use of a shape, so this lists the
    shapes run so far. Prints worker 0's report (print_fn=None: silent) and
    returns every worker's, a list by rank of {'status', 'shapes', 'padded'} ('padded': the
    convolutions whose channel count was timed plain and padded, with the choice).
    """
    reports = dispatch("nn_explain_conv")[1]
    if print_fn is not None:
        r = reports[0]
        print_fn(r["status"] + ("\n" + cudnn.describe(r["shapes"]) if r["shapes"] else "\n(no convolution run yet)"))
        for p in r["padded"]:
            key = p["key"]
            if p["plain_ms"] is None:       # DMATH_TUNE=off: padded wherever cuDNN takes it, nothing timed
                timing = "untimed: DMATH_TUNE=off"
            else:
                timing = f"plain {p['plain_ms']:.3f} ms, padded " + (
                    f"{p['padded_ms']:.3f} ms" if p["padded_ms"] is not None else "refused by cuDNN")
            print_fn(f"  {key['direction']} {key['n']}x{key['c']}x{key['h']}x{key['w']} {key['dtype']}: channels "
                     f"padded to {_channels_to(key['c'], _PAD_TO[key['direction']])}: "
                     f"{'yes' if p['padded'] else 'no'} ({timing})")
    return reports


# ---- kernels -------------------------------------------------------------------------------


def _bands(g, groups, k):
    """Per group: (kernel rows, im2col rows) as slices."""
    cg, kg = g.channels // groups, k // groups
    return [(slice(q * kg, (q + 1) * kg), slice(q * cg * g.taps, (q + 1) * cg * g.taps)) for q in range(groups)]


@CONV2D.kernel(capturable=True)
def _conv2d(call):
    """Inputs X, W[, b]; output Y (n, K*Ho*Wo).

    Y_k (K, n*Ho*Wo) = W @ im2col(X), one GEMM per group, then reordered to NCHW rows (plus the
    bias, then the activation: '' or 'relu'). Channels-last rows are converted at the edges.
    """
    st = call.entry.static
    g, has_bias, groups, activation = st.geometry, st.has_bias, st.groups, st.activation
    x = rows.local(call.inputs[0])
    if x is None:
        return rows.nothing_here(call)
    if st.channels_last:
        x = channels_first(x, g.channels, g.height, g.width)
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
    res = memory.empty(out.shape, out.dtype) if st.channels_last else out
    o3 = res.reshape(n, k, length)
    if has_bias:
        o3[...] = y + rows.local(call.inputs[2]).astype(acc, copy=False).reshape(1, k, 1)
    else:
        o3[...] = y
    if activation == "relu":
        backend.current().xp.maximum(res, 0, out=res)
    if st.channels_last:
        channels_last_into(out, res, k, g.out_h, g.out_w)
    return [rows.shard(call, 0, [out])]


@CONV2D_BACKWARD.kernel(capturable=True)
def _conv2d_backward(call):
    """Inputs dY, X, W; outputs [dX,] [dW,] [db] (`args.gradient_places`).

    With dY_k (K, n*Ho*Wo) the output gradient in GEMM order, per group:
    dW = dY_k @ im2col(X)^T, db = row sums of dY_k (both over this worker's
    samples only), dX = col2im(W^T @ dY_k). Channels-last rows are converted at the edges.
    """
    xp = backend.current().xp
    st = call.entry.static
    g, need_dx, groups = st.geometry, st.need_dx, st.groups
    dy, x = rows.local(call.inputs[0]), rows.local(call.inputs[1])
    if x is None:
        return rows.nothing_here(call)
    acc = rows.compute_dtype(x.dtype)
    w = rows.local(call.inputs[2]).astype(x.dtype, copy=False)
    n, k, length = x.shape[0], w.shape[0], g.out_h * g.out_w
    if st.channels_last:
        x, dy = channels_first(x, g.channels, g.height, g.width), channels_first(dy, k, g.out_h, g.out_w)
    # (n, K, L) -> (K, n*L): one copy, the layout both GEMMs read
    dy_k = xp.ascontiguousarray(dy.reshape(n, k, length).transpose(1, 0, 2), dtype=x.dtype).reshape(k, n * length)
    _, at_dw, at_db = args.gradient_places(st)
    bands = _bands(g, groups, k)
    shards = []
    if at_dw is not None:
        (dw,) = rows.new_output(call, at_dw)
        cols = im2col(x, g, x.dtype)
        for kr, cr in bands:
            rows.matmul(dy_k[kr], cols[cr].T, dw[kr])
        shards.append(rows.shard(call, at_dw, [dw]))
    if at_db is not None:
        (db,) = rows.new_output(call, at_db)
        db[...] = dy_k.sum(axis=1, dtype=acc).reshape(1, k)
        shards.append(rows.shard(call, at_db, [db]))
    if need_dx:
        dcols = memory.empty((g.channels * g.taps, n * length), acc)
        for kr, cr in bands:
            rows.matmul(w[kr].T, dy_k[kr], dcols[cr])
        (dx,) = rows.new_output(call, 0)
        res = memory.empty(dx.shape, dx.dtype) if st.channels_last else dx
        res.reshape(n, g.channels, g.height, g.width)[...] = col2im(dcols, n, g, acc)
        if st.channels_last:
            channels_last_into(dx, res, g.channels, g.height, g.width)
        shards.insert(0, rows.shard(call, 0, [dx]))
    return shards


def bias_gradient(dy, n, k, acc, channels_last=False):
    """The (1, K) sums of an (n, K*L) NCHW gradient over samples and pixels: first along each
    contiguous (sample, channel) row, then over the n samples (a reduction over two strided axes
    at once is several times slower on a GPU).

    Channels-last, the sums are the column sums of (n*L, K): a product with a row of ones (one
    GEMV). An array-library reduction along that axis gives each of the K sums to one thread
    block striding through n*L rows (milliseconds on a large first layer, not microseconds).
    """
    if channels_last:
        m = dy.size // k
        ones = memory.empty((1, m), dy.dtype)
        ones.fill(1)
        out = memory.empty((1, k), acc)
        return rows.matmul(ones, dy.reshape(m, k), out)
    return dy.reshape(n * k, -1).sum(axis=1, dtype=acc).reshape(n, k).sum(axis=0).reshape(1, k)


# ---- cuDNN -------------------------------------------------------------------------------------
def _key(direction, g, n, k, groups, dtype, channels_last, epilogue=""):
    return cudnn.ConvKey(direction, n, g.channels, g.height, g.width, k, g.kh, g.kw, g.sh, g.sw, g.ph, g.pw,
                         g.dh, g.dw, groups, str(dtype), epilogue, channels_last)


def _filters_last(w, g, groups):
    """The (K, C/groups*kh*kw) kernel matrix as (K, kh, kw, C/groups) memory: the filter layout of
    channels-last convolutions (a small copy per call; the weights keep their own form)."""
    k = w.shape[0]
    return _dense(w.reshape(k, g.channels // groups, g.kh, g.kw).transpose(0, 2, 3, 1), w.dtype)


def _dense(a, dtype):
    """`a` as a C-contiguous array of `dtype` (cuDNN is given packed NCHW strides)."""
    return backend.current().xp.ascontiguousarray(a, dtype=dtype)


# Channels-last tensor-core kernels read channels in fours or eights. An RGB first layer (3
# channels) is padded by cuDNN itself into slow kernels, often slower than a copy padded with zero
# channels (about twice, for AlexNet's first layer in float16). So a convolution
# whose channel count is not a multiple of 4 runs both ways at the first call of its shape (outside
# any capture, as cuDNN's own plan timing) and keeps the padded way when it is faster, the padding
# copies included: the forward pass padded to 4 channels, the weight gradient to 8. The choice
# goes through the tuning cache as the plans' do (a later run reads it instead of timing again).
# ConvKey -> (padded?, plain ms, padded ms or None: cuDNN refused it)
_PADDED = {}
_PAD_TIMED_RUNS = 5
_PAD_TO = {"fprop": 4, "wgrad": 8}


def _channels_to(c, multiple):
    return c + (-c) % multiple


def _padded_channels(x, n, pixels, c, cp):
    """The channels-last rows x (n, pixels*c) as (n, pixels*cp), the extra channels zero."""
    out = memory.empty((n, pixels * cp), x.dtype)
    o3 = out.reshape(n, pixels, cp)
    o3[:, :, c:] = 0
    o3[:, :, :c] = x.reshape(n, pixels, c)
    return out


def _ms(fn):
    """Milliseconds per run of fn on the device (after one warm-up run, which builds plans)."""
    xp = backend.current().xp
    stream = xp.cuda.get_current_stream()
    fn()
    start, end = xp.cuda.Event(), xp.cuda.Event()
    start.record(stream)
    for _ in range(_PAD_TIMED_RUNS):
        fn()
    end.record(stream)
    end.synchronize()
    return xp.cuda.get_elapsed_time(start, end) / _PAD_TIMED_RUNS


def _plain_or_padded(key, plain, padded):
    """Run plain() or padded(), whichever was chosen at the first call of `key` (_pad_choice)."""
    choice = _PADDED.get(key)
    if choice is None:
        choice = _PADDED[key] = _pad_choice(key, plain, padded)
    (padded if choice[0] else plain)()


def _pad_choice(key, plain, padded):
    """(padded?, plain ms, padded ms) for `key` under DMATH_TUNE (dmath.tuning): a cached choice where
    it still runs; else both ways timed ('fast' and 'full': two candidates are few), or with 'off'
    the padded way untimed where cuDNN takes it (it was the faster on the RGB layers measured above).
    Raises cudnn.Refused when cuDNN cannot run the convolution: no choice is kept."""
    def adopt(value):
        pad = value.get("padded")
        if not isinstance(pad, bool):
            return None
        try:
            (padded if pad else plain)()            # builds its plans (through the cache too) and runs
        except cudnn.Refused:
            return None
        return pad, value.get("plain_ms"), value.get("padded_ms")

    def tune(how):
        if how == "off":
            try:
                padded()
                return (True, None, None), None
            except cudnn.Refused:
                plain()
                return (False, None, None), None
        plain_ms = _ms(plain)           # raises cudnn.Refused when cuDNN cannot run it
        before = cudnn.workspace_bytes()
        try:
            padded_ms = _ms(padded)
        except cudnn.Refused:
            padded_ms = None
        pad = padded_ms is not None and padded_ms < plain_ms
        if not pad and cudnn.workspace_bytes() > before:
            cudnn.release_workspace()   # grown for the padded plan alone: the next run makes the plain one's
        return (pad, plain_ms, padded_ms), {"padded": pad, "plain_ms": plain_ms, "padded_ms": padded_ms}

    return tuning.decide("cudnn_pad", cudnn.fingerprint(), dict(key._asdict(), tf32=settings.current.tf32), adopt, tune)[0]


def _fprop(key, g, x, w, b, out, n, k, fused):
    """The forward convolution `key` (channels-last, groups 1) of x, w (K, kh, kw, C) and b into out,
    its channels padded to a multiple of 4 where that was timed faster. Raises cudnn.Refused."""
    tail = ((b.data.ptr,) if b is not None else ()) + (out.data.ptr,)

    def padded():
        cp = _channels_to(g.channels, _PAD_TO["fprop"])
        xp_ = _padded_channels(x, n, g.height * g.width, g.channels, cp)
        wp = memory.zeros((k, g.kh, g.kw, cp), w.dtype)
        wp[..., :g.channels] = w
        cudnn.conv(_key("fprop", g._replace(channels=cp), n, k, 1, x.dtype, True, fused),
                   (xp_.data.ptr, wp.data.ptr) + tail)
    _plain_or_padded(key, lambda: cudnn.conv(key, (x.data.ptr, w.data.ptr) + tail), padded)


def _wgrad(key, g, x, dy, dw, n, k):
    """The weight gradient `key` (channels-last, groups 1) of x and dy into dw (K, kh, kw, C), the
    channels padded to a multiple of 8 where that was timed faster. Raises cudnn.Refused."""
    def padded():
        cp = _channels_to(g.channels, _PAD_TO["wgrad"])
        xp_ = _padded_channels(x, n, g.height * g.width, g.channels, cp)
        dwp = memory.empty((k, g.kh, g.kw, cp), dw.dtype)
        cudnn.conv(_key("wgrad", g._replace(channels=cp), n, k, 1, x.dtype, True),
                   (xp_.data.ptr, dy.data.ptr, dwp.data.ptr))
        dw.reshape(k, g.kh, g.kw, g.channels)[...] = dwp[..., :g.channels]
    _plain_or_padded(key, lambda: cudnn.conv(key, (x.data.ptr, dy.data.ptr, dw.data.ptr)), padded)


def padding_choices():
    """The convolutions whose channel count could be padded (to 4 forward, 8 for the weight gradient):
    what was timed, and the choice."""
    return [{"key": key._asdict(), "padded": c[0], "plain_ms": c[1], "padded_ms": c[2]} for key, c in _PADDED.items()]


@CONV2D.kernel(backend="gpu", capturable=True)
def _conv2d_cudnn(call):
    """nn_conv2d through cuDNN's chosen plan (see dmath.gpu.cudnn), the bias and the activation fused
    into it (the graph's epilogue) where cuDNN can; im2col where cuDNN declines the convolution."""
    xp = backend.current().xp
    st = call.entry.static
    g, has_bias, groups, activation = st.geometry, st.has_bias, st.groups, st.activation
    x = rows.local(call.inputs[0])
    if x is None or x.shape[0] == 0 or not cudnn.available():
        return generic("nn_conv2d")(call)
    cl = st.channels_last
    x = _dense(x, x.dtype)
    w = _dense(rows.local(call.inputs[1]), x.dtype)
    if cl:
        w = _filters_last(w, g, groups)
    n, k = x.shape[0], w.shape[0]
    b = _dense(rows.local(call.inputs[2]), x.dtype) if has_bias else None
    (out,) = rows.new_output(call, 0)
    fused = ("bias" if has_bias else "") + ("_" if has_bias and activation else "") + activation
    if cl and groups == 1 and g.channels % 4:
        try:
            _fprop(_key("fprop", g, n, k, groups, x.dtype, cl, fused), g, x, w, b, out, n, k, fused)
            return [rows.shard(call, 0, [out])]
        except cudnn.Refused:
            pass                     # the plain ways below
    if fused:
        ptrs = (x.data.ptr, w.data.ptr) + ((b.data.ptr,) if has_bias else ()) + (out.data.ptr,)
        try:
            cudnn.conv(_key("fprop", g, n, k, groups, x.dtype, cl, fused), ptrs)
            return [rows.shard(call, 0, [out])]
        except cudnn.Refused:
            pass                     # the convolution alone, then the epilogue as separate passes
    try:
        cudnn.conv(_key("fprop", g, n, k, groups, x.dtype, cl), (x.data.ptr, w.data.ptr, out.data.ptr))
    except cudnn.Refused:
        return generic("nn_conv2d")(call)
    if has_bias and cl:
        o2 = out.reshape(-1, k)
        o2 += b.reshape(1, k)
    elif has_bias:
        o3 = out.reshape(n, k, g.out_h * g.out_w)
        o3 += b.reshape(1, k, 1)
    if activation == "relu":
        xp.maximum(out, 0, out=out)
    return [rows.shard(call, 0, [out])]


@CONV2D_BACKWARD.kernel(backend="gpu", capturable=True)
def _conv2d_backward_cudnn(call):
    """nn_conv2d_backward through cuDNN: the weight gradient (wgrad) and the data gradient (dgrad)."""
    st = call.entry.static
    g, need_dx, groups = st.geometry, st.need_dx, st.groups
    dy, x = rows.local(call.inputs[0]), rows.local(call.inputs[1])
    if x is None or x.shape[0] == 0 or not cudnn.available():
        return generic("nn_conv2d_backward")(call)
    dtype, cl = x.dtype, st.channels_last
    _, at_dw, at_db = args.gradient_places(st)
    if at_dw is not None and call.entry.outputs[at_dw].dtype != dtype and rows.compute_dtype(dtype) != dtype:
        # cuDNN writes the weight gradient in the data's dtype: float16 data with wider weights would get
        # a half-precision dW (inf past 65504) where the generic kernel accumulates and stores in float32
        return generic("nn_conv2d_backward")(call)
    x, dy = _dense(x, dtype), _dense(dy, dtype)
    w = _dense(rows.local(call.inputs[2]), dtype)
    n, k = x.shape[0], w.shape[0]
    if cl and need_dx:
        w = _filters_last(w, g, groups)
    dw = dw_io = None
    # cuDNN writes the weight gradient in the data's dtype and, channels-last, in (K, kh, kw, C/g) order:
    # the weights' own (K, C/g, kh, kw) order where kh * kw or C/g is 1 (a 1x1 or depthwise convolution)
    reordered = cl and g.kh * g.kw > 1 and g.channels // groups > 1
    if at_dw is not None:
        (dw,) = rows.new_output(call, at_dw)
        dw_io = dw if dw.dtype == dtype and not reordered else memory.empty(dw.shape, dtype)
    dx = rows.new_output(call, 0)[0] if need_dx else None
    try:
        if dw is not None:
            wkey = _key("wgrad", g, n, k, groups, dtype, cl)
            if cl and groups == 1 and g.channels % 4:
                _wgrad(wkey, g, x, dy, dw_io, n, k)
            else:
                cudnn.conv(wkey, (x.data.ptr, dy.data.ptr, dw_io.data.ptr))
        if need_dx:
            cudnn.conv(_key("dgrad", g, n, k, groups, dtype, cl), (dy.data.ptr, w.data.ptr, dx.data.ptr))
    except cudnn.Refused:
        return generic("nn_conv2d_backward")(call)
    shards = []
    if dw is not None:
        if reordered:
            cg = g.channels // groups
            dw.reshape(k, cg, g.kh, g.kw)[...] = dw_io.reshape(k, g.kh, g.kw, cg).transpose(0, 3, 1, 2)
        elif dw_io is not dw:
            dw[...] = dw_io
        shards.append(rows.shard(call, at_dw, [dw]))
    if at_db is not None:
        (db,) = rows.new_output(call, at_db)
        db[...] = bias_gradient(dy, n, k, rows.compute_dtype(dtype), cl)
        shards.append(rows.shard(call, at_db, [db]))
    if need_dx:
        shards.insert(0, rows.shard(call, 0, [dx]))
    return shards


@EXPLAIN_CONV.kernel()
def _explain_conv(call):
    """Every worker's cuDNN status and plan choices, gathered on the master (a list by rank)."""
    call.result = gather_objects(call.world, {"status": cudnn.status(), "shapes": cudnn.explain(),
                                              "padded": padding_choices()})
    return []
