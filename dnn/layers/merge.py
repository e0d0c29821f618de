"""Layers of branchy networks: Add and Concatenate (called on a list of tensors), GlobalAvgPool2D,
AdaptiveAvgPool2D and ZeroPadding2D. Each is data parallel and has no weights."""

from ..errors import ConfigError, ShapeError
from ..graph.node import int_tuple
from ..ops import Pool2D as PoolFn
from ..ops.join import adaptive_avg_pool, concat, global_avg_pool, merge_add, pad
from .base import Layer


class _Join(Layer):
    """A layer called on a list of two or more tensors (dnn.functional.call_layer)."""
    joins = True
    #: the branches meet in the order the convolutions run (channels-last on GPUs): no conversion
    image_rows = "channels_last"

    def _shapes(self, shapes):
        shapes = [tuple(s) for s in shapes]
        if len(shapes) < 2:
            raise ShapeError(f"{type(self).__name__} joins two or more tensors, got {len(shapes)}")
        return shapes


class Add(_Join):
    """The sum of tensors of one shape (a residual connection): `L.Add()([x, shortcut])`."""

    def output_shape(self, sample_shapes):
        shapes = self._shapes(sample_shapes)
        if len(set(shapes)) > 1:
            raise ShapeError(f"Add: every tensor must have the same shape, got {shapes}")
        return shapes[0]

    def forward(self, xs, ctx):
        return merge_add(*xs)


class Concatenate(_Join):
    """Tensors joined along the channels (images of one height and width: an Inception module's
    branches) or the features (flat samples): `L.Concatenate()([a, b, c])`. Keras' axis: the
    channels of (C, H, W) samples (axis=1 of the NCHW batch), the features of flat ones.

    axis: None, or Keras' name of that axis (1 or -3 for images, 1 or -1 for flat samples); any
    other axis is refused (no other join is built)."""

    def __init__(self, axis=None, name=None):
        super().__init__(name)
        if axis is not None and (isinstance(axis, bool) or not isinstance(axis, int)):
            raise ConfigError(f"Concatenate: axis must be None or an integer, got {axis!r}")
        self.axis = axis

    def get_config(self):
        return {**super().get_config(), "axis": self.axis}

    def output_shape(self, sample_shapes):
        shapes = self._shapes(sample_shapes)
        if self.axis is not None and self.axis not in ((1, -3) if all(len(s) == 3 for s in shapes) else (1, -1)):
            raise ConfigError(f"Concatenate: joins along the channels of images (axis 1 or -3) or the features "
                              f"of flat samples (axis 1 or -1), got axis={self.axis} for samples {shapes}")
        if all(len(s) == 3 for s in shapes):
            if len({s[1:] for s in shapes}) > 1:
                raise ShapeError(f"Concatenate: images must have one height and width, got {shapes}")
            return (sum(s[0] for s in shapes),) + shapes[0][1:]
        if all(len(s) == 1 for s in shapes):
            return (sum(s[0] for s in shapes),)
        raise ShapeError(f"Concatenate: join images with images or flat samples with flat samples, got {shapes}")

    def forward(self, xs, ctx):
        return concat(*xs)


class GlobalAvgPool2D(Layer):
    """The mean of each channel over the image: (C, H, W) samples become (C,) (torchvision's
    AdaptiveAvgPool2d(1) followed by flatten)."""
    image_rows = "channels_last"

    def output_shape(self, sample_shape):
        if len(sample_shape) != 3:
            raise ShapeError(f"GlobalAvgPool2D needs image samples (C, H, W), got {tuple(sample_shape)}")
        return (sample_shape[0],)

    def forward(self, x, ctx):
        return global_avg_pool(x)


class AdaptiveAvgPool2D(Layer):
    """Average pooling to a fixed output size (oh, ow) whatever the input's (PyTorch's
    AdaptiveAvgPool2d): an ordinary average pool where the output divides the input (nothing
    where they are equal), else PyTorch's uneven, overlapping windows."""
    image_rows = "channels_last"

    def __init__(self, output_size, name=None):
        super().__init__(name)
        out = int_tuple(output_size, ConfigError(f"AdaptiveAvgPool2D: output_size must be n or (oh, ow), "
                                                 f"got {output_size!r}"))
        out = out * 2 if len(out) == 1 else out
        if len(out) != 2 or min(out) < 1:
            raise ConfigError(f"AdaptiveAvgPool2D: output_size must be n or (oh, ow) of positive sizes, "
                              f"got {output_size!r}")
        self.output_size = out

    def output_shape(self, sample_shape):
        if len(sample_shape) != 3:
            raise ShapeError(f"AdaptiveAvgPool2D needs image samples (C, H, W), got {tuple(sample_shape)}")
        return (sample_shape[0],) + self.output_size

    def forward(self, x, ctx):
        _, h, w = x.sample_shape
        oh, ow = self.output_size
        if (h, w) == (oh, ow):
            return x
        if h % oh == 0 and w % ow == 0:
            k = (h // oh, w // ow)
            return PoolFn(k, k, 0, "average").apply(x)
        return adaptive_avg_pool(x, self.output_size)

    def get_config(self):
        return {**super().get_config(), "output_size": list(self.output_size)}


class ZeroPadding2D(Layer):
    """Images padded with zeros: padding = p (all sides), (ph, pw) or ((top, bottom), (left, right))."""
    image_rows = "channels_last"

    def __init__(self, padding=1, name=None):
        super().__init__(name)
        self.pads = pads_of(padding, "ZeroPadding2D")

    def output_shape(self, sample_shape):
        if len(sample_shape) != 3:
            raise ShapeError(f"ZeroPadding2D needs image samples (C, H, W), got {tuple(sample_shape)}")
        c, h, w = sample_shape
        t, b, l, r = self.pads
        return (c, h + t + b, w + l + r)

    def forward(self, x, ctx):
        return pad(x, self.pads) if any(self.pads) else x

    def get_config(self):
        t, b, l, r = self.pads
        return {**super().get_config(), "padding": [[t, b], [l, r]]}


def pads_of(padding, what):
    """(top, bottom, left, right) from p, (ph, pw) or ((top, bottom), (left, right))."""
    error = ConfigError(f"{what}: padding must be p, (ph, pw) or ((top, bottom), (left, right)) of "
                        f"non-negative integers, got {padding!r}")
    try:
        if isinstance(padding, (list, tuple)) and len(padding) == 2 and all(isinstance(p, (list, tuple))
                                                                          for p in padding):
            pads = int_tuple(padding[0], error) + int_tuple(padding[1], error)
        else:
            hw = int_tuple(padding, error)
            hw = hw * 2 if len(hw) == 1 else hw
            pads = (hw[0], hw[0], hw[1], hw[1]) if len(hw) == 2 else ()
    except TypeError as exc:
        raise error from exc
    if len(pads) != 4 or min(pads) < 0 or any(isinstance(p, bool) for p in pads):
        raise error
    return tuple(int(p) for p in pads)


__all__ = ["Add", "Concatenate", "GlobalAvgPool2D", "AdaptiveAvgPool2D", "ZeroPadding2D"]
