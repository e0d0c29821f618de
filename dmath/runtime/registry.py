"""Worker-side kernels, registered by name; the master's op functions name them in commands."""

KERNELS = {}

#: name -> False, True or a predicate of the command's Entry: whether a recorded plan
#: may capture the kernel into a CUDA graph (see graphs.py for what that requires)
CAPTURABLE = {}


def kernel(name, capturable=False):
    """Register `fn(call)` as the worker-side kernel of operation `name`.

    capturable: True (or a function of the command's Entry returning True)
    when the kernel, on the GPU backend, only enqueues device work on the
    current stream: CuPy kernels and copies, no host synchronisation, no
    host-device transfer, no MPI, no cuBLAS through CuPy (it refuses during a
    capture; `dmath.blas` then calls the library itself),
    no replica-cache use, and every allocation through the array module. Such
    kernels may be replayed from a CUDA graph (graphs.py).
    """
    def register(fn):
        if name in KERNELS:
            raise ValueError(f"kernel {name!r} registered twice")
        KERNELS[name] = fn
        CAPTURABLE[name] = capturable
        return fn
    return register


def capturable(entry):
    """Whether `entry`'s kernel may be captured into a CUDA graph (the same answer on every rank)."""
    rule = CAPTURABLE.get(entry.op, False)
    return bool(rule(entry)) if callable(rule) else bool(rule)
