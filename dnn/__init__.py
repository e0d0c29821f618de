"""dnn: MagmaDNN's deep-learning feature set on dmath matrices.

    import dnn
    from dnn import layers as L
    model = dnn.Sequential([L.Input((1, 28, 28)), L.Conv2D(32, 5, padding='same'), L.Activation('relu'),
                            L.Pool2D(2), L.Flatten(), L.Dense(10), L.Output('softmax')],
                           loss='cross_entropy', optimizer=dnn.optim.SGD(lr=0.05))
    model.fit(x, y, batch_size=100, epochs=5)

Packages, bottom to top: graph (nodes, autodiff), ops (differentiable
functions), layers, optim, losses, training (fit loop, recorded programs,
asynchronous SGD, callbacks, progress), model; parallel holds the per-layer
strategies. See docs/ARCHITECTURE.md, section dnn.
"""
from dmath import __version__  # one project, one version
import sys as _sys

from . import data, graph, initializers, layers, losses, ops, optim, parallel, search, training
from .training import callbacks
from .errors import ConfigError, DNNError, GraphError, ModelFileError, NotSupportedError, ShapeError, TrainingError
from .functional import Input, SymbolicTensor
from .model import Model, Sequential, load
from . import models

# users write dnn.callbacks.ModelCheckpoint and `from dnn.callbacks import ...`: the module lives in
# dnn/training with the rest of the fit machinery, and is importable under its public name too
_sys.modules[__name__ + ".callbacks"] = callbacks

__all__ = ["__version__", "Model", "Input", "SymbolicTensor", "Sequential", "load", "models", "data", "graph", "layers", "ops", "optim", "losses", "initializers",
           "callbacks", "parallel", "search", "DNNError", "ShapeError", "ConfigError", "GraphError", "ModelFileError",
           "NotSupportedError", "TrainingError"]
