"""Host microseconds per kernel launch on one GPU: CuPy ufuncs, ElementwiseKernel, RawKernel, cuBLAS, torch.

    python tools/launch_costs.py

A diagnostic for dispatch latency: what each way of starting the same small
device operation costs the launching thread (the device work is tiny).
"""
import ctypes
import time

import cupy as cp
import numpy as np


def per_call(fn, n=20000):
    for _ in range(200):
        fn()
    cp.cuda.Device().synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    t = (time.perf_counter() - t0) / n * 1e6
    cp.cuda.Device().synchronize()
    return t


def main():
    a = cp.random.rand(128, 256, dtype=cp.float32)
    b = cp.random.rand(256, 256, dtype=cp.float32)
    o = cp.empty_like(a)
    rows = {}
    rows["cupy.tanh(a, out=o)"] = per_call(lambda: cp.tanh(a, out=o))
    rows["cupy.multiply(a, 0.5, out=o)"] = per_call(lambda: cp.multiply(a, 0.5, out=o))
    rows["cupy.add(a, a, out=o)"] = per_call(lambda: cp.add(a, a, out=o))
    rows["cupy.empty"] = per_call(lambda: cp.empty((128, 256), cp.float32))
    ek = cp.ElementwiseKernel("T x", "T y", "y = tanh(x)", "dm_tanh")
    rows["ElementwiseKernel(a, o)"] = per_call(lambda: ek(a, o))
    rk = cp.RawKernel(r'''extern "C" __global__ void t(const float* x, float* y, long long n) {
        long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; if (i < n) y[i] = tanhf(x[i]); }''', "t")
    n = a.size
    grid = ((n + 255) // 256,)
    rows["RawKernel launch"] = per_call(lambda: rk(grid, (256,), (a, o, np.int64(n))))
    from cupy_backends.cuda.libs import cublas
    h = cp.cuda.device.get_cublas_handle()
    al, be = np.array(1.0, np.float32), np.array(0.0, np.float32)
    rows["cupy cublas.gemmEx"] = per_call(lambda: cublas.gemmEx(
        h, 0, 0, 256, 128, 256, al.ctypes.data, b.data.ptr, 0, 256, a.data.ptr, 0, 256, be.ctypes.data,
        o.data.ptr, 0, 256, 68, -1))
    lib = None
    with open("/proc/self/maps") as maps:
        for line in maps:
            if "libcublas.so" in line and "libcublasLt" not in line:
                lib = ctypes.CDLL(line.split()[-1])
                break
    c = ctypes
    lib.cublasGemmEx.argtypes = [c.c_void_p, c.c_int, c.c_int, c.c_int, c.c_int, c.c_int, c.c_void_p,
                                 c.c_void_p, c.c_int, c.c_int, c.c_void_p, c.c_int, c.c_int, c.c_void_p,
                                 c.c_void_p, c.c_int, c.c_int, c.c_int, c.c_int]
    ap, bp, op_ = a.data.ptr, b.data.ptr, o.data.ptr
    alp, bep = al.ctypes.data, be.ctypes.data
    rows["ctypes cublasGemmEx"] = per_call(lambda: lib.cublasGemmEx(
        h, 0, 0, 256, 128, 256, alp, bp, 0, 256, ap, 0, 256, bep, op_, 0, 256, 68, -1))
    try:
        import torch
        ta = torch.rand(128, 256, device="cuda")
        tb = torch.rand(256, 256, device="cuda")
        to = torch.empty_like(ta)
        rows["torch.tanh(a, out=o)"] = per_call(lambda: torch.tanh(ta, out=to))
        rows["torch.mul(a, 0.5, out=o)"] = per_call(lambda: torch.mul(ta, 0.5, out=to))
        rows["torch.tanh(a)"] = per_call(lambda: torch.tanh(ta))
        rows["torch.mm(a, b, out=o)"] = per_call(lambda: torch.mm(ta, tb, out=to))
    except ImportError:
        pass
    for k, v in rows.items():
        print(f"{k:34s} {v:7.2f} us")


if __name__ == "__main__":
    main()
