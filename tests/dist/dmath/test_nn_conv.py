"""dmath.nn.conv2d and conv2d_backward: every geometry option, every batch layout, against loops,
finite differences and (when installed) PyTorch."""
import functools

import numpy as np
import pytest

import dmath
import _nn_ref as ref
from _cases import make, runs_may_differ, values

P = dmath.num_workers()
LAYOUTS = ref.batch_layouts(P)
N, C, H, W, K = 3, 2, 6, 5, 3

#: name -> (kernel_hw, stride, padding, dilation)
GEOMETRIES = {
    "plain3x3": ((3, 3), (1, 1), (0, 0), (1, 1)),
    "stride2_pad1": ((3, 3), (2, 2), (1, 1), (1, 1)),
    "rect_dilated": ((2, 3), (1, 2), (1, 0), (2, 1)),
}


def _problem(geom, seed=0):
    (kh, kw), stride, padding, dilation = GEOMETRIES[geom]
    x = values((N, C * H * W), seed)
    w = values((K, C * kh * kw), seed + 1)
    b = values((1, K), seed + 2)
    want = ref.conv2d(x.reshape(N, C, H, W), w.reshape(K, C, kh, kw), b.reshape(-1), stride, padding, dilation)
    return x, w, b, want.reshape(N, -1)


def _args(geom):
    kernel_hw, stride, padding, dilation = GEOMETRIES[geom]
    return dict(stride=stride, padding=padding, dilation=dilation), kernel_hw


def test_output_shape():
    assert dmath.nn.conv2d_output_shape((3, 28, 28), 5, 32, 1, 2) == (32, 28, 28)
    assert dmath.nn.conv2d_output_shape((1, 7, 9), (3, 2), 4, (2, 1), (1, 0), (1, 3)) == (4, 4, 6)
    with pytest.raises(dmath.ShapeError):
        dmath.nn.conv2d_output_shape((1, 4, 4), 5, 8)
    # a stride past the kernels' index range is refused on the master (10**18 overflowed im2col's view
    # on a worker and ended the runtime: a hostile-use probe); any stride past the image is one window
    assert dmath.nn.conv2d_output_shape((1, 7, 9), 3, 2, 2 ** 31 - 1) == (2, 1, 1)
    x = dmath.from_numpy(np.ones((2, 1 * 7 * 9)), layout=dmath.RowBlock())
    w = dmath.from_numpy(np.ones((2, 9)), layout=dmath.Replicated())
    for bad in (2 ** 31, 10 ** 18, (1, 10 ** 18)):
        with pytest.raises(dmath.ShapeError, match="stride must be at most 2147483647"):
            dmath.nn.conv2d_output_shape((1, 7, 9), 3, 2, bad)
        with pytest.raises(dmath.ShapeError, match="stride must be at most"):
            dmath.nn.pool2d(x, (1, 7, 9), 2, stride=bad, mode="average")
    assert dmath.nn.pool2d(x, (1, 7, 9), 2, stride=3, mode="average")[0].shape == (2, 2 * 3)


@pytest.mark.parametrize("geom", list(GEOMETRIES))
@pytest.mark.parametrize("name", list(LAYOUTS))
def test_forward(name, geom):
    x, w, b, want = _problem(geom)
    kw_args, kernel_hw = _args(geom)
    xm = make(x, LAYOUTS[name](N), "float64")
    y = dmath.nn.conv2d(xm, make(w, dmath.Replicated(), "float64"), make(b, dmath.Replicated(), "float64"),
                        (C, H, W), kernel_hw=kernel_hw, **kw_args)
    assert y.shape == want.shape and y.dtype == "float64"
    np.testing.assert_allclose(y.to_numpy(), want, rtol=1e-12, atol=1e-12)


