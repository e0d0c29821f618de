"""A residual block's tail fused into its BatchNorm (dnn.Model(fuse=...), dnn.functional.residual_tails):
the fused model equals the unfused one (outputs, every gradient, the weights after SGD steps) in
float64, NCHW and channels-last rows, trained and frozen BatchNorms; the fused node's gradients by
central differences; the step drops the residual after the forward. Runs at every worker count."""
import numpy as np
import pytest

import dmath
import dnn
from dnn import graph as G, layers as L, ops
from dnn.functional import residual_tails
from dnn.graph.execute import Releases, topological_order
from test_dnn_gradcheck import gradcheck


def _resnet_like(fuse, channels_last=False, freeze=None, dtype="float64"):
    """stem conv-bn-relu; a basic block (bn2(h) + identity, relu); a downsampling block whose tail adds
    two BatchNorms (bn3(h) + downsample bn(x), relu); a sum with no relu after it; global pool, dense."""
    dmath.random.seed(4)
    x = dnn.Input((3, 6, 6))
    s = L.Activation("relu")(L.BatchNorm(name="bn1")(L.Conv2D(4, 3, padding=1, use_bias=False)(x)))
    h = L.Activation("relu")(L.BatchNorm(name="b1.bn1")(L.Conv2D(4, 3, padding=1, use_bias=False)(s)))
    h = L.BatchNorm(name="b1.bn2")(L.Conv2D(4, 3, padding=1, use_bias=False)(h))
    s = L.Activation("relu")(L.Add()([h, s]))
    h = L.Activation("relu")(L.BatchNorm(name="b2.bn1")(L.Conv2D(6, 1, use_bias=False)(s)))
    h = L.BatchNorm(name="b2.bn3")(L.Conv2D(6, 3, stride=2, padding=1, use_bias=False)(h))
    d = L.BatchNorm(name="b2.down")(L.Conv2D(6, 1, stride=2, use_bias=False)(s))
    s = L.Activation("relu")(L.Add()([h, d]))
    t = L.BatchNorm(name="b3.bn")(L.Conv2D(6, 1, use_bias=False)(s))
    s = L.Add()([s, t])                 # the BatchNorm second, no relu after the sum
    out = L.Output("softmax")(L.Dense(3)(L.GlobalAvgPool2D()(s)))
    m = dnn.Model(x, out, dtype=dtype, optimizer=dnn.optim.SGD(lr=0.1, momentum=0.9), fuse=fuse,
                  channels_last=channels_last)
    for name in freeze or ():
        next(layer for layer in m.layers if layer.name == name).trainable = False
    return m


def _data(n=8):
    rng = np.random.default_rng(0)
    return rng.normal(size=(n, 3, 6, 6)), rng.integers(0, 3, n)


def _gradients(m):
    """The gradients of the last training program's loss (its last batch) at the current weights."""
    prog = m._last_program()
    return [g.to_numpy() for g in G.gradients(prog.loss, prog.grad_at)]


def _run(build, fuses):
    """{fuse: (outputs before training, the gradients after one step, the weights after two more
    epochs of SGD with momentum, the outputs then, the ops of the training step)}."""
    x, y = _data()
    results = {}
    for fuse in fuses:
        m = build(fuse)
        before = m.predict(x)
        m.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0)
        fns = _ops(m)
        grads = _gradients(m)
        m.fit(x, y, batch_size=4, epochs=2, shuffle=False, verbose=0)
        results[fuse] = (before, grads, m.get_weights(), m.predict(x), fns)
    return results


def _assert_same(got, base, rtol, atol):
    np.testing.assert_allclose(got[0], base[0], rtol=1e-12, atol=1e-14)
    assert len(got[1]) == len(base[1]) and len(got[2]) == len(base[2])
    for a, b in zip(got[1] + got[2], base[1] + base[2]):
        np.testing.assert_allclose(a, b, rtol=rtol, atol=atol)
    np.testing.assert_allclose(got[3], base[3], rtol=rtol, atol=atol)


def _ops(m):
    """(function, number of inputs) of each node of the last program."""
    return [(n.fn, len(n.inputs)) for n in m._last_program().order if n.fn is not None]


def test_residual_tails_are_the_sums_a_batchnorm_alone_feeds():
    m = _resnet_like(True)
    g = m.graph
    names = {a: g.tensors[k].layer.name for a, k in residual_tails(g).items()}
    assert sorted(names.values()) == ["b1.bn2", "b2.bn3", "b3.bn"]
    assert all(isinstance(g.tensors[a].layer, L.Add) for a in names)


