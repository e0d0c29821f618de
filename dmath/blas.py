"""Local matrix products on one worker's arrays: `out = alpha * a @ b + beta * out`.

`a` and `b` may be transposed views (no copy is made for them). On the GPU
this is one cuBLAS GemmEx call on the current stream, float16 accumulating
in float32; on the CPU NumPy's matmul, float16 computed in float32 (NumPy
has no half-precision BLAS).
"""
from typing import NamedTuple

import numpy as np

from . import backend, memory

_CUDA_TYPE = {"float16": 2, "float32": 0, "float64": 1}          # cudaDataType
_COMPUTE = {"float16": 68, "float32": 68, "float64": 70}         # CUBLAS_COMPUTE_32F / _64F
_SCALAR = {"float16": np.float32, "float32": np.float32, "float64": np.float64}
_DEFAULT_ALGO, _TENSOR_OP_ALGO = -1, 99                           # CUBLAS_GEMM_DEFAULT(_TENSOR_OP)
_DEFAULT_MATH, _TENSOR_OP_MATH = 0, 1                            # CUBLAS_DEFAULT_MATH, CUBLAS_TENSOR_OP_MATH
_HOST_POINTERS = 0                                               # CUBLAS_POINTER_MODE_HOST

#: "cupy" and "captured": the two ways to call cuBLAS (`_Calls`), made at first use
_CALLS = {}


def gemm(a, b, out, alpha=1.0, beta=0.0):
    """out = alpha * a @ b + beta * out, with `out` a C-ordered array (or a row-strided view).

    `a` and `b` share a dtype; `out` has it too, or is float32 when they are
    float16 (accumulating a product over several panels without rounding
    each partial sum to half precision).
    """
    m, k = a.shape
    n = b.shape[1]
    if m == 0 or n == 0:
        return out
    if k == 0:
        if beta == 0.0:
            out.fill(0)
        elif beta != 1.0:
            out *= beta
        return out
    if backend.current().is_gpu:
        return _gemm_gpu(a, b, out, alpha, beta)
    return _gemm_cpu(a, b, out, alpha, beta)


def _gemm_cpu(a, b, out, alpha, beta):
    if a.dtype.char == "e":         # float16 (comparing with np.float16 converts it on every product)
        prod = np.matmul(a.astype(np.float32), b.astype(np.float32))
        if alpha != 1.0:
            prod *= alpha
        if beta != 0.0:
            prod += beta * out.astype(np.float32)
        out[...] = prod
        return out
    if beta == 0.0:
        np.matmul(a, b, out=out)
        if alpha != 1.0:
            out *= alpha
        return out
    prod = np.matmul(a, b)
    if beta != 1.0:
        out *= beta
    if alpha != 1.0:
        prod *= alpha
    out += prod
    return out


def _row_major(x):
    """(x or a contiguous copy, leading dimension, transposed?) in row-major terms."""
    isz = x.itemsize
    s0, s1 = x.strides
    if s1 == isz and s0 >= max(1, x.shape[1]) * isz and s0 % isz == 0:
        return x, s0 // isz, False
    if s0 == isz and s1 >= max(1, x.shape[0]) * isz and s1 % isz == 0:
        return x, s1 // isz, True
    x = backend.current().xp.ascontiguousarray(x)
    return x, max(1, x.shape[1]), False


#: numpy dtype -> its name (`dtype.name` is computed in Python on every read: microseconds per product)
_NAME = {np.dtype(n): n for n in _CUDA_TYPE}
#: (scalar type, value) -> (a 0-d host array holding the value, its address), the alpha or beta
#: cuBLAS reads: kept, so a repeated product makes none and asks no array for its address (NumPy
#: builds a ctypes helper object per `.ctypes` access). cuBLAS reads host scalars before the call
#: returns, or copies them into a graph being captured.
_HOST_SCALARS = {}


