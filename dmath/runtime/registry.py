"""Worker-side kernels, registered by name; the master's op functions name them in commands."""

KERNELS = {}


def kernel(name):
    """Register `fn(call)` as the worker-side kernel of operation `name`."""
    def register(fn):
        if name in KERNELS:
            raise ValueError(f"kernel {name!r} registered twice")
        KERNELS[name] = fn
        return fn
    return register