@pytest.mark.parametrize("channels_last", [False, True])
@pytest.mark.parametrize("freeze", [(), ("b1.bn2", "b2.down")])
def test_fused_model_equals_the_unfused_one(channels_last, freeze):
    results = _run(lambda fuse: _resnet_like(fuse, channels_last, freeze), (False, "relu", True))
    fused = [(f.activation, n) for f, n in results[True][4] if isinstance(f, ops.BatchNorm)]
    # the three sums run inside their BatchNorms (a fourth input), two of them with the relu after them
    assert not any(isinstance(f, ops.join.Merge) for f, _ in results[True][4])
    assert sorted(fused, key=str) == sorted([("relu", 3)] * 3 + [("relu", 4)] * 2 + [(None, 3), (None, 4)], key=str)
    assert sum(isinstance(f, ops.join.Merge) for f, _ in results["relu"][4]) == 3
    assert not any(isinstance(f, ops.BatchNorm) and f.activation for f, _ in results[False][4])
    for fuse in ("relu", True):
        _assert_same(results[fuse], results[False], rtol=1e-9, atol=1e-12)


def test_the_fold_changes_no_layer_name_weight_or_count():
    a, b = _resnet_like(False), _resnet_like(True)
    assert [layer.name for layer in a.layers] == [layer.name for layer in b.layers]
    assert a.count_params() == b.count_params()
    sa, sb = a.state_dict(), b.state_dict()
    assert list(sa) == list(sb)
    x, y = _data()
    summaries = []
    for m in (a, b):
        m.fit(x, y, batch_size=8, epochs=1, verbose=0)
        lines = []
        m.summary(print_fn=lines.append)
        summaries.append(lines)
    assert summaries[0] == summaries[1]
    assert "\n".join(summaries[1]).count("(Add)") == 3


def test_fuse_is_checked():
    with pytest.raises(dnn.ConfigError):
        _resnet_like("add")
    with pytest.raises(dnn.ConfigError):
        _resnet_like(1)


@pytest.mark.parametrize("training", [True, False])
@pytest.mark.parametrize("relu", [None, "relu"])
def test_fused_node_gradients_by_central_differences(training, relu):
    rng = np.random.default_rng(3)
    rm = dmath.from_numpy(rng.normal(size=(1, 3)), dtype="float64", layout=dmath.Replicated())
    rv = dmath.from_numpy(rng.uniform(0.5, 2.0, (1, 3)), dtype="float64", layout=dmath.Replicated())

    def build(x, g, b, r):
        # momentum 0: a training step leaves the running statistics as they are (the loss is repeatable)
        return ops.BatchNorm(rm, rv, training, momentum=0.0, activation=relu).apply(x, g, b, r)
    arrays = [rng.normal(size=(6, 12)), rng.uniform(0.5, 1.5, (1, 3)), rng.normal(size=(1, 3)) * 0.3,
              rng.normal(size=(6, 12))]
    gradcheck(build, arrays, layouts=[None, dmath.Replicated(), dmath.Replicated(), None],
              sample_shapes=[(3, 2, 2), None, None, (3, 2, 2)], seed=7)


def test_the_step_drops_the_residual_after_the_forward():
    """The fused backward reads y, never the residual: a residual no other backward reads is released
    right after the fused node's forward, not kept to the backward pass."""
    from dnn.graph.node import Variable
    rng = np.random.default_rng(5)
    stats = [dmath.from_numpy(a, dtype="float64", layout=dmath.Replicated()) for a in (np.zeros((1, 3)),
                                                                                       np.ones((1, 3)))]
    leaves = []
    for a in (rng.normal(size=(4, 12)), rng.normal(size=(4, 12))):
        v = Variable(dmath.from_numpy(a, dtype="float64", layout=dmath.RowBlock()))
        v.sample_shape = (3, 2, 2)
        leaves.append(v)
    g, b = (Variable(dmath.from_numpy(a, dtype="float64", layout=dmath.Replicated()))
            for a in (np.ones((1, 3)), np.zeros((1, 3))))
    x, r = (ops.to_channels_last(v) for v in leaves)
    y = ops.BatchNorm(*stats, True, activation="relu").apply(x, g, b, r)
    loss = G.sum(ops.to_channels_first(y))
    order = topological_order([loss])
    rel = Releases(order, [leaves[0], leaves[1], g, b])
    at = order.index(y)
    assert r in rel.forward[at]                                  # dropped once the fused node has run
    assert not any(x in step for step in rel.forward)           # x: read by the backward
    assert y not in rel.forward[at]


