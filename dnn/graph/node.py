"""Nodes of the compute graph: leaves that hold matrices, and outputs of functions.

A graph is built first (define, then run, as MagmaDNN's `op::` API): building
a node checks shapes and dtypes at once, so a network that does not fit
together fails where it is written, before anything runs. Evaluating a node
computes the values of everything it depends on, in topological order, as
dmath matrices on the workers.

Every node evaluates to a 2-D matrix. `sample_shape` says what one row is:
(features,) for a flat batch, (C, H, W) for an image batch stored as
(N, C*H*W) rows in NCHW order; reshaping between the two moves no data.
"""
import itertools
import math
import numbers

import dmath

from ..errors import ConfigError, GraphError, ShapeError

_ids = itertools.count(1)



def canonical_dtype(dtype):
    """'float16' | 'float32' | 'float64' from any spelling numpy accepts; ConfigError otherwise.

    dmath's rule (`dmath.backend.canonical_dtype`), raised as dnn's configuration error."""
    try:
        return dmath.backend.canonical_dtype(dtype)
    except dmath.DTypeError as exc:
        raise ConfigError(str(exc)) from exc


def int_tuple(value, error):
    """An int n as (n,), a sequence of numbers as a tuple of ints; raises the exception `error`
    (from the cause) where `value` is neither."""
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        return (int(value),)
    try:
        items = tuple(value)
    except TypeError as exc:
        raise error from exc
    # whole numbers only: int() would truncate 2.5 to 2, and take True or '3'
    if not all(isinstance(d, numbers.Integral) and not isinstance(d, bool) for d in items):
        raise error
    return tuple(int(d) for d in items)


def check_shape(shape, what="shape"):
    """A (rows, cols) pair of non-negative ints; an int n or a 1-tuple (n,) means a (1, n) row."""
    dims = int_tuple(shape, ShapeError(f"{what} must be a pair (rows, cols) of integers, got {shape!r}"))
    if len(dims) == 1:
        dims = (1, dims[0])
    if len(dims) != 2 or min(dims) < 0:
        raise ShapeError(f"{what} must be a pair (rows, cols) of non-negative integers, got {shape!r}")
    return dims


class Node:
    """A value in the compute graph.

    Attributes:
        shape: (rows, cols) of the matrix the node evaluates to.
        dtype: 'float16', 'float32' or 'float64'.
        sample_shape: the shape of one row: (cols,) or an image (C, H, W).
        fn: the `Function` that computes it (None for a leaf).
        inputs: the nodes `fn` reads.
        after: nodes that run before this one although it does not read them (an ordering edge,
            execute.topological_order's only: no value or gradient flows along it). A layer that
            updates state of its own at each call (a BatchNorm's running statistics) is called in
            the order its calls were written, as in PyTorch.
        value: the dmath.Matrix of the last evaluation (None before).
    """

    trainable = False

    def __init__(self, shape, dtype, fn=None, inputs=(), name=None, sample_shape=None):
        self.shape = check_shape(shape)
        self.dtype = canonical_dtype(dtype)
        self.fn = fn
        self.inputs = tuple(inputs)
        self.after = ()
        self.id = next(_ids)
        self.name = name or (f"{fn.name}_{self.id}" if fn is not None else f"node_{self.id}")
        if sample_shape is None:
            sample_shape = (self.shape[1],)
        sample_shape = tuple(int(d) for d in sample_shape)
        if math.prod(sample_shape) != self.shape[1]:
            raise ShapeError(f"{self.name}: a sample of shape {sample_shape} does not fill a row of "
                             f"{self.shape[1]} columns")
        self.sample_shape = sample_shape
        # an image's row holds its values channels-last, (H, W, C), instead of (C, H, W); sample_shape
        # stays (C, H, W) either way (set by Function.apply; dnn.ops.to_channels_last converts)
        self.channels_last = False
        self.value = None
        self.layout = None      # the layout of its value in the latest training step (execute.forward)

    @property
    def is_leaf(self):
        return self.fn is None

    def eval(self):
        """Evaluate the graph up to this node; returns its value, a dmath.Matrix."""
        from .execute import forward
        forward([self])
        return self.value

    def numpy(self):
        """Evaluate and gather the value on the master as a numpy array."""
        return self.eval().to_numpy()

    def __repr__(self):
        kind = type(self).__name__
        return f"<{kind} {self.name} shape={self.shape} dtype={self.dtype}>"

    # Arithmetic operators build nodes through dnn.ops (installed there, as
    # Chainer does, so that this module does not import the ops above it).


class Leaf(Node):
    """A node whose value is given, not computed: a Variable, a Constant or a Placeholder."""

    def __init__(self, value, name=None, sample_shape=None):
        if not isinstance(value, dmath.Matrix):
            raise GraphError(f"a leaf holds a dmath.Matrix, got {type(value).__name__}")
        super().__init__(value.shape, value.dtype, name=name, sample_shape=sample_shape)
        self.value = value

    def assign(self, value):
        """Replace the value by a matrix of the same shape and dtype (a new handle)."""
        _check_fits(self, value)
        self.value = value


class Variable(Leaf):
    """A trainable parameter: its matrix persists and optimizers update it in place."""

    trainable = True


class Constant(Leaf):
    """A fixed matrix (no gradient is ever computed for it)."""


class Placeholder(Node):
    """An input whose matrix is fed before each evaluation (`feed`)."""

    def feed(self, value):
        """Use `value` (a dmath.Matrix of this node's shape and dtype) in the next evaluations."""
        _check_fits(self, value)
        self.value = value


def _check_fits(node, value):
    if not isinstance(value, dmath.Matrix):
        raise GraphError(f"{node.name}: expected a dmath.Matrix, got {type(value).__name__}")
    if tuple(value.shape) != node.shape or value.dtype != node.dtype:
        raise ShapeError(f"{node.name}: expected a {node.shape} {node.dtype} matrix, "
                         f"got {tuple(value.shape)} {value.dtype}")
