"""2-D convolution and pooling over image batches (N, C*H*W), through dmath.nn.

The kernels run on each worker's samples (a row layout of the batch); the
weight gradient of a convolution comes out Partial over the batch's workers,
like a dense layer's, and the optimizer all-reduces it.
"""
import dmath

from ..errors import ConfigError, ShapeError
from ..graph.function import Function


def pair(v, what):
    """(a, b) from an int or a pair of non-negative ints."""
    if isinstance(v, int) and not isinstance(v, bool):
        v = (v, v)
    try:
        a, b = (int(x) for x in v)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{what} must be an int or a pair of ints, got {v!r}") from exc
    if a < 0 or b < 0:
        raise ConfigError(f"{what} must be non-negative, got {v!r}")
    return (a, b)


def _image(name, x):
    if len(x.sample_shape) != 3:
        raise ShapeError(f"{name}: the input must be an image batch with samples (C, H, W), got samples of "
                         f"shape {x.sample_shape} (put an Input((C, H, W)) or a Reshape first)")
    return x.sample_shape


def window_output(size, k, stride, pad, dilation=1):
    """Output length of a sliding window along one axis (floor mode, as PyTorch)."""
    return (size + 2 * pad - dilation * (k - 1) - 1) // stride + 1


class Conv2D(Function):
    """y = conv2d(x, W) + b, W (K, C/groups*kh*kw) the (K, C/groups, kh, kw) kernel flattened;
    cross-correlation as PyTorch."""
    name = "conv2d"

    def __init__(self, kernel_hw, stride=(1, 1), padding=(0, 0), dilation=(1, 1), groups=1, activation=None):
        self.kernel_hw = pair(kernel_hw, "kernel")
        self.stride = pair(stride, "stride")
        self.padding = pair(padding, "padding")
        self.dilation = pair(dilation, "dilation")
        if min(self.kernel_hw + self.stride + self.dilation) < 1:
            raise ConfigError("conv2d: kernel, stride and dilation must be at least 1")
        if isinstance(groups, bool) or not isinstance(groups, int) or groups < 1:
            raise ConfigError(f"conv2d: groups must be a positive integer, got {groups!r}")
        if activation not in (None, "relu"):
            raise ConfigError(f"conv2d: a fused activation must be None or 'relu', got {activation!r}")
        self.groups, self.activation = groups, activation

    def infer(self, x, w, b=None):
        c, h, wd = self.image_shape = _image(self.name, x)
        kh, kw = self.kernel_hw
        k = w.shape[0]
        if c % self.groups or k % self.groups:
            raise ShapeError(f"conv2d: groups={self.groups} must divide the input channels ({c}) and the "
                             f"kernels ({k})")
        cg = c // self.groups
        if w.shape[1] != cg * kh * kw:
            raise ShapeError(f"conv2d: a kernel for {cg} input channels per group of {kh}x{kw} has "
                             f"{cg * kh * kw} columns, got a weight of shape {w.shape}")
        if b is not None and b.shape != (1, k):
            raise ShapeError(f"conv2d: the bias must be (1, {k}), got {b.shape}")
        ho = window_output(h, kh, self.stride[0], self.padding[0], self.dilation[0])
        wo = window_output(wd, kw, self.stride[1], self.padding[1], self.dilation[1])
        if ho < 1 or wo < 1:
            raise ShapeError(f"conv2d: a {kh}x{kw} kernel (dilation {self.dilation}, padding {self.padding}) "
                             f"does not fit a {h}x{wd} image")
        return (x.shape[0], k * ho * wo), x.dtype, (k, ho, wo)

    def forward(self, x, w, b=None):
        return dmath.nn.conv2d(x, w, b, self.image_shape, stride=self.stride, padding=self.padding,
                               dilation=self.dilation, kernel_hw=self.kernel_hw, groups=self.groups,
                               activation=self.activation)

    def backward(self, xs, y, gy, needs):
        x, w = xs[0], xs[1]
        if self.activation == "relu":
            gy = dmath.where(y, gy, 0.0)         # y > 0 exactly where the pre-activation was
        gx, gw, gb = dmath.nn.conv2d_backward(gy, x, w, self.image_shape, self.kernel_hw, self.stride,
                                              self.padding, self.dilation, need_dx=needs[0], groups=self.groups)
        grads = (gx if needs[0] else None, gw if needs[1] else None)
        return grads if len(xs) == 2 else grads + (gb if needs[2] else None,)


class Pool2D(Function):
    """Max or average pooling over kernel windows (average counts the padding, as PyTorch's default)."""
    name = "pool2d"

    def __init__(self, kernel, stride=None, padding=(0, 0), mode="max"):
        if mode not in ("max", "average"):
            raise ConfigError(f"pool2d: mode must be 'max' or 'average', got {mode!r}")
        self.kernel = pair(kernel, "kernel")
        self.stride = pair(stride if stride is not None else self.kernel, "stride")
        self.padding = pair(padding, "padding")
        self.mode = mode
        if min(self.kernel + self.stride) < 1:
            raise ConfigError("pool2d: kernel and stride must be at least 1")
        if self.padding[0] * 2 > self.kernel[0] or self.padding[1] * 2 > self.kernel[1]:
            raise ConfigError(f"pool2d: padding {self.padding} must be at most half the kernel {self.kernel}")

    def infer(self, x):
        c, h, w = self.image_shape = _image(self.name, x)
        ho = window_output(h, self.kernel[0], self.stride[0], self.padding[0])
        wo = window_output(w, self.kernel[1], self.stride[1], self.padding[1])
        if ho < 1 or wo < 1:
            raise ShapeError(f"pool2d: a {self.kernel} window does not fit a {h}x{w} image")
        return (x.shape[0], c * ho * wo), x.dtype, (c, ho, wo)

    def forward(self, x):
        y, self.argmax = dmath.nn.pool2d(x, self.image_shape, self.kernel, stride=self.stride,
                                         padding=self.padding, mode=self.mode)
        return y

    def backward(self, xs, y, gy, needs):
        return (dmath.nn.pool2d_backward(gy, self.argmax, self.image_shape, self.kernel, self.stride,
                                         self.padding, self.mode),)


def conv2d(x, w, b=None, kernel_hw=None, stride=1, padding=0, dilation=1, groups=1):
    """Convolution of an image-batch node x with the flattened kernel node w (K, C/groups*kh*kw)."""
    if kernel_hw is None:
        raise ConfigError("conv2d: kernel_hw=(kh, kw) is required (w is stored flattened)")
    fn = Conv2D(kernel_hw, stride, padding, dilation, groups)
    return fn.apply(x, w) if b is None else fn.apply(x, w, b)


def pool2d(x, kernel, stride=None, padding=0, mode="max"):
    return Pool2D(kernel, stride, padding, mode).apply(x)
