"""dmath.nn.sgd_update, adam_update and all_finite against NumPy, in every layout, at any worker count."""
import numpy as np
import pytest

import dmath

SHAPE = (7, 5)
LAYOUTS = {
    "replicated": lambda: dmath.Replicated(),
    "rowblock": lambda: dmath.RowBlock(),
    "colblock": lambda: dmath.ColBlock(),
    "cyclic": lambda: dmath.BlockCyclic((2, 2)),
}


def _arrays(seed, n=3):
    rng = np.random.default_rng(seed)
    return [rng.normal(size=SHAPE) for _ in range(n)]


def ref_sgd(p, g, v, lr, momentum, nesterov, wd, scale):
    g = g / scale + wd * p
    if momentum:
        v = momentum * v + g
        d = g + momentum * v if nesterov else v
    else:
        d = g
    return p - lr * d, v


def ref_adam(p, g, m, v, step, ds, b1, b2, eps, wd, scale):
    g = g / scale + wd * p
    m = b1 * m + (1 - b1) * g
    v = b2 * v + (1 - b2) * g * g
    return p - step * m / (np.sqrt(v) * ds + eps), m, v


def _scalar(value, on_device):
    return dmath.full((1, 1), value, dtype="float64", layout=dmath.Replicated()) if on_device else value


