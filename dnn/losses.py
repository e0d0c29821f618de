"""Losses of a model: cross_entropy, binary_cross_entropy, mse.

A loss builds the training head of a network from the node `z` that enters
the output activation and that activation's name: cross-entropy after a
softmax (or on raw logits, 'linear', as PyTorch's CrossEntropyLoss, or
after a log_softmax: the negative log-likelihood of its log-probabilities,
PyTorch's NLLLoss) and binary cross-entropy after a sigmoid (or on logits)
are fused with it, which is exact and does not overflow; any other pairing
applies the activation first. The output activation is a final
Activation/Output layer or the last layer's own (Dense(n,
activation='softmax')): the two spellings train alike. Every loss averages
over the batch (PyTorch's reduction='mean').

A loss also says how targets are given (`targets`) and how accuracy is
counted: 'categorical' (the largest output is the label), 'binary'
(outputs above the threshold are 1) or None (regression).
"""

import numpy as np

import dmath

from .errors import ConfigError, ShapeError
from .ops import (activation as make_activation, binary_cross_entropy, cross_entropy, mse,
                  sigmoid_binary_cross_entropy, softmax_cross_entropy)


class Loss:
    """Base of the model losses."""

    name = "loss"
    #: how accuracy is counted: 'categorical', 'binary' or None
    accuracy = None

    def head(self, z, target, activation):
        """(loss node, prediction node, accuracy reference) for pre-activation z, targets and the output
        activation; the reference is what `correct_count` compares with: the threshold of a binary
        accuracy, the `class_ranks` row of a categorical one, None without an accuracy."""
        raise NotImplementedError

    def one_hot(self, kind, width, label_range, outputs):
        """Whether a dataset's targets are one-hot encoded on the workers for this loss.

        kind: 'labels' (integer classes, one per sample) or 'rows' (`width`
        values per sample); label_range: (min, max) of the labels or values
        (None: not known). Raises ShapeError when the targets do not fit a
        network of `outputs` outputs.
        """
        if width != outputs:
            raise ShapeError(f"{self.name}: targets must have {outputs} value(s) per sample, got {width}")
        return False

    def __repr__(self):
        return f"<loss {self.name}>"


class CrossEntropy(Loss):
    """Categorical cross-entropy; targets are integer labels (N,) or one-hot rows (N, classes)."""

    name = "cross_entropy"
    accuracy = "categorical"

    #: activations whose cross-entropy is the fused softmax one on z: softmax probabilities, logits,
    #: and log_softmax log-probabilities (their negative log-likelihood is the same value)
    fused_with = ("softmax", "log_softmax", "linear", None)

    def head(self, z, target, activation):
        ranks = class_ranks(z.shape[1], z.dtype)
        if activation in self.fused_with:
            # the accuracy ranks z: its argmax is that of the probabilities (or log-probabilities)
            return softmax_cross_entropy(z, target), z, ranks
        p = make_activation(activation).apply(z)
        return cross_entropy(p, target), p, ranks

    def one_hot(self, kind, width, label_range, outputs):
        if kind == "labels":
            lo, hi = label_range
            if lo < 0 or hi >= outputs:
                raise ShapeError(f"cross_entropy: labels must be in [0, {outputs}), got {lo}..{hi}")
            return True
        if width == 1 and outputs > 1:
            # one value per sample that is not a whole number (_targets takes whole ones for labels)
            lo, hi = label_range if label_range else (float("nan"),) * 2
            raise ShapeError(f"cross_entropy: one target per sample is a class label, a whole number in "
                             f"[0, {outputs}); these are not all whole (values {lo:g}..{hi:g}): pass integer "
                             f"labels or one-hot rows of {outputs} values")
        return super().one_hot(kind, width, label_range, outputs)


