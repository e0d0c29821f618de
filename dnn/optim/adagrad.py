"""AdaGrad (Duchi et al.), PyTorch's form."""
import dmath

from .base import Optimizer, _non_negative, _positive


class AdaGrad(Optimizer):
    """s += g^2;  w -= lr * g / (sqrt(s) + eps).

    Args: lr=0.01, eps=1e-10, initial_accumulator_value=0.0, weight_decay=0.0, schedule=None.
    """

    state_names = ("sum",)
    non_negative_state = ("sum",)

    def __init__(self, lr=0.01, eps=1e-10, initial_accumulator_value=0.0, weight_decay=0.0, schedule=None):
        super().__init__(lr, weight_decay, schedule)
        self.eps = _positive(eps, "eps")
        self.initial_accumulator_value = _non_negative(initial_accumulator_value, "initial_accumulator_value")

    def _hyper(self):
        return {"eps": self.eps, "initial_accumulator_value": self.initial_accumulator_value}

    def prepare(self, params):
        fresh = [p for p in params if p not in self._state]
        super().prepare(params)
        if self.initial_accumulator_value:
            for p in fresh:
                self._state[p]["sum"] += self.initial_accumulator_value

    def update(self, p, g, state, h):
        s = state["sum"]
        s += g * g
        p -= (g / (dmath.sqrt(s) + self.eps)) * h.lr
