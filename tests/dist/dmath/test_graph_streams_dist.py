"""A recorded plan of independent chains on several CUDA streams (DMATH_GRAPH_STREAMS,
dmath/runtime/streams.py): planned on every rank, and replayed (on a GPU: captured on those streams,
then launched) with the values of NumPy, temporaries freed and reused inside the graph, an input
written in place after other chains read it, and a collective between the chains. Runs at every
worker count."""
import gc

import numpy as np
import pytest

import dmath
from dmath.ops.base import dispatch

from _cases import make, tol, values

SHAPE = (48, 40)


@pytest.fixture
def streams():
    """Every rank plans the plans defined next on up to 4 streams; back to the setting's value at the end."""
    gc.collect()
    dmath.stats()                   # (earlier tests' plans dropped: the counts below are this test's)
    before = dmath.settings.current.graph_streams
    dispatch("test_graph_streams", scalars=[4])
    yield
    dispatch("test_graph_streams", scalars=[before])


def test_independent_chains_replay_exactly_on_streams(streams):
    lay = dmath.RowBlock()
    xv = [values(SHAPE, 80 + k) for k in range(4)]
    xs = [make(v, lay, "float32") for v in xv]
    acc = dmath.zeros(SHAPE, "float32", lay)
    with dmath.record() as plan:
        outs = []
        for k, x in enumerate(xs):
            t = dmath.tanh(x * (k + 1.0))       # temporaries: freed inside the plan, their blocks reused
            u = t * t - x
            outs.append(dmath.exp(u * -0.5))
        total = (outs[0] + outs[1]) + (outs[2] + outs[3])
        s = total.sum(axis=0)                   # a reduction over the workers between the chains' ends
        acc += total                            # an input written in place
        xs[0] *= 0.5                            # written in place after the chains read it

    def chains(xv):
        return sum(np.exp(-0.5 * (np.tanh(v * (k + 1.0)) ** 2 - v)) for k, v in enumerate(xv))
    expect_acc = chains(xv)                     # (the recording ran the block once)
    for r in range(5):
        xv = [values(SHAPE, 90 + 4 * r + k) for k in range(4)]
        for x, v in zip(xs, xv):
            x.assign(v)
        plan.replay()
        want = chains(xv)
        expect_acc = expect_acc + want
        np.testing.assert_allclose(total.to_numpy(), want, **tol("float32"))
        np.testing.assert_allclose(s.to_numpy().ravel(), want.sum(axis=0), rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(acc.to_numpy(), expect_acc, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(xs[0].to_numpy(), 0.5 * xv[0], **tol("float32"))
    stats = dmath.stats()
    # planned on several streams on every rank (after the first replay measured what talks)
    assert all(1 < st["plan_streams"] <= 4 for st in stats), [st["plan_streams"] for st in stats]
    if dmath.device() == "gpu":
        assert stats[0]["plan_graphs"] >= 1    # captured on those streams, then launched
