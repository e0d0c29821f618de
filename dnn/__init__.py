"""dnn: MagmaDNN's deep-learning feature set on dmath matrices.

    import dnn
    from dnn import layers as L
    model = dnn.Sequential([L.Input((1, 28, 28)), L.Conv2D(32, 5, padding='same'), L.Activation('relu'),
                            L.Pool2D(2), L.Flatten(), L.Dense(10), L.Output('softmax')],
                           loss='cross_entropy', optimizer=dnn.optim.SGD(lr=0.05))
    model.fit(x, y, batch_size=100, epochs=5)

Packages, bottom to top: graph (nodes, autodiff), ops (differentiable
functions), layers, optim, losses, model; parallel holds the per-layer
strategies. See docs/ARCHITECTURE.md, section dnn.
"""
from dmath import __version__  # one project, one version
from . import callbacks, data, graph, initializers, layers, losses, ops, optim, parallel, search
from .errors import ConfigError, DNNError, GraphError, ModelFileError, NotSupportedError, ShapeError, TrainingError
from .model import Sequential, load

__all__ = ["__version__", "Sequential", "load", "data", "graph", "layers", "ops", "optim", "losses", "initializers",
           "callbacks", "parallel", "search", "DNNError", "ShapeError", "ConfigError", "GraphError", "ModelFileError",
           "NotSupportedError", "TrainingError"]
