"""GoogLeNet (Inception v1, Szegedy et al. 2015) as torchvision builds it: batch norm after every
convolution (eps 0.001), ceil-mode max pooling, and a 3x3 convolution in the branch the paper
gives a 5x5 (torchvision's layout, kept so that its weights load)."""
from .. import layers as L
from ..errors import ConfigError
from ._build import check, compile_model, conv_bn, dense, dropout as drop, image_input

_EPS = 1e-3

#: (name, ch1x1, ch3x3red, ch3x3, ch5x5red, ch5x5, pool_proj), and the max pools between
_MODULES = [("inception3a", 64, 96, 128, 16, 32, 32), ("inception3b", 128, 128, 192, 32, 96, 64), "pool3",
            ("inception4a", 192, 96, 208, 16, 48, 64), ("inception4b", 160, 112, 224, 24, 64, 64),
            ("inception4c", 128, 128, 256, 24, 64, 64), ("inception4d", 112, 144, 288, 32, 64, 64),
            ("inception4e", 256, 160, 320, 32, 128, 128), "pool4",
            ("inception5a", 256, 160, 320, 32, 128, 128), ("inception5b", 384, 192, 384, 48, 128, 128)]


def _bc(x, name, filters, kernel, padding=0, stride=1):
    return conv_bn(x, name, filters, kernel, stride, padding, eps=_EPS)


def _inception(x, name, c1, c3r, c3, c5r, c5, pool_proj):
    b1 = _bc(x, f"{name}.branch1", c1, 1)
    b2 = _bc(_bc(x, f"{name}.branch2.0", c3r, 1), f"{name}.branch2.1", c3, 3, 1)
    b3 = _bc(_bc(x, f"{name}.branch3.0", c5r, 1), f"{name}.branch3.1", c5, 3, 1)
    b4 = _bc(L.Pool2D(3, stride=1, padding=1, ceil_mode=True)(x), f"{name}.branch4.1", pool_proj, 1)
    return L.Concatenate()([b1, b2, b3, b4])


def _aux(x, name, num_classes, p):
    """torchvision's InceptionAux: adaptive average pooling to 4x4, 1x1 conv, fc 1024, fc."""
    x = L.Flatten()(_bc(L.AdaptiveAvgPool2D(4)(x), f"{name}.conv", 128, 1))
    x = drop(dense(x, 1024, f"{name}.fc1", relu=True), p)
    return dense(x, num_classes, f"{name}.fc2")


def googlenet(num_classes=1000, input_shape=(3, 224, 224), dtype="float32", optimizer=None, aux_logits=False,
              dropout=0.2, dropout_aux=0.7, aux_weight=0.3, **kwargs):
    """GoogLeNet: 6,624,904 parameters for 1000 classes (aux_logits=False; 13,004,888 with the
    auxiliary heads), as torchvision's googlenet. aux_logits=True adds its two auxiliary heads as outputs 2 and 3, trained with
    loss weights [1, aux_weight, aux_weight] (the paper's 0.3); predict then returns three arrays."""
    num_classes, input_shape, p = check(num_classes, input_shape, dropout, 32, "googlenet")
    if not isinstance(aux_logits, bool):
        raise ConfigError(f"googlenet: aux_logits must be True or False, got {aux_logits!r}")
    x = inp = image_input(input_shape)
    x = _bc(x, "conv1", 64, 7, 3, 2)
    x = L.Pool2D(3, stride=2, ceil_mode=True)(x)
    x = _bc(x, "conv2", 64, 1)
    x = _bc(x, "conv3", 192, 3, 1)
    x = L.Pool2D(3, stride=2, ceil_mode=True)(x)
    taps = {}
    for m in _MODULES:
        if m == "pool3":
            x = L.Pool2D(3, stride=2, ceil_mode=True)(x)
        elif m == "pool4":
            x = L.Pool2D(2, stride=2, ceil_mode=True)(x)
        else:
            x = taps[m[0]] = _inception(x, *m)
    # the heads after the trunk, as torchvision lists its modules (the state_dict's order)
    aux = [_aux(taps[t], name, num_classes, dropout_aux)
           for t, name in (("inception4a", "aux1"), ("inception4d", "aux2"))] if aux_logits else []
    x = dense(drop(L.GlobalAvgPool2D()(x), p), num_classes, "fc")
    if aux:
        return compile_model(inp, [x] + aux, "googlenet", dtype, optimizer,
                             loss_weights=[1.0, aux_weight, aux_weight], **kwargs)
    return compile_model(inp, x, "googlenet", dtype, optimizer, **kwargs)
