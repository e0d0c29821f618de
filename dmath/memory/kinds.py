"""Memory kinds (MagmaDNN's MemoryManager): where a matrix's local blocks live on a worker.

    'device'        device memory from the pool (on the CPU backend: host memory)
    'host'          pinned host memory; a kernel gets a device copy for the one
                    command that uses it (made then, or earlier by `prefetch`)
    'managed'       a host copy and a device copy, each valid or stale; one is
                    refreshed from the other only when its side needs it
    'cuda_managed'  CUDA unified memory, which kernels use directly (never more
                    than the device has free)

On the CPU backend every kind is host memory and behaves the same; the kind
is still recorded and reported. Kernels compute on device arrays only: a
shard held in host memory on a GPU carries a `HostCopies`, and `Shard.pieces`
asks it for the device arrays: the one place where host data comes to the
device. The runtime calls `HostCopies.after_command` when the command ends.
A kind is a property of the shard (and of the Matrix on the master), never
part of a command's signature.
"""
import numpy as np

from .. import backend
from ..comm import collectives
from ..errors import DMathError
from . import pool

KINDS = ("device", "host", "managed", "cuda_managed")


def check(kind):
    """`kind` validated (None: the default of the current backend)."""
    if kind is None:
        return default()
    if not isinstance(kind, str) or kind not in KINDS:     # (an array's `in` raised NumPy's ValueError)
        raise DMathError(f"memory must be one of {', '.join(repr(k) for k in KINDS)} (or None for the "
                         f"default), got {kind!r}")
    return kind


def default():
    """'device' on a GPU backend, 'host' on the CPU backend."""
    return "device" if backend.current().is_gpu else "host"


def code(kind):
    """The kind as a number, to travel among a command's dynamic scalars."""
    return float(KINDS.index(kind))


def from_code(value):
    return KINDS[int(value)]


def pooled(kind):
    """True when matrices of `kind` live in the pool that the memory limit caps.

    The limit caps the memory kernels compute in: host memory on the CPU
    backend (every kind), device memory on a GPU ('device' and the device copy
    of 'managed'; 'host' is pinned host memory, 'cuda_managed' unified memory
    checked against the device's free memory instead).
    """
    return not backend.current().is_gpu or kind in ("device", "managed")


def _stream():
    return backend.current().xp.cuda.get_current_stream()


class HostCopies:
    """A GPU worker's shard kept in host memory ('host' or 'managed').

    host: pinned numpy arrays, one per piece; dev: device arrays or None.
    Validity flags say which copy holds the current values; `ready` is the
    event of a prefetch still copying into `dev`.
    """
    __slots__ = ("kind", "host", "dev", "host_valid", "dev_valid", "staged", "ready")

    def __init__(self, kind, host, dev=None, host_valid=True):
        self.kind = kind
        self.host = host
        self.dev = dev
        self.host_valid = host_valid
        self.dev_valid = dev is not None
        self.staged = False        # the device copy was handed to a kernel in the current command
        self.ready = None

    def device(self):
        """The device arrays with the current values (copied from the host on the compute stream if stale)."""
        if self.dev_valid:
            if self.ready is not None:
                # a prefetch made them: the compute stream waits for it, the host does not
                _stream().wait_event(self.ready)
                self.ready = None
        else:
            stream = _stream()
            if self.dev is None:
                self.dev = [pool.current().empty(h.shape, h.dtype) for h in self.host]
            for d, h in zip(self.dev, self.host):
                if h.size:
                    d.set(h, stream=stream)     # asynchronous: the pinned host arrays outlive it
            self.dev_valid = True
        self.staged = True
        return self.dev

    def host_arrays(self):
        """The host arrays with the current values (copied from the device first if stale)."""
        if not self.host_valid:
            stream = _stream()
            for d, h in zip(self.dev, self.host):
                if h.size:
                    d.get(stream=stream, out=h)
            collectives.device_done()
            self.host_valid = True
        return self.host

    def after_command(self, written):
        """Called by the runtime when a command that read (and maybe wrote) this shard ends."""
        if not self.staged:
            return
        self.staged = False
        if written:
            self.host_valid = False        # the kernel wrote the device copy
        if self.kind == "host":
            # host memory holds no device copy between commands: write back what changed, let go
            self.host_arrays()
            self.dev, self.dev_valid = None, False

    def prefetch(self, side):
        """Start copying the host arrays to the device on stream `side`; a later use waits for it there."""
        if self.dev_valid:
            return
        compute = _stream()
        if self.dev is None:
            # allocated on the compute stream, so the pool hands these blocks out again only
            # in that stream's order
            self.dev = [pool.current().empty(h.shape, h.dtype) for h in self.host]
        # the blocks may have been freed by work still queued on the compute stream
        side.wait_event(compute.record())
        for d, h in zip(self.dev, self.host):
            if h.size:
                d.set(h, stream=side)
        self.ready = side.record()
        self.dev_valid = True

    def __del__(self):
        # the device blocks of a prefetch still in flight go back to the pool now: whoever
        # gets them next on the compute stream must wait until the copy into them is done
        if self.ready is not None:
            try:
                _stream().wait_event(self.ready)
            except Exception:  # noqa: BLE001 - interpreter shutdown: nothing runs afterwards
                pass


