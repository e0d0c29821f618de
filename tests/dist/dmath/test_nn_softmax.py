"""dmath.nn softmax, log_softmax and the fused softmax cross-entropy, in every batch layout."""
import numpy as np
import pytest

import dmath
import _nn_ref as ref
from _cases import make, values

P = dmath.num_workers()
LAYOUTS = ref.batch_layouts(P)
N, CLASSES = 7, 5
TOL = {"float16": dict(rtol=5e-3, atol=2e-3), "float32": dict(rtol=1e-5, atol=1e-6),
       "float64": dict(rtol=1e-12, atol=1e-13)}


def _labels(n=N, classes=CLASSES, seed=0):
    y = np.random.default_rng(seed).integers(0, classes, n)
    return y, np.eye(classes)[y]


@pytest.mark.parametrize("dtype", ["float64", "float32", "float16"])
@pytest.mark.parametrize("name", list(LAYOUTS))
def test_softmax_and_log_softmax(name, dtype):
    x = values((N, CLASSES), 1, -4.0, 4.0)
    xm = make(x, LAYOUTS[name](N), dtype)
    xq = x.astype(dtype).astype(np.float64)
    for fn, want in ((dmath.nn.softmax, ref.softmax(xq)), (dmath.nn.log_softmax, ref.log_softmax(xq))):
        y = fn(xm)
        assert y.shape == x.shape and y.dtype == dtype
        assert type(y.layout) is dmath.RowBlock or y.layout.replicated
        np.testing.assert_allclose(y.to_numpy().astype(np.float64), want, **TOL[dtype])


def test_softmax_large_logits_do_not_overflow():
    x = np.array([[1000.0, 0.0, -1000.0], [3e4, 3e4, 0.0]])
    for dtype in ("float16", "float32"):
        y = dmath.nn.softmax(dmath.from_numpy(x, dtype=dtype)).to_numpy().astype(np.float64)
        np.testing.assert_allclose(y, [[1, 0, 0], [0.5, 0.5, 0]], atol=1e-3)


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_cross_entropy_of_logits_whose_spread_overflows(dtype):
    """Finite logits whose log-softmax underflows to -inf where the label is 0 add nothing (0 log 0 = 0):
    1e308 and -1e308 in a row made the loss NaN (0 * -inf; a hostile-use probe). A label on such a
    class gives inf, as PyTorch's; a NaN logit still gives NaN."""
    big = float(np.finfo(dtype).max)
    x = np.array([[big, -big, 0.0], [0.0, 1.0, 2.0]])
    t = np.array([[1.0, 0.0, 0.0], [0.0, 0.0, 1.0]])
    loss, _ = dmath.nn.softmax_cross_entropy(dmath.from_numpy(x, dtype=dtype), dmath.from_numpy(t, dtype=dtype))
    np.testing.assert_allclose(loss.to_numpy()[0, 0], ref.cross_entropy(x[1:], t[1:]) / 2, rtol=1e-6)
    t[0] = [0.0, 1.0, 0.0]
    loss, _ = dmath.nn.softmax_cross_entropy(dmath.from_numpy(x, dtype=dtype), dmath.from_numpy(t, dtype=dtype))
    assert loss.to_numpy()[0, 0] == np.inf
    x[1, 0] = np.nan
    loss, _ = dmath.nn.softmax_cross_entropy(dmath.from_numpy(x, dtype=dtype), dmath.from_numpy(t, dtype=dtype))
    assert np.isnan(loss.to_numpy()[0, 0])


@pytest.mark.parametrize("dtype", ["float64", "float32", "float16"])
@pytest.mark.parametrize("name", list(LAYOUTS))
def test_cross_entropy_forward(name, dtype):
    x = values((N, CLASSES), 2, -3.0, 3.0)
    _, t = _labels()
    lay = LAYOUTS[name](N)
    loss, probs = dmath.nn.softmax_cross_entropy(make(x, lay, dtype), make(t, lay, dtype))
    xq = x.astype(dtype).astype(np.float64)
    assert loss.shape == (1, 1) and loss.layout.replicated
    assert loss.dtype == ("float64" if dtype == "float64" else "float32")
    assert probs.dtype == dtype
    np.testing.assert_allclose(loss.to_numpy()[0, 0], ref.cross_entropy(xq, t), **TOL[dtype])
    np.testing.assert_allclose(probs.to_numpy().astype(np.float64), ref.softmax(xq), **TOL[dtype])