def test_forward_without_bias_and_square_kernel_inferred():
    x, w, _, _ = _problem("plain3x3", seed=10)
    want = ref.conv2d(x.reshape(N, C, H, W), w.reshape(K, C, 3, 3), None)
    # W in a distributed layout and no bias: dmath.nn replicates W first
    y = dmath.nn.conv2d(make(x, dmath.RowBlock(), "float64"), make(w, dmath.ColBlock(), "float64"), None,
                        (C, H, W))
    np.testing.assert_allclose(y.to_numpy(), want.reshape(N, -1), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_forward_low_precision(dtype):
    x, w, b, _ = _problem("stride2_pad1", seed=20)
    kw_args, kernel_hw = _args("stride2_pad1")
    q = lambda a: a.astype(dtype).astype(np.float64)   # noqa: E731
    want = ref.conv2d(q(x).reshape(N, C, H, W), q(w).reshape(K, C, 3, 3), q(b).reshape(-1),
                      **kw_args).reshape(N, -1)
    y = dmath.nn.conv2d(make(x, dmath.RowBlock(), dtype), make(w, dmath.Replicated(), dtype),
                        make(b, dmath.Replicated(), dtype), (C, H, W), kernel_hw=kernel_hw, **kw_args)
    assert y.dtype == dtype
    tol = dict(rtol=2e-3, atol=3e-3) if dtype == "float16" else dict(rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(y.to_numpy().astype(np.float64), want, **tol)


def _backward(name, geom, seed, need_dx=True, need_db=True, need_dw=True):
    x, w, b, want = _problem(geom, seed)
    kw_args, kernel_hw = _args(geom)
    r = values(want.shape, seed + 5)
    lay = LAYOUTS[name](N)
    out = dmath.nn.conv2d_backward(make(r, lay, "float64"), make(x, lay, "float64"),
                                   make(w, dmath.Replicated(), "float64"), (C, H, W), kernel_hw,
                                   need_dx=need_dx, need_db=need_db, need_dw=need_dw, **kw_args)
    return x, w, b, r, out, kw_args, kernel_hw


@functools.lru_cache(maxsize=None)
def _reference_gradients(geom, seed):
    """dL/dX, dL/dW, dL/db of L = sum(conv2d(X, W, b) * R) by central differences of the loops."""
    x, w, b, want = _problem(geom, seed)
    kw_args, (kh, kw) = _args(geom)
    r = values(want.shape, seed + 5)

    def loss(xx, ww, bb):
        y = ref.conv2d(xx.reshape(N, C, H, W), ww.reshape(K, C, kh, kw), bb.reshape(-1), **kw_args)
        return float((y.reshape(N, -1) * r).sum())
    return (ref.numeric_grad(lambda z: loss(z, w, b), x), ref.numeric_grad(lambda z: loss(x, z, b), w),
            ref.numeric_grad(lambda z: loss(x, w, z), b))


@pytest.mark.parametrize("geom", list(GEOMETRIES))
@pytest.mark.parametrize("name", list(LAYOUTS))
def test_backward_against_finite_differences(name, geom):
    """dX, dW, db against central differences of the loop reference (every element), and dX
    against dmath's own forward along random directions."""
    x, w, b, r, (dx, dw, db), kw_args, kernel_hw = _backward(name, geom, seed=30)
    for got, want in zip((dx, dw, db), _reference_gradients(geom, 30)):
        np.testing.assert_allclose(got.to_numpy(), want, rtol=1e-6, atol=1e-8)
    lay = LAYOUTS[name](N)
    wm, bm = make(w, dmath.Replicated(), "float64"), make(b, dmath.Replicated(), "float64")

    def dmath_loss(z):
        y = dmath.nn.conv2d(make(z, lay, "float64"), wm, bm, (C, H, W), kernel_hw=kernel_hw, **kw_args)
        return float((y.to_numpy() * r).sum())
    ref.directional_check(dmath_loss, x, dx.to_numpy(), seed=31)


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_weight_gradients_are_sums_over_the_workers(name):
    """dW and db come out Partial over a RowBlock batch (no communication) and Replicated over a
    Replicated one; either way they remap to the complete Replicated sum. dX keeps the row layout."""
    x, w, b, r, (dx, dw, db), _, _ = _backward(name, "plain3x3", seed=40)
    lay = LAYOUTS[name](N)
    if lay.replicated:
        assert dw.layout.replicated and db.layout.replicated
    else:
        assert dw.layout.partial and db.layout.partial
    assert type(dx.layout) is dmath.RowBlock or dx.layout.replicated
    full = dw.remap(dmath.Replicated()).to_numpy()
    np.testing.assert_allclose(full, dw.to_numpy(), rtol=1e-14)


def test_need_dx_false_and_layouts_agree():
    grads = {}
    for name in ("row", "rep", "col"):
        *_, (dx, dw, db), _, _ = _backward(name, "stride2_pad1", seed=50, need_dx=False)
        assert dx is None
        grads[name] = (dw.to_numpy(), db.to_numpy())
    for name in ("rep", "col"):
        np.testing.assert_allclose(grads[name][0], grads["row"][0], rtol=1e-13, atol=1e-14)
        np.testing.assert_allclose(grads[name][1], grads["row"][1], rtol=1e-13, atol=1e-14)


@pytest.mark.parametrize("wanted", [(True, True, False), (False, True, False), (True, False, True),
                                    (True, False, False), (False, False, True)], ids=str)
@pytest.mark.parametrize("name", ["row", "rep"])
def test_gradients_not_wanted_are_not_made(name, wanted):
    """need_dx / need_dw / need_db False (a first layer, a frozen layer, a convolution without a bias):
    those gradients come back None, the others as when all are made (bit for bit where two runs give
    the same bits; on GPUs a cuDNN plan may sum in another order each run: seen at 1 H200, 1 ulp)."""
    need_dx, need_dw, need_db = wanted
    *_, got, _, _ = _backward(name, "stride2_pad1", seed=55, need_dx=need_dx, need_dw=need_dw, need_db=need_db)
    *_, full, _, _ = _backward(name, "stride2_pad1", seed=55)
    for want, g, f in zip(wanted, got, full):
        assert (g is None) == (not want)
        if want and runs_may_differ():
            np.testing.assert_allclose(g.to_numpy(), f.to_numpy(), rtol=1e-13, atol=1e-13)
        elif want:
            np.testing.assert_array_equal(g.to_numpy(), f.to_numpy())


def test_no_gradient_wanted_makes_no_command():
    *_, got, _, _ = _backward("row", "plain3x3", seed=56, need_dx=False, need_dw=False, need_db=False)
    assert got == (None, None, None)


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_backward_low_precision(dtype):
    x, w, b, r, (dx, dw, db), kw_args, kernel_hw = _backward("row", "stride2_pad1", seed=60)
    lay = dmath.RowBlock()
    low = dmath.nn.conv2d_backward(make(r, lay, dtype), make(x, lay, dtype), make(w, dmath.Replicated(), dtype),
                                   (C, H, W), kernel_hw, **kw_args)
    tol = dict(rtol=1e-2, atol=1e-2) if dtype == "float16" else dict(rtol=1e-5, atol=1e-5)
    for got, want in zip(low, (dx, dw, db)):
        assert got.dtype == dtype
        np.testing.assert_allclose(got.to_numpy().astype(np.float64), want.to_numpy(), **tol)


def test_backward_float16_data_with_float32_weights():
    """dW and dB come in w's dtype at its precision: float16 data with float32 weights gives the float32
    gradient of the float16 values (the cuDNN path wrote dW in float16 first: inf past 65504)."""
    kw_args, kernel_hw = _args("stride2_pad1")
    q16 = lambda a: a.astype(np.float16).astype(np.float64)   # noqa: E731
    # products of about 4096 summed over the samples and pixels: dW is past float16's 65504
    x = q16(64.0 + values((N, C * H * W), 95))
    w = values((K, C * 9), 96).astype(np.float32)
    ho, wo = dmath.nn.conv2d_output_shape((C, H, W), kernel_hw, K, **kw_args)[1:]
    r = q16(64.0 + values((N, K * ho * wo), 97))

    def loss(xx, ww):
        return float((ref.conv2d(xx.reshape(N, C, H, W), ww.reshape(K, C, 3, 3), None, **kw_args)
                      .reshape(N, -1) * r).sum())

    # the loss is linear in x and in w: each gradient entry is the loss at a unit vector (float64)
    unit = lambda shape, j: np.eye(1, int(np.prod(shape)), j).reshape(shape)   # noqa: E731
    want_dw = np.array([loss(x, unit(w.shape, j)) for j in range(w.size)]).reshape(w.shape)
    want_db = r.reshape(N, K, -1).sum(axis=(0, 2)).reshape(1, K)
    want_dx = np.array([loss(unit(x.shape, j), q16(w)) for j in range(x.size)]).reshape(x.shape)
    assert np.abs(want_dw).max() > 65504
    lay = dmath.RowBlock()
    dx, dw, db = dmath.nn.conv2d_backward(make(r, lay, "float16"), make(x, lay, "float16"),
                                          make(w, dmath.Replicated(), "float32"), (C, H, W), kernel_hw, **kw_args)
    assert (dx.dtype, dw.dtype, db.dtype) == ("float16", "float32", "float32")
    np.testing.assert_allclose(dw.to_numpy(), want_dw, rtol=1e-5)
    np.testing.assert_allclose(db.to_numpy(), want_db, rtol=1e-6)
    # dX in the data's dtype, from the weights rounded to it
    np.testing.assert_allclose(dx.to_numpy().astype(np.float64), want_dx, rtol=2e-3, atol=1e-2)


def test_against_torch():
    torch = pytest.importorskip("torch")
    x, w, b, _ = _problem("rect_dilated", seed=70)
    kw_args, (kh, kw) = _args("rect_dilated")
    xt = torch.tensor(x.reshape(N, C, H, W), requires_grad=True)
    wt = torch.tensor(w.reshape(K, C, kh, kw), requires_grad=True)
    bt = torch.tensor(b.reshape(-1), requires_grad=True)
    yt = torch.nn.functional.conv2d(xt, wt, bt, **kw_args)
    r = values(tuple(yt.shape), 71)
    (yt * torch.tensor(r)).sum().backward()
    y = dmath.nn.conv2d(dmath.from_numpy(x), dmath.from_numpy(w, dmath.Replicated()),
                        dmath.from_numpy(b, dmath.Replicated()), (C, H, W), kernel_hw=(kh, kw), **kw_args)
    dx, dw, db = dmath.nn.conv2d_backward(dmath.from_numpy(r.reshape(N, -1)), dmath.from_numpy(x),
                                          dmath.from_numpy(w, dmath.Replicated()), (C, H, W), (kh, kw), **kw_args)
    np.testing.assert_allclose(y.to_numpy(), yt.detach().numpy().reshape(N, -1), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(dx.to_numpy(), xt.grad.numpy().reshape(N, -1), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(dw.to_numpy(), wt.grad.numpy().reshape(K, -1), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(db.to_numpy(), bt.grad.numpy().reshape(1, -1), rtol=1e-12, atol=1e-12)


# ---- grouped convolution ---------------------------------------------------------------------------
GC, GK, GROUPS = 4, 6, 2


@functools.lru_cache(maxsize=None)
def _grouped(seed):
    x = values((N, GC * H * W), seed)
    w = values((GK, GC // GROUPS * 9), seed + 1)
    b = values((1, GK), seed + 2)
    r = values((N, GK * H * W), seed + 3)

    def loss(xx, ww, bb):
        y = ref.conv2d(xx.reshape(N, GC, H, W), ww.reshape(GK, GC // GROUPS, 3, 3), bb.reshape(-1),
                       padding=(1, 1), groups=GROUPS)
        return float((y.reshape(N, -1) * r).sum())
    want = ref.conv2d(x.reshape(N, GC, H, W), w.reshape(GK, GC // GROUPS, 3, 3), b.reshape(-1), padding=(1, 1),
                      groups=GROUPS).reshape(N, -1)
    grads = (ref.numeric_grad(lambda z: loss(z, w, b), x), ref.numeric_grad(lambda z: loss(x, z, b), w),
             ref.numeric_grad(lambda z: loss(x, w, z), b))
    return x, w, b, r, want, grads


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_grouped_forward_and_backward(name):
    """groups=2: each half of the channels meets its own half of the kernels (loops and differences)."""
    x, w, b, r, want, grads = _grouped(90)
    lay, rep = LAYOUTS[name](N), dmath.Replicated()
    y = dmath.nn.conv2d(make(x, lay, "float64"), make(w, rep, "float64"), make(b, rep, "float64"), (GC, H, W),
                        padding=1, groups=GROUPS)
    np.testing.assert_allclose(y.to_numpy(), want, rtol=1e-12, atol=1e-12)
    got = dmath.nn.conv2d_backward(make(r, lay, "float64"), make(x, lay, "float64"), make(w, rep, "float64"),
                                   (GC, H, W), 3, padding=1, groups=GROUPS)
    for g, want_g in zip(got, grads):
        np.testing.assert_allclose(g.to_numpy(), want_g, rtol=1e-6, atol=1e-8)


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_fused_relu_equals_relu_after(name):
    x, w, b, want = _problem("stride2_pad1", seed=95)
    kw_args, kernel_hw = _args("stride2_pad1")
    lay, rep = LAYOUTS[name](N), dmath.Replicated()
    for bias in (b, None):
        bm = make(bias, rep, "float64") if bias is not None else None
        y = dmath.nn.conv2d(make(x, lay, "float64"), make(w, rep, "float64"), bm, (C, H, W),
                            kernel_hw=kernel_hw, activation="relu", **kw_args)
        plain = ref.conv2d(x.reshape(N, C, H, W), w.reshape(K, C, 3, 3), None if bias is None else bias.reshape(-1),
                           **kw_args).reshape(N, -1)
        np.testing.assert_allclose(y.to_numpy(), np.maximum(plain, 0), rtol=1e-12, atol=1e-12)
    with pytest.raises(dmath.DMathError, match="activation"):
        dmath.nn.conv2d(make(x, lay, "float64"), make(w, rep, "float64"), None, (C, H, W), activation="tanh")


def test_grouped_errors():
    x = dmath.from_numpy(values((N, GC * H * W), 1))
    with pytest.raises(dmath.ShapeError, match="groups=3 must divide"):
        dmath.nn.conv2d(x, dmath.zeros((GK, 9)), None, (GC, H, W), groups=3)
    with pytest.raises(dmath.ShapeError, match="groups must be at least 1"):
        dmath.nn.conv2d(x, dmath.zeros((GK, 9)), None, (GC, H, W), groups=0)
    with pytest.raises(dmath.ShapeError, match="C/groups"):
        dmath.nn.conv2d(x, dmath.zeros((GK, GC * 9 + 1)), None, (GC, H, W), groups=2)


def test_explain_conv2d_lists_what_runs():
    reports = dmath.nn.explain_conv2d(print_fn=None)
    assert len(reports) == P
    for r in reports:
        assert "cuDNN" in r["status"]
        for row in r["shapes"]:
            assert row["key"]["direction"] in ("fprop", "dgrad", "wgrad") and "engine" in row
    if dmath.device() == "cpu":
        assert all(r["status"].startswith("cuDNN not used") and not r["shapes"] for r in reports)


ERRORS = {
    "image_mismatch": lambda x, w, b: dmath.nn.conv2d(x, w, b, (C, H, W + 1)),
    "image_not_triple": lambda x, w, b: dmath.nn.conv2d(x, w, b, (C, H * W)),
    "w_not_multiple_of_c": lambda x, w, b: dmath.nn.conv2d(x, dmath.zeros((K, 7)), b, (C, H, W)),
    "w_not_square": lambda x, w, b: dmath.nn.conv2d(x, dmath.zeros((K, C * 6)), b, (C, H, W)),
    "kernel_hw_mismatch": lambda x, w, b: dmath.nn.conv2d(x, w, b, (C, H, W), kernel_hw=(2, 3)),
    "bias_shape": lambda x, w, b: dmath.nn.conv2d(x, w, dmath.zeros((K, 1)), (C, H, W)),
    "kernel_too_big": lambda x, w, b: dmath.nn.conv2d(x, w, b, (C, H, W), dilation=3),
    "zero_stride": lambda x, w, b: dmath.nn.conv2d(x, w, b, (C, H, W), stride=0),
    "negative_padding": lambda x, w, b: dmath.nn.conv2d(x, w, b, (C, H, W), padding=(-1, 0)),
    "float_stride": lambda x, w, b: dmath.nn.conv2d(x, w, b, (C, H, W), stride=1.5),
    "dy_shape": lambda x, w, b: dmath.nn.conv2d_backward(x, x, w, (C, H, W), 3),
}


@pytest.mark.parametrize("case", ERRORS)
def test_errors_raise_on_the_master(case):
    x, w, b, want = _problem("plain3x3", seed=80)
    xm, wm, bm = dmath.from_numpy(x), dmath.from_numpy(w), dmath.from_numpy(b)
    with pytest.raises(dmath.ShapeError):
        ERRORS[case](xm, wm, bm)
    np.testing.assert_allclose(dmath.nn.conv2d(xm, wm, bm, (C, H, W)).to_numpy(), want, rtol=1e-12, atol=1e-12)
