"""Joining and padding the samples of batches: feature concatenation, its split, image padding, its crop.

Branchy networks (Inception modules, DenseNet blocks) concatenate their
branches' outputs along the channels of each sample; torchvision's pooling
in ceil mode and Keras' 'same' padding with a stride pad an image unevenly.
A batch row holds one sample, so both are row-local: each worker joins or
pads its own samples, with no communication.

A row is seen as `groups` runs of values, one per group, and concatenation
puts, group by group, the runs of every input side by side. With groups=1 it
is the plain concatenation of the rows: flat features, and images in NCHW
rows (each channel's plane is contiguous, so channels concatenate as whole
blocks). With groups = H*W it is channel concatenation of channels-last rows
(each pixel holds its channels together). `split_features` is the adjoint.
"""
import math
import numbers
from typing import NamedTuple

from ... import memory
from ...errors import DMathError, ShapeError
from ...planning import conv as window
from ...runtime import define
from . import args, rows
from ..base import dispatch, new_meta


class JoinArgs(NamedTuple):
    """Static arguments of `nn_concat` and `nn_split`."""
    groups: int          # runs per row
    widths: tuple        # each part's run width (a part's row holds groups * width values)


class PadArgs(NamedTuple):
    """Static arguments of `nn_pad_images` (padding, or its adjoint: cropping the padding off)."""
    image: tuple         # (C, H, W) of an unpadded sample
    pads: tuple          # (top, bottom, left, right)
    value: float         # what the padding holds
    channels_last: bool  # the rows are channels-last (H, W, C) instead of NCHW
    crop: bool = False   # remove the padding instead


CONCAT = define("nn_concat", JoinArgs)
SPLIT = define("nn_split", JoinArgs)
PAD = define("nn_pad_images", PadArgs)


def _join_args(op, groups, widths, what):
    groups = window.integer(groups, f"{what}: groups", 1)
    try:
        widths = tuple(window.integer(w, f"{what}: width", 1) for w in widths)
    except TypeError as exc:
        raise DMathError(f"{what}: widths must be a sequence of positive integers, got {widths!r}") from exc
    if not widths:
        raise DMathError(f"{what}: nothing to join (no widths)")
    return op.static(groups=groups, widths=widths)


