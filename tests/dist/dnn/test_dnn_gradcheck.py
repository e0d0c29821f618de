"""Every dnn op's backward against central finite differences, in float64, at every worker count.

As Chainer's check_backward: the scalar L = sum(y * R) for a fixed random R;
for each input x and a random direction d, the analytic <dL/dx, d> must equal
(L(x + eps d) - L(x - eps d)) / (2 eps). Batches are RowBlock over the
workers (data parallelism) unless a case says otherwise; parameters are
Replicated, and matmul also runs with a column-split (model-parallel) weight.
"""
import numpy as np
import pytest

import dmath
from dnn import graph as G, ops
from dnn.graph.node import Variable

EPS = 1e-6
RTOL, ATOL = 1e-5, 1e-8


def _leaf(a, layout=None):
    return Variable(dmath.from_numpy(np.asarray(a, dtype=np.float64), layout=layout or dmath.RowBlock()))


def gradcheck(build, arrays, layouts=None, wrt=None, seed=0, sample_shapes=None):
    """Check build(*leaves)'s backward for the leaves `wrt` (default: all) by central differences."""
    rng = np.random.default_rng(seed)
    layouts = layouts or [None] * len(arrays)
    leaves = [_leaf(a, lay) for a, lay in zip(arrays, layouts)]
    if sample_shapes:
        for leaf, s in zip(leaves, sample_shapes):
            if s is not None:
                leaf.sample_shape = tuple(s)
    y = build(*leaves)
    r = G.constant(rng.uniform(-1, 1, y.shape), dtype="float64", layout=dmath.RowBlock())
    loss = G.sum(y * r)
    wrt = list(range(len(leaves))) if wrt is None else wrt
    grads = G.gradients(loss, [leaves[i] for i in wrt])
    for i, g in zip(wrt, grads):
        assert g is not None, f"no gradient for input {i}"
        assert tuple(g.shape) == leaves[i].shape
        d = rng.uniform(-1, 1, leaves[i].shape)
        analytic = float((g.to_numpy() * d).sum())
        x0, lay = np.asarray(arrays[i], dtype=np.float64), leaves[i].value.layout
        values = []
        for sign in (1.0, -1.0):
            leaves[i].assign(dmath.from_numpy(x0 + sign * EPS * d, layout=lay, dtype="float64"))
            values.append(loss.eval().to_numpy()[0, 0])
        leaves[i].assign(dmath.from_numpy(x0, layout=lay, dtype="float64"))
        numeric = (values[0] - values[1]) / (2 * EPS)
        assert abs(analytic - numeric) <= ATOL + RTOL * abs(numeric), \
            f"input {i}: analytic {analytic!r} vs numeric {numeric!r}"


def _u(shape, seed, low=-1.0, high=1.0):
    return np.random.default_rng(seed).uniform(low, high, shape)


REP = dmath.Replicated()
N, F = 7, 5


@pytest.mark.parametrize("name,build,shapes", [
    ("add", lambda a, b: a + b, [(N, F), (N, F)]),
    ("add_row", lambda a, b: a + b, [(N, F), (1, F)]),
    ("sub_col", lambda a, b: a - b, [(N, F), (N, 1)]),
    ("mul_scalar_matrix", lambda a, b: a * b, [(N, F), (1, 1)]),
    ("mul", lambda a, b: a * b, [(N, F), (N, F)]),
    ("div_row", lambda a, b: a / b, [(N, F), (1, F)]),
    ("affine", lambda a: 3.0 - 2.5 * a, [(N, F)]),
    ("neg", lambda a: -a, [(N, F)]),
    ("pow3", lambda a: a ** 3, [(N, F)]),
    ("pow2", lambda a: G.pow(a, 2), [(N, F)]),
    ("exp", G.exp, [(N, F)]),
    ("log", lambda a: G.log(a * a + 1.0), [(N, F)]),
    ("sum_all", G.sum, [(N, F)]),
    ("sum_rows", lambda a: G.sum(a, axis=0), [(N, F)]),
    ("sum_cols", lambda a: G.sum(a, axis=1), [(N, F)]),
    ("mean", lambda a: G.mean(a, axis=0) * 2.0, [(N, F)]),
    ("add_n", lambda a, b: G.sum([a, b, a]), [(N, F), (N, F)]),
    ("sigmoid", G.sigmoid, [(N, F)]),
    ("tanh", G.tanh, [(N, F)]),
    ("softmax", G.softmax, [(N, F)]),
    ("log_softmax", G.log_softmax, [(N, F)]),
])
def test_elementwise_and_activation_ops(name, build, shapes):
    arrays = [_u(s, k + 1) for k, s in enumerate(shapes)]
    if name.startswith("div"):
        arrays[1] = np.abs(arrays[1]) + 0.5
    layouts = [dmath.RowBlock() if s[0] == N else REP for s in shapes]
    gradcheck(build, arrays, layouts)


def test_relu_away_from_the_kink():
    a = _u((N, F), 3)
    a = np.where(np.abs(a) < 0.05, 0.3, a)
    gradcheck(G.relu, [a])


def test_gradient_sums_over_every_consumer():
    # x feeds four consumers (two through one node): the gradients must add up
    gradcheck(lambda x, w: G.tanh(x * w) + x * x - G.sigmoid(x) + G.sum(x, axis=1), [_u((N, F), 1), _u((1, F), 2)],
              [dmath.RowBlock(), REP])


