"""The graph API (MagmaDNN's op::): building, evaluation, topological order, errors, minimize."""
import numpy as np
import pytest

import dmath
import dnn
from dnn import graph as G
from dnn import layers as L


def test_minimize_x_squared_plus_c():
    x = G.var("x", (1, 1), init=5.0)
    c = G.constant(3.0)
    expr = G.add(G.pow(x, 2), c)
    np.testing.assert_allclose(expr.eval().to_numpy(), [[28.0]])
    opt = dnn.optim.SGD(lr=0.1)
    for _ in range(60):
        opt.minimize(expr, [x])
    # x_{k+1} = x_k - 0.1 * 2 x_k = 0.8 x_k
    np.testing.assert_allclose(x.value.to_numpy(), [[5.0 * 0.8 ** 60]], rtol=1e-4)
    np.testing.assert_allclose(expr.eval().to_numpy(), [[3.0]], atol=1e-6)


def test_operators_build_the_same_graph_as_the_functions():
    a = G.var("a", (3, 4), init=np.arange(12.0).reshape(3, 4), dtype="float64")
    b = G.constant(np.full((1, 4), 2.0), dtype="float64")
    e1 = (a * b - 1.0) / 2.0 + a ** 2
    e2 = G.add(G.div(G.sub(G.mul(a, b), 1.0), 2.0), G.pow(a, 2))
    want = (np.arange(12.0).reshape(3, 4) * 2 - 1) / 2 + np.arange(12.0).reshape(3, 4) ** 2
    np.testing.assert_allclose(e1.numpy(), want)
    np.testing.assert_allclose(e2.numpy(), want)


def test_topological_order_puts_inputs_first_and_visits_shared_nodes_once():
    x = G.var("x", (2, 2), init=1.0)
    h = G.tanh(x)
    y = h * h + G.sigmoid(h)
    order = G.topological_order([y])
    pos = {n.id: i for i, n in enumerate(order)}
    assert len(order) == len({n.id for n in order})
    for n in order:
        for i in n.inputs:
            assert pos[i.id] < pos[n.id]
    assert order[-1] is y and order[0] is x


def test_deep_chain_has_no_recursion_limit():
    x = G.var("x", (1, 1), init=0.5, dtype="float64")
    y = x
    for _ in range(3000):
        y = y * 1.0
    assert len(G.topological_order([y])) == 3001


def test_gradients_of_a_matmul_graph_against_numpy():
    rng = np.random.default_rng(0)
    xa, wa = rng.normal(size=(6, 4)), rng.normal(size=(4, 3))
    x = G.constant(xa, dtype="float64", layout=dmath.RowBlock())
    w = G.var("w", (4, 3), init=wa, dtype="float64")
    loss = G.sum(G.matmul(x, w) ** 2)
    (gw,) = G.gradients(loss, [w])
    np.testing.assert_allclose(gw.to_numpy(), 2 * xa.T @ (xa @ wa), rtol=1e-12)


@pytest.mark.parametrize("consumers", [2, 3, 4, 6])
def test_a_node_read_by_several_consumers_gets_the_sum_of_their_gradients(consumers):
    """The terms are kept apart and added in one pass per four (dmath.add_n) when the node is read:
    by its own backward (h) and as a target's gradient (x)."""
    rng = np.random.default_rng(consumers)
    xa = rng.normal(size=(5, 4))
    x = G.var("x", (5, 4), init=xa, dtype="float64")
    h = G.tanh(x)
    scales = [1.0 + k for k in range(consumers)]
    # h feeds every consumer; x feeds h and, once more, the loss directly
    loss = G.sum(G.sum([G.pow(h, 2) * s if k % 2 else G.sigmoid(h) * s for k, s in enumerate(scales)])) \
        + G.sum(x * 3.0)
    (gx,) = G.gradients(loss, [x])
    th = np.tanh(xa)
    sig = 1.0 / (1.0 + np.exp(-th))
    gh = sum(2.0 * th * s if k % 2 else sig * (1.0 - sig) * s for k, s in enumerate(scales))
    np.testing.assert_allclose(gx.to_numpy(), gh * (1.0 - th ** 2) + 3.0, rtol=1e-12)


def test_placeholder_is_fed_and_checked():
    p = G.placeholder((2, 3), dtype="float32", name="p")
    y = G.sum(p * 2.0)
    with pytest.raises(dnn.GraphError, match="must be fed"):
        y.eval()
    with pytest.raises(dnn.ShapeError):
        p.feed(dmath.zeros((3, 2)))
    p.feed(dmath.ones((2, 3)))
    np.testing.assert_allclose(y.eval().to_numpy(), [[12.0]])