def _host_scalar(scalar, value):
    """The address of `value` as a host scalar of type `scalar` (kept alive by _HOST_SCALARS, or for
    the rare value past its 256 entries, by the returned array: (address, array))."""
    key = (scalar, value)
    found = _HOST_SCALARS.get(key)
    if found is None:
        arr = np.array(value, dtype=scalar)
        found = (arr.ctypes.data, arr)
        if len(_HOST_SCALARS) < 256:
            _HOST_SCALARS[key] = found
    return found


#: dtype name -> (scalar type, cudaDataType, compute type, tensor ops?) for GemmEx
_EX = {d: (_SCALAR[d], _CUDA_TYPE[d], _COMPUTE[d], d == "float16") for d in _CUDA_TYPE}


def _gemm_gpu(a, b, out, alpha, beta):
    cupy = _CUPY.get("cupy") or _cupy()
    handle = cupy.cuda.device.get_cublas_handle()
    # the runtime's own flag: asking the stream is a CUDA call on every product
    capturing = memory.capturing()
    calls = _captured_calls(handle) if capturing else (_CALLS.get("cupy") or _cupy_calls())
    dtype = _NAME[a.dtype]
    a, lda, ta = _row_major(a)
    b, ldb, tb = _row_major(b)
    o, ldc, to = _row_major(out)
    if to or o is not out:
        raise ValueError("gemm output must be a row-major array or row-strided view")
    m, k = a.shape
    n = b.shape[1]
    scalar, typ, compute, tensor_ops = _EX[dtype]
    al, al_keep = _host_scalar(scalar, alpha)
    be, be_keep = _host_scalar(scalar, beta)
    calls.set_stream(handle, cupy.cuda.get_current_stream().ptr)
    if capturing or handle not in _HOST_POINTER_HANDLES:
        # alpha, beta live on the host (copied at a capture). Set once per handle outside a capture:
        # nothing leaves it otherwise (CuPy's own cuBLAS routines restore the mode they change)
        calls.set_pointer_mode(handle, _HOST_POINTERS)
        _HOST_POINTER_HANDLES.add(handle)
    # row-major C = A B is column-major C^T = B^T A^T: hand cuBLAS b first
    if dtype == "float64":
        # Dgemm picks faster kernels than GemmEx with compute type 64F on an H200
        # (65 against 52 TFLOP/s at 32768^3, measured)
        calls.dgemm(handle, int(tb), int(ta), n, m, k, al, b.data.ptr, ldb, a.data.ptr, lda, be, out.data.ptr, ldc)
        return out
    if tensor_ops:
        calls.set_math_mode(handle, _TENSOR_OP_MATH)
    try:
        calls.gemm_ex(handle, int(tb), int(ta), n, m, k, al, b.data.ptr, typ, ldb, a.data.ptr, typ, lda, be,
                      out.data.ptr, _CUDA_TYPE[_NAME[out.dtype]], ldc, compute,
                      _TENSOR_OP_ALGO if tensor_ops else _DEFAULT_ALGO)
    finally:
        if tensor_ops:
            calls.set_math_mode(handle, _DEFAULT_MATH)
    return out


#: the cuBLAS handles whose pointer mode `_gemm_gpu` has set to host pointers
_HOST_POINTER_HANDLES = set()
#: "cupy": the cupy module, imported at the first product (an import statement costs a lookup per call)
_CUPY = {}


def _cupy():
    import cupy
    _CUPY["cupy"] = cupy
    return cupy


class _Calls(NamedTuple):
    """The cuBLAS functions `_gemm_gpu` calls, each taking the C API's arguments in its order."""
    set_stream: object
    set_pointer_mode: object
    set_math_mode: object
    dgemm: object
    gemm_ex: object


