"""Batch normalisation kernels (BatchNorm1d over features, BatchNorm2d over channels).

Statistics are over the whole batch: each member of a RowBlock batch sums its
samples and the sums are all-reduced over the batch's group, so every worker
normalises with the statistics a single worker would compute (up to the
order of the additions). The mean and the variance take two passes (and two
all-reduces of C numbers): the variance is a sum of squared deviations,
never E[x^2] - E[x]^2, which cancels badly in float32. float16 data computes
in float32.

With synchronized=False (PyTorch's BatchNorm under DDP, without SyncBatchNorm)
each worker of a RowBlock batch normalises its own rows with their own
statistics: no all-reduce in either pass. The running statistics stay the
same on every worker: each worker updates its own copy of them with its
statistics and returns it divided by the worker count as a Partial term, whose
sum (one all-reduce for every batch norm of a step, which dnn runs in the
background beside the backward pass) is the average of the workers' updates;
dgamma and dbeta are Partial too, summed with the weights' gradients.

A batch of N samples with C channels of S = H*W pixels (S = 1 for 1d) is
viewed as (n, C, S); per-channel statistics run over n and S. Channels-last
image rows (channels_last=True: what the convolutions of a GPU model read
and write) are the same view over (n, S, C) storage, so a network that runs
channels-last never converts around its batch norms.
"""
from typing import NamedTuple

from ... import backend
from ...errors import DMathError, LayoutError, ShapeError
from ...layout import Partial, Replicated, RowBlock, distribution
from ...planning.conv import image
from ...runtime import define, runtime
from ...runtime.registry import collectives_in_graphs
from . import args, norm_cuda, rows
from ..base import as_int, dispatch, new_meta


class BatchNormArgs(NamedTuple):
    """Static arguments of `nn_batchnorm` and `nn_batchnorm_backward`."""
    channels: int    # C: features (1d) or image channels (2d)
    training: bool   # the batch's statistics (True) or the running ones (False)
    channels_last: bool = False   # image rows are channels-last (H, W, C) (nn_format.py)
    relu: bool = False            # a relu applied to Y in the same pass (backward: dY masked by Y > 0)
    residual: bool = False        # forward: R added before the relu (input 5); backward: dR = dY masked by
                                  # Y > 0 (output 3)
    total: int = 0                # > 0: Y (forward), dY and Y (backward) are batches of `total` channels, of
    offset: int = 0               # which channels offset .. offset + C are this batch norm's (a concatenation)
    into: bool = False            # forward with a window: Y written in place into the last input
    remask: bool = False          # backward with relu: the mask recomputed from X (input 4 is beta, not Y)
    summed: bool = False          # backward: dY is the sum of input 0 and the last input (never made)
    local: bool = False           # each worker's own rows' statistics (synchronized=False on a split batch):
                                  # no all-reduce; forward: the running statistics' Partial terms as outputs
                                  # 2 and 3 instead of an update in place; backward: dgamma, dbeta Partial


BATCHNORM = define("nn_batchnorm", BatchNormArgs)
BATCHNORM_BACKWARD = define("nn_batchnorm_backward", BatchNormArgs)


# ---- master halves ----------------------------------------------------------------------
class BatchNormSaved(NamedTuple):
    """What batchnorm hands to batchnorm_backward.

    stats: (2, C) Matrix replicated over the batch's workers, row 0 the mean
    and row 1 1/sqrt(var + eps) that normalised the batch (float32 for a
    float16 batch); with each worker's own statistics (synchronized=False)
    a (2 P, C) RowBlock, worker k's two rows its own; training: whether they
    were the batch's statistics (True) or the running ones (False).
    running: None (the running statistics were updated in place), or with
    each worker's own statistics the pair (mean terms, var terms) of (1, C)
    Partial matrices whose sums are the new running_mean and running_var
    (dmath.sum_partials(terms, out=[running_mean, running_var, ...]) sums
    both pairs of every batch norm of a step in one all-reduce and writes
    them in place). rows: with each worker's own
    statistics, the batch's layout (backward must see the same rows on the
    same workers), else None.
    """
    stats: object    # a dmath.Matrix (this layer sits below matrix.py)
    training: bool
    running: object = None
    rows: object = None


def _channels_of(x, image_shape, what):
    """(C, pixels per channel) of batch `x`: image channels, or its features when image_shape is None."""
    if image_shape is None:
        return x.shape[1], 1
    c, h, w = image(image_shape, x.shape[1], what)
    return c, h * w