@pytest.mark.parametrize("wlayout", ["rep", "col"])
def test_matmul_and_dense(wlayout):
    lay = REP if wlayout == "rep" else dmath.ColBlock()
    x, w, b = _u((N, 6), 1), _u((6, 4), 2), _u((1, 4), 3)
    gradcheck(G.matmul, [x, w], [dmath.RowBlock(), lay])
    gradcheck(G.linear, [x, w, b], [dmath.RowBlock(), lay, lay])
    gradcheck(lambda x, w: G.linear(x, w), [x, w], [dmath.RowBlock(), lay])


def test_matmul_of_two_batches():
    # a (N, k) @ b (k, N): both operands distributed
    gradcheck(G.matmul, [_u((N, 3), 1), _u((3, N), 2)], [dmath.RowBlock(), dmath.ColBlock()])


def _onehot(n, c, seed):
    y = np.random.default_rng(seed).integers(0, c, n)
    return np.eye(c)[y]


def test_losses():
    z, t = _u((N, F), 1, -2, 2), _onehot(N, F, 2)
    gradcheck(G.softmax_cross_entropy, [z, t], wrt=[0])
    gradcheck(lambda z, t: G.cross_entropy(G.softmax(z), t), [z, t], wrt=[0])
    tb = np.random.default_rng(3).uniform(0, 1, (N, 3))
    gradcheck(G.sigmoid_binary_cross_entropy, [_u((N, 3), 4, -3, 3), tb], wrt=[0])
    gradcheck(G.binary_cross_entropy, [_u((N, 3), 5, 0.1, 0.9), tb], wrt=[0])
    gradcheck(G.mse, [_u((N, 3), 6), _u((N, 3), 7)], wrt=[0])


def test_dropout_with_a_fixed_mask():
    counter = dmath.zeros((1, 1), dtype="float64", layout=REP)

    def build(x):
        fn = ops.Dropout(0.4, seed=7, counter=counter)
        orig = fn.forward

        def forward(x):   # every evaluation of the check must draw the same mask (step 42)
            counter.set((0, 0), 41)
            return orig(x)
        fn.forward = forward
        return fn.apply(x)
    gradcheck(build, [_u((N, 8), 1)])


@pytest.mark.parametrize("stride,padding,dilation", [(1, 0, 1), (2, 1, 1), (1, 2, 2), ((2, 1), (1, 0), 1)])
def test_conv2d(stride, padding, dilation):
    c, h, w, k, kh, kw = 2, 6, 5, 3, 3, 2
    x, wt, b = _u((4, c * h * w), 1), _u((k, c * kh * kw), 2), _u((1, k), 3)
    build = lambda x, wt, b: ops.Conv2D((kh, kw), stride, padding, dilation).apply(x, wt, b)  # noqa: E731
    gradcheck(build, [x, wt, b], [dmath.RowBlock(), REP, REP], sample_shapes=[(c, h, w), None, None])


def test_conv2d_with_fused_relu_and_groups():
    c, h, w, k = 4, 5, 5, 4
    x, wt, b = _u((4, c * h * w), 11), _u((k, c // 2 * 9), 12), _u((1, k), 13)
    build = lambda x, wt, b: ops.Conv2D(3, 1, 1, 1, groups=2, activation="relu").apply(x, wt, b)  # noqa: E731
    gradcheck(build, [x, wt, b], [dmath.RowBlock(), REP, REP], sample_shapes=[(c, h, w), None, None])


@pytest.mark.parametrize("mode,kernel,stride,padding", [("max", 2, None, 0), ("max", 3, 2, 1),
                                                        ("average", 2, 1, 0), ("average", 3, 2, 1)])
def test_pool2d(mode, kernel, stride, padding):
    c, h, w = 2, 6, 5
    # distinct values: the max of every window is unique, so the function is differentiable there
    x = np.random.default_rng(1).permutation(5 * c * h * w).reshape(5, c * h * w) / 10.0
    build = lambda x: ops.Pool2D(kernel, stride, padding, mode).apply(x)  # noqa: E731
    gradcheck(build, [x], sample_shapes=[(c, h, w)])


@pytest.mark.parametrize("image", [None, (3, 2, 2)])
def test_batchnorm_training(image):
    feats = 4 if image is None else 12
    channels = 4 if image is None else 3
    x, gamma, beta = _u((6, feats), 1), _u((1, channels), 2, 0.5, 1.5), _u((1, channels), 3)
    rm = dmath.zeros((1, channels), dtype="float64", layout=REP)
    rv = dmath.ones((1, channels), dtype="float64", layout=REP)
    build = lambda x, g, b: ops.BatchNorm(rm, rv, training=True).apply(x, g, b)  # noqa: E731
    gradcheck(build, [x, gamma, beta], [dmath.RowBlock(), REP, REP], sample_shapes=[image, None, None])


def test_reshape_passes_gradients_through():
    gradcheck(lambda x: G.tanh(G.reshape(x, (2, 2, 3))) * 2.0, [_u((N, 12), 1)])


def test_cast_gradient_comes_back_in_the_input_precision():
    # finite differences through float32 would measure float32 rounding: check the chain rule directly
    x = _leaf(_u((N, 3), 1))
    r = _u((N, 3), 2)
    y = G.sum(G.cast(x, "float32") * G.constant(r, dtype="float32", layout=dmath.RowBlock()))
    (g,) = G.gradients(y, [x])
    assert g.dtype == "float64" and y.dtype == "float32"
    np.testing.assert_allclose(g.to_numpy(), r.astype(np.float32), rtol=0, atol=0)
