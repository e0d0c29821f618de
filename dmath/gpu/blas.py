"""Local matrix products on one worker's arrays: `out = alpha * a @ b + beta * out`.

`a` and `b` may be transposed views (no copy is made for them). On the GPU
this is one cuBLAS GemmEx (Dgemm for float64) call on the current stream,
float16 accumulating in float32, or for a prepared `Product` one cuBLASLt
call with its algorithm chosen once (cublaslt.py); on the CPU NumPy's
matmul, float16 computed in float32 (NumPy has no half-precision BLAS).
"""
from typing import NamedTuple

import numpy as np

from .. import backend, memory, settings
from . import cublaslt

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
    if k == 0 or alpha == 0.0:
        # no product to form (BLAS: with alpha == 0, a and b are not read, so an inf or NaN in them
        # does not reach out); beta == 0 ignores what out held, as the products below do
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
    a, lda, ta = _row_major(a)
    b, ldb, tb = _row_major(b)
    o, ldc, to = _row_major(out)
    if to or o is not out:
        raise ValueError("gemm output must be a row-major array or row-strided view")
    _GpuArgs(_NAME[a.dtype], _NAME[out.dtype], int(ta), int(tb), a.shape[0], b.shape[1], a.shape[1],
           lda, ldb, ldc).launch(a.data.ptr, b.data.ptr, out.data.ptr, alpha, beta)
    return out


class _GpuArgs(NamedTuple):
    """A GPU product's cuBLAS arguments other than the pointers and scalars (row-major terms:
    op(a) is m x k, op(b) k x n; ta, tb: 1 where the array holds op(x) column-major)."""
    dtype: str
    out_dtype: str
    ta: int
    tb: int
    m: int
    n: int
    k: int
    lda: int
    ldb: int
    ldc: int

    def launch(self, a_ptr, b_ptr, out_ptr, alpha, beta):
        """out = alpha op(a) op(b) + beta out on the current stream (one cuBLAS call)."""
        cupy = _CUPY.get("cupy") or _cupy()
        handle = cupy.cuda.device.get_cublas_handle()
        # the runtime's own flag: asking the stream is a CUDA call on every product
        capturing = memory.capturing()
        calls = _captured_calls(handle) if capturing else (_CALLS.get("cupy") or _cupy_calls())
        scalar, typ, compute, tensor_ops = _EX[self.dtype]
        al, al_keep = _host_scalar(scalar, alpha)
        be, be_keep = _host_scalar(scalar, beta)
        calls.set_stream(handle, cupy.cuda.get_current_stream().ptr)
        if capturing or handle not in _HOST_POINTER_HANDLES:
            # alpha, beta live on the host (copied at a capture). Set once per handle outside a capture:
            # nothing leaves it otherwise (CuPy's own cuBLAS routines restore the mode they change)
            calls.set_pointer_mode(handle, _HOST_POINTERS)
            _HOST_POINTER_HANDLES.add(handle)
        # row-major C = A B is column-major C^T = B^T A^T: hand cuBLAS b first
        if typ == 1:
            # Dgemm picks faster kernels than GemmEx with compute type 64F on an H200
            # (65 against 52 TFLOP/s at 32768^3, measured)
            calls.dgemm(handle, self.tb, self.ta, self.n, self.m, self.k, al, b_ptr, self.ldb, a_ptr, self.lda,
                        be, out_ptr, self.ldc)
            return
        if tensor_ops:
            calls.set_math_mode(handle, _TENSOR_OP_MATH)
        try:
            calls.gemm_ex(handle, self.tb, self.ta, self.n, self.m, self.k, al, b_ptr, typ, self.ldb, a_ptr, typ,
                          self.lda, be, out_ptr, _CUDA_TYPE[self.out_dtype], self.ldc, compute,
                          _TENSOR_OP_ALGO if tensor_ops else _DEFAULT_ALGO)
        finally:
            if tensor_ops:
                calls.set_math_mode(handle, _DEFAULT_MATH)


