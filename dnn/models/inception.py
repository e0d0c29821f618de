"""Inception v3 (Szegedy et al. 2016) as torchvision builds it (Inception3): batch norm with eps
0.001 after every convolution, asymmetric 1x7 / 7x1 (and 1x3 / 3x1) convolutions, average
pooling with padding counted (PyTorch's default), and the auxiliary head on Mixed_6e."""
from .. import layers as L
from ..errors import ConfigError
from ._build import check, compile_model, conv_bn, dense, dropout as drop, image_input

_EPS = 1e-3


def _bc(x, name, filters, kernel, padding=0, stride=1):
    return conv_bn(x, name, filters, kernel, stride, padding, eps=_EPS)


def _avg(x):
    return L.Pool2D(3, stride=1, padding=1, mode="average")(x)


def _cat(xs):
    return L.Concatenate()(xs)


def _a(x, n, pool_features):
    b1 = _bc(x, f"{n}.branch1x1", 64, 1)
    b5 = _bc(_bc(x, f"{n}.branch5x5_1", 48, 1), f"{n}.branch5x5_2", 64, 5, 2)
    b3 = _bc(_bc(_bc(x, f"{n}.branch3x3dbl_1", 64, 1), f"{n}.branch3x3dbl_2", 96, 3, 1), f"{n}.branch3x3dbl_3", 96, 3, 1)
    return _cat([b1, b5, b3, _bc(_avg(x), f"{n}.branch_pool", pool_features, 1)])


def _b(x, n):
    b3 = _bc(x, f"{n}.branch3x3", 384, 3, 0, 2)
    d = _bc(_bc(_bc(x, f"{n}.branch3x3dbl_1", 64, 1), f"{n}.branch3x3dbl_2", 96, 3, 1), f"{n}.branch3x3dbl_3",
            96, 3, 0, 2)
    return _cat([b3, d, L.Pool2D(3, stride=2)(x)])


def _c(x, n, c7):
    b1 = _bc(x, f"{n}.branch1x1", 192, 1)
    b7 = _bc(x, f"{n}.branch7x7_1", c7, 1)
    b7 = _bc(b7, f"{n}.branch7x7_2", c7, (1, 7), (0, 3))
    b7 = _bc(b7, f"{n}.branch7x7_3", 192, (7, 1), (3, 0))
    d = _bc(x, f"{n}.branch7x7dbl_1", c7, 1)
    for k, (f, kern, pad) in enumerate(((c7, (7, 1), (3, 0)), (c7, (1, 7), (0, 3)), (c7, (7, 1), (3, 0)),
                                        (192, (1, 7), (0, 3))), 2):
        d = _bc(d, f"{n}.branch7x7dbl_{k}", f, kern, pad)
    return _cat([b1, b7, d, _bc(_avg(x), f"{n}.branch_pool", 192, 1)])


def _d(x, n):
    b3 = _bc(_bc(x, f"{n}.branch3x3_1", 192, 1), f"{n}.branch3x3_2", 320, 3, 0, 2)
    b7 = _bc(x, f"{n}.branch7x7x3_1", 192, 1)
    b7 = _bc(b7, f"{n}.branch7x7x3_2", 192, (1, 7), (0, 3))
    b7 = _bc(b7, f"{n}.branch7x7x3_3", 192, (7, 1), (3, 0))
    b7 = _bc(b7, f"{n}.branch7x7x3_4", 192, 3, 0, 2)
    return _cat([b3, b7, L.Pool2D(3, stride=2)(x)])


def _e(x, n):
    b1 = _bc(x, f"{n}.branch1x1", 320, 1)
    b3 = _bc(x, f"{n}.branch3x3_1", 384, 1)
    b3a = _bc(b3, f"{n}.branch3x3_2a", 384, (1, 3), (0, 1))
    b3b = _bc(b3, f"{n}.branch3x3_2b", 384, (3, 1), (1, 0))
    d = _bc(_bc(x, f"{n}.branch3x3dbl_1", 448, 1), f"{n}.branch3x3dbl_2", 384, 3, 1)
    da = _bc(d, f"{n}.branch3x3dbl_3a", 384, (1, 3), (0, 1))
    db = _bc(d, f"{n}.branch3x3dbl_3b", 384, (3, 1), (1, 0))
    # torchvision concatenates [2a, 2b] and [3a, 3b] first: the same channel order as one concatenation
    return _cat([b1, b3a, b3b, da, db, _bc(_avg(x), f"{n}.branch_pool", 192, 1)])


def _aux(x, num_classes):
    c, h, w = x.shape
    if (h - 5) // 3 + 1 < 5:
        raise ConfigError(f"inception_v3: aux_logits=True needs a Mixed_6e map of at least 17x17 (input about "
                          f"299x299), got {h}x{w}; or aux_logits=False")
    x = L.Pool2D(5, stride=3, mode="average")(x)
    x = _bc(_bc(x, "AuxLogits.conv0", 128, 1), "AuxLogits.conv1", 768, 5)
    return dense(L.GlobalAvgPool2D()(x), num_classes, "AuxLogits.fc")


def inception_v3(num_classes=1000, input_shape=(3, 299, 299), dtype="float32", optimizer=None, aux_logits=True,
                 dropout=0.5, aux_weight=0.3, **kwargs):
    """Inception v3: 27,161,264 parameters for 1000 classes with its auxiliary head (aux_logits=True,
    torchvision's default), 23,834,568 without, as torchvision's inception_v3. With the head the
    model has two outputs, trained with loss weights [1, aux_weight]; predict returns both."""
    num_classes, input_shape, p = check(num_classes, input_shape, dropout, 75, "inception_v3")
    if not isinstance(aux_logits, bool):
        raise ConfigError(f"inception_v3: aux_logits must be True or False, got {aux_logits!r}")
    x = inp = image_input(input_shape)
    x = _bc(x, "Conv2d_1a_3x3", 32, 3, 0, 2)
    x = _bc(x, "Conv2d_2a_3x3", 32, 3)
    x = _bc(x, "Conv2d_2b_3x3", 64, 3, 1)
    x = L.Pool2D(3, stride=2)(x)
    x = _bc(x, "Conv2d_3b_1x1", 80, 1)
    x = _bc(x, "Conv2d_4a_3x3", 192, 3)
    x = L.Pool2D(3, stride=2)(x)
    x = _a(x, "Mixed_5b", 32)
    x = _a(x, "Mixed_5c", 64)
    x = _a(x, "Mixed_5d", 64)
    x = _b(x, "Mixed_6a")
    for n, c7 in (("Mixed_6b", 128), ("Mixed_6c", 160), ("Mixed_6d", 160), ("Mixed_6e", 192)):
        x = _c(x, n, c7)
    aux = _aux(x, num_classes) if aux_logits else None
    x = _d(x, "Mixed_7a")
    x = _e(x, "Mixed_7b")
    x = _e(x, "Mixed_7c")
    x = dense(drop(L.GlobalAvgPool2D()(x), p), num_classes, "fc")
    if aux is not None:
        return compile_model(inp, [x, aux], "inception_v3", dtype, optimizer, loss_weights=[1.0, aux_weight], **kwargs)
    return compile_model(inp, x, "inception_v3", dtype, optimizer, **kwargs)
