"""Neural-network operations on distributed batches: softmax, cross-entropy, convolution, pooling,
batch normalisation, dropout, labels; and fused optimizer steps (sgd_update, adam_update,
all_finite: dmath/updates.py).

A batch is a matrix of shape (N, features): row i is sample i, an image
batch is (N, C*H*W) in NCHW order with the image shape (C, H, W) passed as a
tuple. Every function accepts a batch in any layout and first puts it in a
row layout, where each worker holds whole samples: RowBlock (data
parallelism; any group and sizes) and Replicated are used as they are,
anything else is remapped to RowBlock over the same workers (a Partial
batch is reduced on the way). Results come back in that row layout.
Parameters (kernels, biases, gamma, beta) are replicated over the batch's
workers before dispatch; the kernels then run on each worker's own samples.

Sums over the batch:
- weight gradients of conv2d_backward come out Partial over the batch's
  workers for a RowBlock batch (each worker's sum over its samples: no
  communication until the caller remaps them to Replicated, typically all
  layers at once), and Replicated for a Replicated batch (every member
  already holds the complete sum);
- batch-norm statistics and gradients and the cross-entropy loss are
  all-reduced inside the kernel, so they equal the one-worker result.

Every argument is checked here, on the master, before anything is sent to
the workers; a mistake raises ShapeError, LayoutError or DMathError and
leaves the runtime usable. The worker kernels are in dmath/ops/nn_*.py.
"""
import math
import numbers
from typing import NamedTuple

import numpy as np

from .backend import canonical_dtype
from .errors import DMathError, DTypeError, LayoutError, ShapeError
from .layout import Partial, Replicated, RowBlock, distribution
from .matrix import Matrix
from .ops.base import dispatch, dist_of, new_meta
from .ops.nn_rows import compute_dtype
from .ops.nn_batch import ImageTransform as TransformSpec
from .planning import conv as window
from .planning.conv import image as _image, integer as _int
from .runtime import runtime

#: float16 represents every integer up to 2**11 exactly (max-pool window positions)
_F16_EXACT_INT = 2048
#: step and seed travel as float64 scalars: integers up to 2**53 are exact
_F64_EXACT_INT = 2 ** 53


class BatchNormSaved(NamedTuple):
    """What batchnorm hands to batchnorm_backward.

    stats: (2, C) Matrix replicated over the batch's workers, row 0 the mean
    and row 1 1/sqrt(var + eps) that normalised the batch (float32 for a
    float16 batch); training: whether they were the batch's statistics
    (True) or the running ones (False).
    """
    stats: Matrix
    training: bool


# ---- argument checks -----------------------------------------------------------
def _require(m, what):
    if not isinstance(m, Matrix):
        raise DMathError(f"{what} must be a dmath.Matrix, got {type(m).__name__}")
    return m


def _real(value, what):
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real) or not math.isfinite(value):
        raise DMathError(f"{what} must be a finite real number, got {value!r}")
    return float(value)


def _counter(value, what):
    """A non-negative integer that travels exactly as a float64 scalar (seed, step)."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real) or not math.isfinite(value) \
            or value != int(value) or not 0 <= value < _F64_EXACT_INT:
        raise DMathError(f"{what} must be an integer in [0, 2**53), got {value!r}")
    return float(value)


def _shape(m, shape, what):
    if m.shape != tuple(shape):
        raise ShapeError(f"{what} has shape {m.shape}, expected {tuple(shape)}")


# ---- layouts ----------------------------------------------------------------------
def _rows(m, what):
    """`m` in a row layout: RowBlock and Replicated as they are, anything else as RowBlock
    over the same workers (a Partial matrix is summed on the way)."""
    _require(m, what)
    if type(m.layout) is RowBlock or m.layout.replicated:
        return m
    return m.remap(RowBlock(dist_of(m).group))


def _like(m, ref, what):
    """`m` (as many rows as `ref`) with its rows on the same workers as `ref`'s."""
    _require(m, what)
    p = runtime().nworkers
    if distribution(m.layout, m.shape, p).same_placement(distribution(ref.layout, m.shape, p)):
        return m
    return m.remap(ref.layout)


