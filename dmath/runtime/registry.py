"""Worker-side kernels, registered by name (and, optionally, by backend); commands name them.

A kernel written once with the backend's array module (`xp`) serves both
backends. Where a library only one backend has does the work better (cuDNN
for convolutions, a CUDA kernel for pooling), a second kernel is registered
under the same name for that backend: the runtime picks it when the command's
signature is registered, so no kernel tests which backend it runs on. Such a
kernel may hand a case it cannot do to the generic one (`generic(name)`).
"""

import os

#: whether a kernel that runs NCCL collectives on the compute stream may be captured into a CUDA
#: graph (NCCL supports capture: a data-parallel training step, its gradient all-reduce
#: included, then replays as one graph launch per worker). DMATH_GRAPH_COLLECTIVES=0: never.
COLLECTIVES_IN_GRAPHS = os.environ.get("DMATH_GRAPH_COLLECTIVES", "1") != "0"

#: (name, backend name or None) -> kernel function; None: any backend
KERNELS = {}

#: same keys -> False, True or a predicate of the command's Entry: whether a recorded plan
#: may capture the kernel into a CUDA graph (see graphs.py for what that requires)
CAPTURABLE = {}


def kernel(name, capturable=False, backend=None):
    """Register `fn(call)` as the worker-side kernel of operation `name`.

    backend: None (every backend) or 'gpu' / 'cpu' (that backend only; it
    takes precedence over the generic kernel there).
    capturable: True (or a function of the command's Entry returning True)
    when the kernel, on the GPU backend, only enqueues device work on the
    current stream: CuPy kernels and copies, library calls that accept a
    capture (cuDNN, NCCL; cuBLAS through `dmath.blas`), no host
    synchronisation, no host-device transfer, no MPI, no replica-cache use,
    and every allocation through the array module. Such kernels may be
    replayed from a CUDA graph (graphs.py).
    """
    def register(fn):
        key = (name, backend)
        if key in KERNELS:
            raise ValueError(f"kernel {name!r} registered twice for backend {backend!r}")
        KERNELS[key] = fn
        CAPTURABLE[key] = capturable
        return fn
    return register


def lookup(name, backend):
    """(kernel, capture rule) of operation `name` on the backend named `backend` ('cpu' or 'gpu')."""
    key = (name, backend) if (name, backend) in KERNELS else (name, None)
    if key not in KERNELS:
        raise KeyError(f"no kernel registered for operation {name!r}")
    return KERNELS[key], CAPTURABLE[key]


def generic(name):
    """The backend-independent kernel of `name` (what a backend's own kernel falls back to)."""
    return KERNELS[(name, None)]


def capturable(entry):
    """Whether `entry`'s kernel may be captured into a CUDA graph (the same answer on every rank)."""
    rule = entry.capture_rule
    return bool(rule(entry)) if callable(rule) else bool(rule)
