"""Synthetic classification sets: reproducible, learnable, any feature or image shape."""
import numbers

import numpy as np

from .errors import DataError


def _positive_int(value, what):
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise DataError(f"synthetic_classification: {what} must be a positive integer, got {value!r}")
    return int(value)


def synthetic_classification(n, shape, classes, seed=0, noise=1.0, dtype="float32"):
    """(x, y): n samples of `classes` Gaussian clusters.

    shape: the number of features (x is (n, features)) or a sample shape
    such as (C, H, W) (x is (n, C, H, W)). Each class has a centre drawn
    from N(0, 1) per feature; a sample is its class centre plus N(0, noise^2)
    noise, so the classes are separable when noise is small against the
    distance between centres (about sqrt(2 * features)). y is int64 in
    [0, classes). The same seed gives the same set.
    """
    n = _positive_int(n, "n")
    classes = _positive_int(classes, "classes")
    try:
        sample = (shape,) if isinstance(shape, numbers.Integral) else tuple(shape)
    except TypeError as exc:
        raise DataError(f"synthetic_classification: shape must be a number of features or a tuple, "
                        f"got {shape!r}") from exc
    sample = tuple(_positive_int(s, "each entry of shape") for s in sample)
    if not sample:
        raise DataError("synthetic_classification: shape must name at least one dimension")
    # an infinite noise makes every sample inf or NaN
    if isinstance(noise, bool) or not isinstance(noise, numbers.Real) or not noise >= 0 or not np.isfinite(noise):
        raise DataError(f"synthetic_classification: noise must be a finite non-negative number, got {noise!r}")
    # None draws a fresh set; otherwise the seed NumPy's generator takes (a raw ValueError or TypeError there)
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, numbers.Integral) or seed < 0):
        raise DataError(f"synthetic_classification: seed must be a non-negative integer or None, got {seed!r}")
    if dtype not in ("float16", "float32", "float64"):
        raise DataError(f"synthetic_classification: dtype must be float16, float32 or float64, got {dtype!r}")
    rng = np.random.default_rng(seed)
    features = int(np.prod(sample))
    centres = rng.standard_normal((classes, features))
    y = rng.integers(0, classes, n)
    x = centres[y] + float(noise) * rng.standard_normal((n, features))
    return x.reshape((n,) + sample).astype(dtype), y.astype(np.int64)