def _replicated(m, group, what):
    """`m` replicated on (at least) every worker of `group`."""
    _require(m, what)
    lay = m.layout
    if lay.replicated and set(group) <= set(lay.members(runtime().nworkers)):
        return m
    return m.remap(Replicated(group))


def _group(x):
    return tuple(dist_of(x).group)


def _sum_layout(x):
    """The layout of a sum over the batch `x`'s samples computed without communication."""
    return Replicated(_group(x)) if x.layout.replicated else Partial(_group(x))


# ---- softmax and cross-entropy ----------------------------------------------------------
def _softmax(x, log, what):
    x = _rows(x, what)
    if x.shape[1] == 0:
        raise ShapeError(f"{what} needs at least one column, got shape {x.shape}")
    return dispatch("nn_softmax", [x], [new_meta(x.layout, x.shape, x.dtype)], static=(log,))[0][0]


def softmax(x):
    """Row-wise softmax of the batch `x` (N, classes); float16 computes in float32."""
    return _softmax(x, False, "softmax")


def log_softmax(x):
    """Row-wise log-softmax of the batch `x` (N, classes), without overflow for large logits."""
    return _softmax(x, True, "log_softmax")


def softmax_cross_entropy(logits, labels):
    """The fused softmax and cross-entropy of a batch: (loss, probs).

    logits (N, classes); labels (N, classes), one-hot or any rows of
    probabilities (each summing to 1). loss is the batch mean of
    -sum(labels * log_softmax(logits)), a (1, 1) Matrix replicated over the
    batch's workers, float64 for float64 logits and float32 otherwise;
    probs = softmax(logits) in the logits' row layout and dtype, kept for
    softmax_cross_entropy_backward.
    """
    logits = _rows(logits, "softmax_cross_entropy: logits")
    _require(labels, "softmax_cross_entropy: labels")
    _shape(labels, logits.shape, "softmax_cross_entropy: labels")
    if logits.shape[0] == 0 or logits.shape[1] == 0:
        raise ShapeError(f"softmax_cross_entropy needs at least one sample and one class, got {logits.shape}")
    labels = _like(labels, logits, "softmax_cross_entropy: labels")
    loss_dtype = "float64" if logits.dtype == "float64" else "float32"
    outs = [new_meta(Replicated(_group(logits)), (1, 1), loss_dtype),
            new_meta(logits.layout, logits.shape, logits.dtype)]
    (loss, probs), _ = dispatch("nn_softmax_cross_entropy", [logits, labels], outs,
                                scalars=(1.0 / logits.shape[0],))
    return loss, probs


def softmax_cross_entropy_backward(probs, labels, scale=1.0):
    """d loss / d logits = (probs - labels) * scale / N, one fused pass (scale: e.g. a loss scale)."""
    probs = _rows(probs, "softmax_cross_entropy_backward: probs")
    _require(labels, "softmax_cross_entropy_backward: labels")
    _shape(labels, probs.shape, "softmax_cross_entropy_backward: labels")
    if probs.shape[0] == 0:
        raise ShapeError("softmax_cross_entropy_backward needs at least one sample")
    labels = _like(labels, probs, "softmax_cross_entropy_backward: labels")
    scale = _real(scale, "softmax_cross_entropy_backward: scale")
    out = new_meta(probs.layout, probs.shape, probs.dtype)
    return dispatch("nn_softmax_cross_entropy_backward", [probs, labels], [out],
                    scalars=(scale / probs.shape[0],))[0][0]


# ---- convolution ---------------------------------------------------------------------------
def conv2d_output_shape(image_shape, kernel_hw, K, stride=(1, 1), padding=(0, 0), dilation=(1, 1)):
    """(K, Ho, Wo) of a convolution of (C, H, W) images with K kernels of kernel_hw (pure).

    Ho = (H + 2 ph - dh (kh - 1) - 1) // sh + 1, and likewise Wo; raises
    ShapeError when the (dilated) kernel does not fit the padded image.
    """
    g = window.geometry(image_shape, kernel_hw, stride, padding, dilation, "conv2d")
    return (_int(K, "conv2d: number of kernels K", 1), g.out_h, g.out_w)


