"""Local matrix products on one worker's arrays: `out = alpha * a @ b + beta * out`.

`a` and `b` may be transposed views (no copy is made for them). On the GPU
this is one cuBLAS GemmEx call on the current stream, float16 accumulating
in float32; on the CPU NumPy's matmul, float16 computed in float32 (NumPy
has no half-precision BLAS).
"""
import numpy as np

from . import backend

_CUDA_TYPE = {"float16": 2, "float32": 0, "float64": 1}          # cudaDataType
_COMPUTE = {"float16": 68, "float32": 68, "float64": 70}         # CUBLAS_COMPUTE_32F / _64F
_SCALAR = {"float16": np.float32, "float32": np.float32, "float64": np.float64}
_DEFAULT_ALGO, _TENSOR_OP_ALGO = -1, 99                           # CUBLAS_GEMM_DEFAULT(_TENSOR_OP)


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
    if a.dtype == np.float16:
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


def _gemm_gpu(a, b, out, alpha, beta):
    import cupy
    from cupy_backends.cuda.libs import cublas
    if _capturing(cupy):
        return _gemm_captured(cupy, a, b, out, alpha, beta)
    dtype = a.dtype.name
    a, lda, ta = _row_major(a)
    b, ldb, tb = _row_major(b)
    o, ldc, to = _row_major(out)
    if to or o is not out:
        raise ValueError("gemm output must be a row-major array or row-strided view")
    m, k = a.shape
    n = b.shape[1]
    scalar = _SCALAR[dtype]
    al, be = np.array(alpha, dtype=scalar), np.array(beta, dtype=scalar)
    handle = cupy.cuda.device.get_cublas_handle()
    cublas.setStream(handle, cupy.cuda.get_current_stream().ptr)
    cublas.setPointerMode(handle, cublas.CUBLAS_POINTER_MODE_HOST)   # alpha, beta live on the host
    # row-major C = A B is column-major C^T = B^T A^T: hand cuBLAS b first
    typ = _CUDA_TYPE[dtype]
    if dtype == "float64":
        # Dgemm picks faster kernels than GemmEx with compute type 64F on an H200
        # (65 against 52 TFLOP/s at 32768^3, measured)
        cublas.dgemm(handle, int(tb), int(ta), n, m, k, al.ctypes.data, b.data.ptr, ldb,
                     a.data.ptr, lda, be.ctypes.data, out.data.ptr, ldc)
        return out
    tensor_ops = dtype == "float16"
    if tensor_ops:
        cublas.setMathMode(handle, cublas.CUBLAS_TENSOR_OP_MATH)
    try:
        cublas.gemmEx(handle, int(tb), int(ta), n, m, k, al.ctypes.data, b.data.ptr, typ, ldb,
                      a.data.ptr, typ, lda, be.ctypes.data, out.data.ptr, _CUDA_TYPE[out.dtype.name], ldc,
                      _COMPUTE[dtype], _TENSOR_OP_ALGO if tensor_ops else _DEFAULT_ALGO)
    finally:
        if tensor_ops:
            cublas.setMathMode(handle, cublas.CUBLAS_DEFAULT_MATH)
    return out


# ---- GEMM inside a CUDA graph capture -------------------------------------------------
# CuPy's cuBLAS bindings refuse to run while a stream is being captured, but
# cuBLAS itself can be captured once its handle has a workspace (no allocation
# may happen during a capture). So the capture path calls the C library
# directly (ctypes), on the same handle, with a workspace set once.
_CAPTURE = {}
_WORKSPACE_BYTES = 32 << 20


def _capturing(cupy):
    try:
        return cupy.cuda.get_current_stream().is_capturing()
    except AttributeError:      # a CuPy without capture support cannot be capturing
        return False


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


def _gemm_captured(cupy, a, b, out, alpha, beta):
    lib = _libcublas()
    handle = cupy.cuda.device.get_cublas_handle()
    if handle not in _CAPTURE:
        raise RuntimeError("dmath.blas.prepare_capture() must run before a capture that multiplies")
    dtype = a.dtype.name
    a, lda, ta = _row_major(a)
    b, ldb, tb = _row_major(b)
    _, ldc, _ = _row_major(out)
    m, k = a.shape
    n = b.shape[1]
    scalar = _SCALAR[dtype]
    al, be = np.array(alpha, dtype=scalar), np.array(beta, dtype=scalar)
    _check(lib.cublasSetStream_v2(handle, cupy.cuda.get_current_stream().ptr), "SetStream")
    _check(lib.cublasSetPointerMode_v2(handle, 0), "SetPointerMode")   # host scalars, copied at capture
    if dtype == "float64":
        _check(lib.cublasDgemm_v2(handle, int(tb), int(ta), n, m, k, al.ctypes.data, b.data.ptr, ldb,
                                  a.data.ptr, lda, be.ctypes.data, out.data.ptr, ldc), "Dgemm")
        return out
    tensor_ops = dtype == "float16"
    typ = _CUDA_TYPE[dtype]
    if tensor_ops:
        _check(lib.cublasSetMathMode(handle, 1), "SetMathMode")        # CUBLAS_TENSOR_OP_MATH
    try:
        _check(lib.cublasGemmEx(handle, int(tb), int(ta), n, m, k, al.ctypes.data, b.data.ptr, typ, ldb,
                                a.data.ptr, typ, lda, be.ctypes.data, out.data.ptr, _CUDA_TYPE[out.dtype.name],
                                ldc, _COMPUTE[dtype], _TENSOR_OP_ALGO if tensor_ops else _DEFAULT_ALGO), "GemmEx")
    finally:
        if tensor_ops:
            lib.cublasSetMathMode(handle, 0)
    return out
