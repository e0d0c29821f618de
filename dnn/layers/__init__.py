"""Layers (MagmaDNN's set): builders of graph nodes that own their parameters.

    Input, Dense, Activation, Conv2D, Pool2D, Dropout, Flatten, Reshape, BatchNorm, Output;
    for graph models (dnn.Model): Add, Concatenate (called on lists), GlobalAvgPool2D, AdaptiveAvgPool2D,
    ZeroPadding2D
"""
from ..errors import ConfigError
from ..registry import register_into
from .base import Context, Layer, Weight
from .conv import Conv2D, Pool2D
from .core import Activation, Dense, Dropout, Flatten, Input, Output, Reshape
from .merge import AdaptiveAvgPool2D, Add, Concatenate, GlobalAvgPool2D, ZeroPadding2D
from .normalization import BatchNorm

#: the library's layer classes by name (model files name them); `register` adds the user's own
BUILT_IN = {c.__name__: c for c in (Input, Dense, Activation, Conv2D, Pool2D, Dropout, Flatten, Reshape,
                                    BatchNorm, Output, Add, Concatenate, GlobalAvgPool2D, AdaptiveAvgPool2D,
                                    ZeroPadding2D)}
KINDS = dict(BUILT_IN)


def register(cls):
    """Make a Layer subclass of your own loadable: dnn.load and from_config rebuild it by its class
    name from get_config() (a decorator: `@dnn.layers.register`; returns the class).

    A model that uses an unregistered layer trains and saves as any other; loading its file needs the
    class registered in the loading program (model files hold settings, never code). A name of the
    library's layers cannot be taken; registering another class under a name registered before
    replaces it (a class defined again, as in a notebook)."""
    return register_into(KINDS, BUILT_IN, Layer, "dnn.layers.Layer", "layer", cls)


def from_config(config):
    """A new layer from its get_config() dict (a library layer, or one of yours given to `register`)."""
    args = dict(config)
    kind = args.pop("class", None)
    if kind not in KINDS:
        raise ConfigError(f"unknown layer class {kind!r}; expected one of {sorted(KINDS)} (a layer of your "
                          "own: dnn.layers.register(YourLayer) before loading)")
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
           "from_config", "register"]
