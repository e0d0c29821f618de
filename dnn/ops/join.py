"""Functions of branchy networks: the sum and the concatenation of branches, global average
pooling, and uneven image padding (through dmath.nn's row-local kernels: no communication).

Each reads image rows in either order (NCHW or channels-last) and gives its
result in the same order, so a network that runs channels-last never converts
around a residual sum or an Inception module's concatenation.
"""
import math

import dmath

from ..errors import GraphError, ShapeError
from ..graph.function import Function
from ._util import result_dtype
from .conv import _image


def _several(name, xs):
    """ShapeError unless xs holds two nodes or more."""
    if len(xs) < 2:
        raise ShapeError(f"{name}: needs at least two nodes, got {len(xs)}")


def _same_order(name, xs):
    """The one row order (channels-last or not) of the image nodes xs."""
    orders = {x.channels_last for x in xs}
    if len(orders) > 1:
        raise GraphError(f"{name}: the inputs mix NCHW and channels-last image rows; convert them to one order")
    return orders.pop()


class Merge(Function):
    """The sum of same-shape nodes (a residual connection): Keras' Add."""
    name = "merge_add"
    saves_inputs = saves_output = False
    keeps_channels_last = True

    def infer(self, *xs):
        _several(self.name, xs)
        first = xs[0]
        for x in xs[1:]:
            if x.shape != first.shape or x.sample_shape != first.sample_shape:
                raise ShapeError(f"{self.name}: every input must have the shape of the first, samples "
                                 f"{first.sample_shape}; got samples {x.sample_shape}")
        return first.shape, result_dtype(*xs), first.sample_shape

    def output_channels_last(self, inputs):
        return _same_order(self.name, inputs)

    def forward(self, *xs):
        y = xs[0] + xs[1]
        for x in xs[2:]:
            y += x
        return y

    def backward(self, xs, y, gy, needs):
        # every input receives the output's gradient itself (no function changes a gradient in place)
        return tuple(gy if need else None for need in needs)


class Concat(Function):
    """Samples joined along their channels (images of one size) or features (flat samples)."""
    name = "concat"
    saves_inputs = saves_output = False
    keeps_channels_last = True

    def infer(self, *xs):
        _several(self.name, xs)
        n, dtype = xs[0].shape[0], xs[0].dtype
        for x in xs:
            if x.shape[0] != n or x.dtype != dtype:
                raise ShapeError(f"{self.name}: every input must be a batch of {n} {dtype} samples, got "
                                 f"{x.shape} {x.dtype}")
        shapes = [x.sample_shape for x in xs]
        if all(len(s) == 3 for s in shapes):
            if len({s[1:] for s in shapes}) > 1:
                raise ShapeError(f"{self.name}: images must have one height and width to join their channels, "
                                 f"got samples {shapes}")
            h, w = shapes[0][1:]
            self.channels_last = _same_order(self.name, xs)
            self.groups = h * w if self.channels_last else 1
            self.widths = tuple(s[0] * (1 if self.channels_last else h * w) for s in shapes)
            return (n, sum(x.shape[1] for x in xs)), dtype, (sum(s[0] for s in shapes), h, w)
        if all(len(s) == 1 for s in shapes):
            self.groups, self.widths = 1, tuple(s[0] for s in shapes)
            return (n, sum(self.widths)), dtype, (sum(self.widths),)
        raise ShapeError(f"{self.name}: join images with images or flat samples with flat samples, got "
                         f"samples {shapes}")

    def output_channels_last(self, inputs):
        return _same_order(self.name, inputs)

    def forward(self, *xs):
        return dmath.nn.concat_features(xs, self.groups)

    def backward(self, xs, y, gy, needs):
        parts = dmath.nn.split_features(gy, self.widths, self.groups)
        return tuple(p if need else None for p, need in zip(parts, needs))


class GlobalAvgPool(Function):
    """The mean of each channel over the image: (C, H, W) samples become (C,) features."""
    name = "global_avg_pool"
    saves_inputs = saves_output = False
    keeps_channels_last = True

    def infer(self, x):
        self.image_shape = _image(self.name, x)
        self.channels_last = x.channels_last
        return (x.shape[0], self.image_shape[0]), x.dtype, (self.image_shape[0],)

    def output_channels_last(self, inputs):
        return False        # one value per channel: the same row in either order

    def forward(self, x):
        return dmath.nn.pool2d(x, self.image_shape, self.image_shape[1:], mode="average",
                               channels_last=self.channels_last)[0]

    def backward(self, xs, y, gy, needs):
        return (dmath.nn.pool2d_backward(gy, None, self.image_shape, self.image_shape[1:], mode="average",
                                         channels_last=self.channels_last),)


class AdaptiveAvgPool(Function):
    """Average pooling to an (oh, ow) output in PyTorch's adaptive windows (dmath.nn.adaptive_avg_pool)."""
    name = "adaptive_avg_pool"
    saves_inputs = saves_output = False
    keeps_channels_last = True

    def __init__(self, out_hw):
        self.out_hw = tuple(int(v) for v in out_hw)

    def infer(self, x):
        self.image_shape = c, _, _ = _image(self.name, x)
        self.channels_last = x.channels_last
        oh, ow = self.out_hw
        return (x.shape[0], c * oh * ow), x.dtype, (c, oh, ow)

    def forward(self, x):
        return dmath.nn.adaptive_avg_pool(x, self.image_shape, self.out_hw, self.channels_last)

    def backward(self, xs, y, gy, needs):
        return (dmath.nn.adaptive_avg_pool_backward(gy, self.image_shape, self.out_hw, self.channels_last),)


class Pad(Function):
    """Images padded by (top, bottom, left, right) rows and columns of a constant."""
    name = "pad"
    saves_inputs = saves_output = False
    keeps_channels_last = True

    def __init__(self, pads, value=0.0):
        self.pads, self.value = tuple(int(p) for p in pads), float(value)

    def infer(self, x):
        self.image_shape = c, h, w = _image(self.name, x)
        self.channels_last = x.channels_last
        t, b, l, r = self.pads
        out = (c, h + t + b, w + l + r)
        return (x.shape[0], math.prod(out)), x.dtype, out

    def forward(self, x):
        return dmath.nn.pad_images(x, self.image_shape, self.pads, self.value, self.channels_last)

    def backward(self, xs, y, gy, needs):
        return (dmath.nn.crop_images(gy, self.image_shape, self.pads, self.channels_last),)


def merge_add(*xs):
    """A node: the sum of the same-shape nodes xs."""
    return Merge().apply(*xs)


def concat(*xs):
    """A node: the image nodes xs joined along their channels (flat nodes: along their features)."""
    return Concat().apply(*xs)


def global_avg_pool(x):
    """A node: the mean of each channel of the image node x, as (C,) features."""
    return GlobalAvgPool().apply(x)


def adaptive_avg_pool(x, out_hw):
    """A node: the image node x average-pooled to out_hw = (oh, ow) in PyTorch's adaptive windows."""
    return AdaptiveAvgPool(out_hw).apply(x)


def pad(x, pads, value=0.0):
    """A node: the image node x padded by pads = (top, bottom, left, right) of `value`."""
    return Pad(pads, value).apply(x)
