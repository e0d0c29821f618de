"""RMSProp (PyTorch's form, with optional momentum and the centered variant)."""
import dmath

from .base import Optimizer, _bool, _positive, _unit, setting


class RMSProp(Optimizer):
    """s = alpha s + (1 - alpha) g^2;  avg = sqrt(s - a^2) + eps (centered, a = mean of g) or sqrt(s) + eps;
    w -= lr * b with b = momentum b + g / avg (momentum > 0) or w -= lr * g / avg.

    Args: lr=0.01, alpha=0.99, eps=1e-8, momentum=0.0, centered=False, weight_decay=0.0, schedule=None,
    foreach=True (the base class's: the rule has no form over lists, so either value steps the
    parameters one command each; kept in the config).
    """

    non_negative_state = ("square_avg",)

    def __init__(self, lr=0.01, alpha=0.99, eps=1e-8, momentum=0.0, centered=False, weight_decay=0.0,
                 schedule=None, foreach=True):
        super().__init__(lr, weight_decay, schedule, foreach)
        self.alpha = alpha
        self.eps = eps
        self.momentum = momentum
        self.centered = centered

    # may change between fits, checked as the constructor's arguments; the state follows (state_names)
    alpha = setting("alpha", lambda opt, value: _unit(value, "alpha"))
    eps = setting("eps", lambda opt, value: _positive(value, "eps"))
    momentum = setting("momentum", lambda opt, value: _unit(value, "momentum"))
    centered = setting("centered", lambda opt, value: _bool(value, "centered"))

    @property
    def state_names(self):
        return (("square_avg",) + (("grad_avg",) if self._centered else ())
                + (("momentum_buffer",) if self._momentum else ()))

    def _hyper(self):
        return {"alpha": self.alpha, "eps": self.eps, "momentum": self.momentum, "centered": self.centered,
                "foreach": self.foreach}

    def update(self, p, g, state, h):
        s = state["square_avg"]
        s *= h.factor(self.alpha)
        s += (g * g) * (1.0 - self.alpha)
        if self.centered:
            a = state["grad_avg"]
            a *= h.factor(self.alpha)
            a += g * (1.0 - self.alpha)
            avg = dmath.sqrt(s - a * a) + self.eps
        else:
            avg = dmath.sqrt(s) + self.eps
        mu = self.step_momentum()       # the user's, or asynchronous SGD's corrected one
        if mu:
            b = state["momentum_buffer"]
            b *= h.factor(mu)
            b += g / avg
            p -= b * h.lr
        else:
            p -= (g / avg) * h.lr
