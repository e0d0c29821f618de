"""torchvision's ImageNet transforms on Pillow images, with draws that depend on (seed, sample) only.

    training    RandomResizedCrop(size, scale=(0.08, 1), ratio=(3/4, 4/3)) then
                RandomHorizontalFlip(0.5)
    evaluation  Resize(resize_size) (the shorter side) then CenterCrop(size)

They take a Pillow image or decoded (H, W, 3) uint8 pixels (simplejpeg's)
and end as uint8 (H, W, 3) pixels; the normalisation ((v/255 - mean) / std)
and the cast to the model's dtype come later, on the device (dmath's
host_batch). The crop box and the flip of a sample are drawn from a
generator seeded by (seed, the sample's place in the stream of samples
drawn so far): the same at any worker count and thread count, and the same
sample drawn again in another epoch gets new draws. The geometry follows
torchvision's `RandomResizedCrop.get_params`, `F.resize` and `CenterCrop`
exactly (bilinear, Pillow's antialiasing), so only the random numbers differ.
"""
import math

import numpy as np

from .errors import DataError

#: torchvision's ImageNet statistics (of pixels scaled to [0, 1])
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


def pillow():
    """Pillow's Image module (the `images` extra), imported on first use: dnn needs it for image
    folders only."""
    try:
        from PIL import Image
    except ImportError as exc:
        raise DataError("dnn.data.ImageFolder decodes images with Pillow: pip install Pillow (the 'images' "
                        "extra)") from exc
    return Image


def sample_generator(seed, stream):
    """The NumPy generator of one sample's draws: a function of (seed, stream) only."""
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence([int(seed), int(stream)])))


def random_resized_crop_box(width, height, rng, scale=(0.08, 1.0), ratio=(3 / 4, 4 / 3)):
    """(left, top, right, bottom) of torchvision's RandomResizedCrop.get_params for a width x height
    image: ten tries at a box of a random share of the area (in `scale`) and aspect ratio
    (log-uniform in `ratio`) that fits, else the largest central box within the ratio range."""
    area = width * height
    lo, hi = math.log(ratio[0]), math.log(ratio[1])
    for _ in range(10):
        target = area * rng.uniform(scale[0], scale[1])
        aspect = math.exp(rng.uniform(lo, hi))
        w = int(round(math.sqrt(target * aspect)))
        h = int(round(math.sqrt(target / aspect)))
        if 0 < w <= width and 0 < h <= height:
            top = int(rng.integers(0, height - h + 1))
            left = int(rng.integers(0, width - w + 1))
            return left, top, left + w, top + h
    in_ratio = width / height
    if in_ratio < min(ratio):
        w, h = width, int(round(width / min(ratio)))
    elif in_ratio > max(ratio):
        w, h = int(round(height * max(ratio))), height
    else:
        w, h = width, height
    top, left = (height - h) // 2, (width - w) // 2
    return left, top, left + w, top + h


def train_draws(width, height, rng, scale, ratio, flip):
    """(crop box, mirrored) of one training sample, in torchvision's order of draws."""
    box = random_resized_crop_box(width, height, rng, scale, ratio)
    return box, bool(flip and rng.random() < 0.5)


def image_size(img):
    """(width, height) of a Pillow image or of (H, W, 3) pixels."""
    return (img.shape[1], img.shape[0]) if isinstance(img, np.ndarray) else img.size


def as_pillow(img, box=None):
    """A Pillow image of `img` (a Pillow image or (H, W, 3) uint8 pixels), cropped to `box` if given
    (pixels are cropped before they are copied into Pillow: one copy of the region only)."""
    if isinstance(img, np.ndarray):
        if box is not None:
            img = img[box[1]:box[3], box[0]:box[2]]
        return pillow().fromarray(np.ascontiguousarray(img))
    return img if box is None else img.crop(box)


def resized_crop(img, box, size, mirrored):
    """`img` cropped to `box`, resized to size (H, W) bilinear (antialiased), mirrored: uint8 (H, W, 3)."""
    out = np.asarray(as_pillow(img, box).resize((size[1], size[0]), pillow().BILINEAR))
    return out[:, ::-1] if mirrored else out


def resize_shorter(width, height, size):
    """(width, height) after torchvision's Resize(size) of an int: the shorter side becomes `size`,
    the longer int(size * long / short)."""
    if width <= height:
        return size, int(size * height / width)
    return int(size * width / height), size


def center_crop_box(width, height, size):
    """(left, top, right, bottom) of torchvision's CenterCrop(size (H, W)) of a width x height image
    (at least as large)."""
    top = int(round((height - size[0]) / 2.0))
    left = int(round((width - size[1]) / 2.0))
    return left, top, left + size[1], top + size[0]


def eval_transform(img, size, resize_size):
    """Resize(resize_size) then CenterCrop(size): uint8 (H, W, 3). An image whose resized shorter side
    is still below the crop is scaled up to cover it (torchvision would pad with zeros)."""
    width, height = image_size(img)
    short = max(resize_size, size[0], size[1])
    w, h = resize_shorter(width, height, short)
    box = center_crop_box(w, h, size)
    if (w, h) == (width, height):
        return np.asarray(as_pillow(img, box))
    return np.asarray(as_pillow(img).resize((w, h), pillow().BILINEAR).crop(box))
