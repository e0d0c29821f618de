"""The core layers: Input, Dense, Activation, Dropout, Flatten, Reshape, Output."""
import math
import numbers

import numpy as np

from .. import parallel as par
from ..checked import Checked
from ..errors import ConfigError, ShapeError
from ..graph.node import int_tuple
from ..ops import Dropout as DropoutFn, Reshape as ReshapeFn, activation as make_activation, linear
from ..ops.activation import ACTIVATIONS
from ..ops.dropout import new_counter
from .base import Layer


def _sample_shape(shape):
    dims = int_tuple(shape, ConfigError(f"a sample shape is (features,) or (C, H, W), got {shape!r}"))
    if len(dims) not in (1, 3) or min(dims) < 1:
        raise ConfigError(f"a sample shape is (features,) or (C, H, W) of positive sizes, got {shape!r}")
    return dims


def counter_value(array, what, limit):
    """The one whole number in [0, limit) that `array` holds (a layer's counter, Layer.get_state) as an
    int; ShapeError naming `what` otherwise. NaN, infinity or several values are a damaged or crafted
    file's: int() of infinity raised a raw OverflowError, and of several values the first was used."""
    a = np.asarray(array)
    ok = a.size == 1 and a.dtype.kind in "iuf"
    if ok and a.dtype.kind == "f":
        v = float(a.reshape(-1)[0])
        ok = math.isfinite(v) and v == math.floor(v)
        v = int(v) if ok else None
    elif ok:
        v = int(a.reshape(-1)[0])
    if not ok or not 0 <= v < limit:
        got = repr(a.tolist()) if a.size <= 4 else f"an array of shape {a.shape}"
        raise ShapeError(f"{what} must be one whole number in [0, 2**{limit.bit_length() - 1}), got {got}")
    return v


def _check_activation(name):
    if name is not None and (not isinstance(name, str) or name not in ACTIVATIONS):
        raise ConfigError(f"unknown activation {name!r}; expected one of {sorted(ACTIVATIONS)} or None")
    return name


def _check_function(name):
    """An Activation layer's function: one of ACTIVATIONS (None is not a function)."""
    if name is None:
        raise ConfigError("Activation needs a function name")
    return _check_activation(name)


def _dropout_rate(p):
    if isinstance(p, bool) or not isinstance(p, numbers.Real) or not 0 <= p < 1:
        raise ConfigError(f"Dropout: p must be in [0, 1), got {p!r}")
    return float(p)


def _dropout_seed(seed):
    # (below 2**53: the seed travels as a float64 scalar, exact only that far)
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, numbers.Integral)
                             or not 0 <= seed < 2 ** 53):
        raise ConfigError(f"Dropout: seed must be an integer in [0, 2**53) or None, got {seed!r}")
    return seed


class Input(Layer):
    """The shape of one input sample: (features,) or an image (C, H, W). First layer of a Sequential."""

    def __init__(self, shape, name=None):
        super().__init__(name)
        self.shape = _sample_shape(shape)

    def output_shape(self, sample_shape):
        return self.shape

    def forward(self, x, ctx):
        return x

    def get_config(self):
        return {**super().get_config(), "shape": list(self.shape)}


class Dense(Layer):
    """A fully-connected layer y = x W + b, W of shape (in_features, units).

    Args:
        units: output features.
        activation: an optional activation applied after (a name, e.g. 'relu'); on a model's last
            layer it is the output activation, fused with the loss as an Output layer is.
        use_bias: add b (1, units).
        kernel_init, bias_init: initializers (names, numbers or dnn.initializers objects).
        parallel: 'data' (W replicated, the batch split), 'model' (W in column
            blocks, each worker owns units / P outputs) or 'auto' (fit times all data
            parallel against the cost model of dnn.parallel at its first steps and keeps
            the faster: dnn.training.strategy).
    """

    strategies = par.STRATEGIES

    activation = Checked(_check_activation)

    def __init__(self, units, activation=None, use_bias=True, kernel_init="glorot_uniform", bias_init="zeros",
                 parallel="data", name=None):
        super().__init__(name, parallel)
        if isinstance(units, bool) or not isinstance(units, numbers.Integral) or units < 1:
            raise ConfigError(f"Dense: units must be a positive integer, got {units!r}")
        self.units = int(units)
        self.activation = activation
        if not isinstance(use_bias, bool):     # (a string such as "False", from a file too, read as True)
            raise ConfigError(f"Dense: use_bias must be True or False, got {use_bias!r}")
        self.use_bias = use_bias
        self.kernel_init, self.bias_init = kernel_init, bias_init

    def output_shape(self, sample_shape):
        return (self.units,)

    def _create(self, sample_shape, dtype):
        fan_in = math.prod(sample_shape)
        layout = par.weight_layout(self.strategy or "data")
        self.kernel = self._add_weight("kernel", self.kernel_init, (fan_in, self.units), dtype, layout)
        self.bias = None
        if self.use_bias:
            self.bias = self._add_weight("bias", self.bias_init, (1, self.units), dtype, layout,
                                         public_shape=(self.units,), fans=(fan_in, self.units))

    def proposal(self, batch, nworkers):
        return par.choose_dense(math.prod(self.input_shape), self.units, batch, nworkers)

    def adopt(self, strategy):
        self.strategy = strategy
        layout = par.weight_layout(strategy)
        # (both over all the model's workers)
        self.move_weights([w for w in self.weights if type(w.value.layout) is not type(layout)], layout)

    def pre_activation(self, x, ctx):
        """The node x W + b, before the layer's activation (a model's last layer: its activation is
        fused with the loss instead, dnn.functional.build_nodes)."""
        w = ctx.param(self.kernel)
        return linear(x, w) if self.bias is None else linear(x, w, ctx.param(self.bias))

    def forward(self, x, ctx):
        y = self.pre_activation(x, ctx)
        return make_activation(self.activation).apply(y) if self.activation else y

    def get_config(self):
        return {**super().get_config(), "units": self.units, "activation": self.activation,
                "use_bias": self.use_bias, "kernel_init": _init_config(self.kernel_init),
                "bias_init": _init_config(self.bias_init), "parallel": self.parallel}


