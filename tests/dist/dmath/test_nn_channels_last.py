"""Channels-last image rows: dmath.nn.to_channels_last / to_channels_first, conv2d and pool2d with
channels_last=True against the NCHW reference in every batch layout, and dnn models that run their
convolutions channels-last (the conversions a Program inserts, the same training as NCHW)."""
import numpy as np
import pytest

import dmath
import dnn
import _nn_ref as ref
from _cases import make, values
from dnn import layers as L

P = dmath.num_workers()
LAYOUTS = ref.batch_layouts(P)
N, C, H, W, K = 3, 4, 6, 5, 6
GPU = dmath.device() == "gpu"


def last(a, c, h, w):
    """NCHW rows (n, C*H*W) as channels-last rows (n, H*W*C) (the reference conversion)."""
    return a.reshape(a.shape[0], c, h, w).transpose(0, 2, 3, 1).reshape(a.shape[0], -1)


def first(a, c, h, w):
    return a.reshape(a.shape[0], h, w, c).transpose(0, 3, 1, 2).reshape(a.shape[0], -1)


# ---- conversions --------------------------------------------------------------------------------
@pytest.mark.parametrize("name", list(LAYOUTS))
def test_conversions_are_transposes_and_inverse(name):
    x = values((N, C * H * W), 1)
    xm = make(x, LAYOUTS[name](N), "float64")
    xl = dmath.nn.to_channels_last(xm, (C, H, W))
    # a row layout, each worker's whole samples (another layout is put in RowBlock first)
    assert xl.shape == x.shape and (type(xl.layout) is dmath.RowBlock or xl.layout.replicated)
    np.testing.assert_array_equal(xl.to_numpy(), last(x, C, H, W))
    np.testing.assert_array_equal(dmath.nn.to_channels_first(xl, (C, H, W)).to_numpy(), x)


def test_conversion_errors():
    xm = make(values((N, C * H * W)), dmath.RowBlock(), "float64")
    with pytest.raises(dmath.ShapeError):
        dmath.nn.to_channels_last(xm, (C, H, W + 1))
    with pytest.raises(dmath.ShapeError):
        dmath.nn.to_channels_first(xm, (C, H))


# ---- convolution ------------------------------------------------------------------------------
#: name -> (kernel_hw, stride, padding, dilation, groups)
CONVS = {
    "3x3_pad1": ((3, 3), (1, 1), (1, 1), (1, 1), 1),
    "rect_stride_dilated": ((2, 3), (2, 1), (1, 0), (1, 2), 1),
    "grouped": ((3, 3), (1, 1), (0, 0), (1, 1), 2),
}


