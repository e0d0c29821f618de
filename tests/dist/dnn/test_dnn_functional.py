"""Graph models (dnn.Model, the functional API): a chain trains exactly as Sequential; residual
sums, channel concatenation, global pooling, 'same' padding with a stride and ceil-mode pooling
against PyTorch (float64, forward and one SGD step, NCHW and channels-last rows); several inputs
and outputs with loss weights; save/load; freezing; the new ops' gradients by central
differences; the errors. Runs at every worker count."""
import json

import numpy as np
import pytest

import dmath
import dnn
from dnn import layers as L, ops
from test_dnn_gradcheck import gradcheck

try:
    import torch
    import torch.nn.functional as TF
except ImportError:       # the PyTorch comparisons skip; everything else runs
    torch = None

needs_torch = pytest.mark.skipif(torch is None, reason="PyTorch (the oracle) is not installed")


def _blobs(n=48, features=6, classes=3, seed=0):
    rng = np.random.default_rng(seed)
    y = rng.integers(0, classes, n)
    x = rng.normal(size=(n, features)) + y[:, None]
    return x, y


def test_a_chain_built_with_the_functional_api_trains_as_sequential():
    x, y = _blobs()

    def sequential():
        return dnn.Sequential([L.Input(6), L.Dense(8), L.Activation("tanh"), L.Dropout(0.2), L.Dense(3),
                               L.Output("softmax")], dtype="float64", optimizer=dnn.optim.SGD(lr=0.2, momentum=0.9))

    def functional():
        inp = dnn.Input(6)
        h = L.Dropout(0.2)(L.Activation("tanh")(L.Dense(8)(inp)))
        return dnn.Model(inp, L.Output("softmax")(L.Dense(3)(h)), dtype="float64",
                         optimizer=dnn.optim.SGD(lr=0.2, momentum=0.9), name="sequential")
    a, b = sequential(), functional()
    b.set_weights(a.get_weights())
    ha = a.fit(x, y, batch_size=16, epochs=2, verbose=0)
    hb = b.fit(x, y, batch_size=16, epochs=2, verbose=0)
    assert ha["loss"] == hb["loss"]
    for wa, wb in zip(a.get_weights(), b.get_weights()):
        np.testing.assert_array_equal(wa, wb)
    np.testing.assert_array_equal(a.predict(x), b.predict(x))
    assert [type(layer) for layer in a.layers] == [type(layer) for layer in b.layers]


# ---- a branchy network against PyTorch -------------------------------------------------------------
def _branchy(channels_last, dtype="float64"):
    """x -> conv-bn-relu -> [1x1 | 3x3 | maxpool+1x1] concatenated + a 1x1 shortcut (Add) -> relu ->
    3x3 stride 2 'same' -> 3x3/2 ceil-mode max pool -> global average -> dense -> softmax."""
    x = dnn.Input((3, 8, 8))
    h = L.Activation("relu")(L.BatchNorm(eps=1e-3)(L.Conv2D(4, 3, padding=1, use_bias=False)(x)))
    a = L.Conv2D(4, 1)(h)
    b = L.Conv2D(2, (1, 3), padding=(0, 1))(h)
    c = L.Conv2D(2, 1)(L.Pool2D(3, stride=1, padding=1)(h))
    s = L.Conv2D(8, 1, use_bias=False)(h)
    r = L.Activation("relu")(L.Add()([L.Concatenate()([a, b, c]), s]))
    d = L.Conv2D(6, 3, stride=2, padding="same")(r)
    p = L.Pool2D(3, stride=2, ceil_mode=True)(d)
    out = L.Output("softmax")(L.Dense(5)(L.GlobalAvgPool2D()(p)))
    return dnn.Model(x, out, dtype=dtype, optimizer=dnn.optim.SGD(lr=0.1), channels_last=channels_last)


def _torch_branchy(model):
    """The same network in PyTorch with the model's weights; returns (forward, parameters, buffers)."""
    convs = [layer for layer in model.layers if isinstance(layer, L.Conv2D)]
    bn = next(layer for layer in model.layers if isinstance(layer, L.BatchNorm))
    dense = next(layer for layer in model.layers if isinstance(layer, L.Dense))
    t = lambda a: torch.tensor(a, dtype=torch.float64, requires_grad=True)  # noqa: E731
    cw = [[t(w) for w in layer.get_weights()] for layer in convs]
    g, beta, rm, rv = bn.get_weights()
    g, beta = t(g), t(beta)
    rm, rv = torch.tensor(rm), torch.tensor(rv)
    dw, db = (t(w) for w in dense.get_weights())

    def conv(i, v, **kw):
        return TF.conv2d(v, cw[i][0], cw[i][1] if len(cw[i]) > 1 else None, **kw)

    def forward(xb):
        h = TF.relu(TF.batch_norm(conv(0, xb, padding=1), rm, rv, g, beta, training=True, momentum=0.1, eps=1e-3))
        a = conv(1, h)
        b = conv(2, h, padding=(0, 1))
        c = conv(3, TF.max_pool2d(h, 3, stride=1, padding=1))
        r = TF.relu(torch.cat([a, b, c], 1) + conv(4, h))
        d = conv(5, TF.pad(r, (0, 1, 0, 1)), stride=2)        # Keras 'same': the odd pixel at the end
        p = TF.max_pool2d(d, 3, stride=2, ceil_mode=True)
        return p.mean(dim=(2, 3)) @ dw + db
    params = [w for ws in cw for w in ws] + [g, beta, dw, db]
    return forward, params, (rm, rv)


