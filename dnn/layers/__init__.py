"""Layers (MagmaDNN's set): builders of graph nodes that own their parameters.

    Input, Dense, Activation, Conv2D, Pool2D, Dropout, Flatten, Reshape, BatchNorm, Output
"""
from ..errors import ConfigError
from .base import Context, Layer, Weight
from .conv import Conv2D, Pool2D
from .core import Activation, Dense, Dropout, Flatten, Input, Output, Reshape
from .normalization import BatchNorm

KINDS = {c.__name__: c for c in (Input, Dense, Activation, Conv2D, Pool2D, Dropout, Flatten, Reshape,
                                 BatchNorm, Output)}


def from_config(config):
    """A new layer from its get_config() dict."""
    args = dict(config)
    kind = args.pop("class", None)
    if kind not in KINDS:
        raise ConfigError(f"unknown layer class {kind!r}; expected one of {sorted(KINDS)}")
    try:
        return KINDS[kind](**args)
    except TypeError as exc:
        raise ConfigError(f"layer {kind}: bad arguments {args}: {exc}") from exc


__all__ = ["Layer", "Context", "Weight", "Input", "Dense", "Activation", "Conv2D", "Pool2D", "Dropout",
           "Flatten", "Reshape", "BatchNorm", "Output", "from_config"]