@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("momentum,nesterov", [(0.0, False), (0.9, False), (0.9, True)])
def test_sgd_update_matches_numpy(layout, momentum, nesterov):
    P, G, V = _arrays(0)
    lay = LAYOUTS[layout]()
    p = dmath.from_numpy(P, layout=lay)
    v = dmath.from_numpy(V, layout=lay) if momentum else None
    # the gradient arrives Partial (data parallelism): it is summed into the parameter's layout
    g = dmath.from_numpy(G * 4.0, layout=dmath.Partial())
    out = dmath.nn.sgd_update(p, g, _scalar(0.1, layout != "cyclic"), v, momentum=momentum, nesterov=nesterov,
                              weight_decay=0.01, grad_scale=_scalar(4.0, layout == "rowblock"))
    assert out is p
    ref_p, ref_v = ref_sgd(P, G * 4.0, V, 0.1, momentum, nesterov, 0.01, 4.0)
    np.testing.assert_allclose(p.to_numpy(), ref_p, rtol=1e-13, atol=1e-13)
    if momentum:
        np.testing.assert_allclose(v.to_numpy(), ref_v, rtol=1e-13, atol=1e-13)


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_adam_update_matches_numpy_over_steps(layout):
    P, _, _ = _arrays(1)
    lay = LAYOUTS[layout]()
    p = dmath.from_numpy(P, layout=lay)
    m, v = dmath.zeros(SHAPE, dtype="float64", layout=lay), dmath.zeros(SHAPE, dtype="float64", layout=lay)
    rm, rv, rp = np.zeros(SHAPE), np.zeros(SHAPE), P
    b1, b2, lr = 0.8, 0.99, 0.01
    for t, G in enumerate(_arrays(2, 3), start=1):
        step, ds = lr / (1 - b1 ** t), 1 / np.sqrt(1 - b2 ** t)
        dmath.nn.adam_update(p, dmath.from_numpy(G, layout=lay), m, v, _scalar(step, t % 2 == 0), ds,
                             beta1=b1, beta2=b2, eps=1e-6, weight_decay=0.05)
        rp, rm, rv = ref_adam(rp, G, rm, rv, step, ds, b1, b2, 1e-6, 0.05, 1.0)
    np.testing.assert_allclose(p.to_numpy(), rp, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(m.to_numpy(), rm, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(v.to_numpy(), rv, rtol=1e-12, atol=1e-12)


def test_float16_gradient_of_float32_weights_computes_in_float32():
    P, G, V = _arrays(3)
    p = dmath.from_numpy(P, dtype="float32", layout=dmath.Replicated())
    v = dmath.from_numpy(V, dtype="float32", layout=dmath.Replicated())
    g16 = G.astype(np.float16)
    dmath.nn.sgd_update(p, dmath.from_numpy(g16, dtype="float16", layout=dmath.Replicated()), 0.5, v,
                        momentum=0.5, grad_scale=2.0)
    ref_p, ref_v = ref_sgd(P.astype(np.float32), g16.astype(np.float32), V.astype(np.float32), 0.5, 0.5,
                           False, 0.0, 2.0)
    np.testing.assert_allclose(p.to_numpy(), ref_p, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(v.to_numpy(), ref_v, rtol=1e-6, atol=1e-6)


def test_a_partial_gradient_on_one_worker_is_read_where_it_is():
    """A Partial over one worker is its own sum: placed as its Replicated twin, so the update and
    all_finite read it in place (one command each, no remap); over two or more workers it is summed."""
    P_, G, V = _arrays(5)
    last = (dmath.num_workers() - 1,)
    one, rep = dmath.Partial(group=last), dmath.Replicated(group=last)
    g = dmath.from_numpy(G, layout=rep).remap(one)
    p, v = dmath.from_numpy(P_, layout=rep), dmath.from_numpy(V, layout=rep)
    assert g.placed_as(p) and p.placed_as(g)
    every = dmath.from_numpy(G, layout=dmath.Replicated())
    assert every.remap(dmath.Partial()).placed_as(every) == (dmath.num_workers() == 1)
    assert not dmath.from_numpy(G, layout=dmath.RowBlock()).placed_as(dmath.from_numpy(G[:3]))

    def commands(grad, p, v):
        s0 = dmath.stats()
        dmath.nn.sgd_update(p, grad, 0.1, v, momentum=0.9, gate=dmath.nn.all_finite([grad]))
        return dmath.stats()[0]["control_msgs"] - s0[0]["control_msgs"]
    # as many commands as with the Replicated gradient itself (no remap before either)
    assert commands(g, p, v) == commands(dmath.from_numpy(G, layout=rep), p.copy(), v.copy())
    ref_p, ref_v = ref_sgd(P_, G, V, 0.1, 0.9, False, 0.0, 1.0)
    np.testing.assert_allclose(p.to_numpy(), ref_p, rtol=1e-13)
    np.testing.assert_allclose(v.to_numpy(), ref_v, rtol=1e-13)
    with pytest.raises(dmath.DMathError, match="placed_as"):
        g.placed_as(G)


@pytest.mark.parametrize("layout", ["replicated", "colblock"])
def test_a_closed_gate_changes_nothing_even_with_nan_gradients(layout):
    P, G, V = _arrays(4)
    G[2, 3] = np.nan
    lay = LAYOUTS[layout]()
    p, v = dmath.from_numpy(P, layout=lay), dmath.from_numpy(V, layout=lay)
    m = dmath.from_numpy(V, layout=lay)
    g = dmath.from_numpy(G, layout=lay)
    ok = dmath.nn.all_finite([g, p])
    assert ok.layout.replicated and ok.dtype == "float32" and ok.to_numpy()[0, 0] == 0.0
    dmath.nn.sgd_update(p, g, 0.1, v, momentum=0.9, gate=ok)
    dmath.nn.adam_update(p, g, m, v, 0.1, gate=ok)
    np.testing.assert_array_equal(p.to_numpy(), P)
    np.testing.assert_array_equal(v.to_numpy(), V)
    np.testing.assert_array_equal(m.to_numpy(), V)
    G[2, 3] = 0.0
    dmath.nn.sgd_update(p, dmath.from_numpy(G, layout=lay), 0.1, v, momentum=0.9,
                        gate=dmath.nn.all_finite([dmath.from_numpy(G, layout=lay)]))
    np.testing.assert_allclose(p.to_numpy(), ref_sgd(P, G, V, 0.1, 0.9, False, 0.0, 1.0)[0], rtol=1e-13)


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("bad", [None, np.inf, -np.inf, np.nan])
def test_all_finite(dtype, layout, bad):
    a = np.arange(35.0).reshape(SHAPE)
    if bad is not None:
        a[6, 4] = bad                        # the last element: on the last worker of a split layout
    m = dmath.from_numpy(a, dtype=dtype, layout=LAYOUTS[layout]())
    ones = dmath.ones((3, 2), dtype="float32", layout=dmath.RowBlock())
    assert dmath.nn.all_finite([ones, m]).to_numpy()[0, 0] == (1.0 if bad is None else 0.0)
    # a Partial matrix is tested after its sum
    part = dmath.from_numpy(a, dtype="float32", layout=dmath.Partial())
    assert dmath.nn.all_finite([part]).to_numpy()[0, 0] == (1.0 if bad is None else 0.0)


def test_recorded_sgd_step_follows_its_scalar_matrices():
    P, G, V = _arrays(5)
    p = dmath.from_numpy(P, layout=dmath.Replicated())
    v = dmath.from_numpy(V, layout=dmath.Replicated())
    g = dmath.from_numpy(G, layout=dmath.Replicated())
    lr = dmath.full((1, 1), 0.1, dtype="float64", layout=dmath.Replicated())
    with dmath.record() as plan:
        dmath.nn.sgd_update(p, g, lr, v, momentum=0.9, gate=dmath.nn.all_finite([g]))
    rp, rv = ref_sgd(P, G, V, 0.1, 0.9, False, 0.0, 1.0)
    for value in (0.2, 0.05):
        lr.set((0, 0), value)
        plan.replay()
        rp, rv = ref_sgd(rp, G, rv, value, 0.9, False, 0.0, 1.0)
    np.testing.assert_allclose(p.to_numpy(), rp, rtol=1e-13, atol=1e-13)
    np.testing.assert_allclose(v.to_numpy(), rv, rtol=1e-13, atol=1e-13)


def test_bad_arguments_raise_before_dispatch():
    p = dmath.zeros(SHAPE, layout=dmath.RowBlock())
    g = dmath.zeros(SHAPE)
    cases = [
        (lambda: dmath.nn.sgd_update(p, g, 0.1, momentum=0.9), dmath.DMathError),          # no buffer
        (lambda: dmath.nn.sgd_update(p, dmath.zeros((2, 2)), 0.1), dmath.ShapeError),
        (lambda: dmath.nn.sgd_update(p, g, 0.1, dmath.zeros(SHAPE, dtype="float64"), momentum=0.5),
         dmath.ShapeError),
        (lambda: dmath.nn.sgd_update(p, g, dmath.zeros((2, 1))), dmath.ShapeError),
        (lambda: dmath.nn.sgd_update(p, g, float("nan")), dmath.DMathError),
        (lambda: dmath.nn.sgd_update(p, g, 0.1, momentum=1.0), dmath.DMathError),
        (lambda: dmath.nn.sgd_update(p, g, 0.1, grad_scale=0.0), dmath.DMathError),
        (lambda: dmath.nn.sgd_update(p, np.zeros(SHAPE), 0.1), dmath.DMathError),
        (lambda: dmath.nn.adam_update(p, g, dmath.zeros(SHAPE), dmath.zeros(SHAPE), 0.1, eps=0), dmath.DMathError),
        (lambda: dmath.nn.adam_update(p, g, dmath.zeros(SHAPE), dmath.zeros(SHAPE), 0.1, beta2=1.0),
         dmath.DMathError),
        (lambda: dmath.nn.all_finite([]), dmath.DMathError),
        (lambda: dmath.nn.all_finite([p, dmath.zeros(SHAPE, dtype="int32")]), dmath.DTypeError),
    ]
    if dmath.num_workers() > 1:       # at one worker every layout places the same elements
        cases.append((lambda: dmath.nn.sgd_update(p, g, 0.1, dmath.zeros(SHAPE, layout=dmath.ColBlock()),
                                                  momentum=0.5), dmath.LayoutError))
    for fn, err in cases:
        with pytest.raises(err):
            fn()
    np.testing.assert_array_equal(p.to_numpy(), np.zeros(SHAPE))       # nothing ran, the runtime is fine
