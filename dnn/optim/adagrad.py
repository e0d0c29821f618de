"""AdaGrad (Duchi et al.), PyTorch's form."""
import dmath

from .base import Optimizer, _non_negative, _positive, setting


class AdaGrad(Optimizer):
    """s += g^2;  w -= lr * g / (sqrt(s) + eps).

    Args: lr=0.01, eps=1e-10, initial_accumulator_value=0.0, weight_decay=0.0, schedule=None,
    foreach=True (the base class's: the rule has no form over lists, so either value steps the
    parameters one command each; kept in the config).
    """

    state_names = ("sum",)
    non_negative_state = ("sum",)

    def __init__(self, lr=0.01, eps=1e-10, initial_accumulator_value=0.0, weight_decay=0.0, schedule=None,
                 foreach=True):
        super().__init__(lr, weight_decay, schedule, foreach)
        self.eps = eps
        self.initial_accumulator_value = initial_accumulator_value

    # may change between fits, checked as the constructor's arguments (an accumulator's initial value
    # applies to parameters that have no state yet)
    eps = setting("eps", lambda opt, value: _positive(value, "eps"))
    initial_accumulator_value = setting("initial_accumulator_value",
                                        lambda opt, value: _non_negative(value, "initial_accumulator_value"))

    def _hyper(self):
        return {"eps": self.eps, "initial_accumulator_value": self.initial_accumulator_value,
                "foreach": self.foreach}

    def prepare(self, params, lr_scale=1.0):
        # the base class's signature: asynchronous training passes its staleness-aware lr_scale
        fresh = [p for p in params if p not in self._state]
        super().prepare(params, lr_scale)
        if self.initial_accumulator_value:
            for p in fresh:
                self._state[p]["sum"] += self.initial_accumulator_value

    def update(self, p, g, state, h):
        s = state["sum"]
        s += g * g
        p -= (g / (dmath.sqrt(s) + self.eps)) * h.lr
