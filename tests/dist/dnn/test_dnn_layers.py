"""Layers: forward and backward against NumPy references and, when it is installed, PyTorch;
parameters, initializers, train versus eval mode, configs."""
import re

import numpy as np
import pytest

import dmath
import dnn
import _nn_ref as ref
from dnn import graph as G, layers as L
from dnn.graph.node import Variable
from dnn.layers import Context

P = dmath.num_workers()


def run_layer(layer, x, sample_shape, r, training=True, dtype="float64", build=True):
    """(y, dL/dx, [dL/dparam]) of layer on the batch x (numpy, RowBlock) for L = sum(y * r)."""
    if build:
        layer.build(sample_shape, dtype)
    xv = Variable(dmath.from_numpy(x.reshape(x.shape[0], -1), dtype=dtype, layout=dmath.RowBlock()))
    xv.sample_shape = tuple(sample_shape)
    y = layer(xv, Context(training, dtype, dtype))
    loss = G.sum(y * G.constant(r.reshape(y.shape), dtype=dtype, layout=dmath.RowBlock()))
    grads = G.gradients(loss, [xv] + layer.params)
    return y.value.to_numpy(), grads[0].to_numpy(), [g.to_numpy() for g in grads[1:]]


def _rng(seed=0):
    return np.random.default_rng(seed)


@pytest.mark.parametrize("parallel", ["data", "model"])
def test_dense_against_numpy(parallel):
    rng = _rng(1)
    x, r = rng.normal(size=(9, 6)), rng.normal(size=(9, 4))
    layer = L.Dense(4, parallel=parallel, name="d", bias_init=0.5)
    layer.build((6,), "float64")
    w = layer.get_weights()[0]
    assert layer.get_weights()[1].shape == (4,) and np.all(layer.get_weights()[1] == 0.5)
    lay = layer.kernel.value.layout
    assert (type(lay) is dmath.ColBlock) == (parallel == "model") and (lay.replicated == (parallel == "data"))
    y, gx, (gw, gb) = run_layer(layer, x, (6,), r, build=False)
    np.testing.assert_allclose(y, x @ w + 0.5, rtol=1e-12)
    np.testing.assert_allclose(gx, r @ w.T, rtol=1e-12)
    np.testing.assert_allclose(gw, x.T @ r, rtol=1e-12)
    np.testing.assert_allclose(gb.ravel(), r.sum(axis=0), rtol=1e-12)


def test_dense_auto_strategy_follows_the_cost_model():
    wide, narrow = L.Dense(512, parallel="auto"), L.Dense(10, parallel="auto")
    wide.build((512,), "float32")
    narrow.build((512,), "float32")
    wide.decide(batch=32, nworkers=P)
    narrow.decide(batch=32, nworkers=P)
    assert narrow.strategy == "data"
    assert wide.strategy == ("model" if P > 1 else "data")
    assert dnn.parallel.choose_dense(784, 528, 100, 4) == "model"
    assert dnn.parallel.choose_dense(528, 10, 100, 4) == "data"


@pytest.mark.parametrize("name", ["sigmoid", "tanh", "relu", "softmax", "log_softmax", "linear"])
def test_activations_against_numpy(name):
    rng = _rng(2)
    x, r = rng.normal(size=(7, 5)), rng.normal(size=(7, 5))
    y, gx, _ = run_layer(L.Activation(name, name="a"), x, (5,), r)
    want = {"sigmoid": lambda v: 1 / (1 + np.exp(-v)), "tanh": np.tanh, "relu": lambda v: np.maximum(v, 0),
            "softmax": ref.softmax, "log_softmax": ref.log_softmax, "linear": lambda v: v}[name](x)
    np.testing.assert_allclose(y, want, rtol=1e-12, atol=1e-14)
    if name == "softmax":
        np.testing.assert_allclose(gx, want * (r - (r * want).sum(axis=1, keepdims=True)), rtol=1e-10)