def compute_empty(kind, shape, dtype):
    """An array a kernel can compute into for a new shard of `kind` (unified memory for 'cuda_managed')."""
    p = pool.current()
    if kind == "cuda_managed" and p.is_device:
        return p.unified_empty(shape, dtype)
    return p.empty(shape, dtype)


def store(arrays, kind):
    """(pieces, home) of a new shard of `kind` that takes over `arrays`.

    `arrays` are fresh: made by `compute_empty(kind, ...)` (device arrays on a
    GPU) or host arrays from `memory.host_empty` (what scatter receives).
    `home` is a HostCopies for 'host' and 'managed' on a GPU, else None.
    """
    p = pool.current()
    if not p.is_device:
        return arrays, None
    on_host = all(isinstance(a, np.ndarray) for a in arrays)
    if kind in ("host", "managed"):
        if on_host:
            return None, HostCopies(kind, arrays)
        host = [p.host_empty(a.shape, a.dtype) for a in arrays]
        if kind == "managed":
            # the device arrays are the device copy; the host copy is filled when the host needs it
            return None, HostCopies(kind, host, dev=arrays, host_valid=False)
        home = HostCopies(kind, host, dev=arrays, host_valid=False)
        home.host_arrays()
        home.dev, home.dev_valid = None, False
        return None, home
    if not on_host:
        return arrays, None
    stream = _stream()
    out = []
    for a in arrays:
        d = compute_empty(kind, a.shape, a.dtype)
        if a.size:
            d.set(a, stream=stream)
        out.append(d)
    collectives.device_done()  # the host arrays are staging buffers, reused once they are released
    return out, None


def host_arrays(shard):
    """The shard's values as host arrays, without a trip to the device when a host copy is current.

    On the CPU backend these are the pieces themselves: read them, never write.
    """
    if shard.home is not None:
        return shard.home.host_arrays()
    p = pool.current()
    pieces = shard.pieces
    if not p.is_device:
        return pieces
    stream = _stream()
    out = []
    for a in pieces:
        h = p.host_empty(a.shape, a.dtype)
        if a.size:
            a.get(stream=stream, out=h)
        out.append(h)
    collectives.device_done()
    return out


def copy_for(shard, kind):
    """Fresh arrays holding the shard's values, in the form `store(..., kind)` takes."""
    p = pool.current()
    home = shard.home
    if home is not None and home.host_valid and kind in ("host", "managed"):
        out = [p.host_empty(h.shape, h.dtype) for h in home.host]     # host to host, no device trip
        for o, h in zip(out, home.host):
            o[...] = h
        return out
    src = shard.pieces
    out = [compute_empty(kind, a.shape, a.dtype) for a in src]
    for o, a in zip(out, src):
        o[...] = a
    return out


_side = []


def prefetch(shard):
    """Start the asynchronous host-to-device copy of a host-held shard (no-op for the others)."""
    if shard.home is None:
        return
    if not _side:
        _side.append(backend.current().xp.cuda.Stream(non_blocking=True))
    shard.home.prefetch(_side[0])
