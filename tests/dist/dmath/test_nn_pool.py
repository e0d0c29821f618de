"""dmath.nn.pool2d and pool2d_backward (max and average) in every batch layout."""
import functools

import numpy as np
import pytest

import dmath
import _nn_ref as ref
from _cases import make, values

P = dmath.num_workers()
LAYOUTS = ref.batch_layouts(P)
N, C, H, W = 3, 2, 6, 5

#: name -> (kernel, stride, padding)
GEOMETRIES = {
    "2x2": ((2, 2), (2, 2), (0, 0)),
    "3x3_s1_overlap": ((3, 3), (1, 1), (0, 0)),
    "3x2_s2_pad1": ((3, 2), (2, 1), (1, 1)),
}
MODES = ("max", "average")


def _run(x, name, geom, mode, dtype="float64"):
    kernel, stride, padding = GEOMETRIES[geom]
    return dmath.nn.pool2d(make(x, LAYOUTS[name](N), dtype), (C, H, W), kernel, stride, padding, mode)


def _reference(x, geom, mode):
    kernel, stride, padding = GEOMETRIES[geom]
    return ref.pool2d(x.reshape(N, C, H, W), kernel, stride, padding, mode).reshape(N, -1)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("geom", list(GEOMETRIES))
@pytest.mark.parametrize("name", list(LAYOUTS))
def test_forward(name, geom, mode):
    x = values((N, C * H * W), 1, -2.0, 2.0)
    y, am = _run(x, name, geom, mode)
    want = _reference(x, geom, mode)
    assert y.shape == want.shape
    np.testing.assert_allclose(y.to_numpy(), want, rtol=1e-13, atol=1e-14)
    if mode == "max":
        assert am.shape == y.shape
        kh, kw = GEOMETRIES[geom][0]
        a = am.to_numpy()
        assert np.all((a == np.round(a)) & (a >= 0) & (a < kh * kw))
    else:
        assert am is None


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("mode", MODES)
def test_forward_low_precision(mode, dtype):
    x = values((N, C * H * W), 2, -2.0, 2.0)
    y, _ = _run(x, "row", "3x2_s2_pad1", mode, dtype)
    want = _reference(x.astype(dtype).astype(np.float64), "3x2_s2_pad1", mode)
    assert y.dtype == dtype
    tol = dict(rtol=1e-3, atol=1e-3) if dtype == "float16" else dict(rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(y.to_numpy().astype(np.float64), want, **tol)


@functools.lru_cache(maxsize=None)
def _reference_gradient(geom, mode, seed):
    x = values((N, C * H * W), seed, -2.0, 2.0)
    r = values(_reference(x, geom, mode).shape, seed + 1)
    return ref.numeric_grad(lambda z: float((_reference(z, geom, mode) * r).sum()), x)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("geom", list(GEOMETRIES))
@pytest.mark.parametrize("name", list(LAYOUTS))
def test_backward_against_finite_differences(name, geom, mode):
    seed = 10
    x = values((N, C * H * W), seed, -2.0, 2.0)
    y, am = _run(x, name, geom, mode)
    r = values(y.shape, seed + 1)
    kernel, stride, padding = GEOMETRIES[geom]
    dx = dmath.nn.pool2d_backward(make(r, LAYOUTS[name](N), "float64"), am, (C, H, W), kernel, stride,
                                  padding, mode)
    assert dx.shape == x.shape
    got = dx.to_numpy()
    np.testing.assert_allclose(got, _reference_gradient(geom, mode, seed), rtol=1e-6, atol=1e-8)

    def dmath_loss(z):
        return float((_run(z, name, geom, mode)[0].to_numpy() * r).sum())
    ref.directional_check(dmath_loss, x, got, seed=seed + 2)


def test_row_and_replicated_batches_agree():
    x = values((N, C * H * W), 20)
    r = values((N, C * 3 * 2), 21)
    out = {}
    for name in ("row", "rep"):
        y, am = _run(x, name, "2x2", "max", "float32")
        kernel, stride, padding = GEOMETRIES["2x2"]
        dx = dmath.nn.pool2d_backward(make(r, LAYOUTS[name](N), "float32"), am, (C, H, W), kernel, stride,
                                      padding, "max")
        out[name] = (y.to_numpy(), dx.to_numpy())
    for a, b in zip(out["row"], out["rep"]):
        np.testing.assert_array_equal(a, b)


def test_against_torch():
    torch = pytest.importorskip("torch")
    x = values((N, C * H * W), 30)
    kernel, stride, padding = GEOMETRIES["3x2_s2_pad1"]
    for mode, fn in (("max", torch.nn.functional.max_pool2d), ("average", torch.nn.functional.avg_pool2d)):
        xt = torch.tensor(x.reshape(N, C, H, W), requires_grad=True)
        yt = fn(xt, kernel, stride, padding)
        r = values(tuple(yt.shape), 31)
        (yt * torch.tensor(r)).sum().backward()
        y, am = dmath.nn.pool2d(dmath.from_numpy(x), (C, H, W), kernel, stride, padding, mode)
        dx = dmath.nn.pool2d_backward(dmath.from_numpy(r.reshape(N, -1)), am, (C, H, W), kernel, stride,
                                      padding, mode)
        np.testing.assert_allclose(y.to_numpy(), yt.detach().numpy().reshape(N, -1), rtol=1e-12)
        np.testing.assert_allclose(dx.to_numpy(), xt.grad.numpy().reshape(N, -1), rtol=1e-12, atol=1e-14)


def _relu_output(seed):
    """Relu'd values with many zeros: whole windows of zeros, and windows whose maximum is positive."""
    return np.maximum(values((N, C * H * W), seed, -2.0, 1.0), 0.0)


@pytest.mark.parametrize("channels_last", [False, True])
@pytest.mark.parametrize("dtype", ["float64", "float32", "float16"])
@pytest.mark.parametrize("geom", list(GEOMETRIES))
@pytest.mark.parametrize("name", list(LAYOUTS))
def test_after_relu_applies_the_relus_mask_exactly(name, geom, dtype, channels_last):
    # the fused pool's gradient is bitwise the pool's gradient masked by the relu (where(x, dX, 0))
    x = _relu_output(50)
    kernel, stride, padding = GEOMETRIES[geom]
    xm = make(x, LAYOUTS[name](N), dtype)
    if channels_last:
        xm = dmath.nn.to_channels_last(xm, (C, H, W))
    got = {}
    for fused in (False, True):
        y, am = dmath.nn.pool2d(xm, (C, H, W), kernel, stride, padding, "max", channels_last=channels_last,
                                after_relu=fused)
        dy = make(values(y.shape, 51), LAYOUTS[name](N), dtype)
        dx = dmath.nn.pool2d_backward(dy, am, (C, H, W), kernel, stride, padding, "max",
                                      channels_last=channels_last)
        if not fused:
            dx = dmath.where(xm, dx, 0.0)
        if channels_last:
            dx = dmath.nn.to_channels_first(dx, (C, H, W))
        got[fused] = (y.to_numpy(), am.to_numpy(), dx.to_numpy())
    (y0, am0, dx0), (y1, am1, dx1) = got[False], got[True]
    np.testing.assert_array_equal(y1, y0)
    np.testing.assert_array_equal(am1, np.where(y0 > 0, am0, -1))
    assert (am1 == -1).any() and (am1 >= 0).any(), "the case must hold zero windows and positive ones"
    np.testing.assert_array_equal(dx1, dx0)
    assert np.all(dx1[x.astype(dtype) == 0] == 0)


ERRORS = {
    "bad_mode": (dmath.DMathError, lambda x: dmath.nn.pool2d(x, (C, H, W), 2, mode="min")),
    "after_relu_average": (dmath.DMathError, lambda x: dmath.nn.pool2d(x, (C, H, W), 2, mode="average",
                                                                      after_relu=True)),
    "after_relu_not_bool": (dmath.DMathError, lambda x: dmath.nn.pool2d(x, (C, H, W), 2, after_relu="yes")),
    "image_mismatch": (dmath.ShapeError, lambda x: dmath.nn.pool2d(x, (C, H, H), 2)),
    "padding_over_half": (dmath.ShapeError, lambda x: dmath.nn.pool2d(x, (C, H, W), 2, padding=2)),
    "kernel_too_big": (dmath.ShapeError, lambda x: dmath.nn.pool2d(x, (C, H, W), 7)),
    "max_backward_needs_argmax": (dmath.DMathError,
                                  lambda x: dmath.nn.pool2d_backward(dmath.zeros((N, C * 9)), None, (C, H, W), 2)),
    "dy_shape": (dmath.ShapeError, lambda x: dmath.nn.pool2d_backward(x, x, (C, H, W), 2)),
}


@pytest.mark.parametrize("case", ERRORS)
def test_errors_raise_on_the_master(case):
    x = values((N, C * H * W), 40)
    xm = dmath.from_numpy(x)
    kind, fn = ERRORS[case]
    with pytest.raises(kind):
        fn(xm)
    np.testing.assert_allclose(dmath.nn.pool2d(xm, (C, H, W), 2)[0].to_numpy(), _reference(x, "2x2", "max"))


# ---- ceil mode (PyTorch's): the kernels' own windows past the image, no padded copy ---------------
#: (H, W, kernel, stride, padding) whose ceil-mode output is larger than the floor mode's
CEIL = {"8x7_k3s2": (8, 7, 3, 2, 0), "8x6_k3s2_p1": (8, 6, 3, 2, 1), "9x9_k2s2": (9, 9, 2, 2, 0),
        "12x12_k3s2": (12, 12, 3, 2, 0), "1x3_k2s2_kernel_past_the_image": (1, 3, 2, 2, 0),
        "2x5_k3s2_p1": (2, 5, 3, 2, 1)}


def _ceil_reference(x, h, w, k, s, p, n, c):
    """Ceil mode through floor mode: the images padded with -inf at the bottom and right by the extra
    rows the rule adds (dmath.planning.conv.ceil_extra, checked against PyTorch's sizes in dnn's tests)."""
    from dmath.planning.conv import ceil_extra
    eh, ew = ceil_extra(h, k, s, p), ceil_extra(w, k, s, p)
    big = np.full((n, c, h + eh, w + ew), -np.inf)
    big[:, :, :h, :w] = x.reshape(n, c, h, w)
    return ref.pool2d(big, (k, k), (s, s), (p, p), "max"), (eh, ew)


@pytest.mark.parametrize("channels_last", [False, True])
@pytest.mark.parametrize("geom", list(CEIL))
@pytest.mark.parametrize("name", list(LAYOUTS))
def test_ceil_mode_forward_and_backward(name, geom, channels_last):
    h, w, k, s, p = CEIL[geom]
    n, c = 4, 8
    x = values((n, c * h * w), 31, -2.0, 2.0)
    want, extra = _ceil_reference(x, h, w, k, s, p, n, c)
    assert any(extra)
    _, _, ho, wo = want.shape
    lay = LAYOUTS[name](n)

    def rows(a, hh, ww):        # NCHW rows -> the layout's rows
        a4 = a.reshape(n, c, hh, ww)
        return a4.transpose(0, 2, 3, 1).reshape(n, -1) if channels_last else a4.reshape(n, -1)

    def run(z):
        return dmath.nn.pool2d(make(rows(z, h, w), lay, "float64"), (c, h, w), k, s, p, "max",
                               channels_last=channels_last, ceil_mode=True)
    y, am = run(x)
    np.testing.assert_array_equal(y.to_numpy(), rows(want, ho, wo))
    r = values((n, c * ho * wo), 32)
    dx = dmath.nn.pool2d_backward(make(rows(r, ho, wo), lay, "float64"), am, (c, h, w), k, s, p, "max",
                                  channels_last=channels_last, ceil_mode=True)
    got = dx.to_numpy()
    if channels_last:
        got = got.reshape(n, h, w, c).transpose(0, 3, 1, 2).reshape(n, -1)

    def loss(z):
        out = run(z)[0].to_numpy()
        if channels_last:
            out = out.reshape(n, ho, wo, c).transpose(0, 3, 1, 2).reshape(n, -1)
        return float((out * r).sum())
    ref.directional_check(loss, x, got, seed=33)
    # every output gradient reaches exactly one input (the window's maximum): the sums agree
    np.testing.assert_allclose(got.sum(), r.sum(), rtol=1e-12)


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_ceil_mode_matches_a_padded_floor_pool_bitwise(dtype):
    """The windows past the image read nothing: the same values, positions and gradients as pooling
    the image padded with -inf (how dnn computed ceil mode before), in low precision too."""
    h, w, k, s, p, n, c = 9, 7, 3, 2, 1, 3, 16
    x = values((n, c * h * w), 41, -3.0, 3.0)
    _, (eh, ew) = _ceil_reference(x, h, w, k, s, p, n, c)
    big = np.full((n, h + eh, w + ew, c), -np.inf)
    big[:, :h, :w, :] = x.reshape(n, c, h, w).transpose(0, 2, 3, 1)
    lay = dmath.RowBlock()
    y0, am0 = dmath.nn.pool2d(make(big.reshape(n, -1), lay, dtype), (c, h + eh, w + ew), k, s, p, channels_last=True)
    xl = x.reshape(n, c, h, w).transpose(0, 2, 3, 1).reshape(n, -1)
    y, am = dmath.nn.pool2d(make(xl, lay, dtype), (c, h, w), k, s, p, channels_last=True, ceil_mode=True)
    np.testing.assert_array_equal(y.to_numpy(), y0.to_numpy())
    np.testing.assert_array_equal(am.to_numpy(), am0.to_numpy())
    dy = values(y.shape, 42)
    dx0 = dmath.nn.pool2d_backward(make(dy, lay, dtype), am0, (c, h + eh, w + ew), k, s, p, channels_last=True)
    dx = dmath.nn.pool2d_backward(make(dy, lay, dtype), am, (c, h, w), k, s, p, channels_last=True, ceil_mode=True)
    inside = dx0.to_numpy().reshape(n, h + eh, w + ew, c)[:, :h, :w, :]
    np.testing.assert_array_equal(dx.to_numpy(), inside.reshape(n, -1))


def test_ceil_mode_is_refused_for_average_and_non_bools():
    x = make(values((N, C * H * W), 1), dmath.RowBlock(), "float64")
    with pytest.raises(dmath.DMathError, match="ceil_mode applies to max pooling"):
        dmath.nn.pool2d(x, (C, H, W), 3, 2, mode="average", ceil_mode=True)
    with pytest.raises(dmath.DMathError, match="ceil_mode must be True or False"):
        dmath.nn.pool2d(x, (C, H, W), 3, 2, ceil_mode="yes")


def test_a_backward_call_with_other_window_arguments_says_which():
    x = make(values((N, C * 8 * 7), 5), dmath.RowBlock(), "float64")
    y, am = dmath.nn.pool2d(x, (C, 8, 7), 3, 2, ceil_mode=True)
    with pytest.raises(dmath.ShapeError, match="same kernel, stride, padding and ceil_mode as the forward"):
        dmath.nn.pool2d_backward(y, am, (C, 8, 7), 3, 2)


@pytest.mark.parametrize("ceil_mode", [False, True])
@pytest.mark.parametrize("channels_last", [False, True])
def test_a_window_of_minus_infinity_routes_its_gradient_to_a_pixel_not_the_padding(channels_last, ceil_mode):
    """Only the image's pixels can be a window's maximum: with every value -inf, each window's gradient
    goes to its first pixel (PyTorch's rule); the padding tap at (0, 0) took it, and it was lost."""
    n, c, h, w = 2, 8, 3, 3
    x = np.full((n, c * h * w), -np.inf)
    x[1] = values((1, c * h * w), 51)[0]                  # the second sample ordinary, for contrast

    def rows(a, hh, ww):
        a4 = a.reshape(n, c, hh, ww)
        return a4.transpose(0, 2, 3, 1).reshape(n, -1) if channels_last else a4.reshape(n, -1)
    y, am = dmath.nn.pool2d(make(rows(x, h, w), dmath.RowBlock(), "float64"), (c, h, w), 2, 2, 1,
                            channels_last=channels_last, ceil_mode=ceil_mode)
    ho = y.shape[1] // c
    side = int(round(ho ** 0.5))
    dy = np.ones((n, c * ho))
    dx = dmath.nn.pool2d_backward(make(dy, dmath.RowBlock(), "float64"), am, (c, h, w), 2, 2, 1,
                                  channels_last=channels_last, ceil_mode=ceil_mode).to_numpy()
    if channels_last:
        dx = dx.reshape(n, h, w, c).transpose(0, 3, 1, 2).reshape(n, -1)
    # every output's gradient reaches the input, in both samples
    np.testing.assert_allclose(dx.sum(axis=1), dy.sum(axis=1))
    # the all -inf sample: each window's first pixel (kernel 2, stride 2, padding 1 on 3x3: the windows
    # start at rows -1, 1 (and 3 in ceil mode, past the image: none here), first pixels at 0 and 1)
    first = np.zeros((h, w))
    for oy in range(side):
        for ox in range(side):
            r, q = max(oy * 2 - 1, 0), max(ox * 2 - 1, 0)
            first[r, q] += 1
    np.testing.assert_array_equal(dx[0].reshape(c, h, w), np.broadcast_to(first, (c, h, w)))
    assert np.all(np.isneginf(y.to_numpy()[0]))