@needs_torch
@pytest.mark.parametrize("channels_last", [False, True])
def test_branchy_network_forward_and_sgd_step_match_pytorch(channels_last):
    dmath.random.seed(3)
    model = _branchy(channels_last)
    assert model.output_shape == (5,)
    fwd, params, (rm, rv) = _torch_branchy(model)
    rng = np.random.default_rng(1)
    x = rng.normal(size=(12, 3, 8, 8))
    y = rng.integers(0, 5, 12)
    xt = torch.tensor(x)
    # predict: evaluation mode (running statistics) in both
    bn = next(layer for layer in model.layers if isinstance(layer, L.BatchNorm))
    logits = fwd_eval(model, xt)
    np.testing.assert_allclose(model.predict(x), torch.softmax(logits, 1).detach().numpy(), rtol=1e-10, atol=1e-12)
    # one SGD step on the whole batch
    loss = TF.cross_entropy(fwd(xt), torch.tensor(y))
    loss.backward()
    with torch.no_grad():
        for p in params:
            p -= 0.1 * p.grad
    hist = model.fit(x, y, batch_size=12, epochs=1, shuffle=False, verbose=0)
    assert hist["loss"][0] == pytest.approx(loss.item(), rel=1e-10)
    bn_w = bn.get_weights()
    np.testing.assert_allclose(bn_w[2], rm.numpy(), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(bn_w[3], rv.numpy(), rtol=1e-10, atol=1e-12)
    order = [w for layer in model.layers if isinstance(layer, L.Conv2D) for w in layer.get_weights()]
    order += bn_w[:2] + [w for layer in model.layers if isinstance(layer, L.Dense) for w in layer.get_weights()]
    for got, want in zip(order, params):
        np.testing.assert_allclose(got, want.detach().numpy(), rtol=1e-9, atol=1e-11)


def fwd_eval(model, xt):
    """The branchy network's logits in evaluation mode, from the model's current weights."""
    fwd, _, _ = _torch_branchy(model)
    bn = next(layer for layer in model.layers if isinstance(layer, L.BatchNorm))
    _, _, rm, rv = bn.get_weights()
    saved = TF.batch_norm

    def eval_bn(v, m, var, w, b, training, momentum, eps):
        return saved(v, torch.tensor(rm), torch.tensor(rv), w, b, training=False, eps=eps)
    TF.batch_norm = eval_bn
    try:
        return fwd(xt)
    finally:
        TF.batch_norm = saved


# ---- several inputs and outputs -----------------------------------------------------------------
def _two_headed(dtype="float64"):
    a, b = dnn.Input(4, name="a"), dnn.Input((1, 2, 2), name="b")
    h = L.Concatenate()([a, L.Flatten()(b)])
    h = L.Dense(6, activation="tanh")(h)
    main = L.Dense(3, activation="softmax", name="main")(h)
    aux = L.Dense(3, name="aux_dense")(a)
    aux = L.Output("softmax", name="aux")(aux)
    return dnn.Model([a, b], [main, aux], loss_weights=[1, 0.3], dtype=dtype,
                     optimizer=dnn.optim.SGD(lr=0.5), name="two")


@needs_torch
def test_two_inputs_two_outputs_with_loss_weights_match_pytorch():
    dmath.random.seed(5)
    model = _two_headed()
    rng = np.random.default_rng(2)
    xa, xb, y = rng.normal(size=(10, 4)), rng.normal(size=(10, 1, 2, 2)), rng.integers(0, 3, 10)
    w1, b1, w2, b2, w3, b3 = [torch.tensor(w, requires_grad=True) for w in model.get_weights()]
    ta, tb = torch.tensor(xa), torch.tensor(xb.reshape(10, 4))
    h = torch.tanh(torch.cat([ta, tb], 1) @ w1 + b1)
    main, aux = h @ w2 + b2, ta @ w3 + b3
    pa, pb = model.predict([xa, xb])
    np.testing.assert_allclose(pa, torch.softmax(main, 1).detach().numpy(), rtol=1e-12)
    np.testing.assert_allclose(pb, torch.softmax(aux, 1).detach().numpy(), rtol=1e-12)
    target = torch.tensor(y)
    loss = TF.cross_entropy(main, target) + 0.3 * TF.cross_entropy(aux, target)
    loss.backward()
    hist = model.fit([xa, xb], y, batch_size=10, epochs=1, shuffle=False, verbose=0)
    assert hist["loss"][0] == pytest.approx(loss.item(), rel=1e-12)
    # accuracy is the first output's
    assert hist["accuracy"][0] == pytest.approx(float((main.argmax(1) == target).double().mean()))
    for got, p in zip(model.get_weights(), (w1, b1, w2, b2, w3, b3)):
        np.testing.assert_allclose(got, (p - 0.5 * p.grad).detach().numpy(), rtol=1e-10, atol=1e-12)
    ev = model.evaluate([xa, xb], y)
    assert set(ev) == {"loss", "accuracy"}
    text = model.summary(print_fn=None)
    assert "Connected to" in text and "concatenate_1, " not in text.split("dense_1")[0]
    assert "Loss weights: [1.0, 0.3]" in text


def test_graph_model_save_load_round_trip(tmp_path):
    dmath.random.seed(6)
    model = _two_headed()
    rng = np.random.default_rng(3)
    xa, xb, y = rng.normal(size=(16, 4)), rng.normal(size=(16, 1, 2, 2)), rng.integers(0, 3, 16)
    model.fit([xa, xb], y, batch_size=8, epochs=1, verbose=0)
    model.save(tmp_path / "g.dnn")
    back = dnn.load(tmp_path / "g.dnn")
    assert isinstance(back, dnn.Model) and not isinstance(back, dnn.Sequential)
    assert [layer.name for layer in back.layers] == [layer.name for layer in model.layers]
    assert back.loss_weights == (1.0, 0.3)
    for p, q in zip(model.predict([xa, xb]), back.predict([xa, xb])):
        np.testing.assert_array_equal(p, q)
    h1 = model.fit([xa, xb], y, batch_size=8, epochs=1, verbose=0)
    h2 = back.fit([xa, xb], y, batch_size=8, epochs=1, verbose=0)
    assert h1["loss"] == h2["loss"]


def test_a_graph_file_with_an_index_out_of_range_is_refused(tmp_path):
    """The graph in a model file names layers and tensors by index: each must be a whole number in
    range. A negative one was taken from the end (Python's indexing), so a crafted file whose output
    is -1 or whose call reads tensor -1 loaded as some other graph, silently."""
    from dnn import serialization
    x = dnn.Input(4)
    out = L.Output("softmax")(L.Dense(3)(L.Dense(5, activation="tanh")(x)))
    dnn.Model(x, out, dtype="float64").save(tmp_path / "g.dnn")
    header, arrays = serialization.read_file(tmp_path / "g.dnn")
    header = {k: v for k, v in header.items() if k not in ("arrays", "data_bytes")}
    assert header["model"]["graph"]["calls"] == [[0, []], [1, [0]], [2, [1]], [3, [2]]]

    def outputs(g, v):
        g["outputs"] = [v]

    def inputs(g, v):
        g["inputs"] = [v]

    def layer(g, v):
        g["calls"][3][0] = v

    def inbound(g, v):
        g["calls"][2][1] = [v]
    cases = [(outputs, -1, "output 0"), (outputs, True, "output 0"), (outputs, 4, "output 0"),
             (outputs, 3.0, "output 0"), (inputs, -4, "input 0"), (layer, -1, "call 3's layer"),
             (layer, 4, "call 3's layer"), (layer, False, "call 3's layer"), (inbound, -1, "call 2 reads tensor"),
             (inbound, 2, "call 2 reads tensor"), (inbound, True, "call 2 reads tensor")]
    for edit, value, what in cases:
        bad = json.loads(json.dumps(header))
        edit(bad["model"]["graph"], value)
        path = tmp_path / "bad.dnn"
        serialization.write_file(path, bad, list(arrays.items()))
        with pytest.raises(dnn.ModelFileError, match=rf"{what} .*whole number in \[0, \d\), got {value!r}"):
            dnn.load(path)
    assert [layer.name for layer in dnn.load(tmp_path / "g.dnn").layers] == \
        ["input_1", "dense_1", "dense_2", "output_1"]


def test_a_shared_layer_is_one_set_of_weights():
    x = dnn.Input(4)
    dense = L.Dense(4, activation="tanh")
    out = L.Dense(2)(L.Add()([dense(x), dense(dense(x))]))
    model = dnn.Model(x, out, loss="mse", dtype="float64")
    assert model.layers.count(dense) == 1
    assert model.count_params() == 4 * 4 + 4 + 4 * 2 + 2
    w, b = dense.get_weights()
    w2, b2 = model.layers[-1].get_weights()
    v = np.random.default_rng(0).normal(size=(5, 4))
    f = lambda z: np.tanh(z @ w + b)  # noqa: E731
    np.testing.assert_allclose(model.predict(v), (f(v) + f(f(v))) @ w2 + b2, rtol=1e-12)


def test_a_layer_built_by_a_model_of_another_precision_is_refused():
    """A layer is built once, in the precision of the first model that uses it; a model of another
    precision trained its weights in that first one's dtype, silently (a float64 model with float32
    weights). It is refused, before anything is named or built; models of one weight dtype still share
    layers, and float16 models keep float32 weights."""
    layers = [L.Input(4), L.Dense(3), L.Output("softmax")]
    first = dnn.Sequential(layers, dtype="float32")
    with pytest.raises(dnn.ConfigError, match=r"dense_1 \(Dense\) .*float32 weights.*'float64' model"):
        dnn.Sequential(layers, dtype="float64")
    x = dnn.Input(4)
    fresh = L.Dense(4)
    with pytest.raises(dnn.ConfigError, match="dense_1"):
        dnn.Model(x, L.Output("softmax")(layers[1](fresh(x))), dtype="float64")
    assert not fresh.built and not fresh.named         # the refusal left the new layer as it was
    half = dnn.Sequential(layers, dtype="float16")      # float32 weights: the same ones
    assert half.layers[1].kernel is first.layers[1].kernel
    again = dnn.Sequential(layers, dtype="float32")
    xs = np.random.default_rng(0).normal(size=(6, 4)).astype(np.float32)
    np.testing.assert_array_equal(again.predict(xs), first.predict(xs))
    wide = L.Dense(3)
    dnn.Model(x, wide(x), loss="mse", dtype="float64")
    with pytest.raises(dnn.ConfigError, match=r"dense_1 \(Dense\) .*float64 weights.*'float16' model"):
        dnn.Model(x, wide(x), loss="mse", dtype="float16")
    with pytest.raises(dnn.ConfigError, match="float64 weights"):
        wide.build((4,), "float32")
    assert wide.kernel.value.dtype == np.float64


# ---- freezing ---------------------------------------------------------------------------------
def test_frozen_layers_keep_their_weights_and_a_frozen_batchnorm_its_statistics():
    x, y = _blobs(features=4)
    x = x.reshape(-1, 1, 2, 2)
    dmath.random.seed(8)
    inp = dnn.Input((1, 2, 2))
    conv = L.Conv2D(3, 1)
    bn = L.BatchNorm()
    out = L.Output("softmax")(L.Dense(3)(L.Flatten()(L.Activation("relu")(bn(conv(inp))))))
    model = dnn.Model(inp, out, dtype="float64", optimizer=dnn.optim.SGD(lr=0.1, momentum=0.9))
    bn.set_weights([np.array([1.5, 0.5, 2.0]), np.array([0.1, -0.2, 0.3]), np.array([0.2, -0.1, 0.0]),
                    np.array([2.0, 0.5, 1.0])])
    conv.trainable = False
    bn.trainable = False
    before = {id(layer): layer.get_weights() for layer in (conv, bn)}
    total = model.count_params()
    assert model.count_trainable_params() == total - (3 * 1 + 3) - 6
    text = model.summary(print_fn=None)
    assert f"Trainable params: {total - 12:,}" in text and "Frozen params: 12" in text and "frozen" in text
    dense_before = model.layers[-2].get_weights()[0].copy()
    model.fit(x, y, batch_size=12, epochs=2, verbose=0)
    for layer in (conv, bn):
        for a, b in zip(before[id(layer)], layer.get_weights()):
            np.testing.assert_array_equal(a, b)
    assert not np.array_equal(dense_before, model.layers[-2].get_weights()[0])
    # the frozen BatchNorm normalises with its running statistics in training too: the loss of a
    # step on the whole set (computed before its update) equals the evaluation loss
    ev = model.evaluate(x, y, batch_size=48)
    h = model.fit(x, y, batch_size=48, epochs=1, shuffle=False, verbose=0)
    assert h["loss"][0] == pytest.approx(ev["loss"], rel=1e-12)
    # unfreezing trains them again (the step is recorded anew)
    model.trainable = True
    model.fit(x, y, batch_size=12, epochs=1, verbose=0)
    assert not np.array_equal(before[id(conv)][0], conv.get_weights()[0])
    model.trainable = False
    assert not model.trainable and model.count_trainable_params() == 0
    with pytest.raises(dnn.ConfigError):
        conv.trainable = "no"


def test_frozen_flag_survives_save_and_load(tmp_path):
    inp = dnn.Input(3)
    d = L.Dense(2)
    model = dnn.Model(inp, L.Dense(2)(d(inp)), loss="mse")
    d.trainable = False
    model.save(tmp_path / "f.dnn")
    back = dnn.load(tmp_path / "f.dnn")
    assert [layer.trainable for layer in back.layers] == [True, False, True]


def test_a_checkpoint_with_a_frozen_layer_resumes_exactly(tmp_path):
    """A frozen layer keeps its momentum for when it trains again; a checkpoint saved while it is
    frozen holds that momentum too (named, since the frozen layer's parameters leave the trained
    list and would shift every position after them), so resuming gives the uninterrupted weights."""
    rng = np.random.default_rng(8)
    x, y = rng.standard_normal((12, 4)), rng.integers(0, 3, 12)

    def run(save):
        dmath.random.seed(3)
        inp = dnn.Input(4)
        h = L.Dense(5, activation="relu", name="h")
        model = dnn.Model(inp, L.Dense(3, activation="softmax")(h(inp)), dtype="float64",
                          optimizer=dnn.optim.SGD(lr=0.2, momentum=0.9))
        model.fit(x, y, batch_size=4, shuffle=False, verbose=0)
        h.trainable = False
        model.fit(x, y, batch_size=4, shuffle=False, verbose=0)
        if save:
            model.save(tmp_path / "frozen.dnn")
            model = dnn.load(tmp_path / "frozen.dnn")
        next(layer for layer in model.layers if layer.name == "h").trainable = True
        model.fit(x, y, batch_size=4, shuffle=False, verbose=0)
        return model.get_weights()
    for a, b in zip(run(False), run(True)):
        np.testing.assert_array_equal(a, b)


# ---- the new ops' gradients ----------------------------------------------------------------------
def _img(node, shape):
    node.sample_shape = shape
    return node


N = 5


@pytest.mark.parametrize("channels_last", [False, True])
@pytest.mark.parametrize("name,build,shapes,samples", [
    ("merge_add3", lambda a, b, c: ops.merge_add(a, b, c), [(N, 12)] * 3, [(3, 2, 2)] * 3),
    ("concat_images", lambda a, b: ops.concat(a, b), [(N, 8), (N, 12)], [(2, 2, 2), (3, 2, 2)]),
    ("global_avg_pool", ops.global_avg_pool, [(N, 18)], [(2, 3, 3)]),
    ("pad_uneven", lambda a: ops.pad(a, (1, 0, 2, 1)), [(N, 12)], [(2, 2, 3)]),
    ("adaptive_avg_pool", lambda a: ops.adaptive_avg_pool(a, (2, 3)), [(N, 70)], [(2, 5, 7)]),
])
def test_new_ops_gradients_by_central_differences(name, build, shapes, samples, channels_last):
    def wrapped(*leaves):
        nodes = list(leaves)
        if channels_last:       # the rows hold the same values channels-last: convert in, and back out
            nodes = [ops.to_channels_last(x) for x in nodes]
        y = build(*nodes)
        return ops.to_channels_first(y) if y.channels_last else y
    arrays = [np.random.default_rng(k).uniform(-1, 1, s) for k, s in enumerate(shapes)]
    gradcheck(wrapped, arrays, sample_shapes=samples)


def test_concat_flat_features_gradient():
    gradcheck(lambda a, b, c: ops.concat(a, b, c), [np.random.default_rng(k).uniform(-1, 1, (N, w))
                                                     for k, w in enumerate((2, 3, 1))])


def test_new_ops_values_against_numpy():
    rng = np.random.default_rng(4)
    a, b = rng.normal(size=(6, 2 * 3 * 2)), rng.normal(size=(6, 1 * 3 * 2))
    na, nb = (dnn.graph.constant(v, dtype="float64", layout=dmath.RowBlock()) for v in (a, b))
    na.sample_shape, nb.sample_shape = (2, 3, 2), (1, 3, 2)
    got = ops.concat(na, nb).eval().to_numpy()
    want = np.concatenate([a.reshape(6, 2, 3, 2), b.reshape(6, 1, 3, 2)], axis=1).reshape(6, -1)
    np.testing.assert_array_equal(got, want)
    got = ops.global_avg_pool(na).eval().to_numpy()
    np.testing.assert_allclose(got, a.reshape(6, 2, 6).mean(axis=2), rtol=1e-14)
    got = ops.pad(na, (0, 1, 2, 0), value=-np.inf).eval().to_numpy()
    want = np.pad(a.reshape(6, 2, 3, 2), ((0, 0), (0, 0), (0, 1), (2, 0)), constant_values=-np.inf)
    np.testing.assert_array_equal(got, want.reshape(6, -1))


@needs_torch
@pytest.mark.parametrize("size,out", [(14, 4), (7, 3), (6, 6), (8, 2), (5, (1, 4)), (1, 6)])
def test_adaptive_average_pooling_matches_pytorch(size, out):
    x = np.random.default_rng(size).normal(size=(3, 2, size, size + 1))
    inp = dnn.Input((2, size, size + 1))
    model = dnn.Model(inp, L.AdaptiveAvgPool2D(out)(inp), loss="mse", dtype="float64")
    want = TF.adaptive_avg_pool2d(torch.tensor(x), out).numpy()
    assert model.output_shape == want.shape[1:]
    np.testing.assert_allclose(model.predict(x), want, rtol=1e-13, atol=1e-15)


@needs_torch
@pytest.mark.parametrize("size,kernel,stride,padding", [(8, 3, 2, 0), (7, 3, 2, 1), (9, 2, 2, 0), (14, 3, 2, 0),
                                                        (1, 2, 2, 0), (2, 3, 3, 1)])
def test_ceil_mode_pooling_matches_pytorch(size, kernel, stride, padding):
    x = np.random.default_rng(size).normal(size=(4, 2, size, size))
    layer = L.Pool2D(kernel, stride=stride, padding=padding, ceil_mode=True)
    want = TF.max_pool2d(torch.tensor(x), kernel, stride, padding, ceil_mode=True).numpy()
    assert layer.output_shape((2, size, size)) == want.shape[1:]
    inp = dnn.Input((2, size, size))
    model = dnn.Model(inp, layer(inp), loss="mse", dtype="float64")
    np.testing.assert_array_equal(model.predict(x), want)


@needs_torch
@pytest.mark.parametrize("size,kernel,stride", [(8, 3, 2), (7, 3, 2), (9, 1, 2), (10, 5, 3), (5, 4, 2)])
def test_same_padding_with_a_stride_follows_keras(size, kernel, stride):
    layer = L.Conv2D(2, kernel, stride=stride, padding="same", use_bias=False)
    inp = dnn.Input((3, size, size))
    model = dnn.Model(inp, layer(inp), loss="mse", dtype="float64")
    out = -(-size // stride)
    assert model.output_shape == (2, out, out)
    total = max((out - 1) * stride + kernel - size, 0)
    x = np.random.default_rng(0).normal(size=(3, 3, size, size))
    xt = TF.pad(torch.tensor(x), (total // 2, total - total // 2, total // 2, total - total // 2))
    want = TF.conv2d(xt, torch.tensor(layer.get_weights()[0]), stride=stride).numpy()
    np.testing.assert_allclose(model.predict(x), want, rtol=1e-12, atol=1e-13)


# ---- errors ---------------------------------------------------------------------------------------
def test_graph_model_errors():
    x, other = dnn.Input((2, 4, 4)), dnn.Input(3)
    with pytest.raises(dnn.ConfigError, match="list of two or more"):
        L.Add()(x)
    with pytest.raises(dnn.ShapeError, match="same shape"):
        L.Add()([x, L.Conv2D(3, 1)(x)])
    with pytest.raises(dnn.ShapeError, match="one height and width"):
        L.Concatenate()([x, L.Pool2D(2)(x)])
    with pytest.raises(dnn.ShapeError, match="images with images"):
        L.Concatenate()([x, other])
    with pytest.raises(dnn.ConfigError, match="one symbolic tensor"):
        L.Dense(2)(np.zeros(3))
    with pytest.raises(dnn.ConfigError, match="not among the model's inputs"):
        dnn.Model(other, L.Dense(2)(L.Flatten()(x)))
    with pytest.raises(dnn.ConfigError, match="reaches none of the outputs"):
        dnn.Model([x, other], L.Dense(2)(L.Flatten()(x)))
    with pytest.raises(dnn.ConfigError, match="loss_weights"):
        dnn.Model(other, L.Dense(2)(other), loss_weights=[1, 2])
    with pytest.raises(dnn.ConfigError, match="same number of values"):
        dnn.Model(other, [L.Dense(2)(other), L.Dense(3)(other)])
    with pytest.raises(dnn.ConfigError, match="dnn.Model"):
        dnn.Sequential([L.Input(3), L.Add()])
    with pytest.raises(dnn.ConfigError, match="ceil_mode"):
        L.Pool2D(2, mode="average", ceil_mode=True)
    # fixed at construction, as the window is (an assignment made output_shape and forward disagree)
    assert L.Pool2D(2, ceil_mode=np.True_).ceil_mode is True
    with pytest.raises(AttributeError):
        L.Pool2D(2).ceil_mode = True
    with pytest.raises(dnn.ConfigError, match="padding"):
        L.ZeroPadding2D((1, 2, 3))
    a, b = dnn.Input(3), dnn.Input(2)
    m = dnn.Model([a, b], L.Dense(2)(L.Concatenate()([a, b])), loss="mse")
    with pytest.raises(dnn.ConfigError, match="2 inputs"):
        m.predict(np.zeros((4, 5)))
    with pytest.raises(dnn.ShapeError, match="same number of samples"):
        m.predict([np.zeros((4, 3)), np.zeros((3, 2))])
    assert m.predict([np.zeros((4, 3)), np.zeros((4, 2))]).shape == (4, 2)


def test_a_model_called_on_tensors_and_ragged_data_raise_dnn_errors():
    """A Model called on a symbolic tensor (nesting) raised Python's "'Model' object is not callable"
    and a ragged list NumPy's "inhomogeneous shape" ValueError (a hostile-use probe): dnn errors that
    say what to do. The advice works: the inner model's layers called on the outer tensors keep
    their weights."""
    a = dnn.Input(4)
    inner = dnn.Sequential([L.Input(4), L.Dense(3, name="d1"), L.Activation("tanh"), L.Dense(2, name="d2")],
                           loss="mse", dtype="float64")
    b = dnn.Input(4)
    with pytest.raises(dnn.NotSupportedError, match="cannot be called on tensors: models do not nest"):
        inner(b)
    t = b
    for layer in inner.layers[1:]:
        t = layer(t)
    outer = dnn.Model(b, L.Dense(1, name="d3")(t), loss="mse", dtype="float64")
    x = np.random.default_rng(0).normal(size=(5, 4))
    for w, v in zip(outer.get_weights()[:4], inner.get_weights()):
        np.testing.assert_array_equal(w, v)
    np.testing.assert_allclose(outer.predict(x), inner.predict(x) @ outer.get_weights()[4] + outer.get_weights()[5],
                               rtol=1e-12)
    m = dnn.Model(a, L.Dense(2, activation="softmax")(a), dtype="float64")
    ragged = [[1, 2, 3, 4], [1, 2]]
    for call in (lambda: m.fit(ragged, [0, 1], verbose=0), lambda: m.evaluate(ragged, [0, 1]),
                 lambda: m.predict(ragged), lambda: m.fit(np.ones((2, 4)), [[0, 1], [1]], verbose=0),
                 lambda: dnn.data.Dataset(ragged, [0, 1])):
        with pytest.raises(dnn.data.DataError, match="must be a rectangular array"):
            call()
    c, d = dnn.Input(4), dnn.Input(4)
    two = dnn.Model([c, d], L.Dense(2, activation="softmax")(L.Concatenate()([c, d])), dtype="float64")
    with pytest.raises(dnn.data.DataError, match=r"x\[1\] must be a rectangular array"):
        two.fit([np.ones((2, 4)), ragged], [0, 1], verbose=0)
    assert m.evaluate(np.ones((2, 4)), [0, 1])["loss"] > 0      # (the runtime is usable)


def test_loss_weights_assigned_are_checked_as_the_constructors():
    """model.loss_weights = ... was taken as given (a hostile-use probe): one weight for two outputs
    dropped the second output's loss, silently, a negative weight or NaN was trained with, and None
    raised a bare TypeError. It is checked as the constructor's argument, and the model unchanged."""
    x, y = _blobs(6, 3, 2)
    a = dnn.Input(3)
    m = dnn.Model(a, [L.Dense(2, activation="softmax")(a), L.Dense(2, activation="softmax")(a)], dtype="float64")
    for bad in [(1.0,), (1.0, 0.0, 5.0), (1.0, float("nan")), (1.0, -1.0), (1.0, float("inf")), "12", 0.5]:
        with pytest.raises(dnn.ConfigError, match="loss_weights"):
            m.loss_weights = bad
        assert m.loss_weights == (1.0, 1.0)
    both = m.evaluate(x, y)["loss"]
    m.loss_weights = np.array([1, 0])
    assert m.loss_weights == (1.0, 0.0)
    first = m.evaluate(x, y)["loss"]
    m.loss_weights = None                       # as the constructor's: 1 each
    assert m.loss_weights == (1.0, 1.0) and m.evaluate(x, y)["loss"] == both
    assert first < both


# ---- everything Sequential has, on a graph -----------------------------------------------------------
def _residual(dtype="float32", record=True, parallel="data"):
    inp = dnn.Input(6)
    h = L.Dense(8, activation="tanh")(inp)
    h = L.Add()([h, L.Dense(8, parallel=parallel)(h)])
    return dnn.Model(inp, L.Output("softmax")(L.Dense(3)(L.Concatenate()([h, inp]))), dtype=dtype, record=record,
                     optimizer=dnn.optim.SGD(lr=0.1, momentum=0.9))


def test_recorded_steps_equal_eager_steps_and_float16_trains():
    x, y = _blobs()
    runs = {}
    for record in (True, False):
        dmath.random.seed(21)
        m = _residual("float64", record)
        runs[record] = (m.fit(x, y, batch_size=16, epochs=2, verbose=0)["loss"], m.get_weights())
    assert runs[True][0] == runs[False][0]
    for a, b in zip(runs[True][1], runs[False][1]):
        np.testing.assert_array_equal(a, b)
    dmath.random.seed(21)
    half = _residual("float16")
    assert half.loss_scale is not None and half.param_dtype == "float32"
    h = half.fit(x, y, batch_size=16, epochs=6, verbose=0)
    assert h["loss"][-1] < h["loss"][0] and h["accuracy"][-1] > 0.6


def test_model_parallel_layer_and_validation_and_callbacks_on_a_graph():
    x, y = _blobs(n=64)
    dmath.random.seed(22)
    m = _residual("float64", parallel="model")
    ref = _residual("float64")
    ref.set_weights(m.get_weights())
    stop = dnn.callbacks.EarlyStopping(monitor="val_loss", patience=0)
    h = m.fit(x[:48], y[:48], batch_size=16, epochs=2, validation_data=(x[48:], y[48:]), verbose=0, callbacks=[stop])
    h2 = ref.fit(x[:48], y[:48], batch_size=16, epochs=2, validation_data=(x[48:], y[48:]), verbose=0)
    np.testing.assert_allclose(h["loss"], h2["loss"][:len(h["loss"])], rtol=1e-12)
    assert "val_accuracy" in h.history
    text = m.summary(print_fn=None)
    assert "model" in text and "ColBlock" in text
    m.fit(x, y, batch_size=16, epochs=3, initial_epoch=2, verbose=0)
    assert m.epochs_trained == 3


def test_asynchronous_sgd_and_search_take_graph_models(P):
    x, y = _blobs(n=64)
    dmath.random.seed(23)
    m = _residual("float64")
    h = m.fit(x, y, batch_size=8, epochs=2, verbose=0, asynchronous=True, max_staleness=0)
    assert np.isfinite(h["loss"]).all() and h["loss"][-1] < h["loss"][0]
    results = dnn.search.grid(lambda p: _residual("float64"), {"lr": [0.1]}, x, y, epochs=1, batch_size=16,
                              validation_data=(x, y), verbose=0)
    assert len(results) == 1 and np.isfinite(results[0]["val_loss"])


@pytest.mark.parametrize("channels_last", [False, True])
def test_batchnorm_with_its_relu_fused_equals_the_two_ops(channels_last):
    """BatchNorm followed by a relu runs as one kernel (both passes); the values and the gradients of
    x, gamma and beta are those of the two separate ops."""
    from dnn import graph as G
    from dnn.graph.node import Variable
    rng = np.random.default_rng(9)
    x0 = rng.normal(size=(6, 3 * 2 * 2))
    results = []
    for fused in (False, True):
        stats = [dmath.from_numpy(np.zeros((1, 3)), dtype="float64", layout=dmath.Replicated()),
                 dmath.from_numpy(np.ones((1, 3)), dtype="float64", layout=dmath.Replicated())]
        x = Variable(dmath.from_numpy(x0, dtype="float64", layout=dmath.RowBlock()))
        x.sample_shape = (3, 2, 2)
        g = Variable(dmath.from_numpy(rng.uniform(0.5, 1.5, (1, 3)) if not results else results[0][3],
                                      dtype="float64", layout=dmath.Replicated()))
        b = Variable(dmath.from_numpy(np.array([[0.1, -0.2, 0.0]]), dtype="float64", layout=dmath.Replicated()))
        h = ops.to_channels_last(x) if channels_last else x
        fn = ops.BatchNorm(stats[0], stats[1], True, activation="relu" if fused else None)
        y = fn.apply(h, g, b)
        y = y if fused else ops.relu(y)
        y = ops.to_channels_first(y) if channels_last else y
        r = G.constant(rng.uniform(-1, 1, y.shape) if not results else results[0][4], dtype="float64",
                       layout=dmath.RowBlock())
        loss = G.sum(y * r)
        grads = G.gradients(loss, [x, g, b])
        results.append((y.value.to_numpy(), [gr.to_numpy() for gr in grads], stats[0].to_numpy(),
                        g.value.to_numpy(), r.value.to_numpy()))
    (y0, g0, m0, _, _), (y1, g1, m1, _, _) = results
    assert (y0 == 0).any() and (y0 > 0).any()
    np.testing.assert_allclose(y1, y0, rtol=1e-14, atol=1e-15)
    for a, b in zip(g1, g0):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-14)


def test_an_input_may_be_an_output():
    x = dnn.Input(3)
    m = dnn.Model(x, x, loss="mse", dtype="float64")
    v = np.arange(6.0).reshape(2, 3)
    np.testing.assert_array_equal(m.predict(v), v)
    assert m.evaluate(v, np.zeros((2, 3)))["loss"] == pytest.approx((v ** 2).mean())


def test_a_multi_input_model_refuses_channels_last_images_and_a_bad_shuffle():
    a, b = dnn.Input((2, 3, 3)), dnn.Input(4)
    model = dnn.Model([a, b], L.Dense(3, activation="softmax")(L.Concatenate()([L.Flatten()(a), b])))
    xa, xb = np.zeros((5, 3, 3, 2)), np.zeros((5, 4))
    with pytest.raises(dnn.ShapeError, match="channels-last"):
        model.predict([xa, xb])
    assert model.predict([xa.transpose(0, 3, 1, 2), xb]).shape == (5, 3)
    with pytest.raises(dnn.ConfigError, match="shuffle must be True or False"):
        model.fit([xa.transpose(0, 3, 1, 2), xb], np.zeros(5, dtype=int), shuffle="x", verbose=0)


def test_concatenate_takes_keras_axis_of_the_join_only():
    a, b = dnn.Input((2, 3, 3)), dnn.Input((1, 3, 3))
    assert L.Concatenate(axis=1)([a, b]).shape == (3, 3, 3)
    assert L.Concatenate(axis=-3).get_config()["axis"] == -3
    with pytest.raises(dnn.ConfigError, match="axis"):
        L.Concatenate(axis=-1)([a, b])
    with pytest.raises(dnn.ConfigError, match="axis must be None or an integer"):
        L.Concatenate(axis="channels")
    f, g = dnn.Input(3), dnn.Input(2)
    assert L.Concatenate(axis=-1)([f, g]).shape == (5,)
