"""Convolution and pooling layers over image batches (samples (C, H, W)); always data parallel."""
import numbers

import dmath
from dmath.planning import conv as window

from ..checked import Checked
from ..errors import ConfigError, ShapeError
from ..ops import Conv2D as ConvFn, Pool2D as PoolFn, activation as make_activation
from ..ops.conv import window_errors
from ..ops.join import pad
from .base import Layer
from .core import _check_activation, _init_config


class Conv2D(Layer):
    """2-D convolution (cross-correlation, as PyTorch) with K = filters output channels.

    Args:
        filters: output channels K.
        kernel: kh or (kh, kw).
        stride, dilation: int or pair.
        padding: int, pair, 'valid' (0) or 'same': with stride 1, an output as large as the input
            (an odd dilated kernel, as PyTorch); with a stride, Keras' rule: ceil(input / stride)
            pixels, the padding split evenly with the odd one at the bottom and right.
        groups: input and output channels in that many groups, each
            convolved on its own (PyTorch's groups; C and K must divide).
        activation: optional activation applied after (on a model's last layer: the output
            activation, fused with the loss as an Output layer is).
        kernel_init, bias_init: initializers; the kernel's fans are
            (C/groups*kh*kw, K*kh*kw), as PyTorch counts them.
        parallel: 'data' or 'auto', which chooses 'data': the kernel is replicated and the batch
            split (a convolution's weights are small beside its activations; 'model' is refused).
    The kernel is stored as a (K, C/groups*kh*kw) matrix; get_weights gives (K, C/groups, kh, kw).
    """
    image_rows = "channels_last"

    activation = Checked(_check_activation)

    def __init__(self, filters, kernel, stride=1, padding=0, dilation=1, activation=None, use_bias=True,
                 kernel_init="glorot_uniform", bias_init="zeros", parallel="data", groups=1, name=None):
        super().__init__(name, parallel)
        if isinstance(filters, bool) or not isinstance(filters, numbers.Integral) or filters < 1:
            raise ConfigError(f"Conv2D: filters must be a positive integer, got {filters!r}")
        self.filters = int(filters)
        with window_errors():
            self.groups = window.integer(groups, "Conv2D: groups", 1)
            self.kernel_hw = window.pair(kernel, "Conv2D: kernel", 1)
            self.stride = window.pair(stride, "Conv2D: stride", 1, window.MAX_STRIDE)
            self.dilation = window.pair(dilation, "Conv2D: dilation", 1)
        if self.filters % self.groups:
            # the input channels are checked alike when the layer sees its input (output_shape)
            raise ShapeError(f"Conv2D: groups={self.groups} must divide the kernels (filters={self.filters})")
        self.padding_spec = padding
        self.padding = self._padding(padding)
        self.activation = activation
        if not isinstance(use_bias, bool):     # (a string such as "False", from a file too, read as True)
            raise ConfigError(f"Conv2D: use_bias must be True or False, got {use_bias!r}")
        self.use_bias = use_bias
        self.kernel_init, self.bias_init = kernel_init, bias_init

    def _padding(self, padding):
        if padding == "valid":
            return (0, 0)
        if padding == "same":
            if self.stride != (1, 1):
                return None         # Keras' rule, decided by the input's size (same_padding)
            span = [d * (k - 1) for d, k in zip(self.dilation, self.kernel_hw)]
            if any(v % 2 for v in span):
                raise ConfigError(f"Conv2D: padding='same' with stride 1 needs an odd (dilated) kernel (as "
                                  f"PyTorch: the same padding on both sides), got {self.kernel_hw}")
            return (span[0] // 2, span[1] // 2)
        with window_errors():
            return window.pair(padding, "Conv2D: padding", 0)

    def _window(self, sample_shape):
        """(symmetric padding of the convolution, extra (bottom, right) rows and columns padded
        before it) for samples of `sample_shape`."""
        if self.padding is not None:
            return self.padding, (0, 0)
        return same_padding(sample_shape[1:], self.kernel_hw, self.stride, self.dilation)

    def output_shape(self, sample_shape):
        if len(sample_shape) != 3:
            raise ShapeError(f"Conv2D needs image samples (C, H, W), got {tuple(sample_shape)}")
        padding, extra = self._window(sample_shape)
        c, h, w = sample_shape
        with window_errors():
            window.groups(self.groups, c, self.filters, "Conv2D")
            g = window.geometry((c, h + extra[0], w + extra[1]), self.kernel_hw, self.stride, padding,
                                self.dilation, "Conv2D")
        return (self.filters, g.out_h, g.out_w)

    def _create(self, sample_shape, dtype):
        cg = sample_shape[0] // self.groups
        kh, kw = self.kernel_hw
        fans = (cg * kh * kw, self.filters * kh * kw)
        rep = dmath.Replicated()
        self.kernel = self._add_weight("kernel", self.kernel_init, (self.filters, cg * kh * kw), dtype, rep,
                                       public_shape=(self.filters, cg, kh, kw), fans=fans)
        self.bias = None
        if self.use_bias:
            self.bias = self._add_weight("bias", self.bias_init, (1, self.filters), dtype, rep,
                                         public_shape=(self.filters,), fans=fans)

    def forward(self, x, ctx, activation=None):
        """The layer's nodes; `activation` ('relu') is fused into the convolution (a following
        Activation layer that a Program folds in), as is the layer's own relu."""
        own = self.activation
        y = self._convolve(x, ctx, "relu" if "relu" in (own, activation) else None)
        return make_activation(own).apply(y) if own and own != "relu" else y

    def pre_activation(self, x, ctx):
        """The convolution's node before the layer's activation (a model's last layer: its
        activation is fused with the loss instead, dnn.functional.build_nodes)."""
        return self._convolve(x, ctx, None)

    def _convolve(self, x, ctx, fused):
        padding, extra = self._window(x.sample_shape)
        if any(extra):
            x = pad(x, (0, extra[0], 0, extra[1]))
        fn = ConvFn(self.kernel_hw, self.stride, padding, self.dilation, self.groups, fused)
        w = ctx.param(self.kernel)
        return fn.apply(x, w) if self.bias is None else fn.apply(x, w, ctx.param(self.bias))

    def absorbs(self, layer):
        """True when `layer`, coming right after this one, can run inside this layer's convolution."""
        return (self.activation in (None, "relu") and type(layer).__name__ == "Activation"
                and layer.activation == "relu")

    def get_config(self):
        return {**super().get_config(), "filters": self.filters, "kernel": list(self.kernel_hw),
                "stride": list(self.stride), "padding": self.padding_spec if isinstance(self.padding_spec, str)
                else list(self.padding), "dilation": list(self.dilation), "activation": self.activation,
                "use_bias": self.use_bias, "groups": self.groups, "kernel_init": _init_config(self.kernel_init),
                "bias_init": _init_config(self.bias_init)}


class Pool2D(Layer):
    """Max or average pooling; stride defaults to the kernel (non-overlapping windows).

    ceil_mode (max pooling): PyTorch's rule, the output rounds up ((H + 2p - k) / s + 1 pixels,
    rounded up, less one where the last window would start in the bottom or right padding): the
    windows that reach past the image pool the pixels they cover (torchvision's GoogLeNet).
    """
    image_rows = "channels_last"

    def __init__(self, kernel=2, stride=None, padding=0, mode="max", ceil_mode=False, name=None):
        super().__init__(name)
        self._template = PoolFn(kernel, stride, padding, mode, ceil_mode)     # validates the arguments

    @property
    def ceil_mode(self):
        """Whether the output rounds up (PyTorch's ceil_mode); fixed at construction, as the window is."""
        return self._template.ceil_mode

    def output_shape(self, sample_shape):
        if len(sample_shape) != 3:
            raise ShapeError(f"Pool2D needs image samples (C, H, W), got {tuple(sample_shape)}")
        return self._template.output_image(tuple(sample_shape), "Pool2D")

    def forward(self, x, ctx):
        # (ceil mode is the pool kernels' own: a padded copy of the batch, -inf at the bottom and
        # right, cost GoogLeNet four fills and eight copies of its largest activations a step)
        t = self._template
        return PoolFn(t.kernel, t.stride, t.padding, t.mode, t.ceil_mode).apply(x)

    def get_config(self):
        t = self._template
        return {**super().get_config(), "kernel": list(t.kernel), "stride": list(t.stride),
                "padding": list(t.padding), "mode": t.mode, "ceil_mode": self.ceil_mode}


def same_padding(size_hw, kernel_hw, stride, dilation):
    """Keras' 'same' padding: ((top, left) padding of the convolution, (bottom - top, right - left)
    extra rows and columns), so that the output is ceil(size / stride) along each axis."""
    sym, extra = [], []
    for n, k, s, d in zip(size_hw, kernel_hw, stride, dilation):
        out = -(-n // s)
        total = max((out - 1) * s + d * (k - 1) + 1 - n, 0)
        sym.append(total // 2)
        extra.append(total - 2 * (total // 2))
    return tuple(sym), tuple(extra)
