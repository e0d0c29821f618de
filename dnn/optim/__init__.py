"""Optimizers (SGD, Adam, RMSProp, AdaGrad), learning-rate schedules and dynamic loss scaling.

Conventions are PyTorch's: weight decay adds `weight_decay * w` to the
gradient; momentum is `v = mu * v + g`, `w -= lr * v`. Every optimizer also
offers MagmaDNN's graph API: `opt.minimize(expr, [vars])` takes one step.
"""
from ..errors import ConfigError
from . import schedules
from .adagrad import AdaGrad
from .adam import Adam
from .base import Optimizer, to_layout_of
from .loss_scale import DynamicLossScale
from .rmsprop import RMSProp
from .sgd import SGD

_KINDS = {"SGD": SGD, "Adam": Adam, "RMSProp": RMSProp, "AdaGrad": AdaGrad}
_ALIASES = {"sgd": "SGD", "adam": "Adam", "rmsprop": "RMSProp", "adagrad": "AdaGrad"}


def get(spec):
    """An optimizer from an instance, a name ('sgd', 'adam', 'rmsprop', 'adagrad') or a get_config() dict."""
    if isinstance(spec, Optimizer):
        return spec
    if isinstance(spec, str):
        name = _ALIASES.get(spec.lower())
        if name is None:
            raise ConfigError(f"unknown optimizer {spec!r}; expected one of {sorted(_ALIASES)}")
        return _KINDS[name]()
    if isinstance(spec, dict) and spec.get("name") in _KINDS:
        args = {k: v for k, v in spec.items() if k != "name"}
        args["schedule"] = schedules.get(args.get("schedule"))
        if "betas" in args:
            try:
                args["betas"] = tuple(args["betas"])
            except TypeError as exc:        # 5 or None: Adam's own check names what a pair must be
                raise ConfigError(f"optimizer {spec['name']}: betas must be a pair of numbers in [0, 1), "
                                  f"got {args['betas']!r} in {spec!r}") from exc
        try:
            return _KINDS[spec["name"]](**args)
        except TypeError as exc:
            raise ConfigError(f"optimizer {spec['name']}: bad arguments {args}: {exc}") from exc
    raise ConfigError(f"an optimizer is a dnn.optim optimizer, a name or a config dict, got {spec!r}")


__all__ = ["Optimizer", "SGD", "Adam", "RMSProp", "AdaGrad", "DynamicLossScale", "schedules", "get",
           "to_layout_of"]
