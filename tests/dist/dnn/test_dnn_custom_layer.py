"""A layer of the user's own (README's "Writing your own layer"): a Layer subclass outside the library
trains in a graph model as the library's layers do (forward and an SGD step against a NumPy float64
transcription whose gradients are central differences), and `dnn.layers.register` makes its model
files loadable (a round trip; refused, unchanged, without it)."""
import numpy as np
import pytest

import dmath
import dnn
from dnn import layers as L


class Scale(L.Layer):
    """y = x * alpha: one learned factor per feature (a weight of the layer's own)."""

    def __init__(self, init="ones", name=None):
        super().__init__(name)
        self.init = init

    def output_shape(self, sample_shape):
        return sample_shape

    def _create(self, sample_shape, dtype):
        self.alpha = self._add_weight("alpha", self.init, (1, sample_shape[0]), dtype, dmath.Replicated())

    def forward(self, x, ctx):
        return dnn.graph.mul(x, ctx.param(self.alpha))

    def get_config(self):
        return {**super().get_config(), "init": self.init}


class Swish(L.Layer):
    """y = x * sigmoid(x): no weights, built from the graph's ops."""

    def output_shape(self, sample_shape):
        return sample_shape

    def forward(self, x, ctx):
        return dnn.graph.mul(x, dnn.graph.sigmoid(x))


def _data(n=12):
    rng = np.random.default_rng(4)
    return rng.normal(size=(n, 5)), rng.integers(0, 3, n)


def _model(lr=0.2):
    dmath.random.seed(2)
    inp = dnn.Input((5,))
    h = Swish()(Scale(name="scale")(L.Dense(4)(inp)))
    return dnn.Model(inp, L.Dense(3, activation="softmax")(h), optimizer=dnn.optim.SGD(lr=lr), dtype="float64")


def _forward(ws, x):
    """The model's class probabilities in NumPy from its weights [W1, b1, alpha, W2, b2]."""
    w1, b1, alpha, w2, b2 = ws
    h = (x @ w1 + b1) * alpha.reshape(1, -1)
    h = h / (1.0 + np.exp(-h))
    z = h @ w2 + b2
    z = z - z.max(axis=1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=1, keepdims=True)


def _loss(ws, x, y):
    return -np.mean(np.log(_forward(ws, x)[np.arange(len(y)), y]))


def _central_step(ws, x, y, lr, h=1e-6):
    """One SGD step of the NumPy model, each gradient by central differences."""
    out = []
    for k, w in enumerate(ws):
        g = np.zeros_like(w)
        for i in np.ndindex(w.shape):
            up = [v.copy() for v in ws]
            down = [v.copy() for v in ws]
            up[k][i] += h
            down[k][i] -= h
            g[i] = (_loss(up, x, y) - _loss(down, x, y)) / (2 * h)
        out.append(w - lr * g)
    return out


def test_a_layer_of_your_own_trains_as_the_numpy_transcription():
    x, y = _data()
    m = _model()
    assert [type(layer).__name__ for layer in m.layers] == ["Input", "Dense", "Scale", "Swish", "Dense"]
    ws = m.get_weights()
    assert [w.shape for w in ws] == [(5, 4), (4,), (1, 4), (4, 3), (3,)]
    np.testing.assert_allclose(m.predict(x), _forward(ws, x), rtol=1e-12, atol=1e-14)
    m.fit(x, y, batch_size=len(y), epochs=1, shuffle=False, verbose=0)
    for got, want in zip(m.get_weights(), _central_step(ws, x, y, 0.2)):
        np.testing.assert_allclose(got, want, rtol=1e-7, atol=1e-9)
    assert "scale (Scale)" in m.summary(print_fn=lambda text: None)


def test_registered_layers_load_and_unregistered_ones_are_refused(tmp_path):
    x, y = _data()
    m = _model()
    m.fit(x, y, batch_size=6, epochs=2, shuffle=False, verbose=0)
    path = str(tmp_path / "custom.dnn")
    m.save(path)
    saved = dict(L.KINDS)
    try:
        L.KINDS.pop("Scale", None)
        L.KINDS.pop("Swish", None)
        with pytest.raises(dnn.ModelFileError, match="register"):
            dnn.load(path)
        assert L.register(Scale) is Scale and L.register(Swish) is Swish
        back = dnn.load(path)
        assert [type(layer) for layer in back.layers][2:4] == [Scale, Swish]
        np.testing.assert_array_equal(back.predict(x), m.predict(x))
        for model in (m, back):
            model.fit(x, y, batch_size=6, epochs=1, shuffle=False, verbose=0)
        for a, b in zip(m.get_weights(), back.get_weights()):
            np.testing.assert_array_equal(a, b)
    finally:
        L.KINDS.clear()
        L.KINDS.update(saved)


def test_register_refuses_what_is_not_a_layer_of_its_own():
    with pytest.raises(dnn.ConfigError, match="subclass of dnn.layers.Layer"):
        L.register(int)
    with pytest.raises(dnn.ConfigError, match="subclass of dnn.layers.Layer"):
        L.register(Scale())
    with pytest.raises(dnn.ConfigError, match="subclass of dnn.layers.Layer"):
        L.register(L.Layer)
    dense = type("Dense", (L.Layer,), {})
    with pytest.raises(dnn.ConfigError, match="name of a dnn layer"):
        L.register(dense)
    assert L.KINDS["Dense"] is L.Dense and L.register(L.Dense) is L.Dense
