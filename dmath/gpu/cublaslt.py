"""Matrix products through cuBLASLt with the algorithm chosen once per product shape (GPU only).

Why: cublasGemmEx chooses the algorithm on every call, which for a small
product costs as much host time as the rest of an eager operation, and the
one it chooses splits k (a second kernel to launch). cuBLASLt takes the
algorithm as an argument: `Matmul` builds the descriptors and asks the
heuristic once, when a `blas.Product` first runs, and for a small product
asks for one kernel that does not split k (ONE_KERNEL_FLOPS); each later
product is one `cublasLtMatmul` call with the pointers, alpha and the
stream. Large products (above ONE_KERNEL_FLOPS) choose among the heuristic's
candidates at their first run outside a capture, on that run's own buffers,
as DMATH_TUNE says (dmath.tuning): the algorithm an earlier run chose on this
GPU model, driver and cuBLASLt, read from the tuning cache (cuBLASLt's
algorithm structure is documented as serializable for the same library
version; cublasLtMatmulAlgoCheck vets it before use); else the first few
candidates timed ('fast'), all of them ('full'), or the heuristic's first
('off'). Measurements: benchmarks/results.

The library is the copy CuPy's cuBLAS loaded (a second copy would be a
second set of handles and kernels). Products run on the current stream, in
order, so the process shares one workspace per device between them. The
capture path (`blas._captured_calls`) keeps cuBLAS proper: this module is
never called while a CUDA graph is being captured.
"""
import ctypes
import os

import numpy as np

from .. import tuning

#: bytes of each device's workspace (cuBLAS's own recommendation for Hopper)
WORKSPACE_BYTES = 32 << 20
#: products of at most this many floating-point operations (2 m n k; 256^3 is 2^25) run as one kernel:
#: k is never split (below it the host's cost of the call, not the device's, is the product's time)
ONE_KERNEL_FLOPS = 1 << 25
#: candidates the heuristic is asked for when every one is timed (DMATH_TUNE=full)
FULL_CANDIDATES = 16
#: timed runs per candidate algorithm (after one warm-up run); the median decides
TIMED_RUNS = 3

_DATA_TYPE = {"float16": 2, "float32": 0, "float64": 1}       # cudaDataType
_COMPUTE = {"float16": 68, "float32": 68, "float64": 70}      # CUBLAS_COMPUTE_32F, _64F (no TF32)
_SCALE = {"float16": 0, "float32": 0, "float64": 1}           # alpha and beta: float, or double for 64F
_DESC_TRANSA, _DESC_TRANSB = 3, 4                              # cublasLtMatmulDescAttributes_t
_PREF_MAX_WORKSPACE, _PREF_REDUCTION_MASK = 1, 3             # cublasLtMatmulPreferenceAttributes_t
_REDUCTION_NONE = 0                                            # cublasLtReductionScheme_t: k is not split

#: "lib": the loaded library with its argument types; device id -> (handle, workspace pointer)
_STATE = {}


class _Algo(ctypes.Structure):
    _fields_ = [("data", ctypes.c_uint64 * 8)]          # cublasLtMatmulAlgo_t


class _Heuristic(ctypes.Structure):
    _fields_ = [("algo", _Algo), ("workspace_size", ctypes.c_size_t), ("state", ctypes.c_int),
                ("waves_count", ctypes.c_float), ("reserved", ctypes.c_int * 4)]


class LtError(RuntimeError):
    """A cuBLASLt call returned a failure status."""


def loaded(stem):
    """The path of the shared library `stem`.so* this process has loaded (the copy CuPy loaded: a
    second copy would have handles and kernels of its own), or None."""
    with open("/proc/self/maps") as maps:
        for line in maps:
            path = line.split()[-1]
            if os.path.basename(path).startswith(stem + ".so"):
                return path
    return None


