"""Host microseconds per kernel launch on one GPU: CuPy ufuncs, ElementwiseKernel, RawKernel, cuBLAS, torch.

    python benchmarks/probes/launch_costs.py

A diagnostic for dispatch latency: what each way of starting the same small
device operation costs the launching thread (the device work is tiny).
"""
import ctypes
import time

import cupy as cp
import numpy as np


def per_call(fn, n=100, bursts=100):
    """Host microseconds per call: the best of `bursts` bursts of n calls, each started on an idle
    device (short enough that the launch queue never fills: the host's cost, not the device's)."""
    for _ in range(200):
        fn()
    best = 1e9
    for _ in range(bursts):
        cp.cuda.Device().synchronize()
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        best = min(best, time.perf_counter() - t0)
    cp.cuda.Device().synchronize()
    return best / n * 1e6


def device_per_call(fn, n=5000):
    """Microseconds per call in a long stream of calls, synchronised at the end (the slower of the
    host's issue rate and the device's execution rate)."""
    for _ in range(200):
        fn()
    cp.cuda.Device().synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    cp.cuda.Device().synchronize()
    return (time.perf_counter() - t0) / n * 1e6


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
    fn = rk.kernel
    nn = np.int64(n)
    rows["Function call"] = per_call(lambda: fn(grid, (256,), (a, o, nn)))
    # the driver's launch with the argument block packed once (pointers rewritten per call)
    params = (ctypes.c_void_p * 2)(a.data.ptr, o.data.ptr)
    count = ctypes.c_longlong(n)
    argv = (ctypes.c_void_p * 3)(ctypes.addressof(params), ctypes.addressof(params) + 8, ctypes.addressof(count))
    argp = ctypes.addressof(argv)
    from cupy.cuda import driver
    fptr, sptr = fn.ptr, cp.cuda.get_current_stream().ptr
    rows["driver.launchKernel (packed)"] = per_call(lambda: driver.launchKernel(
        fptr, grid[0], 1, 1, 256, 1, 1, 0, sptr, argp, 0))

    def repacked():
        params[0] = a.data.ptr
        params[1] = o.data.ptr
        driver.launchKernel(fptr, grid[0], 1, 1, 256, 1, 1, 0, sptr, argp, 0)
    rows["driver.launchKernel (+2 ptr writes)"] = per_call(repacked)
    mem = cp.cuda.alloc(a.nbytes)
    rows["cupy.cuda.alloc"] = per_call(lambda: cp.cuda.alloc(a.nbytes))
    rows["ndarray(shape, dtype, memptr)"] = per_call(lambda: cp.ndarray((128, 256), cp.float32, mem))
    rows["get_current_stream().ptr"] = per_call(lambda: cp.cuda.get_current_stream().ptr)
    from cupy_backends.cuda.libs import cublas
    h = cp.cuda.device.get_cublas_handle()
    al, be = np.array(1.0, np.float32), np.array(0.0, np.float32)
    rows["cupy cublas.gemmEx"] = per_call(lambda: cublas.gemmEx(
        h, 0, 0, 256, 128, 256, al.ctypes.data, b.data.ptr, 0, 256, a.data.ptr, 0, 256, be.ctypes.data,
        o.data.ptr, 0, 256, 68, -1))
    rows["cupy cublas.sgemm"] = per_call(lambda: cublas.sgemm(
        h, 0, 0, 256, 128, 256, al.ctypes.data, b.data.ptr, 256, a.data.ptr, 256, be.ctypes.data, o.data.ptr, 256))
    try:
        rows.update(_lt_costs(a, b, o, per_call))
    except Exception as exc:  # noqa: BLE001 - a diagnostic: say why and go on
        print("cublasLt:", type(exc).__name__, exc)
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
    rows["stream: cupy.tanh"] = device_per_call(lambda: cp.tanh(a, out=o))
    rows["stream: RawKernel"] = device_per_call(lambda: rk(grid, (256,), (a, o, np.int64(n))))
    rows["stream: cupy cublas.gemmEx"] = device_per_call(lambda: cublas.gemmEx(
        h, 0, 0, 256, 128, 256, al.ctypes.data, b.data.ptr, 0, 256, a.data.ptr, 0, 256, be.ctypes.data,
        o.data.ptr, 0, 256, 68, -1))
    for k, v in rows.items():
        print(f"{k:34s} {v:7.2f} us")


def _lt_costs(a, b, o, per_call):
    """Host cost of cublasLtMatmul with its descriptors and algorithm chosen once (row-major a @ b)."""
    c = ctypes
    lt = None
    with open("/proc/self/maps") as maps:
        for line in maps:
            if "libcublasLt.so" in line:
                lt = c.CDLL(line.split()[-1])
                break
    handle = c.c_void_p()
    assert lt.cublasLtCreate(c.byref(handle)) == 0
    desc = c.c_void_p()
    assert lt.cublasLtMatmulDescCreate(c.byref(desc), 68, 0) == 0       # COMPUTE_32F, scale R_32F
    m, k = a.shape
    n = b.shape[1]
    # column-major view: C^T (n x m) = B^T (n x k) A^T (k x m)
    lay = {}
    for name, rows_, cols, ld in (("b", n, k, n), ("a", k, m, k), ("c", n, m, n)):
        d = c.c_void_p()
        assert lt.cublasLtMatrixLayoutCreate(c.byref(d), 0, c.c_uint64(rows_), c.c_uint64(cols), c.c_int64(ld)) == 0
        lay[name] = d
    pref = c.c_void_p()
    assert lt.cublasLtMatmulPreferenceCreate(c.byref(pref)) == 0
    ws_bytes = c.c_uint64(32 << 20)
    assert lt.cublasLtMatmulPreferenceSetAttribute(pref, 1, c.byref(ws_bytes), 8) == 0
    results = (c.c_uint8 * (96 * 4))()
    count = c.c_int()
    st = lt.cublasLtMatmulAlgoGetHeuristic(handle, desc, lay["b"], lay["a"], lay["c"], lay["c"], pref, 4,
                                           results, c.byref(count))
    assert st == 0 and count.value > 0, (st, count.value)
    algo = c.addressof(results)
    ws = cp.empty(32 << 20, cp.uint8)
    al, be = np.array(1.0, np.float32), np.array(0.0, np.float32)
    stream = cp.cuda.get_current_stream().ptr
    lt.cublasLtMatmul.argtypes = [c.c_void_p] * 14 + [c.c_size_t, c.c_void_p]
    args = (handle, desc, al.ctypes.data, b.data.ptr, lay["b"], a.data.ptr, lay["a"], be.ctypes.data,
            o.data.ptr, lay["c"], o.data.ptr, lay["c"], algo, ws.data.ptr, 32 << 20, stream)
    fn = lt.cublasLtMatmul
    out = {"ctypes cublasLtMatmul (cached algo)": per_call(lambda: fn(*args))}
    ref = cp.matmul(a, b)
    fn(*args)
    cp.cuda.Device().synchronize()
    print("cublasLt max abs error against cupy.matmul:", float(cp.abs(o - ref).max()))
    return out


if __name__ == "__main__":
    main()
