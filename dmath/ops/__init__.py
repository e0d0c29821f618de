"""Registered operations: each module holds worker-side kernels (and the master-side helpers in base)."""
from . import base, creation, data, elementwise, info, movement, reductions, storage  # noqa: F401  (registers kernels)
from . import elementwise_cuda  # noqa: F401
from . import files, nn_batch, nn_conv, nn_dropout, nn_format, nn_labels, nn_norm  # noqa: F401
from . import nn_pool, nn_softmax, nn_update  # noqa: F401
from . import host_batches  # noqa: F401