def _cupy_calls():
    """CuPy's bindings (they raise on a failed call)."""
    calls = _CALLS.get("cupy")
    if calls is None:
        from cupy_backends.cuda.libs import cublas
        calls = _CALLS["cupy"] = _Calls(cublas.setStream, cublas.setPointerMode, cublas.setMathMode,
                                        cublas.dgemm, cublas.gemmEx)
    return calls


# ---- GEMM inside a CUDA graph capture -------------------------------------------------
# CuPy's cuBLAS bindings refuse to run while a stream is being captured, but
# cuBLAS itself can be captured once its handle has a workspace (no allocation
# may happen during a capture). So the capture path calls the C library
# directly (ctypes), on the same handle, with a workspace set once.
_CAPTURE = {}
_WORKSPACE_BYTES = 32 << 20


def _libcublas():
    lib = _CAPTURE.get("lib")
    if lib is None:
        import ctypes
        path = "libcublas.so.12"
        # the library CuPy loaded (a second copy would have its own handles)
        with open("/proc/self/maps") as maps:
            for line in maps:
                if "libcublas.so" in line and "libcublasLt" not in line:
                    path = line.split()[-1]
                    break
        lib = ctypes.CDLL(path)
        c = ctypes
        lib.cublasGemmEx.argtypes = [c.c_void_p, c.c_int, c.c_int, c.c_int, c.c_int, c.c_int, c.c_void_p,
                                     c.c_void_p, c.c_int, c.c_int, c.c_void_p, c.c_int, c.c_int, c.c_void_p,
                                     c.c_void_p, c.c_int, c.c_int, c.c_int, c.c_int]
        lib.cublasDgemm_v2.argtypes = [c.c_void_p, c.c_int, c.c_int, c.c_int, c.c_int, c.c_int, c.c_void_p,
                                       c.c_void_p, c.c_int, c.c_void_p, c.c_int, c.c_void_p, c.c_void_p, c.c_int]
        lib.cublasSetStream_v2.argtypes = [c.c_void_p, c.c_void_p]
        lib.cublasSetPointerMode_v2.argtypes = [c.c_void_p, c.c_int]
        lib.cublasSetMathMode.argtypes = [c.c_void_p, c.c_int]
        lib.cublasSetWorkspace_v2.argtypes = [c.c_void_p, c.c_void_p, c.c_size_t]
        _CAPTURE["lib"] = lib
    return lib


def _check(status, what):
    if status != 0:
        raise RuntimeError(f"cuBLAS {what} failed with status {status} during a CUDA graph capture")


def prepare_capture():
    """Give this device's cuBLAS handle a workspace of its own; call before a capture begins.

    No allocation may happen while a stream is captured, and cuBLAS would
    otherwise allocate its workspace on first use. Idempotent; GPU only.
    """
    import cupy
    handle = cupy.cuda.device.get_cublas_handle()
    if handle not in _CAPTURE:
        lib = _libcublas()
        ws = cupy.cuda.runtime.malloc(_WORKSPACE_BYTES)     # outside every pool: kept for good
        _check(lib.cublasSetWorkspace_v2(handle, ws, _WORKSPACE_BYTES), "SetWorkspace")
        _CAPTURE[handle] = ws


def _captured_calls(handle):
    """The C library's functions, called directly (CuPy's bindings refuse during a capture), each
    raising on a failed call."""
    if handle not in _CAPTURE:
        raise RuntimeError("dmath.blas.prepare_capture() must run before a capture that multiplies")
    calls = _CALLS.get("captured")
    if calls is None:
        lib = _libcublas()
        calls = _CALLS["captured"] = _Calls(
            _checked(lib.cublasSetStream_v2, "SetStream"), _checked(lib.cublasSetPointerMode_v2, "SetPointerMode"),
            _checked(lib.cublasSetMathMode, "SetMathMode"), _checked(lib.cublasDgemm_v2, "Dgemm"),
            _checked(lib.cublasGemmEx, "GemmEx"))
    return calls


def _checked(fn, what):
    def call(*args):
        _check(fn(*args), what)
    return call
