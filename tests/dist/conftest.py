"""Setup for the tests that run at every worker count.

`pytest tests/dist` runs as is (P = 1) and under `mpiexec -n P python -m
pytest -p no:cacheprovider tests/dist`. dmath.init() is called here, at import
time, so that on ranks > 0 it never returns: those ranks become workers while
pytest collects, and only rank 0 runs the tests. Test modules may therefore
use dmath.num_workers() at import time to parametrize.
"""
import os

import pytest

# float32 convolutions in float32, not TF32 (the tests compare them with float32 tolerances): set
# before dmath is imported (dmath.gpu.cudnn reads it), on every rank, unless the environment chose
os.environ.setdefault("DMATH_TF32", "0")

import dmath  # noqa: E402
import _kernels  # noqa: F401  (test-only kernels: registered on every rank before init)
import _harness  # noqa: F401,E402  (the op-case harness: backend kernels wrapped on every rank before init)

# the CPU backend unless DMATH_DEVICE says otherwise (tools/gpu_check.sh runs this suite on GPUs)
dmath.init(device=os.environ.get("DMATH_DEVICE", "cpu"))

from _cases import layout_cases, shuffled_digits  # noqa: E402  (after init: workers never get here)


@pytest.fixture(scope="session")
def P():
    """The number of workers."""
    return dmath.num_workers()


@pytest.fixture(scope="session")
def mnist_5k():
    """The 5,000 real MNIST digits in a fixed shuffled order (_cases.shuffled_digits)."""
    return shuffled_digits()


@pytest.fixture(scope="session")
def layouts(P):
    """[(name, factory)] covering every layout kind at this P; factory(shape) -> layout."""
    return layout_cases(P)


#: a test that runs longer than this is taken for a deadlock: pytest-timeout prints every
#: thread's stack and exits, so that mpiexec ends the job instead of hanging
HANG_S = 120


def pytest_collection_modifyitems(config, items):
    if not config.pluginmanager.hasplugin("timeout"):
        return
    here = os.path.dirname(os.path.abspath(__file__))
    for item in items:
        if str(item.fspath).startswith(here) and item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(HANG_S, method="thread"))


@pytest.fixture(autouse=True)
def _hang_watchdog(request):
    """The same limit where pytest-timeout is not installed (a GPU machine with pytest only)."""
    if request.config.pluginmanager.hasplugin("timeout"):
        yield
        return
    import faulthandler
    faulthandler.dump_traceback_later(HANG_S, exit=True)
    yield
    faulthandler.cancel_dump_traceback_later()
