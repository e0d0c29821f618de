"""The array-module switch: NumPy on the CPU backend, CuPy on GPUs.

Kernels never branch on numpy versus cupy: they ask `current()` for the
backend and use its `xp` module and the few helpers below (host transfer,
synchronisation). One GPU per worker is chosen from the node-local rank.
"""
import contextlib

import numpy as np

from . import settings
from .errors import DMathError, DTypeError

#: the dtypes dmath stores; float16 arithmetic accumulates in float32 where it matters
DTYPES = ("float16", "float32", "float64")


def canonical_dtype(dtype):
    """Return the dtype's name ('float16', 'float32' or 'float64') or raise DTypeError."""
    try:
        name = np.dtype(dtype).name
    except TypeError as exc:
        raise DTypeError(f"unknown dtype {dtype!r}; expected one of {DTYPES}") from exc
    if name not in DTYPES:
        raise DTypeError(f"dtype {name} is not supported; expected one of {DTYPES}")
    return name


def itemsize(dtype):
    return np.dtype(dtype).itemsize


class Backend:
    """The array module of this process and the helpers that hide numpy versus cupy."""

    def __init__(self, name, xp, device_id=None):
        self.name = name            # 'cpu' or 'gpu'
        self.xp = xp
        self.device_id = device_id
        self.is_gpu = name == "gpu"
        self._side = None

    def asnumpy(self, a):
        """A host (numpy) copy or view of `a`."""
        return self.xp.asnumpy(a) if self.is_gpu else np.asarray(a)

    def asarray(self, a, dtype=None):
        """`a` (host or device) as an array of this backend."""
        return self.xp.asarray(a, dtype=dtype)

    def quiet(self):
        """A context in which floating-point exceptions (overflow, 0/0) pass silently.

        Elementwise kernels produce inf and nan as IEEE says, like CuPy does;
        only NumPy would warn. A GPU needs no context at all (entering NumPy's
        errstate costs microseconds per command).
        """
        return _NO_CONTEXT if self.is_gpu else _Quiet()

    def copy_to_device(self, out, host):
        """out[...] = host (a host array): asynchronous on the current stream from pinned memory on a
        GPU (the caller keeps `host` unchanged until the stream has passed the copy)."""
        if self.is_gpu:
            out.set(host, stream=self.xp.cuda.get_current_stream())
        else:
            out[...] = host

    def mark(self):
        """A point of the compute stream (a recorded CUDA event) that `passed` can wait for; None on
        the CPU, where every command is done when it returns."""
        return self.xp.cuda.get_current_stream().record() if self.is_gpu else None

    @staticmethod
    def passed(mark):
        """Block the host until the device has passed `mark` (from `mark()`; None: at once)."""
        if mark is not None:
            mark.synchronize()

    def where(self, out, cond, a, b):
        """out[...] = a where cond != 0, else b (arrays broadcasting to out, or Python floats).

        One pass on a GPU (a fused kernel); NumPy has no `out` for where.
        """
        if self.is_gpu:
            args = (cond, a, b)
            _fused_where(self.xp, tuple(hasattr(v, "dtype") for v in args))(*args, out)
        else:
            out[...] = np.where(cond != 0, a, b)
        return out

    def synchronize(self):
        if self.is_gpu:
            self.xp.cuda.get_current_stream().synchronize()

    def synchronize_all(self):
        """Wait for the compute stream and the side stream."""
        if self.is_gpu:
            self.xp.cuda.Device().synchronize()

    def side_stream(self):
        """The stream that carries background communication (GPU only), created on first use.

        It has the highest priority the device offers: a large GEMM on the
        compute stream otherwise occupies every SM and the communication
        kernels queued beside it wait for it to finish, which serialises what
        was meant to overlap.
        """
        if self._side is None:
            # CUDA clamps a priority beyond the device's range to its highest one
            self._side = self.xp.cuda.Stream(non_blocking=True, priority=-100)
        return self._side

    def stream_done(self):
        """True when every queued device operation has finished (always True on the CPU)."""
        return self.xp.cuda.get_current_stream().done if self.is_gpu else True

    def device_idle(self):
        """True when the compute stream and the side stream (if one was made) have finished their work:
        what `synchronize_all` waits for, as a test (always True on the CPU)."""
        if not self.is_gpu:
            return True
        return self.xp.cuda.get_current_stream().done and (self._side is None or self._side.done)

    def __repr__(self):
        dev = f", device {self.device_id}" if self.device_id is not None else ""
        return f"Backend({self.name}{dev})"


