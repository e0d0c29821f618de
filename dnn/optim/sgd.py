"""Stochastic gradient descent with momentum and Nesterov momentum (PyTorch's conventions)."""
from ..errors import ConfigError
from .base import Optimizer, _unit


class SGD(Optimizer):
    """w -= lr * d, where g = grad + weight_decay * w, v = momentum * v + g and
    d = g + momentum * v (nesterov), v (momentum) or g (plain).

    Args: lr=0.01, momentum=0.0, nesterov=False, weight_decay=0.0, schedule=None.
    """

    def __init__(self, lr=0.01, momentum=0.0, nesterov=False, weight_decay=0.0, schedule=None):
        super().__init__(lr, weight_decay, schedule)
        self.momentum = _unit(momentum, "momentum")
        self.nesterov = bool(nesterov)
        if self.nesterov and self.momentum == 0:
            raise ConfigError("nesterov momentum needs momentum > 0")
        self.state_names = ("momentum_buffer",) if self.momentum else ()
        # plain SGD: w - lr (g + wd w) = (1 - lr wd) w - lr g, one pass over w fewer per step
        self.folds_weight_decay = not self.momentum and self.weight_decay > 0

    def _hyper(self):
        return {"momentum": self.momentum, "nesterov": self.nesterov}

    def begin_step(self, scalars, h):
        if self.folds_weight_decay:
            h.decay = 1.0 - h.lr * self.weight_decay      # 1 on a skipped step: its lr is 0

    def update(self, p, g, state, h):
        if self.folds_weight_decay:
            p *= h.decay
            p -= g * h.lr
            return
        d = g
        if self.momentum:
            v = state["momentum_buffer"]
            v *= h.factor(self.momentum)
            v += g
            d = g + v * self.momentum if self.nesterov else v
        p -= d * h.lr
