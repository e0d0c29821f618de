"""2-D convolution and pooling over image batches (N, C*H*W), through dmath.nn.

The kernels run on each worker's samples (a row layout of the batch); the
weight gradient of a convolution comes out Partial over the batch's workers,
like a dense layer's, and the optimizer all-reduces it.

The window (pairs, minimums, fit, pooling padding, groups) is checked by
dmath's one geometry validator (dmath/planning/conv.py), the rule dmath.nn
applies too; its mistakes are ShapeErrors, raised here as dnn's.

Convolution and pooling read their input in the order it comes in: NCHW
rows, or channels-last rows (a node's `channels_last`, made by
to_channels_last), and give their output in the same order. A Sequential
model on a GPU converts once before its first convolution and back before
its first layer that reads NCHW (dnn.training.programs), so cuDNN never converts.
"""
import contextlib

import numpy as np

import dmath
from dmath.planning import conv as window

from ..errors import ConfigError, ShapeError
from ..graph.function import Function


@contextlib.contextmanager
def window_errors():
    """Raise a dmath.ShapeError of the window geometry inside the block as dnn's ShapeError
    (a dnn user catches dnn's errors; the rule and the class are the same as dmath.nn's)."""
    try:
        yield
    except dmath.ShapeError as exc:
        raise ShapeError(str(exc)) from exc


def _image(name, x):
    if len(x.sample_shape) != 3:
        raise ShapeError(f"{name}: the input must be an image batch with samples (C, H, W), got samples of "
                         f"shape {x.sample_shape} (put an Input((C, H, W)) or a Reshape first)")
    return x.sample_shape


