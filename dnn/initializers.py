"""Parameter initializers: constant, uniform, normal, Glorot (Xavier) and He (Kaiming).

An initializer makes a dmath matrix of a given shape, dtype and layout from
dmath.random, whose values depend only on the seed and the global index: a
program initializes the same weights at any worker count and layout.
`fans=(fan_in, fan_out)` defaults to (rows, cols), right for a Dense kernel
(in, out); a Conv2D kernel (K, C*kh*kw) passes (C*kh*kw, K*kh*kw).
"""
import math
import numbers
import operator

import numpy as np

import dmath

from dmath.errors import DTypeError
from dmath.ops.data import check_exact_integers

from .errors import ConfigError, ShapeError


class Initializer:
    """Base: `init(shape, dtype, layout, fans=None)` returns a new dmath.Matrix.

    public_shape: the parameter's shape as get_weights gives it, where the stored matrix's `shape`
    differs (a Conv2D kernel (K, C, kh, kw) stored (K, C*kh*kw), a bias (n,) stored (1, n)); name:
    the parameter's, for messages. FromArray checks its values against both."""

    def __call__(self, shape, dtype="float32", layout=None, fans=None, public_shape=None, name="parameter"):
        fan_in, fan_out = fans if fans is not None else shape
        return self.make(tuple(shape), dtype, layout, max(int(fan_in), 1), max(int(fan_out), 1))

    def make(self, shape, dtype, layout, fan_in, fan_out):
        """The initial dmath matrix of `shape`, `dtype` and `layout` (draw it with dmath.random, so the
        values are the same at every worker count); fan_in and fan_out (at least 1) scale it."""
        raise NotImplementedError

    def get_config(self):
        """A JSON-able description (`get` rebuilds the initializer from it)."""
        return {"name": NAMES[type(self)], **self.__dict__}

    def __repr__(self):
        args = ", ".join(f"{k}={v!r}" for k, v in self.__dict__.items())
        return f"{type(self).__name__}({args})"


class Constant(Initializer):
    """Every value `value`."""
    def __init__(self, value=0.0):
        self.value = _real(value, "constant value")

    def make(self, shape, dtype, layout, fan_in, fan_out):
        return dmath.full(shape, self.value, dtype=dtype, layout=layout)


class Zeros(Constant):
    """Every value 0."""
    def __init__(self):
        super().__init__(0.0)

    def get_config(self):
        return {"name": "zeros"}


class Ones(Constant):
    """Every value 1."""
    def __init__(self):
        super().__init__(1.0)

    def get_config(self):
        return {"name": "ones"}


class Uniform(Initializer):
    """Uniform on [low, high)."""

    def __init__(self, low=-0.05, high=0.05):
        self.low, self.high = _real(low, "low"), _real(high, "high")
        if not self.low < self.high:
            raise ConfigError(f"uniform: low must be below high, got [{low}, {high})")

    def make(self, shape, dtype, layout, fan_in, fan_out):
        return _uniform(shape, dtype, layout, self.low, self.high)


class Normal(Initializer):
    """Normal with mean and standard deviation std."""

    def __init__(self, mean=0.0, std=0.05):
        self.mean, self.std = _real(mean, "mean"), _real(std, "std")
        if self.std < 0:
            raise ConfigError(f"normal: std must be non-negative, got {std}")

    def make(self, shape, dtype, layout, fan_in, fan_out):
        return _normal(shape, dtype, layout, self.mean, self.std)


class GlorotUniform(Initializer):
    """Uniform on +-sqrt(6 / (fan_in + fan_out)) (Glorot & Bengio 2010)."""

    def __init__(self, gain=1.0):
        self.gain = _real(gain, "gain")

    def make(self, shape, dtype, layout, fan_in, fan_out):
        limit = self.gain * math.sqrt(6.0 / (fan_in + fan_out))
        return _uniform(shape, dtype, layout, -limit, limit)


class GlorotNormal(GlorotUniform):
    """Normal with std sqrt(2 / (fan_in + fan_out))."""

    def make(self, shape, dtype, layout, fan_in, fan_out):
        return _normal(shape, dtype, layout, 0.0, self.gain * math.sqrt(2.0 / (fan_in + fan_out)))


class HeUniform(GlorotUniform):
    """Uniform on +-sqrt(6 / fan_in) (He et al. 2015, for ReLU networks)."""

    def make(self, shape, dtype, layout, fan_in, fan_out):
        limit = self.gain * math.sqrt(6.0 / fan_in)
        return _uniform(shape, dtype, layout, -limit, limit)


class HeNormal(GlorotUniform):
    """Normal with std sqrt(2 / fan_in)."""

    def make(self, shape, dtype, layout, fan_in, fan_out):
        return _normal(shape, dtype, layout, 0.0, self.gain * math.sqrt(2.0 / fan_in))


