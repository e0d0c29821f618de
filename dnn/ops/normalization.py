"""Batch normalization (BatchNorm1d over features, BatchNorm2d over channels), through dmath.nn.

In training mode the batch statistics are all-reduced over the batch's
workers inside dmath.nn.batchnorm, so the result equals the one-worker result,
and the running statistics (matrices owned by the layer) are updated in place
as PyTorch does. With synchronized=False each worker normalizes its own rows
by their own statistics (PyTorch's BatchNorm under DDP) and the new running
statistics come as Partial terms (`running_terms`), which the training step
sums for every batch norm in one all-reduce beside the backward pass. In
evaluation mode the running statistics normalize.
"""
import dmath

from ..errors import ConfigError, ShapeError
from ..graph.function import Function, GradientTerms


class BatchNorm(Function):
    """y = gamma * (x - mean) / sqrt(var + eps) + beta, per channel (image batch) or per feature.

    Applied to (x, gamma, beta, r), a residual r of x's shape is added before the fused activation:
    y = act(gamma * x_hat + beta + r), a residual block's tail (BatchNorm, Add, relu) in one kernel
    each way. Its backward reads y for that relu's mask, never r; without a residual the mask is
    recomputed from x and beta (dmath.nn.batchnorm_backward's beta=): y is not read again. The
    gradient of a y read twice (a residual block's output: the next block's convolution and its
    shortcut) comes as the two terms, added as the backward's passes read them (dy2=).
    """
    name = "batchnorm"
    keeps_channels_last = True       # channels-last image rows are normalised as they are
    takes_gradient_terms = True      # a residual block's output gradient: added as the kernels read it

    def __init__(self, running_mean, running_var, training, momentum=0.1, eps=1e-5, activation=None,
                 synchronized=True):
        if not 0.0 <= momentum <= 1.0:
            raise ConfigError(f"batchnorm: momentum must be in [0, 1], got {momentum!r}")
        if not eps > 0:
            raise ConfigError(f"batchnorm: eps must be positive, got {eps!r}")
        self.running_mean, self.running_var = running_mean, running_var
        self.training, self.momentum, self.eps = bool(training), float(momentum), float(eps)
        if activation not in (None, "relu"):
            raise ConfigError(f"batchnorm: a fused activation must be None or 'relu', got {activation!r}")
        self.activation = activation
        if not isinstance(synchronized, bool):
            raise ConfigError(f"batchnorm: synchronized must be True or False, got {synchronized!r}")
        self.synchronized = synchronized
        self.residual = False
        self.saved = None

    def infer(self, x, gamma, beta, residual=None):
        sample = x.sample_shape
        if residual is not None and (residual.shape != x.shape or residual.dtype != x.dtype
                                     or residual.sample_shape != sample or residual.channels_last != x.channels_last):
            raise ShapeError(f"batchnorm: the residual must be like x ({x.shape} {x.dtype}, samples {sample}, "
                             f"channels-last {x.channels_last}); got {residual.shape} {residual.dtype}, samples "
                             f"{residual.sample_shape}, channels-last {residual.channels_last}")
        self.residual = residual is not None
        self.image_shape = sample if len(sample) == 3 else None
        self.channels_last = x.channels_last
        channels = sample[0] if self.image_shape else x.shape[1]
        for what, node in (("gamma", gamma), ("beta", beta)):
            if node.shape != (1, channels):
                raise ShapeError(f"batchnorm: {what} must be (1, {channels}) for samples of shape {sample}, "
                                 f"got {node.shape}")
        if tuple(self.running_mean.shape) != (1, channels) or tuple(self.running_var.shape) != (1, channels):
            raise ShapeError(f"batchnorm: running statistics must be (1, {channels})")
        if self.training:
            check_training_batch(x.shape[0], sample, "batchnorm")
        return x.shape, x.dtype, sample

    def forward(self, x, gamma, beta, residual=None):
        y, self.saved = dmath.nn.batchnorm(x, gamma, beta, self.running_mean, self.running_var,
                                           self.image_shape, self.training, self.momentum, self.eps,
                                           channels_last=self.channels_last, activation=self.activation,
                                           residual=residual, synchronized=self.synchronized)
        return y

    def running_terms(self):
        """The Partial terms of the new running statistics a forward with each worker's own statistics
        made, as ((mean terms, running_mean, keep), (var terms, running_var, keep)), keep = 1 -
        momentum, the share of the old value in the update; () when it updated them in place (or made
        none)."""
        if self.saved is None or self.saved.running is None:
            return ()
        keep = 1.0 - self.momentum
        return tuple((t, r, keep) for t, r in zip(self.saved.running, (self.running_mean, self.running_var)))

    def _remask(self):
        return self.activation == "relu" and not self.residual

    @property
    def saves_output(self):
        # the fused relu's mask: read from y after a residual, else recomputed from x, gamma and beta
        return self.activation == "relu" and not self._remask()

    def saves_input(self, k):
        # x and gamma (and beta for a relu's mask recomputed from x); the residual is not read again
        return k < 2 or (k == 2 and self._remask())

    def backward(self, xs, y, gy, needs):
        x, gamma = xs[0], xs[1]
        remask = self._remask()
        gy, gy2 = (gy.first, gy.second) if isinstance(gy, GradientTerms) else (gy, None)
        return dmath.nn.batchnorm_backward(gy, x, gamma, self.saved, self.image_shape,
                                           channels_last=self.channels_last,
                                           y=y if self.activation == "relu" and not remask else None,
                                           residual=len(xs) == 4, beta=xs[2] if remask else None, dy2=gy2)

    def drop_saved(self):
        self.saved = None


def check_training_batch(batch, sample_shape, what, workers=1):
    """ShapeError unless a training batch of `batch` samples of `sample_shape` has more than one value
    per channel (per feature for flat samples): batch statistics need two. workers: how many split the
    batch when each normalises by its own statistics (synchronized=False); its rows are split as
    evenly as can be (a RowBlock), so the smallest share, floor(batch / workers) samples, needs two."""
    pixels = sample_shape[1] * sample_shape[2] if len(sample_shape) == 3 else 1
    per_channel = batch * pixels
    if per_channel < 2:
        raise ShapeError(f"{what}: batch statistics need more than one value per channel; a training batch of "
                         f"{batch} sample(s) of shape {tuple(sample_shape)} has {per_channel} (pick a "
                         f"batch_size that leaves no last batch of one sample)")
    share, need = batch // workers, (1 if pixels > 1 else 2)
    if workers > 1 and share < need:
        raise ShapeError(f"{what}: with each worker's own statistics (synchronized=False) every worker needs "
                         f"more than one value per channel; a training batch of {batch} sample(s) of shape "
                         f"{tuple(sample_shape)} over {workers} workers leaves {share} on some worker (pick a "
                         f"batch_size whose last batch holds at least {need * workers}, or synchronized=True)")


def batchnorm(x, gamma, beta, running_mean, running_var, training=True, momentum=0.1, eps=1e-5,
              activation=None, residual=None, synchronized=True):
    """A node: x normalised per feature (per channel for images) by the batch statistics in training,
    else by the running ones (updated with `momentum` while training), then scaled by gamma and shifted
    by beta; plus the node `residual` when given, then the `activation` (None or 'relu'), in one kernel.
    synchronized=False: each worker's rows by their own statistics (see the module docstring)."""
    fn = BatchNorm(running_mean, running_var, training, momentum, eps, activation, synchronized)
    return fn.apply(x, gamma, beta) if residual is None else fn.apply(x, gamma, beta, residual)
