"""dmath.nn.batchnorm and batchnorm_backward (1d and 2d, training and eval) in every batch layout:
statistics over the whole batch equal the one-worker result."""
import functools

import numpy as np
import pytest

import dmath
import _nn_ref as ref
from _cases import make, values
from dmath.layout import distribution

P = dmath.num_workers()
LAYOUTS = ref.batch_layouts(P)
N = 5
#: kind -> (image_shape or None, channels, features)
KINDS = {"1d": (None, 4, 4), "2d": ((3, 2, 3), 3, 18)}
EPS, MOMENTUM = 1e-5, 0.1


def _params(kind, seed):
    _, c, f = KINDS[kind]
    x = values((N, f), seed, -1.0, 3.0)           # a non-zero mean
    gamma = values((1, c), seed + 1, 0.5, 1.5)
    beta = values((1, c), seed + 2)
    rm = values((1, c), seed + 3)
    rv = values((1, c), seed + 4, 0.5, 2.0)
    return x, gamma, beta, rm, rv


def _group(lay):
    return distribution(lay, (N, 1), P).group


def _run(kind, name, seed, training=True, dtype="float64"):
    image, c, f = KINDS[kind]
    x, gamma, beta, rm, rv = _params(kind, seed)
    lay = LAYOUTS[name](N)
    rep = dmath.Replicated(group=_group(lay))
    mats = [make(x, lay, dtype)] + [make(a, rep, dtype) for a in (gamma, beta, rm, rv)]
    y, saved = dmath.nn.batchnorm(*mats, image_shape=image, training=training, momentum=MOMENTUM, eps=EPS)
    return (x, gamma, beta, rm, rv), mats, y, saved


@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("name", list(LAYOUTS))
def test_training_forward_and_running_statistics(name, kind):
    (x, gamma, beta, rm, rv), mats, y, saved = _run(kind, name, seed=1)
    _, c, _ = KINDS[kind]
    want, mean, var = ref.batchnorm(x, gamma, beta, c, EPS)
    np.testing.assert_allclose(y.to_numpy(), want, rtol=1e-12, atol=1e-12)
    count = x.size // c
    np.testing.assert_allclose(mats[3].to_numpy(), (1 - MOMENTUM) * rm + MOMENTUM * mean, rtol=1e-13)
    np.testing.assert_allclose(mats[4].to_numpy(), (1 - MOMENTUM) * rv + MOMENTUM * var * count / (count - 1),
                               rtol=1e-13)
    stats = saved.stats.to_numpy()
    np.testing.assert_allclose(stats, np.stack([mean, 1 / np.sqrt(var + EPS)]), rtol=1e-12)
    assert saved.training


@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("name", list(LAYOUTS))
def test_eval_uses_running_statistics(name, kind):
    (x, gamma, beta, rm, rv), mats, y, saved = _run(kind, name, seed=2, training=False)
    image, c, _ = KINDS[kind]
    s = x.reshape(N, c, -1)
    want = (s - rm.reshape(-1, 1)) / np.sqrt(rv.reshape(-1, 1) + EPS) * gamma.reshape(-1, 1) + beta.reshape(-1, 1)
    np.testing.assert_allclose(y.to_numpy(), want.reshape(N, -1), rtol=1e-12, atol=1e-12)
    np.testing.assert_array_equal(mats[3].to_numpy(), rm)      # untouched in eval mode
    np.testing.assert_array_equal(mats[4].to_numpy(), rv)
    assert not saved.training


def test_statistics_equal_the_one_worker_result():
    """The batch spread over every worker gives what one worker holding it all computes."""
    results = []
    for lay in (dmath.RowBlock(), dmath.RowBlock(group=[0]), dmath.RowBlock(sizes=(0,) * (P - 1) + (N,))):
        x, gamma, beta, rm, rv = _params("2d", 3)
        rep = dmath.Replicated(group=_group(lay))
        mats = [make(x, lay, "float32")] + [make(a, rep, "float32") for a in (gamma, beta, rm, rv)]
        y, saved = dmath.nn.batchnorm(*mats, image_shape=(3, 2, 3))
        dy = make(values(x.shape, 4), lay, "float32")
        grads = dmath.nn.batchnorm_backward(dy, mats[0], mats[1], saved, image_shape=(3, 2, 3))
        results.append([y.to_numpy(), saved.stats.to_numpy(), mats[3].to_numpy(), mats[4].to_numpy()]
                       + [g.to_numpy() for g in grads])
    for other in results[1:]:
        for a, b in zip(results[0], other):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


