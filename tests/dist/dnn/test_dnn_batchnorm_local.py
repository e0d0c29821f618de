"""BatchNorm(synchronized=False): each data-parallel worker normalises its own samples by their own
statistics, as PyTorch's BatchNorm under DDP does, and the running statistics stay one value.

Oracles: PyTorch (test-only) applying the network to each worker's block of the batch apart (DDP's
replicas), the loss the mean over the global batch (DDP averages the replicas' gradients), SGD; the
running statistics the average of the workers' own updates (NumPy); the fused kernels (a residual
block's tail, an Inception module's concatenation written in place) against the unfused ones with
the same setting. At one worker it is the synchronised BatchNorm.
"""
import numpy as np
import pytest

import dmath
import dnn
from dmath.layout import distribution
from dnn import layers as L
from test_dnn_fuse import _assert_same, _data as _images, _inception_like, _resnet_like, _run

P = dmath.num_workers()
B = 3 * P + 1                       # uneven blocks of the batch over the workers
MOMENTUM = 0.1


def _blocks(n):
    """(first, stop) of each worker's samples of a batch of n (the training batch's RowBlock)."""
    dist = distribution(dmath.RowBlock(), (n, 1), P)
    rows = [np.flatnonzero(dist.owner_mask(r)[:, 0]) for r in dist.group]
    return [(int(r[0]), int(r[-1]) + 1) for r in rows if len(r)]


def _model(synchronized):
    dmath.random.seed(3)
    return dnn.Sequential([L.Input((2, 3, 3)), L.BatchNorm(momentum=MOMENTUM, synchronized=synchronized, name="bn"),
                           L.Flatten(), L.Dense(3, name="d"), L.Output("softmax")],
                          dtype="float64", optimizer=dnn.optim.SGD(lr=0.5))


def _data():
    rng = np.random.default_rng(7)
    return rng.normal(1.0, 2.0, size=(2 * B, 2, 3, 3)), rng.integers(0, 3, 2 * B)


def test_trains_as_the_replicas_of_ddp_do():
    torch = pytest.importorskip("torch")
    x, y = _data()
    m = _model(False)
    gamma, beta, rm, rv, w, b = m.get_weights()
    m.fit(x, y, batch_size=B, epochs=1, shuffle=False, verbose=0)         # two steps
    bn = torch.nn.BatchNorm2d(2, momentum=MOMENTUM).double()
    lin = torch.nn.Linear(18, 3).double()
    with torch.no_grad():
        bn.weight.copy_(torch.tensor(gamma))
        bn.bias.copy_(torch.tensor(beta))
        lin.weight.copy_(torch.tensor(w.T))
        lin.bias.copy_(torch.tensor(b))
    opt = torch.optim.SGD(list(bn.parameters()) + list(lin.parameters()), lr=0.5)
    run_m, run_v = rm.copy(), rv.copy()
    for step in range(2):
        xb, yb = x[step * B:(step + 1) * B], y[step * B:(step + 1) * B]
        outs, means, varis = [], [], []
        for r0, r1 in _blocks(B):
            part = torch.tensor(xb[r0:r1])
            outs.append(lin(bn(part).reshape(r1 - r0, -1)))
            values = xb[r0:r1].transpose(1, 0, 2, 3).reshape(2, -1)
            means.append(values.mean(axis=1))
            varis.append(values.var(axis=1, ddof=1))
        loss = torch.nn.functional.cross_entropy(torch.cat(outs), torch.tensor(yb))
        opt.zero_grad()
        loss.backward()
        opt.step()
        run_m = (1 - MOMENTUM) * run_m + MOMENTUM * np.mean(means, axis=0)
        run_v = (1 - MOMENTUM) * run_v + MOMENTUM * np.mean(varis, axis=0)
    got = m.get_weights()
    want = [bn.weight.detach().numpy(), bn.bias.detach().numpy(), run_m, run_v,
            lin.weight.detach().numpy().T, lin.bias.detach().numpy()]
    for a, e in zip(got, want):
        np.testing.assert_allclose(a, e, rtol=1e-10, atol=1e-12)


def test_one_worker_is_the_synchronised_batchnorm():
    x, y = _data()
    weights = []
    for sync in (True, False):
        m = _model(sync)
        m.fit(x, y, batch_size=B, epochs=1, shuffle=False, verbose=0)
        weights.append(m.get_weights())
    for a, b in zip(*weights):
        if P == 1:
            np.testing.assert_array_equal(a, b)
    if P > 1:       # the statistics differ, so do the weights (the batch's blocks are not alike)
        assert any(not np.allclose(a, b) for a, b in zip(*weights))