class Conv2D(Function):
    """y = conv2d(x, W) + b, W (K, C/groups*kh*kw) the (K, C/groups, kh, kw) kernel flattened;
    cross-correlation as PyTorch."""
    name = "conv2d"
    keeps_channels_last = True

    def __init__(self, kernel_hw, stride=(1, 1), padding=(0, 0), dilation=(1, 1), groups=1, activation=None):
        with window_errors():
            self.kernel_hw = window.pair(kernel_hw, "conv2d: kernel", 1)
            self.stride = window.pair(stride, "conv2d: stride", 1, window.MAX_STRIDE)
            self.padding = window.pair(padding, "conv2d: padding", 0)
            self.dilation = window.pair(dilation, "conv2d: dilation", 1)
            self.groups = window.integer(groups, "conv2d: groups", 1)
        if activation not in (None, "relu"):
            raise ConfigError(f"conv2d: a fused activation must be None or 'relu', got {activation!r}")
        self.activation = activation
        self.saves_output = activation == "relu"        # backward reads y for the fused relu's mask
        #: the relu's mask is already in the output gradient (fold_relu_masks: a max pool applied it)
        self.gradient_masked = False

    def infer(self, x, w, b=None):
        c, h, wd = self.image_shape = _image(self.name, x)
        self.channels_last = x.channels_last
        k = w.shape[0]
        with window_errors():
            window.groups(self.groups, c, k, "conv2d")
            window.kernel_from_weights(w.shape[1], c // self.groups, self.kernel_hw, "conv2d")
            g = window.geometry(self.image_shape, self.kernel_hw, self.stride, self.padding, self.dilation, "conv2d")
        if b is not None and b.shape != (1, k):
            raise ShapeError(f"conv2d: the bias must be (1, {k}), got {b.shape}")
        return (x.shape[0], k * g.out_h * g.out_w), x.dtype, (k, g.out_h, g.out_w)

    def forward(self, x, w, b=None):
        return dmath.nn.conv2d(x, w, b, self.image_shape, stride=self.stride, padding=self.padding,
                               dilation=self.dilation, kernel_hw=self.kernel_hw, groups=self.groups,
                               activation=self.activation, channels_last=self.channels_last)

    def backward(self, xs, y, gy, needs):
        x, w = xs[0], xs[1]
        if self.activation == "relu" and not self.gradient_masked:
            gy = dmath.where(y, gy, 0.0)         # y > 0 exactly where the pre-activation was
        has_bias = len(xs) == 3
        gx, gw, gb = dmath.nn.conv2d_backward(gy, x, w, self.image_shape, self.kernel_hw, self.stride,
                                              self.padding, self.dilation, need_dx=needs[0], groups=self.groups,
                                              channels_last=self.channels_last, need_db=has_bias and needs[2],
                                              need_dw=needs[1])
        # (each gradient not needed is None: conv2d_backward made none)
        return (gx, gw) if not has_bias else (gx, gw, gb)


class Pool2D(Function):
    """Max or average pooling over kernel windows (average counts the padding, as PyTorch's default)."""
    name = "pool2d"
    saves_inputs = saves_output = False             # backward reads the argmax of the windows only
    keeps_channels_last = True

    #: other names of the modes (PyTorch's and Keras's 'avg')
    ALIASES = {"avg": "average"}

    def __init__(self, kernel, stride=None, padding=(0, 0), mode="max", ceil_mode=False):
        mode = self.ALIASES.get(mode, mode) if isinstance(mode, str) else mode
        if mode not in ("max", "average"):
            raise ConfigError(f"pool2d: mode must be 'max' or 'average' (or 'avg'), got {mode!r}")
        if not isinstance(ceil_mode, (bool, np.bool_)):
            raise ConfigError(f"pool2d: ceil_mode must be True or False, got {ceil_mode!r}")
        ceil_mode = bool(ceil_mode)
        if ceil_mode and mode != "max":
            raise ConfigError("pool2d: ceil_mode applies to max pooling (an average's divisor at the edge would "
                              "differ from PyTorch's)")
        with window_errors():
            self.kernel, self.stride, self.padding = window.pool_window(kernel, stride, padding, "pool2d")
        self.mode, self.ceil_mode = mode, ceil_mode
        self.after_relu = False         # the input is a relu's output (fold_relu_masks)

    def output_image(self, image_shape, what):
        """(C, Ho, Wo) of pooling (C, H, W) images."""
        with window_errors():
            g = window.pool_geometry(image_shape, self.kernel, self.stride, self.padding, what, self.ceil_mode)
        return (g.channels, g.out_h, g.out_w)

    def infer(self, x):
        self.image_shape = _image(self.name, x)
        self.channels_last = x.channels_last
        c, ho, wo = self.output_image(self.image_shape, self.name)
        return (x.shape[0], c * ho * wo), x.dtype, (c, ho, wo)

    def forward(self, x):
        y, self.argmax = dmath.nn.pool2d(x, self.image_shape, self.kernel, stride=self.stride,
                                         padding=self.padding, mode=self.mode, channels_last=self.channels_last,
                                         after_relu=self.after_relu, ceil_mode=self.ceil_mode)
        return y

    def backward(self, xs, y, gy, needs):
        return (dmath.nn.pool2d_backward(gy, self.argmax, self.image_shape, self.kernel, self.stride,
                                         self.padding, self.mode, self.channels_last, self.ceil_mode),)

    def drop_saved(self):
        self.argmax = None


def fold_relu_masks(order, keep=()):
    """Let each max pool that reads a relu-fused convolution's output, as its only reader, apply the
    relu's gradient mask (dmath.nn.pool2d's after_relu): the convolution's backward then skips its
    mask pass and need not keep its output. `order`: the graph's nodes (topological); `keep`: nodes
    the caller reads (their values must stay). Call it before the graph first runs."""
    readers = {}
    for node in order:
        for x in node.inputs:
            readers[x.id] = readers.get(x.id, 0) + 1
    kept = {k.id for k in keep if k is not None}
    for node in order:
        fn = node.fn
        if not isinstance(fn, Pool2D) or fn.mode != "max":
            continue
        src = node.inputs[0]
        conv = src.fn
        if (isinstance(conv, Conv2D) and conv.activation == "relu" and readers[src.id] == 1
                and src.id not in kept):
            fn.after_relu = True
            conv.gradient_masked = True
            conv.saves_output = False


class ImageFormat(Function):
    """An image batch's rows between NCHW and channels-last order (dmath.nn.to_channels_last and
    to_channels_first); the gradient is the other conversion."""
    saves_inputs = saves_output = False

    def __init__(self, to_last):
        self.to_last = bool(to_last)
        self.name = "to_channels_last" if self.to_last else "to_channels_first"

    def infer(self, x):
        self.image_shape = _image(self.name, x)
        if x.channels_last == self.to_last:
            raise ShapeError(f"{self.name}: the input rows are {'already' if self.to_last else 'not'} channels-last")
        return x.shape, x.dtype, x.sample_shape

    def output_channels_last(self, inputs):
        return self.to_last

    def forward(self, x):
        return (dmath.nn.to_channels_last if self.to_last else dmath.nn.to_channels_first)(x, self.image_shape)

    def backward(self, xs, y, gy, needs):
        return ((dmath.nn.to_channels_first if self.to_last else dmath.nn.to_channels_last)(gy, self.image_shape),)


def to_channels_last(x):
    """The image-batch node x (NCHW rows) as channels-last rows: what conv2d and pool2d read fastest."""
    return ImageFormat(True).apply(x)


def to_channels_first(x):
    """The channels-last image-batch node x back in NCHW rows (what every other function reads)."""
    return ImageFormat(False).apply(x)


def conv2d(x, w, b=None, kernel_hw=None, stride=1, padding=0, dilation=1, groups=1):
    """Convolution of an image-batch node x with the flattened kernel node w (K, C/groups*kh*kw)."""
    if kernel_hw is None:
        raise ConfigError("conv2d: kernel_hw=(kh, kw) is required (w is stored flattened)")
    fn = Conv2D(kernel_hw, stride, padding, dilation, groups)
    return fn.apply(x, w) if b is None else fn.apply(x, w, b)


def pool2d(x, kernel, stride=None, padding=0, mode="max"):
    """A node: max (mode='max') or average (mode='average', or its alias 'avg') pooling of image
    node x over kernel windows (stride defaults to the kernel)."""
    return Pool2D(kernel, stride, padding, mode).apply(x)