class BinaryCrossEntropy(Loss):
    """Binary cross-entropy; targets in [0, 1], (N,) for one output or (N, outputs)."""

    name = "binary_cross_entropy"
    accuracy = "binary"

    def one_hot(self, kind, width, label_range, outputs):
        if label_range is not None and (label_range[0] < 0 or label_range[1] > 1):
            raise ShapeError(f"binary_cross_entropy: targets must be in [0, 1], got {label_range[0]:g}.."
                             f"{label_range[1]:g} (class labels of more than two classes: cross_entropy)")
        return super().one_hot(kind, width, label_range, outputs)

    def head(self, z, target, activation):
        if activation in ("sigmoid", "linear", None):
            return sigmoid_binary_cross_entropy(z, target), z, 0.0
        p = make_activation(activation).apply(z)
        return binary_cross_entropy(p, target), p, 0.5


class MeanSquaredError(Loss):
    """Mean squared error over every output."""

    name = "mse"

    def head(self, z, target, activation):
        p = make_activation(activation).apply(z) if activation not in ("linear", None) else z
        return mse(p, target), p, None


_KINDS = {"cross_entropy": CrossEntropy, "categorical_crossentropy": CrossEntropy,
          "binary_cross_entropy": BinaryCrossEntropy, "bce": BinaryCrossEntropy,
          "mse": MeanSquaredError, "mean_squared_error": MeanSquaredError}


def get(spec):
    """A Loss from a name ('cross_entropy', 'binary_cross_entropy', 'mse') or a Loss."""
    if isinstance(spec, Loss):
        return spec
    # a str test first: a list or dict is unhashable, and `in _KINDS` would raise a raw TypeError
    if not isinstance(spec, str) or spec not in _KINDS:
        raise ConfigError(f"unknown loss {spec!r}; expected one of {sorted(_KINDS)}")
    return _KINDS[spec]()


def class_ranks(classes, dtype):
    """The (1, classes) Replicated row a categorical accuracy ranks tied maxima by (classes,
    classes - 1, ..., 1); made before a step is recorded (a recorded step cannot send data)."""
    rank_dtype = "float64" if dtype == "float64" else "float32"     # exact integers up to 2**24 classes
    return dmath.from_numpy(np.arange(classes, 0, -1).reshape(1, classes), layout=dmath.Replicated(),
                            dtype=rank_dtype)


def correct_count(pred, target, kind, reference):
    """The number of correct predictions in the batch as a (1, 1) matrix (no master-side read).

    categorical (reference: `class_ranks`'s): a sample counts when the
    argmax of its target row is the argmax of its outputs, as Keras's
    categorical_accuracy (for one-hot rows: its label), so soft or
    label-smoothed targets count by their largest class. argmax is NumPy's,
    PyTorch's and Keras's: the first of the row's largest values (a row of
    equal outputs counts for its first class only, and an output row
    holding NaN for none). binary (reference: the threshold): the fraction
    of a sample's outputs on the right side of the threshold.
    """
    if kind == "categorical":
        # each row's argmax as the rank of its first maximum (ranks decrease along the row, so the
        # first maximum has the largest); 0 for an output row holding NaN (no maximum equals it),
        # which no target rank (>= 1) equals. The (N, 1) row maxima lie beside their rows, so the
        # broadcasts move nothing
        predicted = _first_max_rank(pred, reference)
        hits = dmath.logical_and(dmath.equal(predicted, _first_max_rank(target, reference)), predicted)
    elif kind == "binary":
        threshold = reference
        above = dmath.greater(pred, threshold)
        hits = (1.0 - dmath.abs(above - target)).sum(axis=1) * (1.0 / pred.shape[1])
    else:
        raise ConfigError(f"no accuracy for loss kind {kind!r}")
    return hits.sum(axis=0)


def _first_max_rank(rows, ranks):
    """(N, 1): the `class_ranks` rank of each row's first largest value (0 when the row holds NaN)."""
    return (dmath.equal(rows, rows.max(axis=1)) * ranks).max(axis=1)
