"""AlexNet (torchvision's one-GPU variant, Krizhevsky 2014) and VGG-16 (configuration D), with
torchvision's parameter names ('features.0', 'classifier.1') and counts."""
from .. import layers as L
from ._build import check, compile_model, dropout as drop, image_input


def _classifier(x, num_classes, p, names):
    x = L.Flatten()(x)
    for k, units in enumerate((4096, 4096)):
        x = drop(x, p) if names[0] == 1 else x
        x = L.Activation("relu")(L.Dense(units, name=f"classifier.{names[k]}")(x))
        x = drop(x, p) if names[0] == 0 else x
    return L.Dense(num_classes, name=f"classifier.{names[2]}")(x)


def alexnet(num_classes=1000, input_shape=(3, 224, 224), dtype="float32", optimizer=None, dropout=0.5, **kwargs):
    """AlexNet: 61,100,840 parameters for 1000 classes, as torchvision's alexnet."""
    num_classes, input_shape, p = check(num_classes, input_shape, dropout, 63, "alexnet")
    x = inp = image_input(input_shape)
    for i, (k, f, s, pad, pool) in zip((0, 3, 6, 8, 10), ((11, 64, 4, 2, True), (5, 192, 1, 2, True),
                                                         (3, 384, 1, 1, False), (3, 256, 1, 1, False),
                                                         (3, 256, 1, 1, True))):
        x = L.Activation("relu")(L.Conv2D(f, k, stride=s, padding=pad, kernel_init="he_normal",
                                          name=f"features.{i}")(x))
        if pool:
            x = L.Pool2D(3, stride=2)(x)
    x = _classifier(L.AdaptiveAvgPool2D(6)(x), num_classes, p, (1, 4, 6))
    return compile_model(inp, x, "alexnet", dtype, optimizer, **kwargs)


_VGG16 = (64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M", 512, 512, 512, "M")


def vgg16(num_classes=1000, input_shape=(3, 224, 224), dtype="float32", optimizer=None, dropout=0.5, **kwargs):
    """VGG-16 (no batch norm): 138,357,544 parameters for 1000 classes, as torchvision's vgg16."""
    num_classes, input_shape, p = check(num_classes, input_shape, dropout, 32, "vgg16")
    x = inp = image_input(input_shape)
    i = 0
    for v in _VGG16:
        if v == "M":
            x = L.Pool2D(2)(x)
            i += 1
        else:
            x = L.Activation("relu")(L.Conv2D(v, 3, padding=1, kernel_init="he_normal", name=f"features.{i}")(x))
            i += 2
    x = _classifier(L.AdaptiveAvgPool2D(7)(x), num_classes, p, (0, 3, 6))
    return compile_model(inp, x, "vgg16", dtype, optimizer, **kwargs)
