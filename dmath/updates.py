"""Fused optimizer steps and the all-finite test: `dmath.nn.sgd_update`, `adam_update`, `all_finite`.

One command updates a parameter and its state in place, in a single pass
over its pieces on every worker. The operations (master halves and kernels)
are in dmath/ops/nn_update.py; this module is their public name.
"""
from .ops.nn_update import adam_update, all_finite, sgd_update

__all__ = ["sgd_update", "adam_update", "all_finite"]
