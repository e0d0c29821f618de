"""A small generated image folder for the ImageFolder tests (tests/dist/test_image_folder.py and
tests/test_image_folder_workers.py)."""
import os

import numpy as np
from PIL import Image

CLASSES = ("ant", "bee", "cow")


def make_folder(root, per_class=20, seed=0, smooth=False):
    """per_class images of random sizes per class (JPEG, PNG, a grayscale and a palette PNG): class k
    brighter in channel k, so that a small network can learn them. The pixels are noise, or with
    smooth=True a coarse random field enlarged (photographs' spectrum: two JPEG decoders then differ
    by their IDCT's rounding only, not by how they upsample noisy chroma)."""
    rng = np.random.default_rng(seed)
    for k, name in enumerate(CLASSES):
        os.makedirs(root / name / "sub", exist_ok=True)
        for i in range(per_class):
            w, h = (int(v) for v in rng.integers(14, 48, size=2))
            if smooth:
                coarse = rng.integers(0, 90, size=(max(2, h // 8), max(2, w // 8), 3)).astype(np.uint8)
                a = np.array(Image.fromarray(coarse).resize((w, h), Image.BILINEAR))
            else:
                a = rng.integers(0, 90, size=(h, w, 3)).astype(np.uint8)
            a[..., k] += 150
            img = Image.fromarray(a)
            where = root / name / ("sub" if i % 7 == 6 else "")
            if i == 4:
                img.convert("L").save(where / f"img{i:02d}.png")
            elif i == 5:
                img.convert("P").save(where / f"img{i:02d}.PNG")
            elif i % 3 == 0:
                img.save(where / f"img{i:02d}.png")
            else:
                img.save(where / f"img{i:02d}.jpg", quality=90)
    return root


def negate_even(x, streams, xp):
    """A batch_transform: mirrors the sign of the samples with an even place in the stream. (Here, in
    a module every rank can import: the workers import a transform by its module's name.)"""
    x[xp.asarray(streams % 2 == 0)] *= -1
