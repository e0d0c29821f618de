"""ResNet-18 and ResNet-50 (He et al. 2016) as torchvision builds them (v1.5: a bottleneck strides
in its 3x3 convolution), with torchvision's parameter names and counts."""
from .. import layers as L
from ._build import check, compile_model, conv_bn, image_input


def _basic(x, name, planes, stride, downsample):
    h = conv_bn(x, (f"{name}.conv1", f"{name}.bn1"), planes, 3, stride, 1, conv=None)
    h = conv_bn(h, (f"{name}.conv2", f"{name}.bn2"), planes, 3, 1, 1, conv=None, relu=False)
    return _join(x, h, name, planes, stride, downsample)


def _bottleneck(x, name, planes, stride, downsample):
    h = conv_bn(x, (f"{name}.conv1", f"{name}.bn1"), planes, 1, conv=None)
    h = conv_bn(h, (f"{name}.conv2", f"{name}.bn2"), planes, 3, stride, 1, conv=None)
    h = conv_bn(h, (f"{name}.conv3", f"{name}.bn3"), planes * 4, 1, conv=None, relu=False)
    return _join(x, h, name, planes * 4, stride, downsample)


def _join(x, h, name, channels, stride, downsample):
    if downsample:
        x = conv_bn(x, (f"{name}.downsample.0", f"{name}.downsample.1"), channels, 1, stride, conv=None,
                    relu=False)
    return L.Activation("relu")(L.Add()([h, x]))


def _resnet(block, counts, expansion, num_classes, input_shape, dtype, optimizer, name, **kwargs):
    num_classes, input_shape, _ = check(num_classes, input_shape, 0.0, 32, name)
    x = inp = image_input(input_shape)
    x = conv_bn(x, ("conv1", "bn1"), 64, 7, 2, 3, conv=None)
    x = L.Pool2D(3, stride=2, padding=1)(x)
    inplanes = 64
    for i, (planes, n) in enumerate(zip((64, 128, 256, 512), counts)):
        for j in range(n):
            stride = 2 if i > 0 and j == 0 else 1
            x = block(x, f"layer{i + 1}.{j}", planes, stride, stride != 1 or inplanes != planes * expansion)
            inplanes = planes * expansion
    x = L.Dense(num_classes, name="fc")(L.GlobalAvgPool2D()(x))
    return compile_model(inp, x, name, dtype, optimizer, **kwargs)


def resnet18(num_classes=1000, input_shape=(3, 224, 224), dtype="float32", optimizer=None, **kwargs):
    """ResNet-18: 11,689,512 parameters for 1000 classes, as torchvision's resnet18. kwargs go to
    dnn.Model (seed, record, channels_last, loss_scale)."""
    return _resnet(_basic, (2, 2, 2, 2), 1, num_classes, input_shape, dtype, optimizer, "resnet18", **kwargs)


def resnet50(num_classes=1000, input_shape=(3, 224, 224), dtype="float32", optimizer=None, **kwargs):
    """ResNet-50: 25,557,032 parameters for 1000 classes, as torchvision's resnet50."""
    return _resnet(_bottleneck, (3, 4, 6, 3), 4, num_classes, input_shape, dtype, optimizer, "resnet50", **kwargs)