def test_shape_errors_are_raised_when_the_graph_is_built():
    a = G.var("a", (3, 4), init=0.0)
    with pytest.raises(dnn.ShapeError, match="matmul"):
        G.matmul(a, a)
    with pytest.raises(dnn.ShapeError, match="broadcast"):
        G.add(a, G.var("b", (4, 3), init=0.0))
    with pytest.raises(dnn.GraphError, match="graph nodes"):
        G.add(a, dmath.zeros((3, 4)))
    with pytest.raises(dnn.ConfigError, match="unknown initializer"):
        G.var("c", (2, 2), init="bogus")


def test_no_gradient_without_a_path():
    a = G.var("a", (2, 2), init=1.0)
    b = G.var("b", (2, 2), init=1.0)
    ga, gb = G.gradients(G.sum(a * 3.0), [a, b])
    np.testing.assert_allclose(ga.to_numpy(), np.full((2, 2), 3.0))
    assert gb is None


def _conv_net_graph():
    """x -> conv(+relu) -> max pool -> flatten -> dense -> softmax cross-entropy, float64."""
    rng = np.random.default_rng(5)
    x = G.constant(rng.normal(size=(6, 2 * 6 * 6)), dtype="float64")
    x.sample_shape = (2, 6, 6)
    w = G.var("w", (3, 2 * 3 * 3), init=rng.normal(size=(3, 18)) * 0.3, dtype="float64")
    v = G.var("v", (3 * 2 * 2, 4), init=rng.normal(size=(12, 4)) * 0.3, dtype="float64")
    labels = G.constant(np.eye(4)[rng.integers(0, 4, 6)], dtype="float64")
    conv = dnn.ops.Conv2D((3, 3), activation="relu").apply(x, w)
    pool = G.pool2d(conv, 2)
    flat = G.flatten(pool)
    logits = G.matmul(flat, v)
    loss = G.softmax_cross_entropy(logits, labels)
    return loss, [w, v], dict(conv=conv, pool=pool, flat=flat, logits=logits)


def test_releases_drop_each_value_after_its_last_reader():
    from dnn.graph.execute import Releases
    loss, params, n = _conv_net_graph()
    order = G.topological_order([loss])
    rel = Releases(order, params, keep=[loss])
    when = {}
    for phase, lists in (("forward", rel.forward), ("backward", rel.backward)):
        for i, nodes in enumerate(lists):
            for node in nodes:
                when[node.id] = (phase, i)
    at = {node.id: i for i, node in enumerate(order)}
    back = {node.id: len(order) - 1 - i for i, node in enumerate(order)}
    # no backward reads the pooled value or its flattened view: gone once their consumer ran forward
    assert when[n["pool"].id] == ("forward", at[n["flat"].id])
    assert when[n["flat"].id] == ("backward", back[n["logits"].id])     # the matmul's backward reads its input
    assert when[n["logits"].id] == ("backward", back[loss.id])          # read by the loss's backward
    assert when[n["conv"].id] == ("backward", back[n["conv"].id])       # its own backward: the relu mask
    assert loss.id not in when and all(p.id not in when for p in params)


def test_backward_with_releases_gives_the_same_gradients_and_keeps_nothing():
    from dnn.graph.execute import Releases
    loss, params, n = _conv_net_graph()
    order = G.topological_order([loss])
    G.forward([loss], order)
    want = [g.to_numpy() for g in G.backward(loss, params, order=order)]
    rel = Releases(order, params, keep=[loss])
    G.forward([loss], order, rel)
    assert n["pool"].value is None and n["flat"].value is not None
    got = G.backward(loss, params, order=order, releases=rel)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g.to_numpy(), w, rtol=1e-12, atol=1e-14)
    assert all(node.value is None for node in n.values()) and loss.value is not None
    assert n["pool"].fn.argmax is None                  # what its forward saved for backward is gone too
    assert n["conv"].layout is not None                 # the layouts stay (Model.summary)


# ---- 9. pool2d mode='avg' ----------------------------------------------------------------------------
def test_pool2d_accepts_avg_as_average():
    rng = np.random.default_rng(0)
    a = rng.standard_normal((2, 1, 4, 4))
    x = G.constant(a.reshape(2, 16), dtype="float64")
    x.sample_shape = (1, 4, 4)
    got = G.pool2d(x, 2, mode="avg").eval().to_numpy()
    want = a.reshape(2, 1, 2, 2, 2, 2).mean(axis=(3, 5)).reshape(2, 4)
    np.testing.assert_allclose(got, want, rtol=1e-14)
    np.testing.assert_array_equal(got, G.pool2d(x, 2, mode="average").eval().to_numpy())
    assert L.Pool2D(2, mode="avg").get_config()["mode"] == "average"
    with pytest.raises(dnn.ConfigError, match="'avg'"):
        G.pool2d(x, 2, mode="mean")
