"""Parallel strategies of a layer, as matrix layouts, and the cost model behind 'auto' (its choice is a
candidate that fit times against all data parallel: dnn.training.strategy).

    'data'   the batch in row blocks over the workers, the weights Replicated;
             the weight gradients (Partial) are all-reduced every step.
    'model'  a Dense kernel (in, out) in column blocks (ColBlock): each worker
             owns some output features; the activations travel instead
             (all-gather of the input, reduce-scatter of its gradient).

The cost model counts the bytes each worker moves per training step
(ring collectives move (P-1)/P of the data per worker, in each direction):
data parallelism moves the weights twice (all-reduce = reduce-scatter +
all-gather); model parallelism moves the input and output activations
forward and their gradients backward. Convolutions are always data parallel
(few weights, large activations: Krizhevsky's "one weird trick").
"""
import dmath

from .errors import ConfigError

STRATEGIES = ("data", "model", "auto")


def dense_traffic(in_features, out_features, batch, nworkers, itemsize=4):
    """{'data': bytes, 'model': bytes} a worker sends per training step for a Dense layer."""
    if nworkers <= 1:
        return {"data": 0.0, "model": 0.0}
    ring = (nworkers - 1) / nworkers
    weights = in_features * out_features + out_features
    return {"data": 2.0 * ring * weights * itemsize,
            "model": 2.0 * ring * batch * (in_features + out_features) * itemsize}


def choose_dense(in_features, out_features, batch, nworkers, itemsize=4):
    """'data' or 'model': the strategy that moves fewer bytes (ties go to 'data')."""
    cost = dense_traffic(in_features, out_features, batch, nworkers, itemsize)
    return "model" if cost["model"] < cost["data"] else "data"


def weight_layout(strategy):
    """The layout of a Dense kernel (in, out) and of its bias (1, out) under `strategy`."""
    if strategy == "model":
        return dmath.ColBlock()
    if strategy == "data":
        return dmath.Replicated()
    raise ConfigError(f"no layout for the undecided strategy {strategy!r}")


def batch_layout(group=None):
    """The layout of every batch matrix: samples in row blocks over the workers of `group` (None: all
    of them), which is data parallelism."""
    return dmath.RowBlock(group)