class Product:
    """`gemm` of operands shaped like the ones it was made from, its arguments worked out once.

    `product(a, b, out_dtype, trans_a, trans_b)` makes it from a command's
    first arrays (a and b as held, unsliced, with flags saying whether the
    product uses their transposes); `run(a, b, out, alpha)` then computes
    out = alpha op(a) op(b) for arrays of the same shapes, strides and
    dtypes into a new C-ordered `out` (the caller checks the strides against
    `strides`): on a GPU one cuBLAS call whose only per-product work is the
    pointers and alpha; on the CPU NumPy's.
    """
    __slots__ = ("strides", "args", "trans_a", "trans_b", "lt")

    def __init__(self, strides, args, trans_a, trans_b):
        self.strides = strides          # (a's, b's) as held
        self.args = args                # the cuBLAS arguments (_GpuArgs) on a GPU, None on the CPU
        self.trans_a, self.trans_b = trans_a, trans_b
        self.lt = None                  # its cublaslt.Matmul, made at the first run; False: cuBLAS's call

    def run(self, a, b, out, alpha):
        """out = alpha op(a) op(b); returns out."""
        args = self.args
        if args is None:
            return _gemm_cpu(a.T if self.trans_a else a, b.T if self.trans_b else b, out, alpha, 0.0)
        lt = self.lt
        if lt is None:
            # (DMATH_CUBLASLT=0: through cuBLAS's GemmEx/Dgemm, as every other product does)
            lt = self.lt = (settings.current.cublaslt and cublaslt.matmul(args)) or False
        if lt and not memory.capturing():
            scalar = _EX[args.dtype][0]
            cupy = _CUPY.get("cupy") or _cupy()
            stream = cupy.cuda.get_current_stream().ptr
            if not lt.settled:          # the algorithm, chosen on these buffers (cublaslt.Matmul.settle)
                lt.settle(a.data.ptr, b.data.ptr, out.data.ptr, stream)
            lt.run(a.data.ptr, b.data.ptr, out.data.ptr, _host_scalar(scalar, alpha)[0], _host_scalar(scalar, 0.0)[0],
                   stream)
        else:
            args.launch(a.data.ptr, b.data.ptr, out.data.ptr, alpha, 0.0)
        return out


def product(a, b, out_dtype, trans_a=False, trans_b=False):
    """The `Product` of arrays like a, b (as held; op(x) is x.T when trans_x) into a new C-ordered
    result of `out_dtype`, or None where `gemm` must do more than one library call (an empty
    product, or an operand that is neither row- nor column-major: it is copied first)."""
    x = a.T if trans_a else a
    y = b.T if trans_b else b
    m, k = x.shape
    n = y.shape[1]
    if not (m and n and k) or x.dtype != y.dtype:
        return None
    if not backend.current().is_gpu:
        return Product((a.strides, b.strides), None, trans_a, trans_b)
    x2, lda, ta = _row_major(x)
    y2, ldb, tb = _row_major(y)
    if x2 is not x or y2 is not y:
        return None
    return Product((a.strides, b.strides), _GpuArgs(_NAME[x.dtype], str(out_dtype), int(ta), int(tb), m, n, k,
                                                 lda, ldb, n), trans_a, trans_b)


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
# directly (ctypes), on the same handle, with a workspace of its own. cuBLAS's
# SetStream puts the handle back on its default workspace pool, so the capture
# path sets that workspace again after every SetStream; outside a capture the
# handle keeps cuBLAS's own pool (CuPy's bindings set the stream too).
_CAPTURE = {}
_WORKSPACE_BYTES = 32 << 20


def _libcublas():
    lib = _CAPTURE.get("lib")
    if lib is None:
        import ctypes
        lib = ctypes.CDLL(cublaslt.loaded("libcublas") or "libcublas.so.12")
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


def prepare_capture(lanes=1):
    """Make the workspaces that this device's cuBLAS handle uses in captured products; call before a
    capture on `lanes` streams begins.

    No allocation may happen while a stream is captured, and cuBLAS would
    otherwise allocate its workspace on first use. `_captured_calls` hands
    one to the handle after each SetStream (which resets it): the workspace
    of the capture's current stream ("lane", dmath.memory.capture_lane), one
    per stream of the capture (kept for later captures), since products on
    different streams of a capture may run at once; on one stream no two do.
    Idempotent; GPU only.
    """
    import cupy
    handle = cupy.cuda.device.get_cublas_handle()
    spaces = _CAPTURE.get(handle)
    if spaces is None:
        _libcublas()
        spaces = _CAPTURE[handle] = []
    while len(spaces) < max(1, int(lanes)):
        spaces.append(cupy.cuda.runtime.malloc(_WORKSPACE_BYTES))     # outside every pool: kept for good


def _captured_calls(handle):
    """The C library's functions, called directly (CuPy's bindings refuse during a capture), each
    raising on a failed call."""
    if handle not in _CAPTURE:
        raise RuntimeError("dmath.gpu.blas.prepare_capture() must run before a capture that multiplies")
    calls = _CALLS.get("captured")
    if calls is None:
        lib = _libcublas()
        set_stream, set_workspace = _checked(lib.cublasSetStream_v2, "SetStream"), \
            _checked(lib.cublasSetWorkspace_v2, "SetWorkspace")

        def set_stream_and_workspace(h, stream):
            set_stream(h, stream)
            # SetStream resets the handle to cuBLAS's default workspace pool, which may allocate
            set_workspace(h, _CAPTURE[h][memory.capture_lane()], _WORKSPACE_BYTES)

        calls = _CALLS["captured"] = _Calls(
            set_stream_and_workspace, _checked(lib.cublasSetPointerMode_v2, "SetPointerMode"),
            _checked(lib.cublasSetMathMode, "SetMathMode"), _checked(lib.cublasDgemm_v2, "Dgemm"),
            _checked(lib.cublasGemmEx, "GemmEx"))
    return calls


def _checked(fn, what):
    def call(*args):
        _check(fn(*args), what)
    return call