def _conv_problem(geom, seed):
    """(conv2d keyword arguments, x, w) of geometry `geom`, the values drawn from `seed`."""
    kernel_hw, stride, padding, dilation, groups = CONVS[geom]
    kw = dict(kernel_hw=kernel_hw, stride=stride, padding=padding, dilation=dilation, groups=groups)
    x, w = values((N, C * H * W), seed), values((K, C // groups * kernel_hw[0] * kernel_hw[1]), seed + 1)
    return kw, x, w


@pytest.mark.parametrize("relu", [False, True])
@pytest.mark.parametrize("geom", list(CONVS))
@pytest.mark.parametrize("name", list(LAYOUTS))
def test_conv2d_channels_last_forward(name, geom, relu):
    kw, x, w = _conv_problem(geom, 2)
    (kh, kwd), g = kw["kernel_hw"], kw["groups"]
    b = values((1, K), 4)
    want = ref.conv2d(x.reshape(N, C, H, W), w.reshape(K, C // g, kh, kwd), b.reshape(-1), kw["stride"],
                      kw["padding"], kw["dilation"], g)
    if relu:
        want = np.maximum(want, 0)
    _, ho, wo = want.shape[1:]
    rep = dmath.Replicated()
    xl = make(last(x, C, H, W), LAYOUTS[name](N), "float64")
    y = dmath.nn.conv2d(xl, make(w, rep, "float64"), make(b, rep, "float64"), (C, H, W),
                        activation="relu" if relu else None, channels_last=True, **kw)
    np.testing.assert_allclose(y.to_numpy(), last(want.reshape(N, -1), K, ho, wo), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("need_dx", [True, False])
@pytest.mark.parametrize("geom", list(CONVS))
@pytest.mark.parametrize("name", list(LAYOUTS))
def test_conv2d_channels_last_backward_equals_nchw(name, geom, need_dx):
    kw, x, w = _conv_problem(geom, 5)
    ko, ho, wo = dmath.nn.conv2d_output_shape((C, H, W), kw["kernel_hw"], K, kw["stride"], kw["padding"],
                                              kw["dilation"])
    dy = values((N, ko * ho * wo), 7)
    lay, rep = LAYOUTS[name](N), dmath.Replicated()
    wm = make(w, rep, "float64")
    got = dmath.nn.conv2d_backward(make(last(dy, ko, ho, wo), lay, "float64"), make(last(x, C, H, W), lay, "float64"),
                                   wm, (C, H, W), need_dx=need_dx, channels_last=True, **kw)
    want = dmath.nn.conv2d_backward(make(dy, lay, "float64"), make(x, lay, "float64"), wm, (C, H, W),
                                    need_dx=need_dx, **kw)
    if need_dx:
        np.testing.assert_allclose(got[0].to_numpy(), last(want[0].to_numpy(), C, H, W), rtol=1e-12, atol=1e-12)
    else:
        assert got[0] is None
    for a, b in zip(got[1:], want[1:]):
        assert a.layout == b.layout
        np.testing.assert_allclose(a.to_numpy(), b.to_numpy(), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("dtype,rtol", [("float32", 1e-4), ("float16", 2e-2)])
def test_conv2d_channels_last_low_precision_matches_nchw(dtype, rtol):
    # on a GPU the two run different cuDNN kernels (NHWC against NCHW): equal up to rounding
    x, w, b = values((8, C * 9 * 9), 8), values((K, C * 9), 9), values((1, K), 10)
    rep = dmath.Replicated()
    wm, bm = make(w, rep, dtype), make(b, rep, dtype)
    xm = make(x, dmath.RowBlock(), dtype)
    y = dmath.nn.conv2d(xm, wm, bm, (C, 9, 9), padding=1, activation="relu").to_numpy().astype(np.float64)
    yl = dmath.nn.conv2d(dmath.nn.to_channels_last(xm, (C, 9, 9)), wm, bm, (C, 9, 9), padding=1, activation="relu",
                         channels_last=True)
    np.testing.assert_allclose(first(yl.to_numpy().astype(np.float64), K, 9, 9), y, rtol=rtol, atol=rtol)


# ---- pooling ----------------------------------------------------------------------------------
POOLS = {"2x2": ((2, 2), (2, 2), (0, 0)), "3x2_s2_pad1": ((3, 2), (2, 1), (1, 1)), "3x3_s2": ((3, 3), (2, 2), (0, 0))}


@pytest.mark.parametrize("mode", ["max", "average"])
@pytest.mark.parametrize("geom", list(POOLS))
@pytest.mark.parametrize("name", list(LAYOUTS))
def test_pool2d_channels_last_forward_and_backward(name, geom, mode):
    kernel, stride, padding = POOLS[geom]
    x = values((N, C * H * W), 11)
    lay = LAYOUTS[name](N)
    want = ref.pool2d(x.reshape(N, C, H, W), kernel, stride, padding, mode)
    _, ho, wo = want.shape[1:]
    y, am = dmath.nn.pool2d(make(last(x, C, H, W), lay, "float64"), (C, H, W), kernel, stride, padding, mode,
                            channels_last=True)
    np.testing.assert_allclose(y.to_numpy(), last(want.reshape(N, -1), C, ho, wo), rtol=1e-12, atol=1e-12)
    y0, am0 = dmath.nn.pool2d(make(x, lay, "float64"), (C, H, W), kernel, stride, padding, mode)
    if mode == "max":
        np.testing.assert_array_equal(am.to_numpy(), last(am0.to_numpy(), C, ho, wo))
    dy = values((N, C * ho * wo), 12)
    dx = dmath.nn.pool2d_backward(make(last(dy, C, ho, wo), lay, "float64"), am, (C, H, W), kernel, stride, padding,
                                  mode, channels_last=True)
    dx0 = dmath.nn.pool2d_backward(make(dy, lay, "float64"), am0, (C, H, W), kernel, stride, padding, mode)
    np.testing.assert_allclose(dx.to_numpy(), last(dx0.to_numpy(), C, H, W), rtol=1e-12, atol=1e-12)


#: (kernel, stride, padding, ceil_mode) of the bitwise comparisons: the windows the GPU's vector kernels
#: compile in (3x3 at stride 1 and 2, 2x2 at stride 2; GoogLeNet's ceil-mode pool), a 3x3 window at a
#: stride only the forward compiles in, and windows of any shape (read from the arguments)
BITWISE_POOLS = {"3x3_s2_pad1": ((3, 3), (2, 2), (1, 1), False), "3x3_s1_pad1": ((3, 3), (1, 1), (1, 1), False),
                 "3x3_s2_ceil": ((3, 3), (2, 2), (0, 0), True), "2x2_s2": ((2, 2), (2, 2), (0, 0), False),
                 "3x3_s3": ((3, 3), (3, 3), (0, 0), False), "3x2_s21_pad1": ((3, 2), (2, 1), (1, 1), False)}


def _bitwise_cases():
    """(dtype, channels, mode, after_relu, geometry): every dtype, vector width and mode over the two
    windows of Inception modules and ResNet's stem, one width for the other windows."""
    for geom in BITWISE_POOLS:
        ceil_mode = BITWISE_POOLS[geom][3]
        for dtype in ("float64", "float32", "float16"):
            for channels in ((16, 12, 6) if geom in ("3x3_s2_pad1", "3x3_s1_pad1") else (16,)):
                for mode, after_relu in (("max", False), ("max", True), ("average", False)):
                    if not (ceil_mode and mode == "average"):
                        yield pytest.param(dtype, channels, mode, after_relu, geom,
                                           id=f"{geom}-{dtype}-{channels}-{mode}{'-after_relu' if after_relu else ''}")


@pytest.mark.parametrize("dtype, channels, mode, after_relu, geom", list(_bitwise_cases()))
def test_pool2d_channels_last_is_bitwise_the_nchw_pool(dtype, channels, mode, after_relu, geom):
    """Channel counts that a GPU's vector kernels take 8, 4 or 2 at a time (or one at a time), over
    windows they compile in and windows they read from their arguments: the same bits as the NCHW
    kernels, forward, argmax and backward (padding and overlapping windows)."""
    kernel, stride, padding, ceil_mode = BITWISE_POOLS[geom]
    c, h, w, n = channels, 10, 7, 5      # 10 rows: a ceil-mode pool has a window more than a floor one
    x = values((n, c * h * w), 21)
    lay = dmath.RowBlock()
    y0, am0 = dmath.nn.pool2d(make(x, lay, dtype), (c, h, w), kernel, stride, padding, mode, after_relu=after_relu,
                              ceil_mode=ceil_mode)
    y, am = dmath.nn.pool2d(make(last(x, c, h, w), lay, dtype), (c, h, w), kernel, stride, padding, mode,
                            channels_last=True, after_relu=after_relu, ceil_mode=ceil_mode)
    ho = (h + 2 * padding[0] - kernel[0] + (stride[0] - 1 if ceil_mode else 0)) // stride[0] + 1
    wo = (w + 2 * padding[1] - kernel[1]) // stride[1] + 1
    assert y0.shape == (n, c * ho * wo)
    np.testing.assert_array_equal(y.to_numpy(), last(y0.to_numpy(), c, ho, wo))
    if mode == "max":
        np.testing.assert_array_equal(am.to_numpy(), last(am0.to_numpy(), c, ho, wo))
    dy = values((n, c * ho * wo), 22)
    dx0 = dmath.nn.pool2d_backward(make(dy, lay, dtype), am0, (c, h, w), kernel, stride, padding, mode,
                                   ceil_mode=ceil_mode)
    dx = dmath.nn.pool2d_backward(make(last(dy, c, ho, wo), lay, dtype), am, (c, h, w), kernel, stride, padding,
                                  mode, channels_last=True, ceil_mode=ceil_mode)
    np.testing.assert_array_equal(dx.to_numpy(), last(dx0.to_numpy(), c, h, w))


@pytest.mark.parametrize("after_relu", [False, True])
@pytest.mark.parametrize("geom", ["3x3_s1_pad1", "3x3_s2_ceil", "3x2_s21_pad1"])
def test_pool2d_channels_last_float16_ties_nan_and_signed_zeros(geom, after_relu):
    """Ties (the first maximum wins), -0 against +0, -inf windows and NaN (the first NaN wins and
    stays) in float16: the channels-last kernels (on a GPU, the half-pair comparisons) give the NCHW
    kernels' values, signs of zero, positions and gradients."""
    kernel, stride, padding, ceil_mode = BITWISE_POOLS[geom]
    c, h, w, n = 16, 10, 7, 3
    pick = np.random.default_rng(5).integers(0, 7, (n, c * h * w))
    x = np.array([-np.inf, -1.0, -0.0, 0.0, 1.0, 2.0, np.nan])[pick]
    lay = dmath.RowBlock()
    y0, am0 = dmath.nn.pool2d(make(x, lay, "float16"), (c, h, w), kernel, stride, padding, "max",
                              after_relu=after_relu, ceil_mode=ceil_mode)
    y, am = dmath.nn.pool2d(make(last(x, c, h, w), lay, "float16"), (c, h, w), kernel, stride, padding, "max",
                            channels_last=True, after_relu=after_relu, ceil_mode=ceil_mode)
    got, want = y.to_numpy(), y0.to_numpy()
    ho = (h + 2 * padding[0] - kernel[0] + (stride[0] - 1 if ceil_mode else 0)) // stride[0] + 1
    wo = (w + 2 * padding[1] - kernel[1]) // stride[1] + 1
    want = last(want, c, ho, wo)
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(np.signbit(got), np.signbit(want))
    assert np.isnan(want).any() and (want == 0).any(), "the case has NaN and zero maxima"
    np.testing.assert_array_equal(am.to_numpy(), last(am0.to_numpy(), c, ho, wo))
    dy = values((n, c * ho * wo), 23)
    dx0 = dmath.nn.pool2d_backward(make(dy, lay, "float16"), am0, (c, h, w), kernel, stride, padding, "max",
                                   ceil_mode=ceil_mode)
    dx = dmath.nn.pool2d_backward(make(last(dy, c, ho, wo), lay, "float16"), am, (c, h, w), kernel, stride,
                                  padding, "max", channels_last=True, ceil_mode=ceil_mode)
    np.testing.assert_array_equal(dx.to_numpy(), last(dx0.to_numpy(), c, h, w))


# ---- dnn ----------------------------------------------------------------------------------------
def _cnn(channels_last, dtype="float64"):
    dmath.random.seed(3)
    return dnn.Sequential([L.Input((3, 12, 12)), L.Conv2D(6, 3, padding=1, activation="relu"), L.Pool2D(2),
                           L.Conv2D(8, 3), L.Activation("relu"), L.Pool2D(2, mode="average"), L.Activation("tanh"),
                           L.Flatten(), L.Dense(16, activation="relu"), L.Dropout(0.2), L.Dense(4),
                           L.Output("softmax")],
                          optimizer=dnn.optim.SGD(lr=0.05, momentum=0.9), dtype=dtype, channels_last=channels_last)


def test_a_channels_last_model_trains_as_the_nchw_one():
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((48, 3 * 12 * 12)), rng.integers(0, 4, 48)
    runs = []
    for cl in (False, True):
        model = _cnn(cl)
        hist = model.fit(x, y, batch_size=12, epochs=2, verbose=0)
        runs.append((hist.history["loss"], model.get_weights(), model.predict(x[:6])))
    # one conversion into channels-last before the first convolution, one back before Flatten
    fmts = [n.fn.name for n in model._last_program().order if n.fn is not None and n.fn.name.startswith("to_channels")]
    assert fmts == ["to_channels_last", "to_channels_first"]
    tol = 1e-9 if GPU else 1e-12          # cuDNN's NHWC and NCHW kernels sum in different orders
    np.testing.assert_allclose(runs[1][0], runs[0][0], rtol=tol)
    for a, b in zip(runs[1][1], runs[0][1]):
        np.testing.assert_allclose(a, b, rtol=tol, atol=tol)
    np.testing.assert_allclose(runs[1][2], runs[0][2], rtol=tol, atol=tol)


def test_channels_last_rows_are_refused_where_they_would_be_misread():
    x = dnn.graph.Placeholder((4, 2 * 3 * 3), "float64", name="x", sample_shape=(2, 3, 3))
    xl = dnn.ops.to_channels_last(x)
    assert xl.channels_last and not dnn.ops.to_channels_first(xl).channels_last
    assert dnn.ops.relu(xl).channels_last          # elementwise: either order
    with pytest.raises(dnn.GraphError, match="channels-last"):
        dnn.ops.softmax(xl)
    with pytest.raises(dnn.ShapeError):
        dnn.ops.to_channels_last(xl)
    with pytest.raises(dnn.ConfigError):
        dnn.Sequential([L.Input((1, 4, 4)), L.Flatten(), L.Dense(2)], channels_last="yes")


def _pool_cnn(channels_last):
    dmath.random.seed(4)
    return dnn.Sequential([L.Input((3, 16, 16)), L.Conv2D(6, 3, padding=1, activation="relu"), L.Pool2D(2),
                           L.Conv2D(8, 3, activation="relu"), L.Conv2D(8, 3), L.Activation("relu"),
                           L.Pool2D(2, stride=1, mode="max"), L.Conv2D(4, 1, activation="relu"),
                           L.Pool2D(2, mode="average"), L.Flatten(), L.Dense(4), L.Output("softmax")],
                          optimizer=dnn.optim.SGD(lr=0.05, momentum=0.9), dtype="float64",
                          channels_last=channels_last)


@pytest.mark.parametrize("channels_last", [False, True])
def test_a_max_pool_after_a_relu_convolution_applies_the_relus_mask(channels_last, monkeypatch):
    # the fold (dnn.ops.fold_relu_masks) changes which kernel masks the gradient, never the numbers
    rng = np.random.default_rng(1)
    x, y = rng.standard_normal((48, 3 * 16 * 16)), rng.integers(0, 4, 48)
    runs = []
    for fold in (False, True):
        with monkeypatch.context() as m:
            if not fold:
                m.setattr(dnn.training.programs, "fold_relu_masks", lambda order, keep=(): None)
            model = _pool_cnn(channels_last)
            hist = model.fit(x, y, batch_size=12, epochs=2, verbose=0)
        order = model._last_program().order
        pools = [n.fn for n in order if isinstance(n.fn, dnn.ops.Pool2D)]
        convs = [n.fn for n in order if isinstance(n.fn, dnn.ops.Conv2D)]
        runs.append((hist.history["loss"], model.get_weights(), [p.after_relu for p in pools],
                     [(c.gradient_masked, c.saves_output) for c in convs]))
    (loss0, w0, pools0, convs0), (loss1, w1, pools1, convs1) = runs
    assert pools0 == [False, False, False] and convs0 == [(False, True)] * 4
    # the first pool reads a relu-fused convolution; the second the convolution that absorbed an
    # Activation layer; the third is an average pool, which cannot carry the mask; the second convolution
    # feeds another convolution
    assert pools1 == [True, True, False]
    assert convs1 == [(True, False), (False, True), (True, False), (False, True)]
    tol = 1e-9 if GPU else 0.0
    np.testing.assert_allclose(loss1, loss0, rtol=tol, atol=tol)
    for a, b in zip(w1, w0):
        np.testing.assert_allclose(a, b, rtol=tol, atol=tol)


# ---- three channels (an RGB first layer): plain or padded to four on a GPU -------------------------
@pytest.mark.parametrize("dtype,tol", [("float64", 1e-12), ("float32", 1e-5), ("float16", 2e-2)])
@pytest.mark.parametrize("padded", [False, True])
@pytest.mark.parametrize("relu", [False, True])
def test_three_channels_give_the_same_results_padded_or_not(dtype, tol, padded, relu, monkeypatch):
    from dmath.ops.nn import conv as nn_conv

    class Forced(dict):
        """Worker 0's choice (it runs in this process), whatever the timing says; the others time it."""
        def get(self, key, default=None):
            return (padded, 0.0, 0.0)
    monkeypatch.setattr(nn_conv, "_PADDED", Forced())
    c = 3
    x, w, b = values((N, c * H * W), 60), values((K, c * 9), 61), values((1, K), 62)
    want = ref.conv2d(x.reshape(N, c, H, W), w.reshape(K, c, 3, 3), b.reshape(-1), (1, 1), (1, 1), (1, 1), 1)
    if relu:
        want = np.maximum(want, 0)
    rep = dmath.Replicated()
    xl = make(last(x, c, H, W), dmath.RowBlock(), dtype)
    y = dmath.nn.conv2d(xl, make(w, rep, dtype), make(b, rep, dtype), (c, H, W), kernel_hw=(3, 3), padding=(1, 1),
                        activation="relu" if relu else None, channels_last=True)
    assert y.dtype == dtype
    np.testing.assert_allclose(y.to_numpy().astype(np.float64), last(want.reshape(N, -1), K, H, W), rtol=tol, atol=tol)
    # the weight gradient (padded to 8 channels when forced) against the NCHW one
    dy = values((N, K * H * W), 65)
    geo = ((3, 3), (1, 1), (1, 1))
    _, dw, db = dmath.nn.conv2d_backward(make(last(dy, K, H, W), dmath.RowBlock(), dtype), xl, make(w, rep, dtype),
                                         (c, H, W), *geo, need_dx=False, channels_last=True)
    _, dw0, db0 = dmath.nn.conv2d_backward(make(dy, dmath.RowBlock(), dtype), make(x, dmath.RowBlock(), dtype),
                                           make(w, rep, dtype), (c, H, W), *geo, need_dx=False)
    scale = np.abs(dw0.to_numpy()).max()
    np.testing.assert_allclose(dw.to_numpy() / scale, dw0.to_numpy() / scale, rtol=tol, atol=tol)
    np.testing.assert_allclose(db.to_numpy(), db0.to_numpy(), rtol=tol, atol=tol * np.abs(db0.to_numpy()).max())


def test_the_padding_choice_is_timed_once_and_explained():
    c, n = 3, 8
    x = make(last(values((n, c * H * W), 63), c, H, W), dmath.RowBlock(), "float32")
    w = make(values((K, c * 9), 64), dmath.Replicated(), "float32")
    first_y = dmath.nn.conv2d(x, w, None, (c, H, W), kernel_hw=(3, 3), padding=(1, 1), channels_last=True)
    again = dmath.nn.conv2d(x, w, None, (c, H, W), kernel_hw=(3, 3), padding=(1, 1), channels_last=True)
    np.testing.assert_array_equal(again.to_numpy(), first_y.to_numpy())
    lines = []
    reports = dmath.nn.explain_conv2d(print_fn=lines.append)
    assert len(reports) == P and lines
    untimed = dmath.tuning.mode() == "off"
    for r in reports:
        if r["status"].startswith("cuDNN not used"):
            assert r["padded"] == []            # im2col: nothing to pad
            continue
        mine = [p for p in r["padded"] if p["key"]["c"] == c and p["key"]["h"] == H and p["key"]["k"] == K]
        assert len(mine) >= 1, r["padded"]
        for p in mine:
            if untimed:     # DMATH_TUNE=off: padded where cuDNN takes it, neither way timed
                assert p["plain_ms"] is None and p["padded_ms"] is None
                assert any("untimed" in line for line in lines), lines
                continue
            assert p["plain_ms"] > 0 and (p["padded_ms"] is None or p["padded_ms"] > 0)
            assert p["padded"] == (p["padded_ms"] is not None and p["padded_ms"] < p["plain_ms"])
