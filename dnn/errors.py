"""Exceptions raised by dnn.

Every mistake a user can make (a shape that does not fit a layer, an unknown
activation, a bad optimizer setting, a corrupt model file) is detected on the
master, before any command reaches the workers, and raised as one of these.
Errors of the matrices underneath are dmath's own (dmath.ShapeError, ...).
"""


class DNNError(Exception):
    """Base class of every dnn error."""


class ShapeError(DNNError, ValueError):
    """A node's or a layer's input shape does not fit the operation."""


class ConfigError(DNNError, ValueError):
    """An argument outside what the layer, optimizer, loss or model accepts."""


class GraphError(DNNError, RuntimeError):
    """The compute graph cannot do what was asked (no value fed, no path to the loss, ...)."""


class TrainingError(DNNError, ArithmeticError):
    """Training cannot usefully go on: a non-finite loss or weights, or a loss scale that skips
    every step (dnn.callbacks.TerminateOnNaN raises it; fit(..., terminate_on_nan=False) turns it off)."""


class ModelFileError(DNNError, OSError):
    """A model file is not a dnn model file, is truncated or corrupt, or does not match the model."""


class NotSupportedError(DNNError, TypeError):
    """A Python protocol a model does not offer (pickling: a model holds dmath matrices; save it)."""
