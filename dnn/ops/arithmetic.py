"""Elementwise arithmetic, reductions and precision casts, through dmath's elementwise functions.

Binary operations broadcast (1, n) row vectors, (m, 1) column vectors and
(1, 1) scalars as dmath does; their backward sums the gradient back down to
the operand's shape. Python numbers enter through `Affine` (y = a*x + b)
and `PowScalar`, fixed when the graph is built, so a recorded step replays
them unchanged.
"""
import numbers

import dmath

from ..errors import ConfigError, ShapeError
from ..graph.function import Function
from ..graph.node import Node, canonical_dtype
from ._util import broadcast_shape, expand, result_dtype, sample_shape_of, unbroadcast
from .elementwise import Elementwise


class _Binary(Function):
    def infer(self, a, b):
        shape = broadcast_shape(self.name, a.shape, b.shape)
        return shape, result_dtype(a, b), sample_shape_of(shape, a, b)


class Add(_Binary):
    """a + b of two nodes (broadcasting a row or column vector)."""
    name = "add"

    def forward(self, a, b):
        return a + b

    def backward(self, xs, y, gy, needs):
        a, b = xs
        return (unbroadcast(gy, a.shape) if needs[0] else None,
                unbroadcast(gy, b.shape) if needs[1] else None)


class Sub(_Binary):
    """a - b of two nodes (broadcasting a row or column vector)."""
    name = "sub"

    def forward(self, a, b):
        return a - b

    def backward(self, xs, y, gy, needs):
        a, b = xs
        return (unbroadcast(gy, a.shape) if needs[0] else None,
                unbroadcast(-gy, b.shape) if needs[1] else None)


class Mul(_Binary):
    """Elementwise (Hadamard) product, MagmaDNN's `product`."""
    name = "mul"

    def forward(self, a, b):
        return a * b

    def backward(self, xs, y, gy, needs):
        a, b = xs
        return (unbroadcast(gy * b, a.shape) if needs[0] else None,
                unbroadcast(gy * a, b.shape) if needs[1] else None)


class Div(_Binary):
    """a / b elementwise of two nodes (broadcasting a row or column vector)."""
    name = "div"

    def forward(self, a, b):
        return a / b

    def backward(self, xs, y, gy, needs):
        a, b = xs
        ga = gy / b
        return (unbroadcast(ga, a.shape) if needs[0] else None,
                unbroadcast(-(ga * y), b.shape) if needs[1] else None)


class Affine(Function):
    """y = scale * x + shift with Python numbers scale and shift."""
    name = "affine"
    saves_inputs = saves_output = False

    def __init__(self, scale=1.0, shift=0.0):
        self.scale, self.shift = _number(scale, "scale"), _number(shift, "shift")

    def forward(self, x):
        y = x * self.scale if self.scale != 1.0 else x
        return y + self.shift if self.shift != 0.0 else (y if y is not x else x.copy())

    def backward(self, xs, y, gy, needs):
        return (gy * self.scale if self.scale != 1.0 else gy,)


class Neg(Function):
    """-x."""
    name = "neg"
    saves_inputs = saves_output = False

    def forward(self, x):
        return -x

    def backward(self, xs, y, gy, needs):
        return (-gy,)


class PowScalar(Function):
    """y = x ** p for a Python number p."""
    name = "pow"

    def __init__(self, p):
        self.p = _number(p, "exponent")

    def forward(self, x):
        return dmath.pow(x, self.p)

    def backward(self, xs, y, gy, needs):
        x, p = xs[0], self.p
        if p == 0.0:
            return (gy * 0.0,)
        if p == 1.0:
            return (gy,)
        d = x * p if p == 2.0 else dmath.pow(x, p - 1.0) * p
        return (gy * d,)


class Exp(Elementwise):
    """e ** x elementwise (dmath.exp and its gradient)."""
    name = "exp"


class Log(Elementwise):
    """The natural logarithm elementwise (dmath.log and its gradient)."""
    name = "log"


class Sum(Function):
    """The sum over everything ((1, 1)), over rows (axis 0: (1, n)) or over columns (axis 1: (m, 1)).

    The result stays a matrix (never a master-side float), so a loss built
    from it stays on the workers and can be recorded.
    """
    name = "sum"

    def __init__(self, axis=None, mean=False):
        if axis not in (None, 0, 1):
            raise ConfigError(f"sum: axis must be None, 0 or 1, got {axis!r}")
        self.axis, self.mean = axis, bool(mean)
        if mean:
            self.name = "mean"

    def infer(self, x):
        shape = {None: (1, 1), 0: (1, x.shape[1]), 1: (x.shape[0], 1)}[self.axis]
        return shape, x.dtype, None

    def _count(self, shape):
        return {None: shape[0] * shape[1], 0: shape[0], 1: shape[1]}[self.axis]

    def forward(self, x):
        if self.axis is None:
            y = x.sum(axis=0).sum(axis=1)
        else:
            y = x.sum(axis=self.axis)
        n = self._count(x.shape)
        return y * (1.0 / n) if self.mean and n else y

    def backward(self, xs, y, gy, needs):
        x = xs[0]
        n = self._count(x.shape)
        g = gy * (1.0 / n) if self.mean and n else gy
        return (expand(g, x, dtype=x.dtype),)


