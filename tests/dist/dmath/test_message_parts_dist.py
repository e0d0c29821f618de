"""Host collectives past an MPI-3 library's int counts: all-to-all-v and all-gather-v go as
point-to-point parts, broadcasts as a sequence of parts. The limits are lowered on every rank
(a test kernel) so that small matrices take those paths; the values must not change."""
import numpy as np
import pytest

import dmath
from dmath.comm import collectives
from dmath.ops.base import dispatch
from _cases import values

P = dmath.num_workers()
pytestmark = pytest.mark.skipif(P < 2 or dmath.device() != "cpu",
                                reason="the host (MPI) collectives of two or more CPU workers")


@pytest.fixture
def small_limits(monkeypatch):
    """Parts of 40 bytes, collectives of more than 96 bytes in parts, on every rank; the number of
    parted exchanges rank 0 (the master is worker 0) takes part in."""
    calls = []
    real = collectives._exchange_in_parts
    monkeypatch.setattr(collectives, "_exchange_in_parts", lambda *a: (calls.append(1), real(*a)))
    kept = [collectives.MAX_MESSAGE_BYTES, collectives.MAX_COLLECTIVE_BYTES]
    dispatch("test_message_limits", scalars=[40, 96])
    try:
        yield calls
    finally:
        dispatch("test_message_limits", scalars=kept)
        assert [collectives.MAX_MESSAGE_BYTES, collectives.MAX_COLLECTIVE_BYTES] == kept


def test_values_survive_parted_collectives(small_limits):
    dmath.synchronize()
    x, y = values((37, 23), 1), values((23, 9), 2)
    a = dmath.from_numpy(x, layout=dmath.RowBlock())
    b = dmath.from_numpy(y, layout=dmath.Replicated())           # a broadcast of the master's values
    np.testing.assert_array_equal(a.remap(dmath.ColBlock()).to_numpy(), x)       # all-to-all-v
    np.testing.assert_array_equal(a.remap(dmath.Replicated()).to_numpy(), x)     # all-gather-v
    np.testing.assert_array_equal(a.remap(dmath.BlockCyclic((3, 2))).to_numpy(), x)
    np.testing.assert_allclose((a.T @ a).to_numpy(), x.T @ x, rtol=1e-12)         # a Partial sum
    np.testing.assert_allclose((a @ b).to_numpy(), x @ y, rtol=1e-12)
    a.replicate()                                                  # a broadcast in parts
    np.testing.assert_allclose(dmath.gemm(a, a.T, layout=dmath.ColBlock()).to_numpy(), x @ x.T, rtol=1e-12)
    assert small_limits, "no collective took the parted path"