@functools.lru_cache(maxsize=None)
def _reference_gradients(kind, seed):
    x, gamma, beta, _, _ = _params(kind, seed)
    _, c, _ = KINDS[kind]
    r = values(x.shape, seed + 9)

    def loss(xx, gg, bb):
        return float((ref.batchnorm(xx, gg, bb, c, EPS)[0] * r).sum())
    return r, (ref.numeric_grad(lambda z: loss(z, gamma, beta), x), ref.numeric_grad(lambda z: loss(x, z, beta), gamma),
               ref.numeric_grad(lambda z: loss(x, gamma, z), beta))


@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("name", list(LAYOUTS))
def test_training_backward_against_finite_differences(name, kind):
    seed = 5
    r, want = _reference_gradients(kind, seed)
    (x, gamma, beta, _, _), mats, y, saved = _run(kind, name, seed)
    image = KINDS[kind][0]
    lay = LAYOUTS[name](N)
    grads = dmath.nn.batchnorm_backward(make(r, lay, "float64"), mats[0], mats[1], saved, image_shape=image)
    for g, w in zip(grads, want):
        np.testing.assert_allclose(g.to_numpy(), w, rtol=1e-5, atol=1e-7)
    assert grads[1].layout.replicated and grads[2].layout.replicated

    def dmath_loss(z):
        zm = make(z, lay, "float64")
        out, _ = dmath.nn.batchnorm(zm, *mats[1:], image_shape=image, training=True, momentum=0.0, eps=EPS)
        return float((out.to_numpy() * r).sum())
    ref.directional_check(dmath_loss, x, grads[0].to_numpy(), seed=seed + 1, rtol=1e-5)


