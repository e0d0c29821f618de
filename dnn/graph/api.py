"""MagmaDNN's `op::` API over dnn.ops: leaves (var, constant, placeholder) and node builders.

    x = dnn.graph.var("x", (1, 1), init=5.0)
    c = dnn.graph.constant(3.0)
    expr = dnn.graph.add(dnn.graph.pow(x, 2), c)      # or x ** 2 + c
    expr.eval().to_numpy()                            # [[28.]]
    opt = dnn.optim.SGD(lr=0.1)
    for _ in range(100):
        opt.minimize(expr, [x])                       # x -> 0
"""
import numbers

import numpy as np

import dmath

from ..errors import ConfigError
from .node import Constant, Placeholder, Variable, canonical_dtype, check_shape

# the builders of every op family, under MagmaDNN's names
from ..ops import (add, add_n, batchnorm, binary_cross_entropy, cast, conv2d, cross_entropy, div,  # noqa: F401
                   dropout, exp, flatten, linear, log, log_softmax, matmul, mean, mse, mul, neg, pool2d, pow,
                   relu, reshape, sigmoid, sigmoid_binary_cross_entropy, softmax, softmax_cross_entropy, sub,
                   sum, tanh)

product = mul                  # MagmaDNN's name of the elementwise product


def _require_runtime():
    if not dmath.is_initialized():
        dmath.init()


def var(name, shape, init=0.0, dtype="float32", layout=None):
    """A trainable variable of `shape`, filled by `init` (a number, an initializer name or object,
    or a numpy array of that shape, whose values the dtype holds). Parameters are Replicated by default (data parallelism)."""
    _require_runtime()
    from .. import initializers
    shape = check_shape(shape, f"var {name!r}: shape")
    value = initializers.get(init)(shape, dtype=canonical_dtype(dtype),
                                   layout=layout if layout is not None else dmath.Replicated(), name=f"var {name!r}")
    return Variable(value, name=name)


def constant(value, shape=None, dtype="float32", layout=None, name=None):
    """A constant node: a number (of `shape`, default (1, 1)), a numpy array or a dmath.Matrix."""
    _require_runtime()
    if isinstance(value, dmath.Matrix):
        m = value if dtype is None or value.dtype == canonical_dtype(dtype) else value.astype(dtype)
    elif isinstance(value, numbers.Real) and not isinstance(value, bool):
        shape = check_shape(shape if shape is not None else (1, 1), "constant shape")
        m = dmath.full(shape, float(value), dtype=canonical_dtype(dtype),
                       layout=layout if layout is not None else dmath.Replicated())
    elif isinstance(value, np.ndarray):
        m = dmath.from_numpy(value, layout=layout if layout is not None else dmath.Replicated(),
                             dtype=canonical_dtype(dtype))
    else:
        raise ConfigError(f"constant: expected a number, a numpy array or a dmath.Matrix, got {value!r}")
    return Constant(m, name=name)


def placeholder(shape, dtype="float32", name=None, sample_shape=None):
    """An input node; give it a matrix with `node.feed(M)` before evaluating."""
    return Placeholder(check_shape(shape, "placeholder shape"), dtype, name=name, sample_shape=sample_shape)