@pytest.mark.parametrize("kernel,stride,padding,dilation", [(3, 1, "same", 1), (2, 2, 0, 1), ((3, 2), 1, 1, 2)])
def test_conv2d_layer_against_numpy(kernel, stride, padding, dilation):
    rng = _rng(3)
    x = rng.normal(size=(5, 2, 7, 6))
    layer = L.Conv2D(3, kernel, stride=stride, padding=padding, dilation=dilation, name="c", bias_init=0.1)
    out = layer.build((2, 7, 6), "float64")
    w, b = layer.get_weights()
    assert w.shape == (3, 2) + layer.kernel_hw and b.shape == (3,)
    r = rng.normal(size=(5,) + out)
    y, _, _ = run_layer(layer, x, (2, 7, 6), r, build=False)
    want = ref.conv2d(x, w, b, layer.stride, layer.padding, layer.dilation)
    assert want.shape[1:] == out
    np.testing.assert_allclose(y.reshape(want.shape), want, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("mode", ["max", "average"])
def test_pool2d_layer_against_numpy(mode):
    x = _rng(4).normal(size=(4, 3, 6, 6))
    layer = L.Pool2D(2, mode=mode, name="p")
    r = _rng(5).normal(size=(4, 3, 3, 3))
    y, gx, _ = run_layer(layer, x, (3, 6, 6), r)
    np.testing.assert_allclose(y.reshape(4, 3, 3, 3), ref.pool2d(x, (2, 2), (2, 2), (0, 0), mode), rtol=1e-12)
    assert gx.shape == (4, 3 * 36)


def test_batchnorm_train_then_eval():
    rng = _rng(6)
    x = rng.normal(2.0, 3.0, size=(8, 2, 3, 3))
    layer = L.BatchNorm(momentum=0.1, name="bn")
    r = rng.normal(size=x.shape)
    y, _, _ = run_layer(layer, x, (2, 3, 3), r, training=True)
    want, mean, var = ref.batchnorm(x.reshape(8, -1), np.ones(2), np.zeros(2), 2, 1e-5)
    np.testing.assert_allclose(y, want, rtol=1e-10, atol=1e-10)
    gamma, beta, rmean, rvar = layer.get_weights()
    n = 8 * 9
    np.testing.assert_allclose(rmean, 0.1 * mean, rtol=1e-10)
    np.testing.assert_allclose(rvar, 0.9 + 0.1 * var * n / (n - 1), rtol=1e-10)
    y_eval, _, _ = run_layer(layer, x, (2, 3, 3), r, training=False, build=False)
    x3 = x.reshape(8, 2, 9)
    want_eval = (x3 - rmean[:, None]) / np.sqrt(rvar[:, None] + 1e-5)
    np.testing.assert_allclose(y_eval, want_eval.reshape(8, -1), rtol=1e-10)


def test_dropout_train_and_eval_modes():
    x = np.ones((50, 40))
    layer = L.Dropout(0.25, seed=3, name="dr")
    y, gx, _ = run_layer(layer, x, (40,), np.ones((50, 40)), training=True)
    kept = y != 0
    assert 0.65 < kept.mean() < 0.85
    np.testing.assert_allclose(y[kept], 1 / 0.75)
    np.testing.assert_array_equal(gx, y)          # d(sum(x * mask))/dx = mask
    y2, _, _ = run_layer(layer, x, (40,), np.ones((50, 40)), training=True, build=False)
    assert (y2 != y).any(), "each training step draws a new mask"
    y_eval, _, _ = run_layer(layer, x, (40,), np.ones((50, 40)), training=False, build=False)
    np.testing.assert_array_equal(y_eval, x)


def test_flatten_and_reshape_move_no_data():
    x = _rng(7).normal(size=(3, 2, 2, 2))
    y, gx, _ = run_layer(L.Flatten(name="f"), x, (2, 2, 2), np.ones((3, 8)))
    np.testing.assert_array_equal(y, x.reshape(3, 8))
    assert L.Flatten().output_shape((2, 2, 2)) == (8,)
    assert L.Reshape((1, 2, 4)).output_shape((8,)) == (1, 2, 4)
    with pytest.raises(dnn.ShapeError):
        L.Reshape((1, 3, 3)).output_shape((8,))
    with pytest.raises(dnn.ConfigError):
        L.Reshape((3, 3))         # samples are (features,) or (C, H, W)


@pytest.mark.parametrize("init,check", [
    ("glorot_uniform", lambda a, fi, fo: np.abs(a).max() <= np.sqrt(6 / (fi + fo))),
    ("he_normal", lambda a, fi, fo: abs(a.std() - np.sqrt(2 / fi)) < 0.1 * np.sqrt(2 / fi)),
    ({"name": "uniform", "low": 2.0, "high": 3.0}, lambda a, fi, fo: a.min() >= 2 and a.max() < 3),
    (0.25, lambda a, fi, fo: np.all(a == 0.25)),
])
def test_initializers(init, check):
    layer = L.Dense(300, kernel_init=init, name="i")
    layer.build((200,), "float32")
    w = layer.get_weights()[0]
    assert check(w, 200, 300)
    assert len(np.unique(w)) > 1000 or np.all(w == w.flat[0])


def test_array_initializers_take_the_parameters_shape_and_values_its_dtype_holds():
    """An initial array of another shape was reshaped when it had as many values (a PyTorch Linear
    weight (out, in) for a Dense kernel (in, out) gave a scrambled kernel; a flat array, a Conv2D kernel
    of another order and a graph variable's transposed array passed too), and 1e300 became inf in a
    float32 layer (a hostile-use probe): refused as set_weights refuses them, the shapes named."""
    w = np.arange(6.0).reshape(2, 3)
    for bad in (w.T, w.reshape(-1)):
        d = L.Dense(3, kernel_init=bad, name="d")
        with pytest.raises(dnn.ShapeError, match=re.escape(f"d/kernel: initial values: expected shape (2, 3), "
                                                           f"got {bad.shape}")):
            d.build((2,), "float64")
        assert not d.built and d.weights == []
    d = L.Dense(3, kernel_init=w, bias_init=np.array([1.0, 2.0, 3.0]), name="d")
    d.build((2,), "float64")
    np.testing.assert_array_equal(d.get_weights()[0], w)
    np.testing.assert_array_equal(d.get_weights()[1], [1, 2, 3])
    with pytest.raises(dnn.ShapeError, match=r"bias: initial values: expected shape \(3,\), got \(1, 3\)"):
        L.Dense(3, bias_init=np.ones((1, 3))).build((2,), "float64")
    k = np.arange(12.0).reshape(3, 2, 1, 2)          # (K, C, kh, kw)
    with pytest.raises(dnn.ShapeError, match=r"expected shape \(3, 2, 1, 2\), got \(2, 3, 2, 1\)"):
        L.Conv2D(3, (1, 2), kernel_init=k.transpose(1, 0, 3, 2)).build((2, 4, 4), "float64")
    conv = L.Conv2D(3, (1, 2), kernel_init=k)
    conv.build((2, 4, 4), "float64")
    np.testing.assert_array_equal(conv.get_weights()[0], k)
    with pytest.raises(dnn.ShapeError, match=r"var 'v': initial values: expected shape \(2, 3\), got \(3, 2\)"):
        G.var("v", (2, 3), init=w.T, dtype="float64")
    np.testing.assert_array_equal(G.var("v", (2, 3), init=w, dtype="float64").value.to_numpy(), w)
    with pytest.raises(dnn.ConfigError, match="past the largest float32"):
        L.Dense(1, kernel_init=np.array([[1e300], [1.0]])).build((2,), "float32")
    with pytest.raises(dnn.ConfigError, match="real numbers"):
        L.Dense(1, kernel_init=np.array([["a"], ["b"]])).build((2,), "float32")
    with pytest.raises(dnn.ConfigError, match="past the largest float32"):
        G.var("v", (1, 1), init=np.array([[-1e39]]), dtype="float32")


def test_initial_weights_do_not_depend_on_the_layout():
    dmath.random.seed(11)
    a = L.Dense(7, parallel="data", name="a")
    a.build((5,), "float64")
    dmath.random.seed(11)
    b = L.Dense(7, parallel="model", name="b")
    b.build((5,), "float64")
    np.testing.assert_array_equal(a.get_weights()[0], b.get_weights()[0])


def test_auto_chooses_data_parallel_convolutions():
    """parallel='auto' is taken by every layer; a convolution's choice is always 'data'."""
    conv = L.Conv2D(4, 3, parallel="auto")
    assert conv.strategy is None
    conv.decide(64, dmath.num_workers())
    assert conv.strategy == "data"


def test_layer_errors():
    with pytest.raises(dnn.ConfigError):
        L.Dense(0)
    with pytest.raises(dnn.ConfigError):
        L.Conv2D(4, 2, padding="same")        # an even kernel has no symmetric 'same' padding
    with pytest.raises(dnn.ConfigError, match="stays data parallel"):
        L.Conv2D(4, 3, parallel="model")
    with pytest.raises(dnn.ConfigError, match=r"\('data', 'auto'\)"):
        L.Conv2D(4, 3, parallel="pipeline")
    with pytest.raises(dnn.ConfigError):
        L.Activation("swish")
    with pytest.raises(dnn.ConfigError):
        L.Dropout(1.0)
    with pytest.raises(dnn.ShapeError):
        L.Conv2D(4, 3).build((10,), "float32")
    with pytest.raises(dnn.ShapeError):
        L.Pool2D(5).build((1, 3, 3), "float32")
    d = L.Dense(3, name="d")
    d.build((4,), "float32")
    with pytest.raises(dnn.ShapeError):
        d.set_weights([np.zeros((3, 4)), np.zeros(3)])


def test_layer_configs_round_trip():
    for layer in (L.Input((1, 28, 28)), L.Dense(10, activation="relu", parallel="auto", kernel_init="he_normal"),
                  L.Conv2D(6, 5, padding="same"), L.Pool2D(2, mode="average"), L.Dropout(0.3, seed=2),
                  L.BatchNorm(momentum=0.2), L.Output("sigmoid"), L.Flatten(), L.Reshape((1, 4, 4))):
        cfg = layer.get_config()
        assert L.from_config(cfg).get_config() == cfg


# ---- PyTorch as a peer (skipped when it is not installed) -----------------------------------------
def _torch():
    return pytest.importorskip("torch")


def _torch_grads(module, x, r):
    torch = _torch()
    xt = torch.tensor(x, dtype=torch.float64, requires_grad=True)
    y = module(xt)
    (y * torch.tensor(r.reshape(y.shape), dtype=torch.float64)).sum().backward()
    return y.detach().numpy(), xt.grad.numpy(), [p.grad.numpy() for p in module.parameters()]


def test_dense_against_torch():
    torch = _torch()
    lin = torch.nn.Linear(6, 4).double()
    layer = L.Dense(4, name="d")
    layer.build((6,), "float64")
    layer.set_weights([lin.weight.detach().numpy().T, lin.bias.detach().numpy()])
    rng = _rng(8)
    x, r = rng.normal(size=(5, 6)), rng.normal(size=(5, 4))
    ty, tgx, (tgw, tgb) = _torch_grads(lin, x, r)
    y, gx, (gw, gb) = run_layer(layer, x, (6,), r, build=False)
    np.testing.assert_allclose(y, ty, rtol=1e-12)
    np.testing.assert_allclose(gx, tgx, rtol=1e-12)
    np.testing.assert_allclose(gw, tgw.T, rtol=1e-12)
    np.testing.assert_allclose(gb.ravel(), tgb, rtol=1e-12)


@pytest.mark.parametrize("stride,padding,dilation", [(1, 1, 1), (2, 0, 1), (1, 2, 2)])
def test_conv2d_against_torch(stride, padding, dilation):
    torch = _torch()
    conv = torch.nn.Conv2d(2, 3, 3, stride=stride, padding=padding, dilation=dilation).double()
    layer = L.Conv2D(3, 3, stride=stride, padding=padding, dilation=dilation, name="c")
    out = layer.build((2, 8, 7), "float64")
    layer.set_weights([conv.weight.detach().numpy(), conv.bias.detach().numpy()])
    rng = _rng(9)
    x = rng.normal(size=(4, 2, 8, 7))
    r = rng.normal(size=(4,) + out)
    ty, tgx, (tgw, tgb) = _torch_grads(conv, x, r)
    y, gx, (gw, gb) = run_layer(layer, x, (2, 8, 7), r, build=False)
    np.testing.assert_allclose(y, ty.reshape(4, -1), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(gx, tgx.reshape(4, -1), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(gw, tgw.reshape(3, -1), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(gb.ravel(), tgb, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("mode", ["max", "average"])
def test_pool2d_against_torch(mode):
    torch = _torch()
    pool = torch.nn.MaxPool2d(3, 2, 1) if mode == "max" else torch.nn.AvgPool2d(3, 2, 1)
    x = _rng(10).normal(size=(3, 2, 7, 7))
    layer = L.Pool2D(3, stride=2, padding=1, mode=mode, name="p")
    out = layer.output_shape((2, 7, 7))
    r = _rng(11).normal(size=(3,) + out)
    ty, tgx, _ = _torch_grads(pool, x, r)
    y, gx, _ = run_layer(layer, x, (2, 7, 7), r)
    np.testing.assert_allclose(y, ty.reshape(3, -1), rtol=1e-12)
    np.testing.assert_allclose(gx, tgx.reshape(3, -1), rtol=1e-12)


@pytest.mark.parametrize("image", [True, False])
def test_batchnorm_against_torch(image):
    torch = _torch()
    bn = (torch.nn.BatchNorm2d(3) if image else torch.nn.BatchNorm1d(3)).double()
    shape = (6, 3, 4, 4) if image else (6, 3)
    x = _rng(12).normal(1.0, 2.0, size=shape)
    r = _rng(13).normal(size=shape)
    layer = L.BatchNorm(name="bn")
    ty, tgx, (tgg, tgb) = _torch_grads(bn.train(), x, r)
    y, gx, (gg, gb) = run_layer(layer, x, shape[1:], r)
    np.testing.assert_allclose(y, ty.reshape(6, -1), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(gx, tgx.reshape(6, -1), rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(gg.ravel(), tgg, rtol=1e-10)
    np.testing.assert_allclose(gb.ravel(), tgb, rtol=1e-10)
    np.testing.assert_allclose(layer.get_weights()[2], bn.running_mean.numpy(), rtol=1e-10)
    np.testing.assert_allclose(layer.get_weights()[3], bn.running_var.numpy(), rtol=1e-10)
    ty_eval, _, _ = _torch_grads(bn.eval(), x, r)
    y_eval, _, _ = run_layer(layer, x, shape[1:], r, training=False, build=False)
    np.testing.assert_allclose(y_eval, ty_eval.reshape(6, -1), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("name", ["sigmoid", "tanh", "relu", "softmax"])
def test_activations_against_torch(name):
    torch = _torch()
    module = {"sigmoid": torch.nn.Sigmoid(), "tanh": torch.nn.Tanh(), "relu": torch.nn.ReLU(),
              "softmax": torch.nn.Softmax(dim=1)}[name]
    x, r = _rng(14).normal(size=(5, 4)), _rng(15).normal(size=(5, 4))
    ty, tgx, _ = _torch_grads(module, x, r)
    y, gx, _ = run_layer(L.Activation(name, name="a"), x, (4,), r)
    np.testing.assert_allclose(y, ty, rtol=1e-12)
    np.testing.assert_allclose(gx, tgx, rtol=1e-10, atol=1e-14)