# ---- a concatenation written in place by its branches' batch norms -----------------------------------
def _inception_like(fuse, channels_last=False, freeze=(), dtype="float64"):
    """conv-bn-relu stem; a module of four branches ending in BatchNorm (three with a relu after it, one
    without) concatenated; a second concatenation with a branch that is not a batch norm (left as it
    is); global pool, dense."""
    dmath.random.seed(8)
    x = dnn.Input((3, 6, 6))
    s = L.Activation("relu")(L.BatchNorm(name="stem.bn")(L.Conv2D(4, 3, padding=1, use_bias=False)(x)))

    def branch(h, c, k, name, relu=True):
        h = L.BatchNorm(name=name)(L.Conv2D(c, k, padding=k // 2, use_bias=False)(h))
        return L.Activation("relu")(h) if relu else h
    m = L.Concatenate()([branch(s, 2, 1, "m.b1"), branch(branch(s, 3, 1, "m.b2a"), 4, 3, "m.b2"),
                         branch(s, 2, 3, "m.b3", relu=False),
                         branch(L.Pool2D(3, stride=1, padding=1)(s), 3, 1, "m.b4")])
    n = L.Concatenate()([branch(m, 3, 1, "n.b1"), L.Pool2D(3, stride=1, padding=1)(m)])
    out = L.Output("softmax")(L.Dense(3)(L.GlobalAvgPool2D()(n)))
    model = dnn.Model(x, out, dtype=dtype, optimizer=dnn.optim.SGD(lr=0.1, momentum=0.9), fuse=fuse,
                      channels_last=channels_last)
    for name in freeze:
        next(layer for layer in model.layers if layer.name == name).trainable = False
    return model


def test_concat_branches_are_the_concatenations_of_batch_norms():
    from dnn.functional import concat_branches
    g = _inception_like(True).graph
    joins = concat_branches(g)
    assert len(joins) == 1
    (branches,) = joins.values()
    assert [g.tensors[b].layer.name for b, _ in branches] == ["m.b1", "m.b2", "m.b3", "m.b4"]
    assert [relu is not None for _, relu in branches] == [True, True, False, True]


@pytest.mark.parametrize("channels_last", [False, True])
@pytest.mark.parametrize("freeze", [(), ("m.b2", "m.b3")])
def test_concatenation_in_place_equals_the_copy(channels_last, freeze):
    results = _run(lambda fuse: _inception_like(fuse, channels_last, freeze), ("relu", True))
    assert sum(isinstance(f, ops.ConcatBatchNorm) for f, _ in results[True][4]) == 1
    assert sum(isinstance(f, ops.join.Concat) for f, _ in results[True][4]) == 1     # the second one
    assert sum(isinstance(f, ops.join.Concat) for f, _ in results["relu"][4]) == 2
    np.testing.assert_array_equal(results[True][0], results["relu"][0])     # the same kernels, in place
    _assert_same(results[True], results["relu"], rtol=1e-10, atol=1e-13)


def test_concatenation_in_place_gradients_by_central_differences():
    rng = np.random.default_rng(11)
    stats = [[dmath.from_numpy(a, dtype="float64", layout=dmath.Replicated())
              for a in (rng.normal(size=(1, c)), rng.uniform(0.5, 2.0, (1, c)))] for c in (2, 3)]

    def build(x1, g1, b1, x2, g2, b2):
        norms = [ops.BatchNorm(*stats[0], True, momentum=0.0, activation="relu"),
                 ops.BatchNorm(*stats[1], True, momentum=0.0)]
        return ops.ConcatBatchNorm(norms).apply(x1, g1, b1, x2, g2, b2)
    arrays = [rng.normal(size=(5, 8)), rng.uniform(0.5, 1.5, (1, 2)), rng.normal(size=(1, 2)) * 0.3,
              rng.normal(size=(5, 12)), rng.uniform(0.5, 1.5, (1, 3)), rng.normal(size=(1, 3)) * 0.3]
    rep = dmath.Replicated()
    gradcheck(build, arrays, layouts=[None, rep, rep, None, rep, rep],
              sample_shapes=[(2, 2, 2), None, None, (3, 2, 2), None, None], seed=12)


@pytest.mark.parametrize("build", [_resnet_like, _inception_like])
def test_float16_fused_models_train_as_the_float64_one(build):
    """Mixed precision through the folds' kernels (float16 activations, computed in float32): one SGD
    step gives the float64 model's loss and weights up to float16 rounding."""
    x, y = _data()
    ref = build(True)
    want = ref.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0)["loss"]
    half = build(True, dtype="float16")
    got = half.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0)["loss"]
    np.testing.assert_allclose(got, want, rtol=2e-3)
    for a, b in zip(half.get_weights(), ref.get_weights()):
        np.testing.assert_allclose(a, b, rtol=1e-2, atol=2e-3)
