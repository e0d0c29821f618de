"""dmath's measurements as pytest-benchmark tests, each with its peer measured in the same job.

The peer's figure goes into the benchmark's `extra_info` (and so into
`--benchmark-json`): GEMM against one device's matmul (NumPy on a CPU worker,
cuBLAS through CuPy on a GPU; optionally PyTorch DTensor on all GPUs), remap
against the library's raw all-to-all of the same bytes (MPI Alltoallv, or
NCCL send/recv on GPUs), cached dispatch against a first send. Every
benchmark also checks its result, so `--benchmark-disable` (one run each) is
a test. See conftest.py for how to run them.
"""
import io

import numpy as np
import pytest

import dmath
from dmath.ops.base import dispatch
from gemm_bench import layout_of
from dispatch_bench import per_command

PEER_REPS = 3
DTENSOR_PORT = 29533


def _median(benchmark):
    """dmath's median seconds, or None when benchmarking is disabled (one correctness run)."""
    return benchmark.stats.stats.median if benchmark.stats else None


def _timed(benchmark, fn, rounds=5):
    return benchmark.pedantic(fn, rounds=rounds, warmup_rounds=1, iterations=1)


@pytest.mark.parametrize("layout", ["RowBlock", "Block2D", "BlockCyclic"])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_gemm(benchmark, request, P, gemm_n, dtype, layout):
    n = gemm_n
    lay = layout_of(layout, P)
    A = dmath.random.rand((n, n), dtype=dtype, layout=lay)
    B = dmath.random.rand((n, n), dtype=dtype, layout=lay)

    def product():
        C = A @ B
        dmath.synchronize()
        return C

    C = _timed(benchmark, product)
    if n <= 1024:
        a, b = A.to_numpy().astype(np.float64), B.to_numpy().astype(np.float64)
        np.testing.assert_allclose(C.to_numpy(), a @ b, rtol=1e-3 if dtype == "float32" else 1e-10)
    peer = dispatch("bench_single_gpu", static=(n, dtype, PEER_REPS, False))[1]
    flops = 2.0 * n ** 3
    info = {"n": n, "dtype": dtype, "layout": layout, "workers": P, "device": dmath.device(),
            "strategy": dmath.explain_gemm(A, B, file=io.StringIO()).splitlines()[0],
            "peer": "cuBLAS (CuPy) on one GPU" if dmath.device() == "gpu" else "NumPy matmul on one worker",
            "peer_s": peer, "peer_tflops": flops / peer / 1e12}
    t = _median(benchmark)
    if t:
        info.update(dmath_tflops=flops / t / 1e12, efficiency=peer / (P * t))
    if request.config.getoption("--bench-peers") and dmath.device() == "gpu":
        dt = dispatch("bench_dtensor", static=(n, dtype, layout, PEER_REPS, DTENSOR_PORT))[1]
        info.update(dtensor_s=dt, dtensor_over_dmath=(dt / t) if (t and not isinstance(dt, str)) else None)
    benchmark.extra_info.update(info)


@pytest.mark.parametrize("target", ["ColBlock", "BlockCyclic"])
def test_remap(benchmark, P, remap_n, target):
    n = remap_n
    lay = {"ColBlock": dmath.ColBlock(), "BlockCyclic": dmath.BlockCyclic((64, 64))}[target]
    A = dmath.random.rand((n, n), dtype="float32", layout=dmath.RowBlock())

    def remap():
        out = A.remap(lay)
        dmath.synchronize()
        return out

    out = _timed(benchmark, remap)
    np.testing.assert_array_equal(out.to_numpy(), A.to_numpy())
    dmath.reset_stats()
    A.remap(lay)
    moved = sum(s["data_bytes_recv"] for s in dmath.stats())
    info = {"n": n, "dtype": "float32", "source": "RowBlock", "target": target, "workers": P,
            "device": dmath.device(), "bytes_moved": moved}
    if P > 1:       # the raw collective of the same per-peer byte counts
        raw = dispatch("bench_raw_alltoall", static=(dmath.RowBlock().resolved(P), lay.resolved(P), (n, n),
                                                     "float32", PEER_REPS))[1]
        info.update(peer="NCCL send/recv" if dmath.device() == "gpu" else "MPI Alltoallv", peer_s=raw,
                    peer_GBps=moved / raw / 1e9)
        t = _median(benchmark)
        if t:
            info.update(dmath_GBps=moved / t / 1e9, raw_over_dmath=raw / t)
    benchmark.extra_info.update(info)


def test_dispatch_cached_id(benchmark, P):
    """A repeated command sends its cached ID; the peer is the first send of a new signature."""
    count = 200
    fresh = [dmath.ones((4, 4 + k), layout=dmath.Replicated()) for k in range(count)]
    same = dmath.ones((4, 4), layout=dmath.Replicated())
    us_first, bytes_first, _ = per_command(lambda c: [fresh[k] * 2.0 for k in range(c)], count)
    us_cached, bytes_cached, _ = per_command(lambda c: [same * 2.0 for _ in range(c)], count)
    assert bytes_cached < bytes_first / 2, (bytes_cached, bytes_first)

    def commands():
        for _ in range(count):
            same * 2.0
        dmath.synchronize()

    _timed(benchmark, commands)
    benchmark.extra_info.update(workers=P, device=dmath.device(), commands_per_round=count,
                                cached_us_per_command=us_cached, cached_control_bytes=bytes_cached,
                                peer="first send of a new signature", peer_us_per_command=us_first,
                                peer_control_bytes=bytes_first)