def concat_features(xs, groups=1):
    """The batches xs (each (N, groups * w_i)) joined along their samples: (N, groups * sum w_i),
    in the first batch's row layout. Row r of the result holds, for each of the `groups` runs in
    turn, run k of row r of xs[0], then of xs[1], ... (groups=1: the rows side by side; for
    channels-last image rows, groups = H*W concatenates channels)."""
    xs = list(xs)
    if not xs:
        raise DMathError("concat_features: nothing to join")
    first = args.rows(xs[0], "concat_features: xs[0]")
    parts = [first]
    for i, x in enumerate(xs[1:], 1):
        args.require(x, f"concat_features: xs[{i}]")
        if x.shape[0] != first.shape[0] or x.dtype != first.dtype:
            raise ShapeError(f"concat_features: xs[{i}] is {x.shape} {x.dtype}, the first batch is "
                             f"{first.shape} {first.dtype}: the parts need the same samples and dtype")
        parts.append(args.like(args.rows(x, f"concat_features: xs[{i}]"), first, f"concat_features: xs[{i}]"))
    groups = window.integer(groups, "concat_features: groups", 1)
    for i, x in enumerate(parts):
        if x.shape[1] % groups:
            raise ShapeError(f"concat_features: xs[{i}] has {x.shape[1]} values per sample, not {groups} runs")
    static = _join_args(CONCAT, groups, [x.shape[1] // groups for x in parts], "concat_features")
    out = new_meta(first.layout, (first.shape[0], sum(x.shape[1] for x in parts)), first.dtype)
    return dispatch("nn_concat", parts, [out], static=static)[0][0]


def split_features(x, widths, groups=1):
    """The inverse of concat_features: x (N, groups * sum(widths)) cut into the batches
    (N, groups * w_i), each in x's row layout."""
    x = args.rows(x, "split_features: x")
    static = _join_args(SPLIT, groups, widths, "split_features")
    if x.shape[1] != static.groups * sum(static.widths):
        raise ShapeError(f"split_features: x has {x.shape[1]} values per sample, {static.groups} runs of "
                         f"widths {list(static.widths)} need {static.groups * sum(static.widths)}")
    outs = [new_meta(x.layout, (x.shape[0], static.groups * w), x.dtype) for w in static.widths]
    return dispatch("nn_split", [x], outs, static=static)[0]


def _pad_args(image_shape, pads, value, channels_last, features, what, crop=False):
    image = window.image(image_shape, features, what)
    try:
        pads = tuple(window.integer(p, f"{what}: pads", 0) for p in pads)
    except TypeError as exc:
        raise DMathError(f"{what}: pads must be (top, bottom, left, right), got {pads!r}") from exc
    if len(pads) != 4:
        raise DMathError(f"{what}: pads must be (top, bottom, left, right), got {pads!r}")
    # +-inf pads a max pool's input (torchvision's ceil mode); anything else must be finite
    infinite = isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isinf(value)
    value = float(value) if infinite else args.real(value, f"{what}: value")
    last = args.flag(channels_last, f"{what}: channels_last")
    return PAD.static(image=image, pads=pads, value=value, channels_last=last, crop=crop)


def padded_shape(image_shape, pads):
    """(C, H + top + bottom, W + left + right)."""
    c, h, w = image_shape
    t, b, l, r = pads
    return (c, h + t + b, w + l + r)


def pad_images(x, image_shape, pads, value=0.0, channels_last=False):
    """The image batch x (N, C*H*W) with `pads` = (top, bottom, left, right) rows and columns of
    `value` (a real number or +-inf) around every image: (N, C*(H+top+bottom)*(W+left+right)) in
    x's row layout. channels_last: x and the result are channels-last rows."""
    x = args.rows(x, "pad_images: x")
    static = _pad_args(image_shape, pads, value, channels_last, x.shape[1], "pad_images")
    out = new_meta(x.layout, (x.shape[0], math.prod(padded_shape(static.image, static.pads))), x.dtype)
    return dispatch("nn_pad_images", [x], [out], static=static)[0][0]


def crop_images(x, image_shape, pads, channels_last=False):
    """The adjoint of pad_images: x (N, C*(H+top+bottom)*(W+left+right)) without its padding,
    (N, C*H*W); image_shape is the unpadded (C, H, W)."""
    x = args.rows(x, "crop_images: x")
    static = _pad_args(image_shape, pads, 0.0, channels_last, None, "crop_images", crop=True)
    args.expect_shape(x, (x.shape[0], math.prod(padded_shape(static.image, static.pads))), "crop_images: x")
    out = new_meta(x.layout, (x.shape[0], math.prod(static.image)), x.dtype)
    return dispatch("nn_pad_images", [x], [out], static=static)[0][0]


@CONCAT.kernel(capturable=True)
def _concat(call):
    st = call.entry.static
    parts = [rows.local(s) for s in call.inputs]
    if parts[0] is None:
        return rows.nothing_here(call)
    (out,) = rows.new_output(call, 0)
    n = out.shape[0]
    o = out.reshape(n, st.groups, sum(st.widths))
    at = 0
    for a, w in zip(parts, st.widths):
        o[:, :, at:at + w] = a.reshape(n, st.groups, w)
        at += w
    return [rows.shard(call, 0, [out])]


@SPLIT.kernel(capturable=True)
def _split(call):
    st = call.entry.static
    x = rows.local(call.inputs[0])
    if x is None:
        return rows.nothing_here(call)
    n = x.shape[0]
    x3 = x.reshape(n, st.groups, sum(st.widths))
    shards, at = [], 0
    for k, w in enumerate(st.widths):
        (out,) = rows.new_output(call, k)
        out.reshape(n, st.groups, w)[...] = x3[:, :, at:at + w]
        shards.append(rows.shard(call, k, [out]))
        at += w
    return shards


def _images4(a, image, channels_last):
    c, h, w = image
    return a.reshape(a.shape[0], h, w, c) if channels_last else a.reshape(a.shape[0], c, h, w)


def _inner(a4, st):
    """The view of the unpadded images inside the padded batch a4."""
    _, h, w = st.image
    t, _, l, _ = st.pads
    return a4[:, t:t + h, l:l + w, :] if st.channels_last else a4[:, :, t:t + h, l:l + w]


@PAD.kernel(capturable=True)
def _pad(call):
    st = call.entry.static
    x = rows.local(call.inputs[0])
    if x is None:
        return rows.nothing_here(call)
    (out,) = rows.new_output(call, 0)
    big = padded_shape(st.image, st.pads)
    if st.crop:
        _images4(out, st.image, st.channels_last)[...] = _inner(_images4(x, big, st.channels_last), st)
    else:
        o = _images4(out, big, st.channels_last)
        memory.fill(o, st.value)
        _inner(o, st)[...] = _images4(x, st.image, st.channels_last)
    return [rows.shard(call, 0, [out])]