def batchnorm(x, gamma, beta, running_mean, running_var, image_shape=None, training=True,
              momentum=0.1, eps=1e-5, channels_last=False, activation=None, residual=None, window=None,
              out=None, synchronized=True):
    """Batch normalisation: (Y, saved).

    image_shape (C, H, W): per-channel statistics over N, H and W
    (BatchNorm2d); None: per-feature statistics over N (BatchNorm1d). gamma,
    beta, running_mean, running_var are (1, C). Training normalises with the
    batch's statistics, all-reduced over the batch's workers, and updates
    running_mean and running_var in place (PyTorch's rule: r = (1 - m) r + m
    s, with the unbiased variance); they must then be Replicated over exactly
    the batch's workers. training=False normalises with the running
    statistics. `saved` (a BatchNormSaved) goes to batchnorm_backward.
    channels_last: x (and Y) are channels-last image rows (N, H*W*C).
    activation: None, or 'relu' applied to Y in the same pass (pass Y to batchnorm_backward).
    residual: None, or a matrix R of x's shape (and row order) added to the normalised batch before
    the activation, in the same pass: Y = act(gamma * x_hat + beta + R), a residual block's tail
    (pass residual=True to batchnorm_backward for R's gradient).
    window: None, or (L, offset) for image batches: Y is channels offset .. offset + C of a batch of
    L channels with x's pixels and rows (a slice of a channel concatenation, written where it
    lies: no concatenation copy); out: that (N, H*W*L) batch, written in place and returned as Y,
    or None: a new batch whose other channels are unset until other calls write them. Pass the
    same window, and that whole batch as dy (and y), to batchnorm_backward.
    synchronized: True, statistics over the whole batch (every worker count gives one worker's
    result); False, in training on a batch split over several workers, each worker's rows
    normalised by their own statistics (PyTorch's BatchNorm under DDP): nothing is all-reduced,
    running_mean and running_var are left as they are and saved.running holds the Partial terms
    of their new values (see BatchNormSaved). On one worker, a Replicated batch or in evaluation
    it changes nothing.
    """
    x = args.rows(x, "batchnorm: x")
    channels, pixels = _channels_of(x, image_shape, "batchnorm")
    training = args.flag(training, "batchnorm: training")
    for m, what in ((gamma, "gamma"), (beta, "beta"), (running_mean, "running_mean"),
                    (running_var, "running_var")):
        args.require(m, f"batchnorm: {what}")
        args.expect_shape(m, (1, channels), f"batchnorm: {what}")
    eps = args.real(eps, "batchnorm: eps")
    if eps <= 0:
        raise DMathError(f"batchnorm: eps must be positive, got {eps}")
    momentum = args.real(momentum, "batchnorm: momentum")
    if not 0.0 <= momentum <= 1.0:
        raise DMathError(f"batchnorm: momentum must be in [0, 1], got {momentum}")
    if residual is not None:
        args.require(residual, "batchnorm: residual")
        args.expect_shape(residual, x.shape, "batchnorm: residual")
        if residual.dtype != x.dtype:
            raise DMathError(f"batchnorm: residual must have x's dtype {x.dtype}, got {residual.dtype}")
    total, offset = _window(window, image_shape, channels, residual is not None, "batchnorm")
    shape = (x.shape[0], x.shape[1] // channels * (total or channels))
    if out is not None:
        _check_out(out, window, x, shape)
    if not isinstance(synchronized, bool):
        raise DMathError(f"batchnorm: synchronized must be True or False, got {synchronized!r}")
    group = args.group_of(x)
    count = x.shape[0] * pixels
    local = training and not synchronized and not x.layout.replicated and len(group) > 1
    if local:
        dist = args.dist_of(x)
        for r in group:
            n = sum(piece.shape[0] for piece in dist.pieces[r])
            if n * pixels < 2:
                raise ShapeError(f"batchnorm: with each worker's own statistics (synchronized=False) every "
                                 f"worker needs more than one value per channel; worker {r} holds {n} of the "
                                 f"{x.shape[0]} samples ({pixels} pixels each)")
    if training and not local:
        if count < 2:
            raise ShapeError(f"batchnorm: training needs more than one value per channel, "
                             f"got {x.shape[0]} samples of {pixels} pixels")
        p = runtime().nworkers
        for m, what in ((running_mean, "running_mean"), (running_var, "running_var")):
            if not m.layout.replicated or set(m.layout.members(p)) != set(group):
                raise LayoutError(f"batchnorm: {what} is updated in place, so it must be Replicated over "
                                  f"the batch's workers {group}; it is {m.layout}")
        running = [running_mean, running_var]
    else:                       # read only: evaluation, or each worker's own statistics (their terms out)
        running = [args.replicated(running_mean, group, "batchnorm: running_mean"),
                   args.replicated(running_var, group, "batchnorm: running_var")]
    inputs = [x, args.replicated(gamma, group, "batchnorm: gamma"),
              args.replicated(beta, group, "batchnorm: beta")] + running
    if residual is not None:
        inputs.append(args.like(residual, x, "batchnorm: residual"))
    if out is not None:
        inputs.append(out)
    stats_dtype = rows.compute_dtype(x.dtype).name
    outs = [len(inputs) - 1 if out is not None else new_meta(x.layout, shape, x.dtype),
            new_meta(RowBlock(group, (2,) * len(group)), (2 * len(group), channels), stats_dtype) if local
            else new_meta(Replicated(group), (2, channels), stats_dtype)]
    if local:
        outs += [new_meta(Partial(group), (1, channels), m.dtype) for m in (running_mean, running_var)]
    elif training:
        outs += [3, 4]
    static = BATCHNORM.static(channels=channels, training=training, channels_last=_last(channels_last, image_shape),
                              relu=_relu(activation, "batchnorm"), residual=residual is not None, total=total,
                              offset=offset, into=out is not None, local=local)
    made, _ = dispatch("nn_batchnorm", inputs, outs, static=static,
                       scalars=(momentum, eps, count / (count - 1) if count > 1 else 1.0))
    made = list(made)
    if out is not None:
        made.insert(0, out)
    if not local:
        return made[0], BatchNormSaved(made[1], training)
    return made[0], BatchNormSaved(made[1], training, tuple(made[2:4]), x.layout)


def batchnorm_backward(dy, x, gamma, saved, image_shape=None, channels_last=False, y=None, residual=False,
                       window=None, beta=None, dy2=None):
    """Gradients of batchnorm: (dX, dgamma, dbeta), and dR after them when residual=True.

    dX in x's row layout; dgamma and dbeta (1, C), in gamma's dtype,
    Replicated over the batch's workers (already summed over the batch); after
    a batchnorm with each worker's own statistics (synchronized=False), Partial:
    each worker's sums over its own rows, summed with the weights' gradients.
    channels_last: dy, x and dX are channels-last image rows. y: batchnorm's
    output Y when it applied a relu (activation='relu'): dy counts where Y > 0 only.
    residual: batchnorm added a residual R; its gradient dR is dy masked by Y > 0 after a relu
    (written by the pass that writes dX), else dy itself. window: batchnorm's window (L, offset):
    dy and y are the (N, H*W*L) batches whose channels offset .. offset + C are read where they lie.
    beta: instead of y after a relu without a residual, batchnorm's beta: the relu's mask is recomputed
    from x (gamma * x_hat + beta > 0 with the forward's own constants and arithmetic), so neither pass
    reads Y (a positive value that rounded to zero in Y's dtype still counts as positive).
    dy2: None, or a second gradient of Y like dy (Y read by two consumers, a residual block's output):
    the gradient is dy + dy2, added (and rounded, as dmath.add would) where the passes read dy, so the
    sum is never written out; with residual=True, dR is that sum (masked after a relu).
    """
    x = args.rows(x, "batchnorm_backward: x")
    channels, _ = _channels_of(x, image_shape, "batchnorm_backward")
    if not isinstance(residual, bool):
        raise DMathError(f"batchnorm_backward: residual must be True or False, got {residual!r}")
    total, offset = _window(window, image_shape, channels, residual, "batchnorm_backward")
    wide = (x.shape[0], x.shape[1] // channels * (total or channels))
    args.require(dy, "batchnorm_backward: dy")
    args.expect_shape(dy, wide, "batchnorm_backward: dy")
    args.require(gamma, "batchnorm_backward: gamma")
    args.expect_shape(gamma, (1, channels), "batchnorm_backward: gamma")
    if not isinstance(saved, BatchNormSaved):
        raise DMathError(f"batchnorm_backward: saved must be what batchnorm returned, got {type(saved).__name__}")
    args.require(saved.stats, "batchnorm_backward: saved.stats")
    group = args.group_of(x)
    local = saved.running is not None
    if local:                   # each worker's own statistics: x must lie where the forward's did
        expected = RowBlock(group, (2,) * len(group))
        args.expect_shape(saved.stats, (2 * len(group), channels), "batchnorm_backward: saved.stats")
        p = runtime().nworkers
        same_rows = saved.rows is not None and \
            distribution(x.layout, x.shape, p).same_placement(distribution(saved.rows, x.shape, p))
        if not same_rows or saved.stats.layout.resolved(p) != expected:
            raise LayoutError(f"batchnorm_backward: saved holds each worker's own statistics of the forward's "
                              f"rows ({saved.rows}); x must be split over the workers as it was there, got "
                              f"{x.layout}")
        stats = saved.stats
    else:
        args.expect_shape(saved.stats, (2, channels), "batchnorm_backward: saved.stats")
        stats = args.replicated(saved.stats, group, "batchnorm_backward: saved.stats")
    inputs = [args.like(dy, x, "batchnorm_backward: dy"), x,
              args.replicated(gamma, group, "batchnorm_backward: gamma"), stats]
    if y is not None and beta is not None:
        raise DMathError("batchnorm_backward: give y or beta for a relu's mask, not both")
    if y is not None:
        args.require(y, "batchnorm_backward: y")
        args.expect_shape(y, wide, "batchnorm_backward: y")
        inputs.append(args.like(y, x, "batchnorm_backward: y"))
    if beta is not None:
        if residual:
            raise DMathError("batchnorm_backward: a relu after a residual needs y for its mask (beta cannot "
                             "recompute it without the residual)")
        args.require(beta, "batchnorm_backward: beta")
        args.expect_shape(beta, (1, channels), "batchnorm_backward: beta")
        inputs.append(args.replicated(beta, group, "batchnorm_backward: beta"))
    rep = Partial(group) if local else Replicated(group)
    outs = [new_meta(x.layout, x.shape, x.dtype), new_meta(rep, (1, channels), gamma.dtype),
            new_meta(rep, (1, channels), gamma.dtype)]
    if dy2 is not None:
        if window is not None:
            raise DMathError("batchnorm_backward: dy2 (a gradient given as a sum) does not go with a window")
        args.require(dy2, "batchnorm_backward: dy2")
        args.expect_shape(dy2, x.shape, "batchnorm_backward: dy2")
        if dy2.dtype != dy.dtype:
            raise DMathError(f"batchnorm_backward: dy2 must have dy's dtype {dy.dtype}, got {dy2.dtype}")
        inputs.append(args.like(dy2, x, "batchnorm_backward: dy2"))
    # dR differs from dy (masked, or a sum): one more output of the dX pass
    masked = residual and (y is not None or dy2 is not None)
    if masked:
        outs.append(new_meta(x.layout, x.shape, x.dtype))
    static = BATCHNORM_BACKWARD.static(channels=channels, training=bool(saved.training),
                                       channels_last=_last(channels_last, image_shape),
                                       relu=y is not None or beta is not None, residual=masked, total=total,
                                       offset=offset, remask=beta is not None, summed=dy2 is not None,
                                       local=local)
    grads = tuple(dispatch("nn_batchnorm_backward", inputs, outs, static=static)[0])
    return grads + (dy,) if residual and not masked else grads


def _check_out(out, window, x, shape):
    """DMathError unless `out` can take batchnorm's window of x in place."""
    if window is None:
        raise DMathError("batchnorm: out is the batch a window is written into: give window=(L, offset)")
    args.require(out, "batchnorm: out")
    args.expect_shape(out, shape, "batchnorm: out")
    p = runtime().nworkers
    if out.dtype != x.dtype or not distribution(out.layout, shape, p).same_placement(distribution(x.layout, shape, p)):
        raise LayoutError(f"batchnorm: out is written in place, so it needs x's dtype {x.dtype} and rows on "
                          f"x's workers ({x.layout}); it is {out.dtype}, {out.layout}")


def _window(window, image_shape, channels, residual, what):
    """(L, offset) of a checked window, (0, 0) for none."""
    if window is None:
        return 0, 0
    if image_shape is None:
        raise DMathError(f"{what}: a window is a slice of an image batch's channels (give image_shape)")
    if residual:
        raise DMathError(f"{what}: a residual and a window do not go together")
    try:
        total, offset = (as_int(v, f"{what}: window") for v in window)
    except (TypeError, ValueError) as exc:
        raise DMathError(f"{what}: window must be (L, offset), got {window!r}") from exc
    if offset < 0 or offset + channels > total:
        raise ShapeError(f"{what}: window {window!r} does not hold {channels} channels from offset {offset}")
    return total, offset


def _relu(activation, what):
    if activation not in (None, "relu"):
        raise DMathError(f"{what}: activation must be None or 'relu', got {activation!r}")
    return activation == "relu"


def _last(channels_last, image_shape):
    if not isinstance(channels_last, bool):
        raise DMathError(f"batchnorm: channels_last must be True or False, got {channels_last!r}")
    if channels_last and image_shape is None:
        raise DMathError("batchnorm: channels_last applies to image batches (give image_shape)")
    return channels_last


# ---- kernels -------------------------------------------------------------------------------


def _channels(x, channels, dtype, last=False, total=0, offset=0):
    """The (n, C, S) view of a batch: of (n, S, C) storage for channels-last rows; total > 0: of
    channels offset .. offset + C of a batch of `total` channels."""
    return _out_view(x, channels, last, total, offset).astype(dtype, copy=False)


def _out_view(out, channels, last, total=0, offset=0):
    """The (n, C, S) view of an output array (written through: never a copy); total > 0: of its
    channels offset .. offset + C, out holding `total` channels."""
    # explicit sizes: a worker may hold no samples, and -1 cannot be inferred from an empty array
    wide = total or channels
    if last:
        view = out.reshape(out.shape[0], out.shape[1] // wide, wide).transpose(0, 2, 1)
    else:
        view = out.reshape(out.shape[0], wide, out.shape[1] // wide)
    return view[:, offset:offset + channels] if total else view


def _channel_sums(a3):
    """Sums over samples and pixels of an (n, C, S) array: along each contiguous row of pixels first
    (one strided reduction over two axes at once is several times slower on a GPU)."""
    return a3.sum(axis=2).sum(axis=0)


def _vec(a, dtype):
    """A replicated (1, C) or (2, C) parameter row as a (C, 1) column that broadcasts over (n, C, S)."""
    return a.reshape(-1, 1).astype(dtype, copy=False)


def _update_running(rm, rv, mean, var, momentum, unbias):
    """The running statistics updated in place with a training batch's mean and (biased) variance;
    PyTorch's convention: the running variance is the unbiased estimate."""
    rm[...] = (1.0 - momentum) * rm + momentum * mean.reshape(rm.shape)
    rv[...] = (1.0 - momentum) * rv + (momentum * unbias) * var.reshape(rv.shape)


def _forward_shards(call, out, stats, training, terms=None):
    """The forward kernel's outputs: Y (the input it was written into, for a window), the statistics,
    and in training the running statistics (updated in place), or with each worker's own statistics
    their Partial terms."""
    y = call.inputs[-1] if call.entry.static.into else rows.shard(call, 0, [out])
    shards = [y, rows.shard(call, 1, [stats])]
    if terms is not None:
        shards += [rows.shard(call, 2, [terms[0]]), rows.shard(call, 3, [terms[1]])]
    elif training:
        shards += [call.inputs[3], call.inputs[4]]
    return shards


def _running_terms(call, rm, rv):
    """With each worker's own statistics: outputs 2 and 3, this worker's copies of running_mean and
    running_var (for its update; `_terms_done` divides them by the worker count)."""
    tm, tv = rows.new_output(call, 2)[0], rows.new_output(call, 3)[0]
    tm[...] = rm
    tv[...] = rv
    return tm, tv


def _share(call):
    """1 / the batch's workers: a worker's part of the average of the workers' running statistics."""
    return 1.0 / len(call.entry.in_dists[0].group)


def _terms_done(call, terms):
    """The updated copies as Partial terms: each divided by the group's size, so that their sum over
    the workers is the average of the workers' updates."""
    share = _share(call)
    for t in terms:
        t *= share


def _local_unbias(count):
    """count / (count - 1): the unbiased variance's factor for a worker's own `count` values."""
    return count / (count - 1) if count > 1 else 1.0


@BATCHNORM.kernel(capturable=lambda entry: collectives_in_graphs() or entry.in_dists[0].replicated
                  or entry.static.local)
def _batchnorm(call):
    """Inputs X, gamma, beta, running_mean, running_var;
    outputs Y, stats (2, C) = [mean; 1/sqrt(var + eps)], and, when training, running_mean
    and running_var updated in place (local: their Partial terms as outputs 2 and 3).
    scalars = (momentum, eps, M / (M - 1)), M = N * S.
    """
    xp = backend.current().xp
    channels, training = call.entry.static.channels, call.entry.static.training
    last = call.entry.static.channels_last
    momentum, eps, unbias = call.scalars
    src = call.inputs[0]
    x = rows.local(src)
    if x is None:
        return rows.nothing_here(call)
    (stats,) = rows.new_output(call, 1)
    cdt = stats.dtype
    rm, rv = rows.local(call.inputs[3]), rows.local(call.inputs[4])
    res = rows.local(call.inputs[5]) if call.entry.static.residual else None
    if last and norm_cuda.usable(x) and (res is None or res.flags.c_contiguous):
        return _batchnorm_gpu(call, x, stats, rm, rv, res)
    x3 = _channels(x, channels, cdt, last)
    local = call.entry.static.local
    terms = _running_terms(call, rm, rv) if local else None
    if training:
        count = (x3.shape[0] if local else src.dist.shape[0]) * x3.shape[2]
        mean = _channel_sums(x3)
        if not local:
            rows.sum_over_batch(call, src.dist, mean)
        mean *= 1.0 / count
        dev = x3 - mean.reshape(-1, 1)
        var = _channel_sums(dev * dev)
        if not local:
            rows.sum_over_batch(call, src.dist, var)
        var *= 1.0 / count
        _update_running(*(terms if local else (rm, rv)), mean, var, momentum,
                        _local_unbias(count) if local else unbias)
        if local:
            _terms_done(call, terms)
    else:
        mean, var = rm.reshape(-1).astype(cdt), rv.reshape(-1).astype(cdt)
        dev = x3 - mean.reshape(-1, 1)
    stats[0] = mean
    stats[1] = 1.0 / xp.sqrt(var + eps)
    gamma, beta = rows.local(call.inputs[1]), rows.local(call.inputs[2])
    out = _output(call)
    scale = stats[1].reshape(-1, 1) * _vec(gamma, cdt)
    view = _out_view(out, channels, last, call.entry.static.total, call.entry.static.offset)
    y3 = dev * scale + _vec(beta, cdt)
    if call.entry.static.residual:
        y3 += _channels(rows.local(call.inputs[5]), channels, cdt, last)
    view[...] = y3
    if call.entry.static.relu:
        xp.maximum(view, 0, out=view)
    return _forward_shards(call, out, stats, training, terms)


def _output(call):
    """The local array Y is written into: a new one, or the window's batch (the last input)."""
    return rows.local(call.inputs[-1]) if call.entry.static.into else rows.new_output(call, 0)[0]


def _batchnorm_gpu(call, x, stats, rm, rv, res):
    """_batchnorm on a GPU for channels-last rows: the (M, C) kernels of norm_cuda (statistics in one
    pass, every per-channel quantity of a training step in one launch, one pass to normalise)."""
    xp = backend.current().xp
    channels, training = call.entry.static.channels, call.entry.static.training
    relu = call.entry.static.relu
    momentum, eps, unbias = call.scalars
    src = call.inputs[0]
    x2 = x.reshape(-1, channels)
    gamma, beta = rows.local(call.inputs[1]).reshape(-1), rows.local(call.inputs[2]).reshape(-1)
    out = _output(call)
    out2 = out.reshape(-1, call.entry.static.total or channels)     # (wider for a window: its channels only)
    first = call.entry.static.offset            # a window's first channel (0: none)
    res2 = None if res is None else res.reshape(-1, channels)
    acc = norm_cuda.acc_dtype(x.dtype)
    local = call.entry.static.local
    fin = training and norm_cuda.finalizes(gamma.dtype, rm.dtype, stats.dtype, acc)
    terms = None
    if local:   # the finalize kernel writes the terms itself (no copies of rm, rv and no scaling pass)
        terms = (rows.new_output(call, 2)[0], rows.new_output(call, 3)[0]) if fin else _running_terms(call, rm, rv)
    consts = None                               # (mean, scale, shift) of the normalisation
    if training:
        count = (x.shape[0] if local else src.dist.shape[0]) * (x.shape[1] // channels)
        shift = rm.reshape(-1)                  # the same on every worker: one all-reduce
        alone = _alone(local, src.dist)
        # the finalize kernel adds up the sums kernel's partial rows where no all-reduce comes between
        sums = norm_cuda.channel_sums(3, x2, shift, reduce=not (fin and alone))
        if local:                               # this worker's rows only: no all-reduce, its own update
            unbias = _local_unbias(count)
        elif not alone:
            rows.sum_over_batch(call, src.dist, sums.reshape(-1))
        if fin:
            consts = norm_cuda.finalize_forward(sums, shift, gamma, beta, rm.reshape(-1), rv.reshape(-1), stats, acc,
                                                count, momentum, unbias, eps,
                                                into=None if terms is None else tuple(t.reshape(-1) for t in terms),
                                                share=_share(call) if local else 1.0)
        else:
            run_m, run_v = (t.reshape(-1) for t in (terms if local else (rm, rv)))
            offset = sums[0] * (1.0 / count)
            mean = shift.astype(xp.float64) + offset
            var = xp.maximum(sums[1] * (1.0 / count) - offset * offset, 0.0)
            _update_running(run_m, run_v, mean, var, momentum, unbias)
    else:
        mean, var = rm.reshape(-1).astype(xp.float64), rv.reshape(-1).astype(xp.float64)
    if consts is None:
        stats[0] = mean
        stats[1] = 1.0 / xp.sqrt(var + eps)
        consts = _affine(stats, gamma, beta)
    norm_cuda.normalize(x2, out2, *consts, relu, res2, first)
    if local and not fin:
        _terms_done(call, terms)
    return _forward_shards(call, out, stats, training, terms)


def _alone(local, dist):
    """Whether a worker's channel sums are complete without an all-reduce: each worker's own statistics
    (local), or a batch every member holds whole (rows.whole_on_each)."""
    return local or rows.whole_on_each(dist)


def _affine(stats, gamma, beta):
    """(mean, scale, shift) of the GPU normalisation, in its constants' dtype, from stats = [mean; 1/std]:
    scale = 1/std as stats hold it times gamma in double (what dm_bn_finalize_fwd computes), so a backward
    that recomputes the relu's mask from x makes the very same constants."""
    xp = backend.current().xp
    acc = norm_cuda.acc_dtype(stats.dtype)
    gamma, beta = gamma.reshape(-1), beta.reshape(-1)
    return (stats[0].astype(acc), (stats[1].astype(xp.float64) * gamma.astype(xp.float64)).astype(acc),
            beta.astype(acc))


@BATCHNORM_BACKWARD.kernel(capturable=lambda entry: collectives_in_graphs() or entry.in_dists[1].replicated
                           or entry.static.local)
def _batchnorm_backward(call):
    """Inputs dY, X, gamma, stats (and Y after a fused relu, or beta to recompute its mask from X; and
    dY's second term when summed); outputs dX, dgamma, dbeta (and dR, dY masked by Y > 0, for a residual
    added before the relu, or dY's sum).

    With x_hat = (x - mean) * r (r = 1/sqrt(var + eps)), over the M values of a channel:
      dbeta = sum(dy), dgamma = sum(dy * x_hat),
      training: dx = gamma * r / M * (M * dy - dbeta - x_hat * dgamma)
      eval:     dx = gamma * r * dy   (the running statistics are constants)
    """
    xp = backend.current().xp
    channels, training = call.entry.static.channels, call.entry.static.training
    last = call.entry.static.channels_last
    src = call.inputs[1]
    dy, x = rows.local(call.inputs[0]), rows.local(src)
    if x is None:
        return rows.nothing_here(call)
    stats = rows.local(call.inputs[3])
    cdt = stats.dtype
    gamma = rows.local(call.inputs[2])
    remask = call.entry.static.remask
    second = rows.local(call.inputs[-1]) if call.entry.static.summed else None
    if last and norm_cuda.usable(x) and dy.flags.c_contiguous and \
            (second is None or second.flags.c_contiguous) and \
            (not remask or norm_cuda.recomputes_mask(x.dtype, gamma.dtype)):
        return _batchnorm_backward_gpu(call, dy, x, stats, second)
    if second is not None:              # the gradient given as two terms: their sum, as dmath.add makes it
        dy = xp.add(dy, second)
    x3 = _channels(x, channels, cdt, last)
    mean, r = stats[0].reshape(-1, 1), stats[1].reshape(-1, 1)
    g = _vec(gamma, cdt)
    shards = []
    if call.entry.static.residual:      # the residual's gradient is the (masked) dy: computed once, kept
        (dr,) = rows.new_output(call, 3)
        if call.entry.static.relu:
            xp.multiply(dy, rows.local(call.inputs[4]) > 0, out=dr)
        else:
            dr[...] = dy
        dy3 = _channels(dr, channels, cdt, last)
        shards = [rows.shard(call, 3, [dr])]
    else:
        window = (call.entry.static.total, call.entry.static.offset)
        dy3 = _channels(dy, channels, cdt, last, *window)
        if remask:                      # where the forward's value was positive, as _batchnorm computed it
            dy3 = dy3 * ((x3 - mean) * (r * g) + _vec(rows.local(call.inputs[4]), cdt) > 0)
        elif call.entry.static.relu:    # the fused relu's gradient: dy where the output was positive
            dy3 = dy3 * (_channels(rows.local(call.inputs[4]), channels, cdt, last, *window) > 0)
    xhat = (x3 - mean) * r
    sums = xp.empty(2 * channels, dtype=cdt)
    sums[:channels] = _channel_sums(dy3)
    sums[channels:] = _channel_sums(dy3 * xhat)
    local = call.entry.static.local
    if not local:
        rows.sum_over_batch(call, src.dist, sums)
    dbeta, dgamma = sums[:channels].reshape(-1, 1), sums[channels:].reshape(-1, 1)
    (dx,) = rows.new_output(call, 0)
    if training:
        count = (x3.shape[0] if local else src.dist.shape[0]) * x3.shape[2]
        _out_view(dx, channels, last)[...] = (g * r * (1.0 / count)) * (count * dy3 - dbeta - xhat * dgamma)
    else:
        _out_view(dx, channels, last)[...] = (g * r) * dy3
    (dg,) = rows.new_output(call, 1)
    (db,) = rows.new_output(call, 2)
    dg[...] = dgamma.reshape(dg.shape)
    db[...] = dbeta.reshape(db.shape)
    return [rows.shard(call, 0, [dx]), rows.shard(call, 1, [dg]), rows.shard(call, 2, [db])] + shards


def _batchnorm_backward_gpu(call, dy, x, stats, second):
    """_batchnorm_backward on a GPU for channels-last rows (norm_cuda): the two sums per channel in one
    pass, every per-channel quantity in one launch, dx in another pass."""
    xp = backend.current().xp
    channels, training = call.entry.static.channels, call.entry.static.training
    src = call.inputs[1]
    wide = call.entry.static.total or channels
    x2, dy2 = x.reshape(-1, channels), dy.reshape(-1, wide)
    g = rows.local(call.inputs[2]).reshape(-1)
    y2 = relu_from = None
    if call.entry.static.remask:                # the mask from x, stats, gamma and beta: Y is not read
        relu_from = (stats, g, rows.local(call.inputs[4]).reshape(-1))
    elif call.entry.static.relu:
        y2 = rows.local(call.inputs[4]).reshape(-1, wide)
    first = call.entry.static.offset            # a window's first channel (0: none)
    acc = norm_cuda.acc_dtype(x.dtype)
    also = None if second is None else second.reshape(-1, wide)      # dY = dy + also, added as read
    local = call.entry.static.local
    fin = norm_cuda.finalizes(g.dtype, stats.dtype, stats.dtype, acc)
    alone = _alone(local, src.dist)
    sums = norm_cuda.channel_sums(2, x2, stats[0], dy2, y2, first, relu_from, also, reduce=not (fin and alone))
    if not alone:
        rows.sum_over_batch(call, src.dist, sums.reshape(-1))
    count = (x.shape[0] if local else src.dist.shape[0]) * (x.shape[1] // channels)
    (dx,) = rows.new_output(call, 0)
    (dg,) = rows.new_output(call, 1)
    (db,) = rows.new_output(call, 2)
    dr = rows.new_output(call, 3)[0] if call.entry.static.residual else None
    if fin:
        mean, a, b, c0 = norm_cuda.finalize_backward(sums, stats, g, dg.reshape(-1), db.reshape(-1), acc,
                                                     count, training)
    else:
        mean, r = stats[0].astype(xp.float64), stats[1].astype(xp.float64)
        dbeta, dgamma = sums[0], sums[1] * r
        a = g.astype(xp.float64) * r
        if training:
            b, c0 = a * r * dgamma * (-1.0 / count), a * dbeta * (-1.0 / count)
        else:
            b = c0 = xp.zeros_like(a)
        dg[...] = dgamma.reshape(dg.shape)
        db[...] = dbeta.reshape(db.shape)
    norm_cuda.input_gradient(dy2, x2, y2, dx.reshape(-1, channels), mean, a, b, c0,
                             None if dr is None else dr.reshape(-1, channels), first, relu_from, also)
    shards = [rows.shard(call, 0, [dx]), rows.shard(call, 1, [dg]), rows.shard(call, 2, [db])]
    return shards + ([rows.shard(call, 3, [dr])] if dr is not None else [])