_NO_CONTEXT = contextlib.nullcontext()


def _quiet_state():
    """[NumPy's error-state context variable, NumPy's function that makes a state, the state it held
    when last asked, that state with every error ignored], or None where NumPy keeps its error state
    otherwise (NumPy 1.x)."""
    try:
        from numpy._core._ufunc_config import _extobj_contextvar, _make_extobj
        _make_extobj(all="ignore")
    except (ImportError, AttributeError, TypeError):
        return None
    return [_extobj_contextvar, _make_extobj, None, None]


_QUIET_STATE = _quiet_state()


class _Quiet:
    """`np.errstate(all="ignore")` at a fraction of its cost on NumPy 2: the ignoring state is made
    once per state it replaces, then only set and reset (errstate builds it on every entry: a
    microsecond per command). NumPy 1.x: errstate itself."""
    __slots__ = ("_token", "_errstate")

    def __enter__(self):
        if _QUIET_STATE is None:
            self._errstate = np.errstate(all="ignore")
            return self._errstate.__enter__()
        var, make, seen, ignore = _QUIET_STATE
        now = var.get()
        if now is not seen:     # the ignoring state keeps the rest of the current one (buffer size)
            ignore = _QUIET_STATE[3] = make(all="ignore")
            _QUIET_STATE[2] = now
        self._token = var.set(ignore)
        return None

    def __exit__(self, *exc_info):
        if _QUIET_STATE is None:
            return self._errstate.__exit__(*exc_info)
        _QUIET_STATE[0].reset(self._token)
        return None
_kernels = {}


def _fused_where(cupy, arrays):
    """The one-pass where kernel for operands that are arrays (True) or Python floats (False):
    a kernel's type placeholders are decided by arrays only, so a float operand is typed double."""
    k = _kernels.get(("where", arrays))
    if k is None:
        params = ", ".join(f"{t if is_array else 'float64'} {v}" for t, v, is_array in zip("CAB", "cab", arrays))
        zero = "(C)0" if arrays[0] else "0.0"
        k = _kernels[("where", arrays)] = cupy.ElementwiseKernel(
            params, "O out", f"out = (c != {zero}) ? (O)a : (O)b", "dmath_where")
    return k


_current = Backend("cpu", np)


def current():
    """The backend chosen by `select` (the CPU backend before init)."""
    return _current


def gpu_available():
    try:
        import cupy
        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:  # no cupy, no driver, or no device: all mean "no GPU"
        return False


def check_device(device):
    """DMathError unless `device` is 'cpu', 'gpu' or None."""
    if device not in (None, "cpu", "gpu"):
        raise DMathError(f"device must be 'cpu', 'gpu' or None, got {device!r}")


def select(device, local_rank=0):
    """Choose the backend for this process: 'cpu', 'gpu' or None (GPU when one is visible).

    The `DMATH_DEVICE` environment variable overrides None. On 'gpu' the
    process binds to GPU `local_rank % device_count`.
    """
    global _current
    device = device or settings.current.device
    check_device(device)
    if device is None:
        device = "gpu" if gpu_available() else "cpu"
    if device == "cpu":
        _current = Backend("cpu", np)
        return _current
    try:
        import cupy
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:
        raise DMathError(f"device='gpu' asked for, but CuPy cannot see a GPU: {exc}") from exc
    if count == 0:
        raise DMathError("device='gpu' asked for, but no GPU is visible")
    dev = local_rank % count
    cupy.cuda.Device(dev).use()
    _current = Backend("gpu", cupy, dev)
    return _current
