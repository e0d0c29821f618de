"""Test-only kernels, registered by conftest.py before dmath.init (workers never import test modules)."""
import time

from dmath.runtime import kernel


@kernel("test_nap")
def _nap(call):
    """Every worker but 0 sleeps for scalars[0] seconds: a long queue there, on any machine."""
    if call.rank != 0:
        time.sleep(call.scalars[0])
    return []
