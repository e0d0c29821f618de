"""pytest-benchmark setup: the dmath benchmarks run like the distributed tests.

    pytest benchmarks                                   # one worker, plain python
    mpiexec -n 4 python -m pytest -p no:cacheprovider benchmarks --bench-scale gpu \\
        --benchmark-json benchmarks/results/bench_h200_p4.json     # rank 0 runs and writes the JSON
    pytest benchmarks --benchmark-disable               # each benchmark once: a correctness run (the suite)

dmath.init() is called here, at import: ranks > 0 become workers and never
return, so the benchmark kernels of the peers (single-device matmul, the raw
all-to-all) are imported first, on every rank.
"""
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gemm_bench   # noqa: E402,F401  (registers the peer kernels on every rank before init)
import remap_bench  # noqa: E402,F401
import dmath        # noqa: E402

dmath.init(device=os.environ.get("DMATH_DEVICE", "cpu"))

#: sizes per scale: GEMM n, remap n
SCALES = {"small": {"gemm": [256, 512], "remap": [512]},
          "cpu": {"gemm": [1024, 2048], "remap": [2048, 4096]},
          "gpu": {"gemm": [16384, 32768], "remap": [8192, 16384]}}


def pytest_addoption(parser):
    parser.addoption("--bench-scale", default="small", choices=sorted(SCALES),
                     help="problem sizes: small (the suite's check), cpu, gpu (the H200 figures)")
    parser.addoption("--bench-peers", action="store_true",
                     help="also time the PyTorch DTensor peer (GPU with PyTorch only)")


def pytest_generate_tests(metafunc):
    scale = SCALES[metafunc.config.getoption("--bench-scale")]
    for name, sizes in scale.items():
        if f"{name}_n" in metafunc.fixturenames:
            metafunc.parametrize(f"{name}_n", sizes)


@pytest.fixture(scope="session")
def P():
    return dmath.num_workers()
