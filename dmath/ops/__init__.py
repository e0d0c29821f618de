"""Registered operations: each module holds worker-side kernels (and the master-side helpers in base)."""
from . import base, creation, data, elementwise, info, movement, reductions  # noqa: F401  (registers kernels)
