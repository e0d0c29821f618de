"""Adam (Kingma & Ba), PyTorch's form: bias corrections as (1, 1) matrices updated inside the step."""
import math

import numpy as np

import dmath

from ..errors import ConfigError
from .base import Optimizer, _positive, _unit, setting


class Adam(Optimizer):
    """m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2;
    w -= lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps),  g = grad + weight_decay * w.

    Args: lr=0.001, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, schedule=None, foreach=True.
    The parameters of one dtype step together (dmath.nn.adam_update_many: one fused pass each, a
    kernel per table of them on GPUs); foreach=False steps them one command each (PyTorch's name).

    Betas changed between fits (or from a callback) correct with the new betas to the power of the
    steps taken, as PyTorch (not a running product of old and new betas).

    t counts the optimizer's steps (Keras' rule), not each parameter's own (PyTorch keeps a step
    count per parameter): a layer frozen for some steps and then trained again is corrected as if
    it had stepped all along, so after a freeze its updates differ from torch.optim.Adam's (equal
    while every parameter trains at every step).
    """

    state_names = ("exp_avg", "exp_avg_sq")
    non_negative_state = ("exp_avg_sq",)
    # b^t, as a saved file may hold it: 1 before the first step (and after steps a float16 model
    # skipped, which leave it as it is), 0 with b = 0 (or once b^t underflows); past 1 the bias
    # correction 1 - b^t turns negative, and below 0 it exceeds 1
    scalar_bounds = {"beta1_power": (0.0, 1.0), "beta2_power": (0.0, 1.0)}
    fused = True

    def __init__(self, lr=0.001, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, schedule=None, foreach=True):
        super().__init__(lr, weight_decay, schedule, foreach)
        self._powers_of = {}    # dtype -> the betas whose powers its beta1_power and beta2_power hold
        self.betas = betas
        self.eps = eps

    # may change between fits, checked as the constructor's arguments
    betas = setting("betas", lambda opt, value: _betas(value))
    eps = setting("eps", lambda opt, value: _positive(value, "eps"))

    def _hyper(self):
        return {"betas": list(self.betas), "eps": self.eps, "foreach": self.foreach}

    def prepare(self, params, lr_scale=1.0):
        """The base class's, then the bias corrections put on the current betas: the step multiplies
        b^t by b, so betas changed between fits (or from a callback) would continue the product of the
        old ones (0.9^4 * 0.5^4); PyTorch corrects with the current betas to the power of the step
        count (0.5^8). The count is read back from the old power (steps a float16 model skipped left it
        as it was), and the new power written once, outside the recorded step."""
        super().prepare(params, lr_scale)
        for dtype, s in self._scalars.items():
            old = self._powers_of.setdefault(dtype, self.betas)
            if old == self.betas:
                continue
            for name, b_old, b_new in (("beta1_power", old[0], self.betas[0]), ("beta2_power", old[1], self.betas[1])):
                if b_old != b_new:
                    s[name].set((0, 0), b_new ** self._steps_of(s[name].get((0, 0)), b_old))
            self._powers_of[dtype] = self.betas

    def _steps_of(self, power, beta):
        """t, from b^t = power (the optimizer's step count where b cannot tell it: b = 0, b^t underflowed)."""
        if power >= 1.0:
            return 0
        if not 0.0 < beta < 1.0 or power <= 0.0:
            return self.iterations
        return round(math.log(power) / math.log(beta))

    def new_scalars(self, dtype):
        # b1^t and b2^t, t = steps taken; 1 before the first step
        return {"beta1_power": 1.0, "beta2_power": 1.0}

    def begin_step(self, s, h):
        b1, b2 = self.betas
        s["beta1_power"] *= h.factor(b1)
        s["beta2_power"] *= h.factor(b2)
        # a skipped first step (gated) leaves 1 - b^t = 0: the floor keeps lr / 0 out (its lr is 0 anyway)
        tiny = float(np.finfo(s["beta1_power"].dtype).tiny)
        h.step_size = h.lr / dmath.maximum(1.0 - s["beta1_power"], tiny)
        h.inv_sqrt_bc2 = dmath.pow(dmath.maximum(1.0 - s["beta2_power"], tiny), -0.5)

    def fused_update(self, p, g, state, h):
        b1, b2 = self.betas
        dmath.nn.adam_update(p, g, state["exp_avg"], state["exp_avg_sq"], h.step_size, h.inv_sqrt_bc2,
                             beta1=b1, beta2=b2, eps=self.eps, weight_decay=self.weight_decay,
                             grad_scale=h.grad_scale, gate=h.gate)

    def fused_update_many(self, params, grads, states, h):
        if not self.foreach:
            return super().fused_update_many(params, grads, states, h)
        b1, b2 = self.betas
        dmath.nn.adam_update_many(params, grads, [st["exp_avg"] for st in states], [st["exp_avg_sq"] for st in states],
                                  h.step_size, h.inv_sqrt_bc2, beta1=b1, beta2=b2, eps=self.eps,
                                  weight_decay=self.weight_decay, grad_scale=h.grad_scale, gate=h.gate)


def _betas(betas):
    """Adam's (beta1, beta2): a pair of numbers in [0, 1), as a tuple of floats."""
    try:
        b1, b2 = betas
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"betas must be a pair of numbers in [0, 1), got {betas!r}") from exc
    return _unit(b1, "beta1"), _unit(b2, "beta2")
