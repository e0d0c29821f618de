"""The compute graph: nodes over dmath matrices, topological order, reverse-mode gradients,
and MagmaDNN's op API (`var`, `constant`, `add`, `sub`, `mul`, `matmul`, `pow`, `sum`, ...).

Machinery (node, function, execute) sits below dnn.ops; `api` is the user's
facade over both.
"""
from .execute import backward, forward, topological_order
from .function import Function
from .node import Constant, Leaf, Node, Placeholder, Variable
from .api import (add, add_n, batchnorm, binary_cross_entropy, cast, constant, conv2d, cross_entropy, div,
                  dropout, exp, flatten, linear, log, log_softmax, matmul, mean, mse, mul, neg, placeholder,
                  pool2d, pow, product, relu, reshape, sigmoid, sigmoid_binary_cross_entropy, softmax,
                  softmax_cross_entropy, sub, sum, tanh, var)


def gradients(loss, wrt, seed=None):
    """Evaluate `loss` and return its gradients with respect to the nodes `wrt` (dmath matrices)."""
    order = topological_order([loss])
    forward([loss], order)
    return backward(loss, list(wrt), seed=seed, order=order)


__all__ = ["Node", "Leaf", "Variable", "Constant", "Placeholder", "Function", "topological_order", "forward",
           "backward", "gradients", "var", "constant", "placeholder", "add", "sub", "mul", "product", "div",
           "neg", "pow", "exp", "log", "sum", "mean", "add_n", "cast", "matmul", "linear", "sigmoid", "tanh",
           "relu", "softmax", "log_softmax", "softmax_cross_entropy", "cross_entropy", "binary_cross_entropy",
           "sigmoid_binary_cross_entropy", "mse", "dropout", "conv2d", "pool2d", "batchnorm", "reshape",
           "flatten"]