def test_cross_entropy_labels_in_another_layout():
    x = values((N, CLASSES), 3)
    _, t = _labels(seed=3)
    loss, _ = dmath.nn.softmax_cross_entropy(make(x, dmath.RowBlock(), "float64"),
                                             make(t, dmath.Block2D(), "float64"))
    np.testing.assert_allclose(loss.to_numpy()[0, 0], ref.cross_entropy(x, t), rtol=1e-12)


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_cross_entropy_backward(name):
    """(probs - labels) * scale / N against finite differences of the float64 reference loss and
    of dmath's own loss along random directions."""
    x = values((N, CLASSES), 4, -2.0, 2.0)
    _, t = _labels(seed=4)
    lay = LAYOUTS[name](N)
    tm = make(t, lay, "float64")
    _, probs = dmath.nn.softmax_cross_entropy(make(x, lay, "float64"), tm)
    d = dmath.nn.softmax_cross_entropy_backward(probs, tm, scale=3.0)
    assert d.shape == x.shape
    got = d.to_numpy()
    want = ref.numeric_grad(lambda z: 3.0 * ref.cross_entropy(z, t), x)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-8)

    def loss_of(z):
        return 3.0 * dmath.nn.softmax_cross_entropy(make(z, lay, "float64"), tm)[0].to_numpy()[0, 0]
    ref.directional_check(loss_of, x, got, seed=5)


def test_log_softmax_rows_normalise():
    x = values((N, CLASSES), 6)
    for name, lay in LAYOUTS.items():
        y = dmath.nn.log_softmax(make(x, lay(N), "float64")).to_numpy()
        np.testing.assert_allclose(np.exp(y).sum(axis=1), 1.0, rtol=1e-13, err_msg=name)


def test_row_and_replicated_batches_agree():
    x = values((N, CLASSES), 7)
    _, t = _labels(seed=7)
    out = {}
    for name in ("row", "rep"):
        lay = LAYOUTS[name](N)
        loss, probs = dmath.nn.softmax_cross_entropy(make(x, lay, "float32"), make(t, lay, "float32"))
        out[name] = (loss.to_numpy(), probs.to_numpy())
    np.testing.assert_allclose(out["row"][0], out["rep"][0], rtol=1e-6)
    np.testing.assert_array_equal(out["row"][1], out["rep"][1])


def test_against_torch():
    torch = pytest.importorskip("torch")
    x = values((N, CLASSES), 8)
    y, t = _labels(seed=8)
    xt = torch.tensor(x, requires_grad=True)
    lt = torch.nn.functional.cross_entropy(xt, torch.tensor(y))
    lt.backward()
    loss, probs = dmath.nn.softmax_cross_entropy(dmath.from_numpy(x), dmath.from_numpy(t))
    d = dmath.nn.softmax_cross_entropy_backward(probs, dmath.from_numpy(t))
    np.testing.assert_allclose(loss.to_numpy()[0, 0], lt.item(), rtol=1e-12)
    np.testing.assert_allclose(d.to_numpy(), xt.grad.numpy(), rtol=1e-10, atol=1e-14)


def test_errors_raise_on_the_master():
    x = dmath.from_numpy(values((N, CLASSES), 9))
    with pytest.raises(dmath.ShapeError):
        dmath.nn.softmax_cross_entropy(x, dmath.zeros((N, CLASSES + 1)))
    with pytest.raises(dmath.ShapeError):
        dmath.nn.softmax(dmath.zeros((3, 0)))
    with pytest.raises(dmath.ShapeError):
        dmath.nn.softmax_cross_entropy(dmath.zeros((0, 3)), dmath.zeros((0, 3)))
    with pytest.raises(dmath.DMathError):
        dmath.nn.softmax(np.zeros((3, 3)))
    with pytest.raises(dmath.DMathError):
        dmath.nn.softmax_cross_entropy_backward(x, x, scale=float("nan"))
    np.testing.assert_allclose(dmath.nn.softmax(x).to_numpy().sum(axis=1), 1.0)