@pytest.mark.parametrize("kind", list(KINDS))
def test_eval_backward(kind):
    (x, gamma, beta, rm, rv), mats, y, saved = _run(kind, "row", seed=6, training=False)
    _, c, _ = KINDS[kind]
    r = values(x.shape, 7)
    dx, dg, db = dmath.nn.batchnorm_backward(make(r, dmath.RowBlock(), "float64"), mats[0], mats[1], saved,
                                             image_shape=KINDS[kind][0])
    inv = 1 / np.sqrt(rv.reshape(-1, 1) + EPS)
    r3, x3 = r.reshape(N, c, -1), x.reshape(N, c, -1)
    xhat = (x3 - rm.reshape(-1, 1)) * inv
    np.testing.assert_allclose(dx.to_numpy(), (r3 * gamma.reshape(-1, 1) * inv).reshape(N, -1), rtol=1e-12)
    np.testing.assert_allclose(dg.to_numpy(), (r3 * xhat).sum(axis=(0, 2))[None, :], rtol=1e-12)
    np.testing.assert_allclose(db.to_numpy(), r3.sum(axis=(0, 2))[None, :], rtol=1e-12)


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_low_precision(dtype):
    (x, gamma, beta, rm, rv), mats, y, saved = _run("2d", "row", seed=8, dtype=dtype)
    q = lambda a: a.astype(dtype).astype(np.float64)   # noqa: E731
    want, _, _ = ref.batchnorm(q(x), q(gamma), q(beta), 3, EPS)
    assert y.dtype == dtype and saved.stats.dtype == "float32"
    tol = dict(rtol=5e-3, atol=5e-3) if dtype == "float16" else dict(rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(y.to_numpy().astype(np.float64), want, **tol)


def test_row_and_replicated_batches_agree():
    out = {}
    for name in ("row", "rep"):
        (x, *_), mats, y, saved = _run("2d", name, seed=9, dtype="float32")
        grads = dmath.nn.batchnorm_backward(make(values(x.shape, 10), LAYOUTS[name](N), "float32"), mats[0],
                                            mats[1], saved, image_shape=KINDS["2d"][0])
        out[name] = [y.to_numpy()] + [g.to_numpy() for g in grads]
    for a, b in zip(out["row"], out["rep"]):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_against_torch():
    torch = pytest.importorskip("torch")
    x, gamma, beta, rm, rv = _params("2d", 11)
    bn = torch.nn.BatchNorm2d(3, eps=EPS, momentum=MOMENTUM).double()
    with torch.no_grad():
        bn.weight.copy_(torch.tensor(gamma.reshape(-1)))
        bn.bias.copy_(torch.tensor(beta.reshape(-1)))
        bn.running_mean.copy_(torch.tensor(rm.reshape(-1)))
        bn.running_var.copy_(torch.tensor(rv.reshape(-1)))
    xt = torch.tensor(x.reshape(N, 3, 2, 3), requires_grad=True)
    r = values(x.shape, 12)
    (bn(xt) * torch.tensor(r.reshape(N, 3, 2, 3))).sum().backward()
    (_, _, _, _, _), mats, y, saved = _run("2d", "row", seed=11)
    dx, dg, db = dmath.nn.batchnorm_backward(dmath.from_numpy(r), mats[0], mats[1], saved, image_shape=(3, 2, 3))
    np.testing.assert_allclose(mats[3].to_numpy()[0], bn.running_mean.numpy(), rtol=1e-12)
    np.testing.assert_allclose(mats[4].to_numpy()[0], bn.running_var.numpy(), rtol=1e-12)
    np.testing.assert_allclose(dx.to_numpy(), xt.grad.numpy().reshape(N, -1), rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(dg.to_numpy()[0], bn.weight.grad.numpy(), rtol=1e-9)
    np.testing.assert_allclose(db.to_numpy()[0], bn.bias.grad.numpy(), rtol=1e-9)


def test_errors_raise_on_the_master():
    (x, gamma, beta, rm, rv), mats, _, _ = _run("1d", "row", seed=13)
    xm, g, b, m, v = mats
    cases = [
        (dmath.ShapeError, lambda: dmath.nn.batchnorm(xm, dmath.ones((1, 3)), b, m, v)),
        (dmath.ShapeError, lambda: dmath.nn.batchnorm(xm, g, b, m, v, image_shape=(3, 1, 1))),
        (dmath.ShapeError, lambda: dmath.nn.batchnorm(xm[0:1, :], g, b, m, v)),   # one value per feature
        (dmath.LayoutError, lambda: dmath.nn.batchnorm(xm, g, b, m.remap(dmath.RowBlock()), v)),
        (dmath.DMathError, lambda: dmath.nn.batchnorm(xm, g, b, m, v, eps=0.0)),
        (dmath.DMathError, lambda: dmath.nn.batchnorm(xm, g, b, m, v, momentum=1.5)),
        (dmath.DMathError, lambda: dmath.nn.batchnorm_backward(xm, xm, g, (m, True))),
    ]
    before = m.to_numpy()
    for kind, fn in cases:
        with pytest.raises(kind):
            fn()
    np.testing.assert_array_equal(m.to_numpy(), before)
    y, _ = dmath.nn.batchnorm(xm, g, b, m, v, training=False)
    assert y.shape == x.shape


# ---- a residual added before the relu, in the same kernel ----------------------------------------
def _fused_reference(x, gamma, beta, r, rm, rv, training, relu, last):
    """act(gamma * x_hat + beta + r) in NumPy, channels-last rows (H, W, C) or NCHW ones."""
    _, c, _ = KINDS["2d"]
    to3 = (lambda a: a.reshape(N, -1, c).transpose(0, 2, 1)) if last else (lambda a: a.reshape(N, c, -1))
    x3 = to3(x)
    mean, var = (x3.mean(axis=(0, 2)), x3.var(axis=(0, 2))) if training else (rm.reshape(-1), rv.reshape(-1))
    y3 = (x3 - mean[:, None]) / np.sqrt(var[:, None] + EPS) * gamma.reshape(-1, 1) + beta.reshape(-1, 1) + to3(r)
    y3 = np.maximum(y3, 0.0) if relu else y3
    return (y3.transpose(0, 2, 1) if last else y3).reshape(N, -1)


@functools.lru_cache(maxsize=None)
def _fused_case(training, relu, last):
    x, gamma, beta, rm, rv = _params("2d", 21)
    r = values(x.shape, 22)
    w = values(x.shape, 23)             # the loss sum(Y * w)
    arrays = [x, gamma, beta, r]

    def loss(k, z):
        a = list(arrays)
        a[k] = z
        return float((_fused_reference(*a, rm, rv, training, relu, last) * w).sum())
    want = [ref.numeric_grad(functools.partial(loss, k), arrays[k]) for k in range(4)]
    return (x, gamma, beta, r, rm, rv, w), _fused_reference(x, gamma, beta, r, rm, rv, training, relu, last), want


@pytest.mark.parametrize("relu", [False, True])
@pytest.mark.parametrize("training", [True, False])
@pytest.mark.parametrize("last", [False, True])
@pytest.mark.parametrize("name", list(LAYOUTS))
def test_residual_fused_forward_and_gradients(name, last, training, relu):
    """Y = act(gamma * x_hat + beta + R) in one pass (a residual block's tail); the gradients of x,
    gamma, beta and R against central differences, in every batch layout, NCHW and channels-last
    rows, batch and running statistics."""
    (x, gamma, beta, r, rm, rv, w), want_y, want = _fused_case(training, relu, last)
    lay = LAYOUTS[name](N)
    rep = dmath.Replicated(group=_group(lay))
    mats = [make(x, lay, "float64")] + [make(a, rep, "float64") for a in (gamma, beta, rm, rv)]
    image = KINDS["2d"][0]
    y, saved = dmath.nn.batchnorm(*mats, image_shape=image, training=training, momentum=MOMENTUM, eps=EPS,
                                  channels_last=last, activation="relu" if relu else None,
                                  residual=make(r, lay, "float64"))
    np.testing.assert_allclose(y.to_numpy(), want_y, rtol=1e-12, atol=1e-12)
    if relu:
        assert (want_y == 0).any() and (want_y > 0).any()
    grads = dmath.nn.batchnorm_backward(make(w, lay, "float64"), mats[0], mats[1], saved, image_shape=image,
                                        channels_last=last, y=y if relu else None, residual=True)
    assert len(grads) == 4
    for k, (g, ww) in enumerate(zip(grads, want)):
        np.testing.assert_allclose(g.to_numpy(), ww, rtol=1e-5, atol=1e-7, err_msg=f"gradient {k}")


def test_residual_is_checked_on_the_master():
    (x, *_), mats, _, _ = _run("2d", "row", seed=24)
    image = KINDS["2d"][0]
    for bad in (dmath.ones((N, 4), dtype="float64"), make(x, dmath.RowBlock(), "float32")):
        with pytest.raises(dmath.DMathError):
            dmath.nn.batchnorm(*mats, image_shape=image, residual=bad)
    y, saved = dmath.nn.batchnorm(*mats, image_shape=image, residual=mats[0])
    with pytest.raises(dmath.DMathError):
        dmath.nn.batchnorm_backward(mats[0], mats[0], mats[1], saved, image_shape=image, residual="yes")


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_residual_fused_low_precision(dtype):
    """The fused residual and relu in float32 and float16 (computed in float32; on GPUs the CUDA
    kernels of channels-last rows) against the float64 reference of the rounded inputs."""
    (x, gamma, beta, r, rm, rv, w), _, _ = _fused_case(True, True, True)
    q = lambda a: a.astype(dtype).astype(np.float64)   # noqa: E731
    lay = dmath.RowBlock()
    mats = [make(x, lay, dtype)] + [make(a, dmath.Replicated(), dtype) for a in (gamma, beta, rm, rv)]
    image = KINDS["2d"][0]
    y, saved = dmath.nn.batchnorm(*mats, image_shape=image, channels_last=True, activation="relu",
                                  residual=make(r, lay, dtype))
    want = _fused_reference(q(x), q(gamma), q(beta), q(r), rm, rv, True, True, True)
    tol = dict(rtol=5e-3, atol=5e-3) if dtype == "float16" else dict(rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(y.to_numpy().astype(np.float64), want, **tol)
    dx, dg, db, dr = dmath.nn.batchnorm_backward(make(w, lay, dtype), mats[0], mats[1], saved, image_shape=image,
                                                 channels_last=True, y=y, residual=True)
    # the residual's gradient is dy where y > 0, exactly
    np.testing.assert_array_equal(dr.to_numpy(), np.where(y.to_numpy() > 0, q(w), 0.0).astype(dtype))
    (_, want_dx, want_dg, want_db), _ = _fused_low_precision_grads(dtype)
    np.testing.assert_allclose(dx.to_numpy().astype(np.float64), want_dx, rtol=0.05 if dtype == "float16" else 1e-4,
                               atol=0.05 if dtype == "float16" else 1e-4)
    np.testing.assert_allclose(dg.to_numpy(), want_dg, rtol=0.02 if dtype == "float16" else 1e-4, atol=1e-3)
    np.testing.assert_allclose(db.to_numpy(), want_db, rtol=0.02 if dtype == "float16" else 1e-4, atol=1e-3)


def _fused_low_precision_grads(dtype):
    """The float64 gradients (x, gamma, beta) of the fused case's loss at the inputs rounded to dtype."""
    (x, gamma, beta, r, rm, rv, w), _, _ = _fused_case(True, True, True)
    q = lambda a: a.astype(dtype).astype(np.float64)   # noqa: E731
    rep = dmath.Replicated()
    mats = [make(q(a), lay, "float64") for a, lay in ((x, dmath.RowBlock()), (gamma, rep), (beta, rep), (rm, rep),
                                                       (rv, rep))]
    y, saved = dmath.nn.batchnorm(*mats, image_shape=KINDS["2d"][0], channels_last=True, activation="relu",
                                  residual=make(q(r), dmath.RowBlock(), "float64"))
    grads = dmath.nn.batchnorm_backward(make(q(w), dmath.RowBlock(), "float64"), mats[0], mats[1], saved,
                                        image_shape=KINDS["2d"][0], channels_last=True, y=y, residual=True)
    return (None,) + tuple(g.to_numpy() for g in grads[:3]), y.to_numpy()


# ---- a window: channels offset .. offset + C of a wider batch (a concatenation written in place) ----
def _join(parts, last):
    """NumPy's channel concatenation of image batches (N, S*C) or (N, C*S)."""
    c = KINDS["2d"][1]
    if last:
        return np.concatenate([p.reshape(N, -1, c) for p in parts], axis=2).reshape(N, -1)
    return np.concatenate([p.reshape(N, c, -1) for p in parts], axis=1).reshape(N, -1)


@pytest.mark.parametrize("relu", [False, True])
@pytest.mark.parametrize("training", [True, False])
@pytest.mark.parametrize("last", [False, True])
@pytest.mark.parametrize("name", list(LAYOUTS))
def test_windows_write_and_read_a_concatenation_in_place(name, last, training, relu):
    """Two batch norms writing their channels of one 6-channel batch give the concatenation of their
    outputs, bitwise; their backward passes reading the concatenation's gradient in place give what
    they give on its slices."""
    image, c, _ = KINDS["2d"]
    lay = LAYOUTS[name](N)
    rep = dmath.Replicated(group=_group(lay))
    act = "relu" if relu else None
    plain, windowed, ys, saved = [], [], [], []
    dy_parts = [values((N, 18), 40 + k) for k in range(2)]
    dy = make(_join(dy_parts, last), lay, "float64")
    out = None
    for k in range(2):
        x, gamma, beta, rm, rv = _params("2d", 30 + 7 * k)
        mk = lambda: [make(x, lay, "float64")] + [make(a, rep, "float64") for a in (gamma, beta, rm, rv)]  # noqa: E731
        a, b = mk(), mk()
        y, s = dmath.nn.batchnorm(*a, image_shape=image, training=training, channels_last=last, activation=act)
        plain.append((a, y, s))
        out, s2 = dmath.nn.batchnorm(*b, image_shape=image, training=training, channels_last=last, activation=act,
                                     window=(2 * c, k * c), out=out)
        windowed.append((b, s2))
        np.testing.assert_array_equal(b[3].to_numpy(), a[3].to_numpy())       # the running statistics alike
    assert out.shape == (N, 36)
    np.testing.assert_array_equal(out.to_numpy(), _join([p[1].to_numpy() for p in plain], last))
    for k in range(2):
        (a, y, s), (b, s2) = plain[k], windowed[k]
        want = dmath.nn.batchnorm_backward(make(dy_parts[k], lay, "float64"), a[0], a[1], s, image_shape=image,
                                           channels_last=last, y=y if relu else None)
        got = dmath.nn.batchnorm_backward(dy, b[0], b[1], s2, image_shape=image, channels_last=last,
                                          y=out if relu else None, window=(2 * c, k * c))
        for g, w in zip(got, want):
            np.testing.assert_allclose(g.to_numpy(), w.to_numpy(), rtol=1e-13, atol=1e-14)


def test_window_errors_raise_on_the_master():
    (x, *_), mats, _, _ = _run("2d", "row", seed=25)
    image = KINDS["2d"][0]
    wide = dmath.zeros((N, 36), dtype="float64", layout=dmath.RowBlock())
    cases = [lambda: dmath.nn.batchnorm(*mats, image_shape=image, window=(5, 3)),           # past the end
             lambda: dmath.nn.batchnorm(*mats, image_shape=image, window=(6, -1)),
             lambda: dmath.nn.batchnorm(*mats, image_shape=image, window="6"),
             lambda: dmath.nn.batchnorm(*mats, image_shape=image, out=wide),                # out without a window
             lambda: dmath.nn.batchnorm(*mats, image_shape=image, window=(6, 0), out=mats[0]),
             lambda: dmath.nn.batchnorm(*mats, image_shape=image, window=(6, 0), residual=mats[0]),
             lambda: dmath.nn.batchnorm(*mats, image_shape=image, window=(6, 0),
                                        out=dmath.zeros((N, 36), dtype="float32", layout=dmath.RowBlock()))]
    if P > 1:
        cases.append(lambda: dmath.nn.batchnorm(*mats, image_shape=image, window=(6, 0),
                                                out=dmath.zeros((N, 36), dtype="float64", layout=dmath.Replicated())))
    before = wide.to_numpy()
    for fn in cases:
        with pytest.raises(dmath.DMathError):
            fn()
    np.testing.assert_array_equal(wide.to_numpy(), before)


# ---- a relu's mask recomputed from x (beta=), instead of read from Y -----------------------------
#: 8 channels of 2x3 images: the GPU kernels' vector widths (8 halves, 4 floats, 2 doubles) apply
WIDE = ((8, 2, 3), 8)


def _wide_params(seed):
    (c, h, w), _ = WIDE
    x = values((N, c * h * w), seed, -2.0, 2.0)       # about half below the relu's threshold
    return (x, values((1, c), seed + 1, 0.5, 1.5), values((1, c), seed + 2), values((1, c), seed + 3),
            values((1, c), seed + 4, 0.5, 2.0))

@pytest.mark.parametrize("dtype", ["float64", "float32", "float16"])
@pytest.mark.parametrize("window", [False, True])
@pytest.mark.parametrize("training", [True, False])
@pytest.mark.parametrize("last", [False, True])
@pytest.mark.parametrize("name", list(LAYOUTS))
def test_relu_mask_recomputed_from_x_equals_the_mask_of_y(name, last, training, window, dtype):
    """batchnorm_backward(beta=...) recomputes the relu's mask from x with the forward's own constants
    and arithmetic: the same gradients, bitwise, as reading Y > 0 (plain batches and a concatenation's
    window; on GPUs the CUDA kernels of channels-last rows)."""
    image, c = WIDE
    lay = LAYOUTS[name](N)
    rep = dmath.Replicated(group=_group(lay))
    x, gamma, beta, rm, rv = _wide_params(50)
    mats = [make(x, lay, dtype)] + [make(a, rep, dtype) for a in (gamma, beta, rm, rv)]
    win = dict(window=(2 * c, c)) if window else {}
    dy = make(values((N, x.shape[1] * (2 if window else 1)), 51), lay, dtype)
    y, saved = dmath.nn.batchnorm(*mats, image_shape=image, training=training, channels_last=last,
                                  activation="relu", **win)
    mask = y.to_numpy()[:, :] > 0
    assert mask.any() and not mask.all()
    by_y = dmath.nn.batchnorm_backward(dy, mats[0], mats[1], saved, image_shape=image, channels_last=last, y=y,
                                       **win)
    by_x = dmath.nn.batchnorm_backward(dy, mats[0], mats[1], saved, image_shape=image, channels_last=last,
                                       beta=mats[2], **win)
    assert len(by_x) == 3
    for k, (got, want) in enumerate(zip(by_x, by_y)):
        np.testing.assert_array_equal(got.to_numpy(), want.to_numpy(), err_msg=f"gradient {k}")


def test_relu_mask_from_x_is_checked_on_the_master():
    (x, *_), mats, _, _ = _run("2d", "row", seed=26)
    image = KINDS["2d"][0]
    y, saved = dmath.nn.batchnorm(*mats, image_shape=image, activation="relu")
    cases = [(dmath.DMathError, dict(y=y, beta=mats[2])),                     # both
             (dmath.DMathError, dict(beta=mats[2], residual=True)),           # a residual's mask needs y
             (dmath.ShapeError, dict(beta=dmath.ones((1, 4), dtype="float64")))]
    for kind, kw in cases:
        with pytest.raises(kind):
            dmath.nn.batchnorm_backward(mats[0], mats[0], mats[1], saved, image_shape=image, **kw)


# ---- a gradient given as two terms (dy2=): summed where the passes read it ------------------------
@pytest.mark.parametrize("dtype", ["float64", "float32", "float16"])
@pytest.mark.parametrize("mask", [None, "y", "beta", "residual", "residual_relu"])
@pytest.mark.parametrize("last", [False, True])
@pytest.mark.parametrize("name", list(LAYOUTS))
def test_gradient_as_two_terms_equals_their_sum(name, last, mask, dtype):
    """batchnorm_backward(dy=a, dy2=b) gives what batchnorm_backward(dy=a + b) gives, bitwise (the sum
    rounded as dmath.add rounds it), dR included: a residual block's output gradient never summed into
    an array of its own."""
    image, c = WIDE
    lay = LAYOUTS[name](N)
    rep = dmath.Replicated(group=_group(lay))
    x, gamma, beta, rm, rv = _wide_params(60)
    mats = [make(x, lay, dtype)] + [make(a, rep, dtype) for a in (gamma, beta, rm, rv)]
    residual = mask in ("residual", "residual_relu")
    relu = mask in ("y", "beta", "residual_relu")
    y, saved = dmath.nn.batchnorm(*mats, image_shape=image, channels_last=last, activation="relu" if relu else None,
                                  residual=make(values(x.shape, 61), lay, dtype) if residual else None)
    a, b = make(values(x.shape, 62), lay, dtype), make(values(x.shape, 63, -2.0, 2.0), lay, dtype)
    kw = dict(image_shape=image, channels_last=last, residual=residual,
              y=y if mask in ("y", "residual_relu") else None, beta=mats[2] if mask == "beta" else None)
    want = dmath.nn.batchnorm_backward(a + b, mats[0], mats[1], saved, **kw)
    got = dmath.nn.batchnorm_backward(a, mats[0], mats[1], saved, dy2=b, **kw)
    assert len(got) == len(want) == (4 if residual else 3)
    for k, (g, w) in enumerate(zip(got, want)):
        np.testing.assert_array_equal(g.to_numpy(), w.to_numpy(), err_msg=f"gradient {k}")


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_gradient_terms_in_other_layouts_are_moved_to_x_rows(name):
    """dy and dy2 laid out unlike x (replicated, or another batch layout): each is moved to x's rows
    first, and the gradients are those of their sum."""
    image, c = WIDE
    lay = LAYOUTS[name](N)
    rep = dmath.Replicated(group=_group(lay))
    x, gamma, beta, rm, rv = _wide_params(70)
    mats = [make(x, lay, "float64")] + [make(a, rep, "float64") for a in (gamma, beta, rm, rv)]
    y, saved = dmath.nn.batchnorm(*mats, image_shape=image, activation="relu")
    a, b = values(x.shape, 71), values(x.shape, 72)
    want = dmath.nn.batchnorm_backward(make(a + b, lay, "float64"), mats[0], mats[1], saved, image_shape=image,
                                       y=y)
    got = dmath.nn.batchnorm_backward(make(a, dmath.Replicated(), "float64"), mats[0], mats[1], saved,
                                      image_shape=image, y=y, dy2=make(b, dmath.RowBlock(), "float64"))
    for g, w in zip(got, want):
        np.testing.assert_allclose(g.to_numpy(), w.to_numpy(), rtol=1e-13, atol=1e-13)


def test_gradient_as_two_terms_is_checked_on_the_master():
    (x, *_), mats, _, _ = _run("2d", "row", seed=27)
    image, c, _ = KINDS["2d"]
    y, saved = dmath.nn.batchnorm(*mats, image_shape=image)
    cases = [dict(dy2=dmath.ones((N, 4), dtype="float64")),
             dict(dy2=make(x, dmath.RowBlock(), "float32")),
             dict(dy2=mats[0], window=(2 * c, 0))]
    for kw in cases:
        with pytest.raises(dmath.DMathError):
            dmath.nn.batchnorm_backward(mats[0], mats[0], mats[1], saved, image_shape=image, **kw)