def conv2d(x, w, b, image_shape, stride=(1, 1), padding=(0, 0), dilation=(1, 1), kernel_hw=None, groups=1,
           activation=None):
    """2-D convolution (cross-correlation, as PyTorch's conv2d) of an image batch.

    x (N, C*H*W); w (K, C/groups*kh*kw), the (K, C/groups, kh, kw) kernel
    flattened; b (1, K) or None. stride, padding, dilation: an int or an
    (h, w) pair. kernel_hw defaults to a square kernel. groups: input and
    output channels in that many groups, each convolved on its own (PyTorch's
    groups). activation: None or 'relu', applied in the same kernel where
    cuDNN fuses it (the values before the activation are never stored; its
    backward needs only Y: pass where(Y, dY, 0) to conv2d_backward).
    Returns Y (N, K*Ho*Wo) in x's row layout and dtype. Each worker
    convolves its own samples: cuDNN on a GPU (the fastest plan timed at the
    first use of a shape, see dmath.nn.explain_conv2d), im2col and GEMMs
    otherwise.
    """
    x = _rows(x, "conv2d: x")
    _require(w, "conv2d: w")
    image = _image(image_shape, x.shape[1], "conv2d")
    k = w.shape[0]
    groups = window.groups(groups, image[0], k, "conv2d")
    g = window.geometry(image, window.kernel_from_weights(w.shape[1], image[0] // groups, kernel_hw, "conv2d"),
                        stride, padding, dilation, "conv2d")
    group = _group(x)
    inputs = [x, _replicated(w, group, "conv2d: w")]
    if b is not None:
        _require(b, "conv2d: b")
        _shape(b, (1, k), "conv2d: b")
        inputs.append(_replicated(b, group, "conv2d: b"))
    if activation not in (None, "relu"):
        raise DMathError(f"conv2d: activation must be None or 'relu', got {activation!r}")
    out = new_meta(x.layout, (x.shape[0], k * g.out_h * g.out_w), x.dtype)
    return dispatch("nn_conv2d", inputs, [out], static=(g, b is not None, groups, activation or ""))[0][0]


def conv2d_backward(dy, x, w, image_shape, kernel_hw, stride=(1, 1), padding=(0, 0), dilation=(1, 1),
                    need_dx=True, groups=1):
    """Gradients of conv2d: (dX or None, dW, dB).

    dX (N, C*H*W) in x's row layout (None when need_dx is False, e.g. for the
    first layer); dW (K, C*kh*kw) and dB (1, K) in w's dtype are sums over
    the samples: Partial over the batch's workers for a RowBlock batch,
    Replicated for a Replicated batch (see the module's docstring).
    """
    x = _rows(x, "conv2d_backward: x")
    _require(w, "conv2d_backward: w")
    _require(dy, "conv2d_backward: dy")
    image = _image(image_shape, x.shape[1], "conv2d_backward")
    k = w.shape[0]
    groups = window.groups(groups, image[0], k, "conv2d_backward")
    kernel_hw = window.kernel_from_weights(w.shape[1], image[0] // groups, kernel_hw, "conv2d_backward")
    g = window.geometry(image, kernel_hw, stride, padding, dilation, "conv2d_backward")
    _shape(dy, (x.shape[0], k * g.out_h * g.out_w), "conv2d_backward: dy")
    dy = _like(dy, x, "conv2d_backward: dy")
    inputs = [dy, x, _replicated(w, _group(x), "conv2d_backward: w")]
    sums = _sum_layout(x)
    outs = [new_meta(sums, w.shape, w.dtype), new_meta(sums, (1, k), w.dtype)]
    if need_dx:
        outs.insert(0, new_meta(x.layout, x.shape, x.dtype))
    made, _ = dispatch("nn_conv2d_backward", inputs, outs, static=(g, bool(need_dx), groups))
    return tuple(made) if need_dx else (None,) + tuple(made)


def explain_conv2d(print_fn=print):
    """What each worker's convolutions run on: cuDNN's chosen plan per shape (with its time, its
    workspace and why it won), or im2col + GEMM (CPU backend, no cuDNN, or a case cuDNN declined).

    Plans are chosen by timing at the first use of a shape, so this lists the
    shapes run so far. Prints worker 0's report (print_fn=None: silent) and
    returns every worker's, a list by rank of {'status', 'shapes'}.
    """
    reports = dispatch("nn_explain_conv")[1]
    if print_fn is not None:
        from .cudnn import describe
        r = reports[0]
        print_fn(r["status"] + ("\n" + describe(r["shapes"]) if r["shapes"] else "\n(no convolution run yet)"))
    return reports


# ---- pooling --------------------------------------------------------------------------------
_POOL_MODES = ("max", "average")


def _pool_geometry(image, kernel, stride, padding, mode, what):
    if mode not in _POOL_MODES:
        raise DMathError(f"{what}: mode must be 'max' or 'average', got {mode!r}")
    return window.pool_geometry(image, kernel, stride, padding, what)


def _argmax_dtype(dtype, taps):
    return "float32" if dtype == "float16" and taps > _F16_EXACT_INT else dtype


def pool2d(x, image_shape, kernel, stride=None, padding=(0, 0), mode="max"):
    """Max or average pooling of an image batch x (N, C*H*W): (Y, argmax).

    kernel, stride (default: the kernel) and padding are ints or (h, w)
    pairs. Y is (N, C*Ho*Wo) in x's row layout. For 'max', argmax is a
    matrix of Y's shape holding the position i*kw + j of each maximum in its
    window (exact small integers, in Y's dtype; float32 for float16 windows
    of more than 2048 taps), to pass to pool2d_backward; None for 'average',
    which divides by kh*kw including padding (PyTorch's count_include_pad).
    """
    x = _rows(x, "pool2d: x")
    image = _image(image_shape, x.shape[1], "pool2d")
    g = _pool_geometry(image, kernel, stride, padding, mode, "pool2d")
    shape = (x.shape[0], image[0] * g.out_h * g.out_w)
    outs = [new_meta(x.layout, shape, x.dtype)]
    if mode == "max":
        outs.append(new_meta(x.layout, shape, _argmax_dtype(x.dtype, g.taps)))
    made, _ = dispatch("nn_pool2d", [x], outs, static=(g, mode))
    return (made[0], made[1]) if mode == "max" else (made[0], None)


def pool2d_backward(dy, argmax, image_shape, kernel, stride=None, padding=(0, 0), mode="max"):
    """d loss / d x of pool2d: dX (N, C*H*W) in dy's row layout and dtype.

    argmax: the matrix pool2d returned (required for 'max'; ignored for
    'average', pass None). The other arguments are pool2d's.
    """
    dy = _rows(dy, "pool2d_backward: dy")
    image = _image(image_shape, None, "pool2d_backward")
    g = _pool_geometry(image, kernel, stride, padding, mode, "pool2d_backward")
    _shape(dy, (dy.shape[0], image[0] * g.out_h * g.out_w), "pool2d_backward: dy")
    inputs = [dy]
    if mode == "max":
        _require(argmax, "pool2d_backward: argmax (from pool2d with mode='max')")
        _shape(argmax, dy.shape, "pool2d_backward: argmax")
        inputs.append(_like(argmax, dy, "pool2d_backward: argmax"))
    out = new_meta(dy.layout, (dy.shape[0], image[0] * image[1] * image[2]), dy.dtype)
    return dispatch("nn_pool2d_backward", inputs, [out], static=(g, mode))[0][0]


# ---- batch normalisation ----------------------------------------------------------------------
def _channels(x, image_shape, what):
    if image_shape is None:
        return x.shape[1], 1
    c, h, w = _image(image_shape, x.shape[1], what)
    return c, h * w


def batchnorm(x, gamma, beta, running_mean, running_var, image_shape=None, training=True,
              momentum=0.1, eps=1e-5):
    """Batch normalisation: (Y, saved).

    image_shape (C, H, W): per-channel statistics over N, H and W
    (BatchNorm2d); None: per-feature statistics over N (BatchNorm1d). gamma,
    beta, running_mean, running_var are (1, C). Training normalises with the
    batch's statistics, all-reduced over the batch's workers, and updates
    running_mean and running_var in place (PyTorch's rule: r = (1 - m) r + m
    s, with the unbiased variance); they must then be Replicated over exactly
    the batch's workers. training=False normalises with the running
    statistics. `saved` (a BatchNormSaved) goes to batchnorm_backward.
    """
    x = _rows(x, "batchnorm: x")
    channels, pixels = _channels(x, image_shape, "batchnorm")
    training = bool(training)
    for m, what in ((gamma, "gamma"), (beta, "beta"), (running_mean, "running_mean"),
                    (running_var, "running_var")):
        _require(m, f"batchnorm: {what}")
        _shape(m, (1, channels), f"batchnorm: {what}")
    eps = _real(eps, "batchnorm: eps")
    if eps <= 0:
        raise DMathError(f"batchnorm: eps must be positive, got {eps}")
    momentum = _real(momentum, "batchnorm: momentum")
    if not 0.0 <= momentum <= 1.0:
        raise DMathError(f"batchnorm: momentum must be in [0, 1], got {momentum}")
    group = _group(x)
    count = x.shape[0] * pixels
    if training:
        if count < 2:
            raise ShapeError(f"batchnorm: training needs more than one value per channel, "
                             f"got {x.shape[0]} samples of {pixels} pixels")
        p = runtime().nworkers
        for m, what in ((running_mean, "running_mean"), (running_var, "running_var")):
            if not m.layout.replicated or set(m.layout.members(p)) != set(group):
                raise LayoutError(f"batchnorm: {what} is updated in place, so it must be Replicated over "
                                  f"the batch's workers {group}; it is {m.layout}")
        running = [running_mean, running_var]
    else:
        running = [_replicated(running_mean, group, "batchnorm: running_mean"),
                   _replicated(running_var, group, "batchnorm: running_var")]
    inputs = [x, _replicated(gamma, group, "batchnorm: gamma"),
              _replicated(beta, group, "batchnorm: beta")] + running
    outs = [new_meta(x.layout, x.shape, x.dtype),
            new_meta(Replicated(group), (2, channels), compute_dtype(x.dtype).name)]
    if training:
        outs += [3, 4]
    made, _ = dispatch("nn_batchnorm", inputs, outs, static=(channels, training),
                       scalars=(momentum, eps, count / (count - 1) if count > 1 else 1.0))
    return made[0], BatchNormSaved(made[1], training)


def batchnorm_backward(dy, x, gamma, saved, image_shape=None):
    """Gradients of batchnorm: (dX, dgamma, dbeta).

    dX in x's row layout; dgamma and dbeta (1, C), in gamma's dtype,
    Replicated over the batch's workers (already summed over the batch).
    """
    x = _rows(x, "batchnorm_backward: x")
    channels, _ = _channels(x, image_shape, "batchnorm_backward")
    _require(dy, "batchnorm_backward: dy")
    _shape(dy, x.shape, "batchnorm_backward: dy")
    _require(gamma, "batchnorm_backward: gamma")
    _shape(gamma, (1, channels), "batchnorm_backward: gamma")
    if not isinstance(saved, BatchNormSaved):
        raise DMathError(f"batchnorm_backward: saved must be what batchnorm returned, got {type(saved).__name__}")
    _require(saved.stats, "batchnorm_backward: saved.stats")
    _shape(saved.stats, (2, channels), "batchnorm_backward: saved.stats")
    group = _group(x)
    inputs = [_like(dy, x, "batchnorm_backward: dy"), x, _replicated(gamma, group, "batchnorm_backward: gamma"),
              _replicated(saved.stats, group, "batchnorm_backward: saved.stats")]
    rep = Replicated(group)
    outs = [new_meta(x.layout, x.shape, x.dtype), new_meta(rep, (1, channels), gamma.dtype),
            new_meta(rep, (1, channels), gamma.dtype)]
    made, _ = dispatch("nn_batchnorm_backward", inputs, outs, static=(channels, bool(saved.training)))
    return tuple(made)


# ---- dropout and labels -------------------------------------------------------------------------
def dropout(x, p, seed, step):
    """Inverted dropout: (Y, mask) with Y = x * mask.

    mask holds 0 (dropped, probability p) or 1 / (1 - p) (kept), so the
    backward pass is dY * mask. The mask depends only on (seed, step, the
    element's global index): the same at any worker count and layout. seed
    is an integer below 2**53. step is either an integer below 2**53 (a
    dynamic scalar: the signature stays cached) or a (1, 1) float32/float64
    Matrix holding one: a counter that stays on the workers. A recorded
    plan replays its scalars unchanged, so a recorded training step passes
    the counter and advances it in place inside the block (`counter += 1`):
    each replay then draws a new mask. Both forms give the same mask for the
    same step.
    """
    x = _rows(x, "dropout: x")
    p = _real(p, "dropout: p")
    if not 0.0 <= p < 1.0:
        raise DMathError(f"dropout: p must be in [0, 1), got {p}")
    inputs, scalars = [x], [p, _counter(seed, "dropout: seed")]
    if isinstance(step, Matrix):
        _shape(step, (1, 1), "dropout: step counter")
        if step.dtype == "float16":
            raise DTypeError("dropout: a float16 step counter is exact only up to 2048; use float32 or float64")
        inputs.append(_replicated(step, _group(x), "dropout: step counter"))
    else:
        scalars.append(_counter(step, "dropout: step"))
    outs = [new_meta(x.layout, x.shape, x.dtype)] * 2
    made, _ = dispatch("nn_dropout", inputs, outs, scalars=scalars)
    return made[0], made[1]


def argmax_rows(x):
    """The column index of each row's maximum (the first on ties) as a numpy int64 array (N,),
    gathered on the master (predicted classes)."""
    x = _rows(x, "argmax_rows: x")
    if x.shape[1] == 0:
        raise ShapeError(f"argmax_rows needs at least one column, got shape {x.shape}")
    return dispatch("nn_argmax_rows", [x])[1]


def one_hot(labels, classes, dtype="float32", layout=None):
    """The (N, classes) one-hot Matrix of integer labels (a numpy array or sequence of N ints).

    layout None means RowBlock(). Only the labels travel to the workers,
    which build their rows themselves.
    """
    classes = _int(classes, "one_hot: classes", 1)
    a = np.asarray(labels)
    if a.ndim != 1:
        raise ShapeError(f"one_hot: labels must be 1-D, got shape {a.shape}")
    if a.size and (a.dtype == np.bool_ or not np.issubdtype(a.dtype, np.integer)):
        raise DMathError(f"one_hot: labels must be integers, got dtype {a.dtype}")
    a = np.ascontiguousarray(a, dtype=np.int64)
    if a.size and (a.min() < 0 or a.max() >= classes):
        raise DMathError(f"one_hot: labels must be in [0, {classes}), got values from {a.min()} to {a.max()}")
    canonical_dtype(dtype)
    target = new_meta(layout, (a.size, classes), dtype)
    lay = target.layout
    row_layout = lay if (type(lay) is RowBlock or lay.replicated) \
        else RowBlock(distribution(lay, target.shape, runtime().nworkers).group)
    made = dispatch("nn_one_hot", [], [new_meta(row_layout, target.shape, target.dtype)], payload=a)[0][0]
    return made if row_layout == lay else made.remap(lay)


# ---- batches from a resident dataset ---------------------------------------------------------------------
def _counter_matrix(m, group, what):
    """A (1, 1) float32/float64 counter replicated on the batch's workers (read on the device)."""
    _require(m, what)
    _shape(m, (1, 1), what)
    if m.dtype == "float16":
        raise DTypeError(f"{what}: a float16 counter is exact only up to 2048; use float32 or float64")
    return _replicated(m, group, what)


def _resident(m, group, what):
    """`m` as it is, when it is Replicated on every worker of `group` (a dataset is never copied here)."""
    _require(m, what)
    lay = m.layout
    if not lay.replicated or not set(group) <= set(lay.members(runtime().nworkers)):
        raise LayoutError(f"{what} must be Replicated on every worker of the batch {tuple(group)} (each takes "
                          f"any sample without communication); it is {lay}")
    return m


def take_rows(source, order, position, out, one_hot=False):
    """Overwrite the batch `out` in place with the samples `source[order[position + i]]`; returns `out`.

    source (N, F): the samples, Replicated on the batch's workers (device
    memory: pure device work; host memory or a mapped file: gathered on
    the host, the next batch read ahead). order (1, M) float64: row
    numbers of `source` (a permutation of range(N) from
    dmath.random.permutation, or of a part of the rows), Replicated there
    too. position: a (1, 1) float32/float64 counter holding the first
    position in `order`; it is read on the device, so a recorded step that
    advances it in place (`position += batch`) takes the next batch at
    every replay. Keep position + batch <= M and the row numbers below N:
    they are not checked on the device. out (B, F) in a row layout
    (RowBlock or Replicated); each worker writes its own rows. one_hot:
    source is (N, 1) class labels and out (B, K) gets their one-hot rows.
    """
    _require(out, "take_rows: out")
    if not (type(out.layout) is RowBlock or out.layout.replicated):
        raise LayoutError(f"take_rows: out must be in a row layout (RowBlock or Replicated), got {out.layout}")
    group = _group(out)
    source = _resident(source, group, "take_rows: source")
    order = _resident(order, group, "take_rows: order")
    if order.shape[0] != 1:
        raise ShapeError(f"take_rows: order must be one row (1, M) of sample indices, got shape {order.shape}")
    if order.dtype != "float64":
        raise DTypeError(f"take_rows: order must be float64 (exact sample indices), got {order.dtype}")
    if out.shape[0] > order.shape[1]:
        raise ShapeError(f"take_rows: a batch of {out.shape[0]} rows from an order of {order.shape[1]} samples")
    if one_hot:
        if source.shape[1] != 1:
            raise ShapeError(f"take_rows: one_hot needs (N, 1) class labels, got source shape {source.shape}")
    elif source.shape[1] != out.shape[1]:
        raise ShapeError(f"take_rows: source rows have {source.shape[1]} values, out rows {out.shape[1]}")
    position = _counter_matrix(position, group, "take_rows: position")
    dispatch("nn_take_rows", [out, source, order, position], [0], static=(bool(one_hot),))
    return out


def _per_channel(value, channels, what, positive=False):
    vals = (value,) * channels if isinstance(value, numbers.Real) and not isinstance(value, (bool, np.bool_)) \
        else tuple(value)
    if len(vals) != channels:
        raise ShapeError(f"transform_images: {what} needs one value per channel ({channels}), got {len(vals)}")
    vals = tuple(_real(v, f"transform_images: {what}") for v in vals)
    if positive and min(vals) <= 0:
        raise DMathError(f"transform_images: {what} must be positive, got {vals}")
    return vals


def transform_images(x, image_shape, shift=0, flip=False, scale=1.0, mean=0.0, std=1.0, counter=None, seed=0):
    """Per-sample image augmentation and normalisation of a batch x (N, C*H*W): a new matrix.

    Each sample is moved by a random (dy, dx) in [-shift, shift]^2 (pixels
    moved in are 0: a random crop of the image padded by `shift`),
    mirrored left-right with probability 1/2 when flip, then scaled and
    normalised per channel: (scale * v - mean_c) / std_c. The draws of a
    sample depend on (seed, counter + its row) only: counter is a (1, 1)
    matrix holding the number of samples drawn before this batch (read on
    the device, so a recorded step advances it in place), required when
    shift or flip is on. With neither, it is the affine normalisation only.
    """
    x = _rows(x, "transform_images: x")
    c, h, w = _image(image_shape, x.shape[1], "transform_images")
    shift = _int(shift, "transform_images: shift", 0)
    if shift >= min(h, w):
        raise ShapeError(f"transform_images: shift {shift} must be smaller than the image ({h}x{w})")
    t = TransformSpec((c, h, w), shift, bool(flip), _real(scale, "transform_images: scale"),
                      _per_channel(mean, c, "mean"), _per_channel(std, c, "std", positive=True))
    inputs = [x]
    if t.random:
        if counter is None:
            raise DMathError("transform_images: random shifts or flips need counter=, a (1, 1) matrix of the "
                             "samples drawn so far")
        inputs.append(_counter_matrix(counter, _group(x), "transform_images: counter"))
    out = new_meta(x.layout, x.shape, x.dtype)
    return dispatch("nn_transform_images", inputs, [out], static=(t,),
                    scalars=(_counter(seed, "transform_images: seed"),))[0][0]


# the fused optimizer steps live in their own module; dmath.nn is where users find them
from .updates import adam_update, all_finite, sgd_update  # noqa: E402

__all__ = ["sgd_update", "adam_update", "all_finite", "take_rows", "transform_images", "explain_conv2d", "softmax", "log_softmax", "softmax_cross_entropy", "softmax_cross_entropy_backward",
           "conv2d", "conv2d_output_shape", "conv2d_backward", "pool2d", "pool2d_backward",
           "batchnorm", "batchnorm_backward", "BatchNormSaved", "dropout", "argmax_rows", "one_hot"]
