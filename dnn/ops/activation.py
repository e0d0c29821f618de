"""Activation functions: sigmoid, tanh, relu through dmath's elementwise functions (forward and
gradient from their dmath definitions: `Elementwise`); softmax and log-softmax through dmath.nn
(whole rows: the master puts the batch in a row layout).

Backward passes reuse the forward output where the derivative is a function
of it (sigmoid, tanh, relu, softmax), so no input needs to be kept.
"""
import dmath

from ..errors import ConfigError
from ..graph.function import Function
from .elementwise import Elementwise

#: activation name -> Function class (the names the layers accept): each class below that is
#: decorated `@_activation`, under its `name`
ACTIVATIONS = {}


def _activation(cls):
    """Make the Function class `cls` an activation the layers accept, under `cls.name`."""
    if cls.name in ACTIVATIONS:
        raise ValueError(f"activation {cls.name!r} defined twice")
    ACTIVATIONS[cls.name] = cls
    return cls


@_activation
class Sigmoid(Elementwise):
    """1 / (1 + exp(-x)) elementwise (dmath.sigmoid and its gradient)."""
    name = "sigmoid"


@_activation
class Tanh(Elementwise):
    """tanh(x) elementwise (dmath.tanh and its gradient)."""
    name = "tanh"


@_activation
class Relu(Elementwise):
    """max(x, 0) elementwise (dmath.relu and its gradient)."""
    name = "relu"


@_activation
class Softmax(Function):
    """Row-wise softmax (each row one sample)."""
    name = "softmax"
    saves_inputs = False

    def forward(self, x):
        return dmath.nn.softmax(x)

    def backward(self, xs, y, gy, needs):
        # dx = y * (gy - rowsum(gy * y))
        return (y * (gy - (gy * y).sum(axis=1)),)


@_activation
class LogSoftmax(Function):
    """Row-wise log-softmax."""
    name = "log_softmax"
    saves_inputs = False

    def forward(self, x):
        return dmath.nn.log_softmax(x)

    def backward(self, xs, y, gy, needs):
        # dx = gy - softmax(x) * rowsum(gy)
        return (gy - dmath.exp(y) * gy.sum(axis=1),)


@_activation
class Identity(Function):
    """The 'linear' activation: x itself."""
    name = "linear"
    saves_inputs = saves_output = False
    keeps_channels_last = True

    def forward(self, x):
        return x

    def backward(self, xs, y, gy, needs):
        return (gy,)


def activation(name):
    """A new Function for the activation called `name` (see ACTIVATIONS)."""
    cls = ACTIVATIONS.get(name if name is not None else "linear")
    if cls is None:
        raise ConfigError(f"unknown activation {name!r}; expected one of {sorted(ACTIVATIONS)}")
    return cls()


def sigmoid(x):
    """A node: the logistic sigmoid of node x."""
    return Sigmoid().apply(x)


def tanh(x):
    """A node: tanh of node x."""
    return Tanh().apply(x)


def relu(x):
    """A node: max(x, 0) of node x."""
    return Relu().apply(x)


def softmax(x):
    """A node: the softmax of each row (sample) of node x."""
    return Softmax().apply(x)


def log_softmax(x):
    """A node: the log of each row's softmax of node x (computed stably)."""
    return LogSoftmax().apply(x)