class FromArray(Initializer):
    """Given values (a numpy array of the parameter's shape, as get_weights gives it: a Dense kernel
    (in, out), a Conv2D kernel (K, C, kh, kw), a bias (n,)). Another shape is refused (ShapeError),
    even of as many values (a PyTorch Linear weight (out, in) was reshaped into a scrambled
    kernel), as are values the parameter's dtype cannot hold (1e300 in a float32 model became inf):
    `check_values`, set_weights' check.

    Its config holds the array's shape, not its values (a model file holds
    the trained weights): rebuilt from a config alone (`shape=`), it gives
    zeros of that shape, which loading a model file then overwrites.
    """

    def __init__(self, array=None, shape=None):
        if array is None:
            try:
                shape = tuple(operator.index(d) for d in shape)
            except TypeError as exc:
                raise ConfigError(f"FromArray: give an array, or the shape of one, got shape {shape!r}") from exc
            if any(d < 0 for d in shape):
                raise ConfigError(f"FromArray: the shape must be non-negative, got {shape}")
            self.given = False      # zeros standing in for a file's values: only their number counts
            array = np.zeros(shape)
        else:
            self.given = True
        self.array = np.asarray(array)

    def __call__(self, shape, dtype="float32", layout=None, fans=None, public_shape=None, name="parameter"):
        if self.given:
            check_values(self.array, tuple(public_shape or shape), dtype, f"{name}: initial values")
        return super().__call__(shape, dtype, layout, fans)

    def make(self, shape, dtype, layout, fan_in, fan_out):
        a = self.array.reshape(shape) if self.array.size == shape[0] * shape[1] else None
        if a is None:
            raise ConfigError(f"initial values of shape {self.array.shape} do not fit a parameter of shape {shape}")
        return dmath.from_numpy(a, layout=layout, dtype=dtype)

    def get_config(self):
        return {"name": "array", "shape": list(self.array.shape)}

    def __repr__(self):
        return f"FromArray({self.array!r})" if self.given else f"FromArray(shape={self.array.shape})"


def check_values(array, shape, dtype, what):
    """`array` as values of a parameter of `shape` and `dtype` (a numpy array of that shape and real
    numbers the dtype holds; its own NaN and infinities are its values), else ShapeError or
    ConfigError naming `what`. set_weights, model files and FromArray check with it."""
    a = np.asarray(array)
    if a.shape != tuple(shape):
        raise ShapeError(f"{what}: expected shape {tuple(shape)}, got {a.shape}")
    if a.dtype.kind not in "biuf":
        raise ConfigError(f"{what}: expected real numbers, got dtype {a.dtype}")
    mine = np.dtype(dtype)
    try:
        check_exact_integers(a, mine, what)     # (2**53 + 1 into float32 rounded)
    except DTypeError as exc:
        raise ConfigError(str(exc)) from exc
    if a.size and a.dtype.kind == "f" and np.finfo(a.dtype).max > np.finfo(mine).max:
        # a finite value past the parameter's dtype would become inf on the write, silently (a float64
        # file's 1e300 loaded into a float32 model); the array's own NaN and inf are its values
        finite = np.abs(a[np.isfinite(a)])
        top = float(np.finfo(mine).max)
        if finite.size and float(finite.max()) > top:
            raise ConfigError(f"{what}: holds {float(finite.max()):g}, past the largest {mine} ({top:g}) of the "
                              f"parameter")
    return a

def _real(v, what):
    if isinstance(v, bool) or not isinstance(v, numbers.Real) or not math.isfinite(v):
        raise ConfigError(f"{what} must be a finite real number, got {v!r}")
    return float(v)


def _uniform(shape, dtype, layout, low, high):
    u = dmath.random.rand(shape, dtype=dtype, layout=layout)
    if (low, high) == (0.0, 1.0):
        return u
    u *= high - low
    u += low
    return u


def _normal(shape, dtype, layout, mean, std):
    z = dmath.random.randn(shape, dtype=dtype, layout=layout)
    z *= std
    if mean:
        z += mean
    return z


NAMES = {Constant: "constant", Zeros: "zeros", Ones: "ones", Uniform: "uniform", Normal: "normal",
         GlorotUniform: "glorot_uniform", GlorotNormal: "glorot_normal", HeUniform: "he_uniform",
         HeNormal: "he_normal", FromArray: "array"}
_BY_NAME = {v: k for k, v in NAMES.items()}
_BY_NAME.update(glorot=GlorotUniform, xavier=GlorotUniform, he=HeNormal, kaiming=HeNormal)


def get(spec):
    """An Initializer from a name ('glorot_uniform', 'he_normal', 'zeros', ...), a number (a constant),
    a numpy array (the values), a config dict ({'name': 'uniform', 'low': -1, 'high': 1}) or an Initializer."""
    if isinstance(spec, Initializer):
        return spec
    if isinstance(spec, numbers.Real) and not isinstance(spec, bool):
        return Constant(spec)
    if isinstance(spec, np.ndarray):
        return FromArray(spec)
    if isinstance(spec, dict):
        args = dict(spec)
        name = args.pop("name", None)
        if name not in _BY_NAME:
            raise ConfigError(f"unknown initializer {name!r}; expected one of {sorted(_BY_NAME)}")
        try:
            return _BY_NAME[name](**args)
        except TypeError as exc:
            raise ConfigError(f"initializer {name!r}: bad arguments {args}: {exc}") from exc
    if isinstance(spec, str):
        if spec not in _BY_NAME:
            raise ConfigError(f"unknown initializer {spec!r}; expected one of {sorted(_BY_NAME)}")
        return _BY_NAME[spec]()
    raise ConfigError(f"an initializer is a name, a number, an array, a config dict or an Initializer, "
                      f"got {spec!r}")