class AddN(Function):
    """The sum of any number of same-shape nodes (MagmaDNN's `op::sum` of a list)."""
    name = "add_n"

    def infer(self, *xs):
        if not xs:
            raise ShapeError("add_n needs at least one node")
        shape = broadcast_shape(self.name, *[x.shape for x in xs])
        return shape, result_dtype(*xs), sample_shape_of(shape, *xs)

    def forward(self, *xs):
        y = xs[0] + xs[1] if len(xs) > 1 else xs[0].copy()
        for x in xs[2:]:
            y += x
        return y

    def backward(self, xs, y, gy, needs):
        return tuple(unbroadcast(gy, x.shape) if need else None for x, need in zip(xs, needs))


class Cast(Function):
    """The same values in another precision; the gradient goes back in the input's precision."""
    name = "cast"

    def __init__(self, dtype):
        self.dtype = canonical_dtype(dtype)

    def infer(self, x):
        return x.shape, self.dtype, x.sample_shape

    def forward(self, x):
        return x.astype(self.dtype)

    def backward(self, xs, y, gy, needs):
        return (gy.astype(xs[0].dtype),)


def _number(v, what):
    if isinstance(v, bool) or not isinstance(v, numbers.Real):
        raise ConfigError(f"{what} must be a real number, got {v!r}")
    return float(v)


# ---- wrappers: build nodes ----------------------------------------------------
def _is_number(v):
    return isinstance(v, numbers.Real) and not isinstance(v, bool)


def add(a, b):
    """a + b for nodes (broadcasting vectors) or a node and a number."""
    if _is_number(b):
        return Affine(1.0, b).apply(a)
    if _is_number(a):
        return Affine(1.0, a).apply(b)
    return Add().apply(a, b)


def sub(a, b):
    """a - b for nodes (broadcasting vectors) or a node and a number."""
    if _is_number(b):
        return Affine(1.0, -b).apply(a)
    if _is_number(a):
        return Affine(-1.0, a).apply(b)
    return Sub().apply(a, b)


def mul(a, b):
    """Elementwise a * b for nodes (broadcasting vectors) or a node and a number."""
    if _is_number(b):
        return Affine(b).apply(a)
    if _is_number(a):
        return Affine(a).apply(b)
    return Mul().apply(a, b)


def div(a, b):
    """Elementwise a / b for nodes or a node and a number."""
    if _is_number(b):
        if b == 0:
            raise ConfigError("div: division by the number 0")
        return Affine(1.0 / b).apply(a)
    if _is_number(a):
        return Affine(a).apply(PowScalar(-1.0).apply(b))
    return Div().apply(a, b)


def neg(x):
    """A node: -x."""
    return Neg().apply(x)


def pow(x, p):  # noqa: A001 - MagmaDNN's name
    """x ** p elementwise, p a number."""
    return PowScalar(p).apply(x)


def exp(x):
    """A node: e ** x elementwise."""
    return Exp().apply(x)


def log(x):
    """A node: the natural logarithm of x elementwise."""
    return Log().apply(x)


def sum(x, axis=None):  # noqa: A001 - MagmaDNN's name
    """The sum of a node ((1, 1), or along `axis`), or of a list of nodes (MagmaDNN's `op::sum`)."""
    if isinstance(x, (list, tuple)):
        return AddN().apply(*x)
    return Sum(axis).apply(x)


def mean(x, axis=None):
    """A node: the mean of x ((1, 1)), or along `axis` (0: over the batch, 1: per sample)."""
    return Sum(axis, mean=True).apply(x)


def add_n(*xs):
    """The sum of nodes (MagmaDNN's `op::sum` of a list)."""
    return AddN().apply(*xs)


def cast(x, dtype):
    """A node: x in `dtype` ('float16', 'float32' or 'float64'); its gradient is cast back."""
    return Cast(dtype).apply(x)


def _install_operators():
    """Python operators on nodes (x + y, 2 * x, x ** 2, -x), as Chainer installs them on Variable."""
    Node.__add__ = lambda a, b: add(a, b)
    Node.__radd__ = lambda a, b: add(b, a)
    Node.__sub__ = lambda a, b: sub(a, b)
    Node.__rsub__ = lambda a, b: sub(b, a)
    Node.__mul__ = lambda a, b: mul(a, b)
    Node.__rmul__ = lambda a, b: mul(b, a)
    Node.__truediv__ = lambda a, b: div(a, b)
    Node.__rtruediv__ = lambda a, b: div(b, a)
    Node.__neg__ = lambda a: neg(a)
    Node.__pow__ = lambda a, p: pow(a, p)


_install_operators()
