"""Image batches between channels-first (NCHW) and channels-last (NHWC) rows.

A batch (N, C*H*W) in NCHW order holds each channel's plane together; the
same batch channels-last, (N, H*W*C), holds each pixel's channels together.
cuDNN's fastest convolutions on recent GPUs read and write channels-last
tensors; handed NCHW ones they convert on the way in and out of every call
(about a fifth of AlexNet's GPU time). A network that converts its batch once
before its first convolution and back once before its first dense layer
skips all of those conversions: conv2d and pool2d take `channels_last=True`.
Each worker converts its own samples (a row layout): no communication.
"""
from typing import NamedTuple

from ...planning import conv as window
from ...runtime import define
from . import args, rows
from ..base import dispatch, new_meta
from .windows import channels_first_into, channels_last_into


class ImageFormatArgs(NamedTuple):
    """Static arguments of `nn_image_format`."""
    image: tuple         # (C, H, W) of one sample
    to_last: bool        # NCHW -> NHWC (True) or NHWC -> NCHW (False)


IMAGE_FORMAT = define("nn_image_format", ImageFormatArgs)


def _convert(x, image_shape, to_last, what):
    x = args.rows(x, f"{what}: x")
    image = window.image(image_shape, x.shape[1], what)
    out = new_meta(x.layout, x.shape, x.dtype)
    return dispatch("nn_image_format", [x], [out], static=IMAGE_FORMAT.static(image=image, to_last=to_last))[0][0]


def to_channels_last(x, image_shape):
    """The image batch x (N, C*H*W), NCHW rows, as channels-last rows (N, H*W*C) in x's row layout."""
    return _convert(x, image_shape, True, "to_channels_last")


def to_channels_first(x, image_shape):
    """The channels-last image batch x (N, H*W*C) as NCHW rows (N, C*H*W) in x's row layout;
    image_shape is still (C, H, W). The inverse of to_channels_last."""
    return _convert(x, image_shape, False, "to_channels_first")


@IMAGE_FORMAT.kernel(capturable=True)
def _image_format(call):
    st = call.entry.static
    x = rows.local(call.inputs[0])
    if x is None:
        return rows.nothing_here(call)
    c, h, w = st.image
    (out,) = rows.new_output(call, 0)
    (channels_last_into if st.to_last else channels_first_into)(out, x, c, h, w)
    return [rows.shard(call, 0, [out])]