class Activation(Layer):
    """An elementwise or row-wise activation: 'sigmoid', 'tanh', 'relu', 'softmax', 'log_softmax', 'linear'."""

    activation = Checked(_check_function)

    def __init__(self, activation, name=None):
        super().__init__(name)
        self.activation = activation

    @property
    def image_rows(self):
        # elementwise activations read image rows in either order; softmax reads whole NCHW rows
        return "any" if ACTIVATIONS[self.activation].keeps_channels_last else "nchw"

    def forward(self, x, ctx):
        return make_activation(self.activation).apply(x)

    def get_config(self):
        return {**super().get_config(), "activation": self.activation}


class Output(Activation):
    """The network's output activation ('softmax', 'sigmoid' or 'linear').

    Training fuses it with the loss where that is exact and stable (softmax
    with cross-entropy, sigmoid with binary cross-entropy); predict applies it.
    """

    def __init__(self, activation="softmax", name=None):
        super().__init__(activation or "linear", name)


class Dropout(Layer):
    """Inverted dropout with rate p in training (kept values scaled by 1 / (1 - p)); identity in evaluation.

    seed: the mask generator's seed (None: the model gives each Dropout its own).
    The masks depend only on (seed, step, element index): the same at any worker count.
    """

    p = Checked(_dropout_rate)
    seed = Checked(_dropout_seed)

    def __init__(self, p=0.5, seed=None, name=None):
        super().__init__(name)
        self.p, self.seed = p, seed
        self.counter = None      # the (1, 1) matrix of mask steps drawn, shared by every graph of this layer

    def forward(self, x, ctx):
        if not ctx.training or self.p == 0.0:
            return x
        if self.counter is None:
            self.counter = new_counter()
        return DropoutFn(self.p, self.seed or 0, self.counter).apply(x)

    def get_state(self):
        return {"counter": np.array(self.counter.get((0, 0)) if self.counter is not None else 0.0)}

    def check_state(self, arrays):
        """`get_state`'s arrays checked, changing nothing: {"counter": int}, or {} without a counter.
        The counter is a float64 matrix, exact (and counting) only below 2**53 (new_counter)."""
        if "counter" not in arrays:
            return {}
        return {"counter": counter_value(arrays["counter"], f"{self.name}: the dropout counter", 2 ** 53)}

    def set_state(self, arrays):
        checked = self.check_state(arrays)
        if "counter" not in checked:
            return
        if self.counter is None:
            self.counter = new_counter()
        self.counter.set((0, 0), float(checked["counter"]))     # in place: recorded steps keep reading it

    def get_config(self):
        return {**super().get_config(), "p": self.p, "seed": self.seed}


class Flatten(Layer):
    """Samples as flat vectors (C, H, W) -> (C*H*W,); no data moves (a batch is always (N, C*H*W))."""

    def output_shape(self, sample_shape):
        return (math.prod(sample_shape),)

    def forward(self, x, ctx):
        return ReshapeFn(self.output_shape(x.sample_shape)).apply(x)


class Reshape(Layer):
    """Samples seen with another shape of the same size, e.g. (784,) -> (1, 28, 28)."""

    def __init__(self, shape, name=None):
        super().__init__(name)
        self.shape = _sample_shape(shape)

    def output_shape(self, sample_shape):
        if math.prod(sample_shape) != math.prod(self.shape):
            raise ShapeError(f"Reshape: samples of shape {tuple(sample_shape)} cannot become {self.shape}")
        return self.shape

    def forward(self, x, ctx):
        return ReshapeFn(self.shape).apply(x)

    def get_config(self):
        return {**super().get_config(), "shape": list(self.shape)}


def _init_config(spec):
    """An initializer spec as JSON (names and numbers as they are)."""
    from .. import initializers
    if isinstance(spec, (str, int, float)):
        return spec
    return initializers.get(spec).get_config()
