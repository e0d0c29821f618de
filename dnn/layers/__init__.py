"""Layers (MagmaDNN's set): builders of graph nodes that own their parameters.

    Input, Dense, Activation, Conv2D, Pool2D, Dropout, Flatten, Reshape, BatchNorm, Output;
    for graph models (dnn.Model): Add, Concatenate (called on lists), GlobalAvgPool2D, AdaptiveAvgPool2D,
    ZeroPadding2D
"""
from ..errors import ConfigError
from .base import Context, Layer, Weight
from .conv import Conv2D, Pool2D
from .core import Activation, Dense, Dropout, Flatten, Input, Output, Reshape
from .merge import AdaptiveAvgPool2D, Add, Concatenate, GlobalAvgPool2D, ZeroPadding2D
from .normalization import BatchNorm

KINDS = {c.__name__: c for c in (Input, Dense, Activation, Conv2D, Pool2D, Dropout, Flatten, Reshape,
                                 BatchNorm, Output, Add, Concatenate, GlobalAvgPool2D, AdaptiveAvgPool2D,
                                 ZeroPadding2D)}


def from_config(config):
    """A new layer from its get_config() dict."""
    args = dict(config)
    kind = args.pop("class", None)
    if kind not in KINDS:
        raise ConfigError(f"unknown layer class {kind!r}; expected one of {sorted(KINDS)}")
    trainable = args.pop("trainable", True)
    try:
        layer = KINDS[kind](**args)
    except TypeError as exc:
        raise ConfigError(f"layer {kind}: bad arguments {args}: {exc}") from exc
    layer.trainable = trainable
    return layer


__all__ = ["Layer", "Context", "Weight", "Input", "Dense", "Activation", "Conv2D", "Pool2D", "Dropout",
           "Flatten", "Reshape", "BatchNorm", "Output", "Add", "Concatenate", "GlobalAvgPool2D", "AdaptiveAvgPool2D",
           "ZeroPadding2D",
           "from_config"]