def _library():
    lib = _STATE.get("lib")
    if lib is not None:
        return lib
    path = loaded("libcublasLt")
    if path is None:
        import cupy
        cupy.cuda.device.get_cublas_handle()     # CuPy loads cuBLAS, and with it cuBLASLt, at first use
        path = loaded("libcublasLt")
    if path is None:
        raise LtError("libcublasLt is not loaded in this process")
    lib = ctypes.CDLL(path)
    vp, c = ctypes.c_void_p, ctypes
    lib.cublasLtCreate.argtypes = [c.POINTER(vp)]
    lib.cublasLtMatmulDescCreate.argtypes = [c.POINTER(vp), c.c_int, c.c_int]
    lib.cublasLtMatmulDescSetAttribute.argtypes = [vp, c.c_int, vp, c.c_size_t]
    lib.cublasLtMatmulDescDestroy.argtypes = [vp]
    lib.cublasLtMatrixLayoutCreate.argtypes = [c.POINTER(vp), c.c_int, c.c_uint64, c.c_uint64, c.c_int64]
    lib.cublasLtMatrixLayoutDestroy.argtypes = [vp]
    lib.cublasLtMatmulPreferenceCreate.argtypes = [c.POINTER(vp)]
    lib.cublasLtMatmulPreferenceSetAttribute.argtypes = [vp, c.c_int, vp, c.c_size_t]
    lib.cublasLtMatmulPreferenceDestroy.argtypes = [vp]
    lib.cublasLtMatmulAlgoGetHeuristic.argtypes = [vp, vp, vp, vp, vp, vp, vp, c.c_int, c.POINTER(_Heuristic),
                                                   c.POINTER(c.c_int)]
    # handle, desc, alpha, A, Adesc, B, Bdesc, beta, C, Cdesc, D, Ddesc, algo, workspace, its size, stream
    lib.cublasLtMatmul.argtypes = [vp] * 14 + [c.c_size_t, vp]
    # handle, desc, Adesc, Bdesc, Cdesc, Ddesc, algo, result
    lib.cublasLtMatmulAlgoCheck.argtypes = [vp] * 7 + [c.POINTER(_Heuristic)]
    lib.cublasLtGetVersion.restype = c.c_size_t
    lib.cublasLtGetVersion.argtypes = []
    _STATE["lib"] = lib
    return lib


def _check(status, what):
    if status != 0:
        raise LtError(f"cuBLASLt {what} failed with status {status}")


def _device_state():
    """(handle, workspace pointer) of the current device, made at its first product."""
    import cupy
    dev = cupy.cuda.runtime.getDevice()
    state = _STATE.get(dev)
    if state is None:
        lib = _library()
        handle = ctypes.c_void_p()
        _check(lib.cublasLtCreate(ctypes.byref(handle)), "Create")
        workspace = cupy.cuda.runtime.malloc(WORKSPACE_BYTES)     # outside every pool: kept for good
        state = _STATE[dev] = (handle, ctypes.c_void_p(workspace))
    return state


