"""Loss functions as graph ops: each returns a (1, 1) matrix, the mean over the batch.

Conventions are PyTorch's (reduction='mean'): cross-entropy averages over
the samples; binary cross-entropy and mean squared error average over every
element (for one output column, the samples). Targets are matrices of the
prediction's shape (one-hot rows for cross-entropy) and get no gradient.

The fused forms (softmax + cross-entropy, sigmoid + binary cross-entropy)
are what training uses: their gradient is (p - t) / N, exact and free of the
overflow that the separate functions meet with saturated outputs.
"""
import dmath

from ..errors import ShapeError
from ..graph.function import Function


def _check_pair(name, pred, target):
    if pred.shape != target.shape:
        raise ShapeError(f"{name}: predictions {pred.shape} and targets {target.shape} must have the same "
                         f"shape (class labels as one-hot rows)")


def _mean_all(m):
    """The mean of every element, as a (1, 1) matrix (no master-side float)."""
    return m.sum(axis=0).sum(axis=1) * (1.0 / (m.shape[0] * m.shape[1]))


class _Loss(Function):
    def infer(self, pred, target):
        _check_pair(self.name, pred, target)
        return (1, 1), pred.dtype, None


class SoftmaxCrossEntropy(_Loss):
    """-sum(t * log softmax(z)) / N, fused (dmath.nn.softmax_cross_entropy); keeps the probabilities."""
    name = "softmax_cross_entropy"
    saves_output = False

    def forward(self, logits, labels):
        loss, self.probs = dmath.nn.softmax_cross_entropy(logits, labels)
        return loss if loss.dtype == logits.dtype else loss.astype(logits.dtype)

    def backward(self, xs, y, gy, needs):
        g = dmath.nn.softmax_cross_entropy_backward(self.probs, xs[1])
        return (g * gy, None)

    def drop_saved(self):
        self.probs = None


class CrossEntropy(_Loss):
    """-sum(t * log p) / N for probabilities p (use SoftmaxCrossEntropy on logits when you can)."""
    name = "cross_entropy"

    def forward(self, p, t):
        return (t * dmath.log(p)).sum(axis=0).sum(axis=1) * (-1.0 / p.shape[0])

    def backward(self, xs, y, gy, needs):
        p, t = xs
        return ((t / p) * (gy * (-1.0 / p.shape[0])), None)


class BinaryCrossEntropy(_Loss):
    """-mean(t log p + (1 - t) log(1 - p)), logs clamped at -100 as PyTorch's BCELoss."""
    name = "binary_cross_entropy"

    def forward(self, p, t):
        logp = dmath.maximum(dmath.log(p), -100.0)
        log1mp = dmath.maximum(dmath.log(1.0 - p), -100.0)
        return -_mean_all(t * (logp - log1mp) + log1mp)

    def backward(self, xs, y, gy, needs):
        p, t = xs
        n = p.shape[0] * p.shape[1]
        denom = dmath.maximum(p - p * p, 1e-12)
        return ((p - t) / denom * (gy * (1.0 / n)), None)


class SigmoidBinaryCrossEntropy(_Loss):
    """Binary cross-entropy of sigmoid(z), fused (PyTorch's BCEWithLogitsLoss)."""
    name = "sigmoid_binary_cross_entropy"

    def forward(self, z, t):
        # max(z, 0) - z t + log(1 + exp(-|z|)): no overflow for any z
        self.probs = dmath.sigmoid(z)
        return _mean_all(dmath.relu(z) - z * t + dmath.log(dmath.exp(-dmath.abs(z)) + 1.0))

    def backward(self, xs, y, gy, needs):
        z, t = xs
        n = z.shape[0] * z.shape[1]
        return ((self.probs - t) * (gy * (1.0 / n)), None)


class MeanSquaredError(_Loss):
    """mean((p - t)^2) over every element."""
    name = "mean_squared_error"

    def forward(self, p, t):
        self.diff = p - t
        return _mean_all(self.diff * self.diff)

    def backward(self, xs, y, gy, needs):
        n = self.diff.shape[0] * self.diff.shape[1]
        return (self.diff * (gy * (2.0 / n)), None)


def softmax_cross_entropy(logits, labels):
    """A (1, 1) node: the batch mean of the cross-entropy of softmax(logits) and the labels (one-hot rows), fused and stable."""
    return SoftmaxCrossEntropy().apply(logits, labels)


def cross_entropy(p, labels):
    """A (1, 1) node: the batch mean of -sum(labels * log(p)) for probabilities p (one-hot label rows)."""
    return CrossEntropy().apply(p, labels)


def binary_cross_entropy(p, t):
    """A (1, 1) node: the mean binary cross-entropy of probabilities p against targets t in [0, 1]."""
    return BinaryCrossEntropy().apply(p, t)


def sigmoid_binary_cross_entropy(z, t):
    """A (1, 1) node: binary cross-entropy of sigmoid(z) against targets t in [0, 1], from the logits z (fused and stable)."""
    return SigmoidBinaryCrossEntropy().apply(z, t)


def mse(p, t):
    """A (1, 1) node: the mean of (p - t) ** 2 over every value."""
    return MeanSquaredError().apply(p, t)
