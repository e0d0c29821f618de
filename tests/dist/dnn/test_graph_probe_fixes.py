"""Regressions of a report-only hostile-use probe of dnn's functional Model, at every worker count.

Oracles: NumPy in float64 (a single output's weighted MSE, a shared BatchNorm's running statistics
updated call by call in PyTorch's order, each worker's own statistics over its row block), the
model with loss weight 1, the values an evaluation gave before its layer's weights moved, and the
state a refused call found.
"""
import numpy as np
import pytest

import dmath
import dnn
from dmath import tuning
from dnn import layers as L
from dnn.data.errors import DataError
from dnn.initializers import FromArray
from dnn.training import strategy

P = dmath.num_workers()


# ---- a single output's loss weight ----------------------------------------------------------------
def test_a_single_outputs_loss_weight_scales_its_loss_and_its_step():
    """loss_weights=[w] on a one-output model was ignored ([0] and [3] trained as [1]); it scales the
    loss and the step as each of several outputs' weights does, also when assigned later."""
    rng = np.random.default_rng(0)
    xs, ys = rng.normal(size=(8, 4)), rng.normal(size=(8, 2))
    got = {}
    for w in (1.0, 3.0, 0.0):
        dmath.random.seed(0)
        x = dnn.Input(4)
        m = dnn.Model(x, L.Dense(2)(x), loss="mse", dtype="float64", loss_weights=[w],
                      optimizer=dnn.optim.SGD(lr=0.1))
        k0, b0 = m.get_weights()
        ev = m.evaluate(xs, ys)["loss"]
        fit = m.fit(xs, ys, batch_size=8, epochs=1, shuffle=False, verbose=0)["loss"][0]
        got[w] = (k0, ev, fit, m.get_weights()[0] - k0)
    k0, ev, fit, step = got[1.0]
    np.testing.assert_allclose(ev, np.mean((xs @ k0 - ys) ** 2), rtol=1e-12)    # bias 0 at the start
    assert fit == pytest.approx(ev, rel=1e-12)
    assert np.abs(step).max() > 1e-3
    for w in (3.0, 0.0):
        np.testing.assert_array_equal(got[w][0], k0)                            # the same start
        assert got[w][1] == pytest.approx(w * ev, rel=1e-12, abs=1e-300)
        assert got[w][2] == pytest.approx(w * ev, rel=1e-12, abs=1e-300)
        np.testing.assert_allclose(got[w][3], w * step, rtol=1e-10, atol=1e-15)
    # assigned after evaluate and fit recorded their steps: the next calls use it
    dmath.random.seed(0)
    x = dnn.Input(4)
    m = dnn.Model(x, L.Dense(2)(x), loss="mse", dtype="float64", optimizer=dnn.optim.SGD(lr=0.1))
    assert m.evaluate(xs, ys)["loss"] == pytest.approx(ev, rel=1e-12)
    m.loss_weights = [3.0]
    assert m.evaluate(xs, ys)["loss"] == pytest.approx(3 * ev, rel=1e-12)
    m.fit(xs, ys, batch_size=8, epochs=1, shuffle=False, verbose=0)
    np.testing.assert_allclose(m.get_weights()[0] - k0, 3 * step, rtol=1e-10)