class Matmul:
    """One product shape's descriptors and algorithm: `run` computes
    out = alpha op(a) op(b) (+ beta out) in row-major terms, with the
    arguments of `blas._GpuArgs` (ta, tb: 1 where an array holds op(x)
    column-major; lda, ldb, ldc its leading dimensions).
    """
    __slots__ = ("_matmul", "_handle", "_desc", "_a", "_b", "_c", "_algo", "_heuristic", "_workspace", "_lib",
                 "_args", "settled", "source", "ms")

    def __init__(self, args):
        self._args = args
        self.settled = False        # True once `settle` made the choice for good
        self.source = "heuristic"   # how the algorithm was chosen: 'heuristic', or dmath.tuning.decide's source
        self.ms = None              # its timed milliseconds, where it was timed
        lib = self._lib = _library()
        self._handle, self._workspace = _device_state()
        self._desc, self._a, self._b, self._c = ctypes.c_void_p(), ctypes.c_void_p(), ctypes.c_void_p(), \
            ctypes.c_void_p()
        in_type, out_type = _DATA_TYPE[args.dtype], _DATA_TYPE[args.out_dtype]
        _check(lib.cublasLtMatmulDescCreate(ctypes.byref(self._desc), _COMPUTE[args.dtype], _SCALE[args.dtype]),
               "MatmulDescCreate")
        # row-major out = op(a) op(b) is column-major out^T = op(b)^T op(a)^T: cuBLASLt's A is b
        for attr, trans in ((_DESC_TRANSA, args.tb), (_DESC_TRANSB, args.ta)):
            value = ctypes.c_int(trans)
            _check(lib.cublasLtMatmulDescSetAttribute(self._desc, attr, ctypes.byref(value), 4), "DescSetAttribute")
        m, n, k = args.m, args.n, args.k
        # a layout is the matrix as stored, column-major: (rows, cols) before its op
        b_rows, b_cols = (k, n) if args.tb else (n, k)
        a_rows, a_cols = (m, k) if args.ta else (k, m)
        _check(lib.cublasLtMatrixLayoutCreate(ctypes.byref(self._a), in_type, b_rows, b_cols, args.ldb), "Layout")
        _check(lib.cublasLtMatrixLayoutCreate(ctypes.byref(self._b), in_type, a_rows, a_cols, args.lda), "Layout")
        _check(lib.cublasLtMatrixLayoutCreate(ctypes.byref(self._c), out_type, n, m, args.ldc), "Layout")
        self._matmul = lib.cublasLtMatmul
        self._use(self._heuristics(1)[0])

    def _heuristics(self, count):
        """The heuristic's first `count` candidates (at least one, else LtError), best first."""
        lib, args = self._lib, self._args
        pref = ctypes.c_void_p()
        _check(lib.cublasLtMatmulPreferenceCreate(ctypes.byref(pref)), "PreferenceCreate")
        try:
            size = ctypes.c_uint64(WORKSPACE_BYTES)
            _check(lib.cublasLtMatmulPreferenceSetAttribute(pref, _PREF_MAX_WORKSPACE, ctypes.byref(size), 8),
                   "PreferenceSetAttribute")
            if 2 * args.m * args.n * args.k <= ONE_KERNEL_FLOPS:
                # a small product takes the device a few us whichever way it runs, but splitting k adds a
                # second kernel (the reduction) and 4 us of host time: one kernel, each sum in one order
                mask = ctypes.c_uint32(_REDUCTION_NONE)
                _check(lib.cublasLtMatmulPreferenceSetAttribute(pref, _PREF_REDUCTION_MASK, ctypes.byref(mask), 4),
                       "PreferenceSetAttribute")
            results = (_Heuristic * count)()
            found = ctypes.c_int(0)
            _check(lib.cublasLtMatmulAlgoGetHeuristic(self._handle, self._desc, self._a, self._b, self._c, self._c,
                                                      pref, count, results, ctypes.byref(found)),
                   "MatmulAlgoGetHeuristic")
        finally:
            lib.cublasLtMatmulPreferenceDestroy(pref)
        out = [_Heuristic.from_buffer_copy(results[i]) for i in range(found.value) if results[i].state == 0]
        if not out:
            raise LtError(f"cuBLASLt has no algorithm for this product ({args})")
        return out

    def _use(self, heuristic):
        self._heuristic = heuristic
        self._algo = ctypes.c_void_p(ctypes.addressof(heuristic.algo))

    def settle(self, a_ptr, b_ptr, out_ptr, stream_ptr):
        """Choose the algorithm for good at the first product outside a capture (its buffers are timed
        on, `out` overwritten): a small product keeps the heuristic's first (the host's time is its
        time); a large one follows DMATH_TUNE through the tuning cache. Never call it while a CUDA
        graph is being captured (timing synchronizes)."""
        self.settled = True
        args = self._args
        if 2 * args.m * args.n * args.k <= ONE_KERNEL_FLOPS:
            return
        key = {"dtype": args.dtype, "out_dtype": args.out_dtype, "ta": int(args.ta), "tb": int(args.tb),
               "m": int(args.m), "n": int(args.n), "k": int(args.k), "lda": int(args.lda), "ldb": int(args.ldb),
               "ldc": int(args.ldc), "workspace": WORKSPACE_BYTES}
        heuristic, self.source = tuning.decide(
            "cublaslt_matmul", _machine(), key, self._adopt,
            lambda how: self._tune(how, a_ptr, b_ptr, out_ptr, stream_ptr))
        self._use(heuristic)

    def _adopt(self, value):
        """A cached algorithm ({'algo': its 8 words, 'ms'}) when cuBLASLt accepts it for this product;
        None otherwise."""
        words = value.get("algo")
        if not (isinstance(words, list) and len(words) == 8
                and all(isinstance(w, int) and 0 <= w < 1 << 64 for w in words)):
            return None
        h = _Heuristic()
        for i, w in enumerate(words):
            h.algo.data[i] = w
        check = _Heuristic()
        status = self._lib.cublasLtMatmulAlgoCheck(self._handle, self._desc, self._a, self._b, self._c, self._c,
                                                   ctypes.byref(h.algo), ctypes.byref(check))
        if status != 0 or check.workspace_size > WORKSPACE_BYTES:
            return None
        h.workspace_size = check.workspace_size
        ms = value.get("ms")
        self.ms = float(ms) if isinstance(ms, (int, float)) else None
        return h

    def _tune(self, how, a_ptr, b_ptr, out_ptr, stream_ptr):
        """(heuristic, value to cache): 'off' keeps the heuristic's first; 'fast' times its first few
        (more for an expensive product: dmath.tuning.timed), 'full' up to FULL_CANDIDATES; the fastest
        is kept."""
        if how == "off":
            return self._heuristic, None
        count = tuning.candidates_wanted(how) or FULL_CANDIDATES
        candidates = self._heuristics(count)
        timed = tuning.timed(candidates, lambda h: self._time(h, a_ptr, b_ptr, out_ptr, stream_ptr), how)
        if not timed:
            return self._heuristic, None          # none ran: cuBLAS's own choice, nothing worth caching
        best, ms = min(timed, key=lambda hm: hm[1])
        self.ms = ms
        value = {"algo": [int(w) for w in best.algo.data], "ms": ms,
                 "timed": [[candidates.index(h), t] for h, t in timed]}
        return best, value

    def _time(self, heuristic, a_ptr, b_ptr, out_ptr, stream_ptr):
        """Median milliseconds of the product with `heuristic`'s algorithm (alpha 1, beta 0, after a
        warm-up run), or None where it fails."""
        import cupy
        scale = ctypes.c_double if _SCALE[self._args.dtype] else ctypes.c_float
        one, zero = scale(1.0), scale(0.0)
        algo = ctypes.byref(heuristic.algo)
        stream = cupy.cuda.get_current_stream()         # the stream of stream_ptr (blas.Product.run's)

        def once():
            return self._matmul(self._handle, self._desc, ctypes.byref(one), b_ptr, self._a, a_ptr, self._b,
                                ctypes.byref(zero), out_ptr, self._c, out_ptr, self._c, algo, self._workspace,
                                WORKSPACE_BYTES, stream_ptr)
        if once() != 0:
            return None
        times = []
        for _ in range(TIMED_RUNS):
            start, end = cupy.cuda.Event(), cupy.cuda.Event()
            start.record(stream)
            status = once()
            end.record(stream)
            end.synchronize()
            if status != 0:
                return None
            times.append(cupy.cuda.get_elapsed_time(start, end))
        return float(np.median(times))

    def run(self, a_ptr, b_ptr, out_ptr, alpha_ptr, beta_ptr, stream_ptr):
        """The product of device pointers a_ptr, b_ptr into out_ptr; alpha_ptr, beta_ptr: host scalars
        of the scale type (float, double for float64); stream_ptr: the stream to run on."""
        status = self._matmul(self._handle, self._desc, alpha_ptr, b_ptr, self._a, a_ptr, self._b, beta_ptr,
                              out_ptr, self._c, out_ptr, self._c, self._algo, self._workspace, WORKSPACE_BYTES,
                              stream_ptr)
        if status:
            _check(status, "Matmul")

    def __del__(self):
        lib = getattr(self, "_lib", None)
        if lib is None:
            return
        try:
            for layout in (self._a, self._b, self._c):
                if layout:
                    lib.cublasLtMatrixLayoutDestroy(layout)
            if self._desc:
                lib.cublasLtMatmulDescDestroy(self._desc)
        except Exception:  # interpreter shutdown: the process frees it all
            pass


def _machine():
    """The current GPU and cuBLASLt, as the tuning cache keys them."""
    import cupy
    key = ("machine", cupy.cuda.runtime.getDevice())
    machine = _STATE.get(key)
    if machine is None:
        machine = _STATE[key] = tuning.gpu_fingerprint(cublaslt=int(_library().cublasLtGetVersion()))
    return machine


def matmul(args):
    """The `Matmul` of `blas._GpuArgs` args, or None where cuBLASLt cannot run it (no library, no
    algorithm): the caller then calls cuBLAS."""
    try:
        return Matmul(args)
    except (LtError, OSError, AttributeError):     # (AttributeError: a cuBLASLt without a symbol used here)
        return None
