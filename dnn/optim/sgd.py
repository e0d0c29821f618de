"""Stochastic gradient descent with momentum and Nesterov momentum (PyTorch's conventions)."""
import dmath

from ..errors import ConfigError
from .base import Optimizer, _bool, _unit, setting


def _momentum(opt, value):
    """SGD.momentum's rule: in [0, 1), and above 0 while nesterov is on."""
    value = _unit(value, "momentum")
    if opt._nesterov and value == 0:
        raise ConfigError("nesterov momentum needs momentum > 0; set nesterov=False first")
    return value


def _nesterov(opt, value):
    """SGD.nesterov's rule: a bool, True only with momentum above 0."""
    value = _bool(value, "nesterov")
    if value and opt._momentum == 0:
        raise ConfigError("nesterov momentum needs momentum > 0")
    return value


class SGD(Optimizer):
    """w -= lr * d, where g = grad + weight_decay * w, v = momentum * v + g and
    d = g + momentum * v (nesterov), v (momentum) or g (plain).

    Args: lr=0.01, momentum=0.0, nesterov=False, weight_decay=0.0, schedule=None, foreach=True.
    The parameters of one dtype step together (dmath.nn.sgd_update_many: one fused pass each, a
    kernel per table of them on GPUs); foreach=False steps them one command each (PyTorch's name).
    """

    fused = True

    def __init__(self, lr=0.01, momentum=0.0, nesterov=False, weight_decay=0.0, schedule=None, foreach=True):
        super().__init__(lr, weight_decay, schedule, foreach)
        self._nesterov = False
        self.momentum = momentum
        self.nesterov = nesterov

    # may change between fits, checked as the constructor's arguments; the state follows (state_names)
    momentum = setting("momentum", _momentum)
    nesterov = setting("nesterov", _nesterov)

    @property
    def state_names(self):
        return ("momentum_buffer",) if self._momentum else ()

    def _hyper(self):
        return {"momentum": self.momentum, "nesterov": self.nesterov, "foreach": self.foreach}

    def _rule(self):
        """(momentum, nesterov) of the update commands: the step's momentum (step_momentum: the user's,
        or asynchronous SGD's corrected one); a momentum of 0 steps as plain SGD, nesterov or not
        (Nesterov's d = g + mu v is g at mu = 0)."""
        mu = self.step_momentum()
        return mu, self.nesterov and mu > 0

    def fused_update(self, p, g, state, h):
        mu, nesterov = self._rule()
        dmath.nn.sgd_update(p, g, h.lr, state.get("momentum_buffer") if mu else None, momentum=mu,
                            nesterov=nesterov, weight_decay=self.weight_decay,
                            grad_scale=h.grad_scale, gate=h.gate)

    def fused_update_many(self, params, grads, states, h):
        if not self.foreach:
            return super().fused_update_many(params, grads, states, h)
        mu, nesterov = self._rule()
        dmath.nn.sgd_update_many(params, grads, h.lr, [st["momentum_buffer"] for st in states] if mu
                                 else None, momentum=mu, nesterov=nesterov,
                                 weight_decay=self.weight_decay, grad_scale=h.grad_scale, gate=h.gate)
