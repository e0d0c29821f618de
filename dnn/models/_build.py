"""What the zoo's builders share: checked arguments, conv + batch norm + relu, the compiled Model.

Every layer is named after the PyTorch module that holds the same weights in
torchvision's model ('layer1.0.conv1', 'Mixed_5b.branch1x1.conv'), so that
`model.load_state_dict(torchvision_model.state_dict())` loads them
(dnn.state_dict); the layers without weights keep the model's own names.
"""
import numbers

from .. import layers as L
from ..errors import ConfigError
from ..functional import Graph, Input
from ..model import Model


def check(num_classes, input_shape, dropout, smallest, what):
    """The checked (num_classes, input_shape, dropout) of a zoo builder; `smallest`: the least
    height and width its pooling allows."""
    if isinstance(num_classes, bool) or not isinstance(num_classes, numbers.Integral) or num_classes < 1:
        raise ConfigError(f"{what}: num_classes must be a positive integer, got {num_classes!r}")
    try:
        c, h, w = (int(v) for v in input_shape)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{what}: input_shape must be (C, H, W), got {input_shape!r}") from exc
    if c < 1 or h < smallest or w < smallest:
        raise ConfigError(f"{what}: input_shape {tuple(input_shape)} is too small: the network's pooling "
                          f"needs images of at least {smallest}x{smallest}")
    if isinstance(dropout, bool) or not isinstance(dropout, numbers.Real) or not 0 <= dropout < 1:
        raise ConfigError(f"{what}: dropout must be in [0, 1), got {dropout!r}")
    return int(num_classes), (c, h, w), float(dropout)


def conv_bn(x, name, filters, kernel, stride=1, padding=0, eps=1e-5, conv="conv", bn="bn", relu=True):
    """Convolution (no bias) named <name>.<conv>, batch norm <name>.<bn>, then a relu: torchvision's
    BasicConv2d (conv='conv', bn='bn'); name may hold the full names instead (conv=None)."""
    cname = f"{name}.{conv}" if conv else name[0]
    bname = f"{name}.{bn}" if conv else name[1]
    h = L.Conv2D(filters, kernel, stride=stride, padding=padding, use_bias=False, kernel_init="he_normal",
                 name=cname)(x)
    h = L.BatchNorm(eps=eps, name=bname)(h)
    return L.Activation("relu")(h) if relu else h


def dense(x, units, name, relu=False):
    h = L.Dense(units, name=name)(x)
    return L.Activation("relu")(h) if relu else h


def dropout(x, p):
    return L.Dropout(p)(x) if p else x


def compile_model(inputs, outputs, name, dtype, optimizer, loss_weights=None, sync_batchnorm=True,
                  _graph_only=False, **kwargs):
    """The Model with the cross-entropy loss, each output through a softmax fused with it.
    sync_batchnorm: every BatchNorm's `synchronized` (False: each data-parallel worker's own
    statistics, as PyTorch's BatchNorm under DDP). (_graph_only: the dnn.functional.Graph of the
    layer calls instead, nothing allocated: the tests count the parameters of the largest networks so.)"""
    if not isinstance(sync_batchnorm, bool):
        raise ConfigError(f"{name}: sync_batchnorm must be True or False, got {sync_batchnorm!r}")
    outs = outputs if isinstance(outputs, list) else [outputs]
    outs = [L.Output("softmax")(o) for o in outs]
    if _graph_only:
        return Graph(inputs, outs)
    model = Model(inputs, outs if len(outs) > 1 else outs[0], loss="cross_entropy", optimizer=optimizer,
                  dtype=dtype, loss_weights=loss_weights, name=name, **kwargs)
    for layer in model.layers:
        if isinstance(layer, L.BatchNorm):
            layer.synchronized = sync_batchnorm
    return model


def image_input(shape):
    return Input(shape)
