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