def test_the_setting_is_part_of_the_layer_config():
    layer = L.BatchNorm(synchronized=False, name="bn")
    assert layer.get_config()["synchronized"] is False
    assert L.from_config(layer.get_config()).synchronized is False
    assert L.from_config({k: v for k, v in layer.get_config().items() if k != "synchronized"}).synchronized
    with pytest.raises(dnn.ConfigError, match="synchronized must be True or False"):
        L.BatchNorm(synchronized=1)
    with pytest.raises(dnn.ConfigError, match="synchronized must be True or False"):
        layer.synchronized = "False"            # (set between fits: a string would read as True)
    assert layer.synchronized is False


@pytest.mark.parametrize("images", [False, True])
def test_a_batch_too_small_for_some_worker_fails_before_any_step(images):
    # 13 flat samples in batches of 5, 5, 3: the last leaves some worker one sample (a value per
    # feature); images need one sample a worker (many pixels): 11 in batches of 5, 5, 1
    n = 11 if images else 13
    rng = np.random.default_rng(3)
    shape = (2, 3, 3) if images else (4,)
    x, y = rng.standard_normal((n,) + shape), rng.integers(0, 2, n)
    body = [L.Conv2D(3, 3, padding="same"), L.BatchNorm(synchronized=False), L.Flatten()] if images else \
        [L.Dense(3), L.BatchNorm(synchronized=False)]
    model = dnn.Sequential([L.Input(shape)] + body + [L.Dense(2), L.Output("softmax")],
                           optimizer=dnn.optim.SGD(lr=0.1), dtype="float64")
    before = model.get_weights()
    if P == 1:
        model.fit(x, y, batch_size=5, epochs=1, shuffle=False, verbose=0)
        return
    with pytest.raises(dnn.ShapeError, match="every worker needs more than one value per channel"):
        model.fit(x, y, batch_size=5, epochs=1, shuffle=False, verbose=0)
    for a, b in zip(before, model.get_weights()):
        np.testing.assert_array_equal(a, b)
    model.layers[2].synchronized = True         # the global batch's statistics: it trains
    model.fit(x, y, batch_size=5, epochs=1, shuffle=False, verbose=0)


def _local(build):
    def make(fuse):
        model = build(fuse)
        for layer in model.layers:
            if isinstance(layer, L.BatchNorm):
                layer.synchronized = False
        return model
    return make


def test_fused_residual_tails_with_each_workers_statistics():
    results = _run(_local(_resnet_like), (False, True))
    _assert_same(results[True], results[False], rtol=1e-10, atol=1e-12)


def test_concatenation_in_place_with_each_workers_statistics():
    results = _run(_local(_inception_like), ("relu", True))
    _assert_same(results[True], results["relu"], rtol=1e-10, atol=1e-13)


def test_float16_with_each_workers_statistics_trains_as_float64():
    """Mixed precision: float16 activations, float32 running statistics and their terms; one SGD step
    gives the float64 model's loss and weights up to float16 rounding."""
    x, y = _images()
    results = []
    for dtype in ("float64", "float16"):
        m = _local(lambda fuse: _resnet_like(fuse, dtype=dtype))(True)
        loss = m.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0)["loss"]
        results.append((loss, m.get_weights()))
    np.testing.assert_allclose(results[1][0], results[0][0], rtol=2e-3)
    for a, b in zip(results[1][1], results[0][1]):
        np.testing.assert_allclose(a, b, rtol=1e-2, atol=2e-3)


def test_a_change_between_fits_records_the_step_anew():
    x, y = _data()
    m = _model(True)
    m.fit(x, y, batch_size=B, epochs=1, shuffle=False, verbose=0)
    first = m._last_program()
    m.layers[1].synchronized = False
    m.fit(x, y, batch_size=B, epochs=1, shuffle=False, verbose=0)
    prog = m._last_program()
    assert prog is not first
    bn = [n.fn for n in prog.order if isinstance(n.fn, dnn.ops.BatchNorm)]
    assert len(bn) == 1 and bn[0].synchronized is False


def test_zoo_models_take_sync_batchnorm():
    for sync in (True, False):
        m = dnn.models.resnet18(num_classes=3, input_shape=(3, 32, 32), dtype="float32", sync_batchnorm=sync)
        norms = [layer for layer in m.layers if isinstance(layer, L.BatchNorm)]
        assert len(norms) == 20 and all(layer.synchronized is sync for layer in norms)
