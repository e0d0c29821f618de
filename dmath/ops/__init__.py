"""Registered operations: each module holds worker-side kernels (and the master-side helpers in base)."""
from . import base, creation, data, elementwise, stats, movement, reductions, storage  # noqa: F401  (registers kernels)
from . import elementwise_cuda  # noqa: F401
from . import files  # noqa: F401
from .nn import batch, conv, dropout, format, labels, norm, pool, softmax, update  # noqa: F401
