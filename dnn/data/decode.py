"""The worker side of an ImageFolder: reads and decodes its own samples of each batch.

`FolderSource` is what every worker builds from the folder's description
(the root, the files relative to it, their labels and the transform's
options: JSON, sent once by the master through dmath's `host_source`).
dmath's host_batch pipeline calls `sample()` on its decoding threads, one
call per sample of this worker's rows of a batch; Pillow (libjpeg-turbo
inside) releases the GIL while it decodes and resizes, so the threads run
in parallel.

With the place 'device_decode' (decoder='nvimgcodec', or tried by the
tuner), dmath decodes the JPEG files on the GPU: it asks `encoded()` for a
file's bytes and `geometry()` for the sample's crop (the draws `region()`
makes), and hands every other file to `region()`, which decodes it here.

A file that cannot be decoded (corrupt, truncated, not an image, pixels
with no 8-bit RGB meaning: see `as_rgb`, or not a regular file: a FIFO is
refused, never waited on) is, with on_error='skip', replaced by the next
file of the same class that decodes (in the folder's order, wrapping
around inside the class): the label stays right, and the replacement
depends on the files alone, so every worker count trains on the same
batches. The file is reported once per worker with a warning and counted
(`report()`). With on_error='raise' the batch fails with a DataError
naming the file.
"""
import io
import json
import os
import re
import threading
import warnings

import numpy as np

from dmath.ops.files import read_regular
from dmath.ops.host_batches import resolve

from . import augment
from .errors import DataError


try:
    import simplejpeg
except ImportError:           # (optional: Pillow decodes every file then)
    simplejpeg = None

#: the decoders a folder may ask for: 'auto' is simplejpeg for JPEG files where it is installed (and,
#: tuned, the GPU), 'nvimgcodec' the GPU (its fallback on the host as 'auto')
DECODERS = ("auto", "pillow", "simplejpeg", "nvimgcodec")
_JPEG = b"\xff\xd8"
#: JPEG colour spaces (simplejpeg's names) that Pillow converts to RGB: see decode_rgb
_PILLOW_COLORSPACES = ("CMYK", "YCCK")
_EOI = b"\xff\xd9"


#: the largest file taken as an image (larger: skipped, or an error, as on_error says; an image of
#: Pillow's decompression-bomb limit, 179 million pixels, is far smaller encoded)
IMAGE_FILE_BYTES = 1 << 30


def decode_rgb(path, decoder="auto"):
    """The RGB image at `path`: (H, W, 3) uint8 pixels from simplejpeg (a JPEG file, decoder 'auto' or
    'simplejpeg', where it is installed), else a Pillow image (see as_rgb). Raises on a file that cannot
    be decoded, and (NotRegularFile, an OSError) on one that is not a regular file: a FIFO is refused at
    once (a blocking open waited for a writer forever and held up the batch).

    Both use libjpeg-turbo's default (accurate) DCT and upsampling, so they give the same pixels;
    simplejpeg skips Pillow's per-image overhead. A CMYK (or YCCK) JPEG goes to Pillow: simplejpeg
    converts it to RGB by another formula (a grey level off in nearly every pixel), so the decoder
    chosen would change the image. A JPEG simplejpeg refuses (damaged: its strict mode raises at a
    truncation) goes to Pillow too, which decides."""
    data = read_regular(path, IMAGE_FILE_BYTES)
    if not data:
        raise ValueError(f"{path}: an empty file")
    if simplejpeg is not None and decoder != "pillow" and data[:2] == _JPEG:
        try:
            if simplejpeg.decode_jpeg_header(data)[2] not in _PILLOW_COLORSPACES:
                return simplejpeg.decode_jpeg(data, colorspace="RGB")
        except ValueError:
            pass
    img = augment.pillow().open(io.BytesIO(data))
    img.load()                # decode now: a truncated file raises here
    return as_rgb(img, path)


#: Pillow's modes of 16-bit integer pixels (a 16-bit grayscale PNG opens as 'I;16')
_16_BIT = ("I;16", "I;16L", "I;16B", "I;16N")


def as_rgb(img, path):
    """The decoded Pillow image `img` (of the file `path`) as an RGB image of 8-bit pixels.

    Pillow's convert('RGB') is right for the 8-bit modes (and Pillow itself reads a 16-bit colour PNG
    as 8-bit RGB, keeping each value's high byte), but it clips the wider integer modes to 0..255
    instead of scaling them: a 16-bit grayscale PNG came out nearly all white, without a word. So:

    - 16-bit integers (modes I;16, I;16B, ...): value >> 8 (0..65535 -> 0..255), the high byte, as
      Pillow reduces 16-bit colour PNGs;
    - 32-bit integers (mode 'I': a TIFF, or an older Pillow's 16-bit PNG): as 16-bit when every value
      is in 0..65535, else refused (no 8-bit meaning);
    - floating-point pixels (mode 'F'): refused: no convention says which values are black and white
      (0..1, 0..255, or unbounded HDR), and a guess would train on wrong images silently.

    A refusal raises DataError, which the folder handles as any file it cannot decode (skipped with a
    warning and counted under on_error='skip', the batch fails naming the file under 'raise'). The GPU
    decoder (nvImageCodec, decoder='nvimgcodec' or tuned) is handed JPEG files only, always 8-bit: PNG
    files, 16-bit ones included, are decoded here on every place."""
    mode = img.mode
    if mode == "RGB":
        return img            # (most JPEGs: used as it is; convert copies)
    if mode in _16_BIT or mode == "I":
        pixels = np.asarray(img)
        if mode == "I" and pixels.size and (int(pixels.min()) < 0 or int(pixels.max()) > 0xFFFF):
            raise DataError(f"{path}: 32-bit integer pixels (Pillow's mode 'I') from {int(pixels.min())} to "
                            f"{int(pixels.max())}, outside 0..65535: only 8- and 16-bit values have a meaning "
                            f"as 8-bit RGB here")
        return augment.pillow().fromarray((pixels >> 8).astype(np.uint8)).convert("RGB")
    if mode == "F":
        raise DataError(f"{path}: floating-point pixels (Pillow's mode 'F') are not supported: no convention says "
                        f"which values are black and white; save the image with 8- or 16-bit integer pixels")
    if mode.startswith("I"):
        raise DataError(f"{path}: Pillow's pixel mode {mode!r} is not supported (8- and 16-bit images are)")
    return img.convert("RGB")


#: how Pillow's errors name an in-memory buffer
_BUFFER_NAME = re.compile(r"<_io\.BytesIO object at 0x[0-9a-fA-F]+>")


class FolderSource:
    """One worker's reader of an image folder (see the module docstring)."""

    def __init__(self, description):
        d = json.loads(description.decode("utf-8"))
        self.root = d["root"]
        self.files = d["files"]
        self.labels = np.asarray(d["labels"], dtype=np.int64)
        self.size = tuple(d["image_size"])
        self.resize_size = int(d["resize_size"])
        self.scale, self.ratio = tuple(d["crop_scale"]), tuple(d["crop_ratio"])
        self.flip = bool(d["flip"])
        self.on_error = d["on_error"]
        self.decoder = d.get("decoder", "auto")
        fn = d.get("batch_transform")
        self._user = resolve(fn) if fn else None
        # the files of class k are first[k] .. first[k + 1] - 1 (the folder lists them class by class)
        self.first = np.searchsorted(self.labels, np.arange(int(self.labels.max()) + 2))
        self.lock = threading.Lock()
        self.bad = {}              # index -> why it could not be decoded (this worker's finds)
        self.bad_stamp = {}        # index -> the file's (size, mtime) when it failed: a changed file is tried again

    # ---- the host stage ------------------------------------------------------------------------
    def sample(self, index, stream, random, seed, out):
        """Sample `index` decoded and transformed into `out` (uint8 (H, W, 3))."""
        img = self._decoded(index)
        if random:
            rng = augment.sample_generator(seed, stream)
            width, height = augment.image_size(img)
            box, mirrored = augment.train_draws(width, height, rng, self.scale, self.ratio, self.flip)
            out[...] = augment.resized_crop(img, box, self.size, mirrored)
        else:
            out[...] = augment.eval_transform(img, self.size, self.resize_size)

    def region(self, index, stream, random, seed):
        """Sample `index` decoded and cropped, not resized, for a resize on the device (dmath's
        place 'device_resize'): ((h, w, 3) uint8 pixels, (full_h, full_w, off_y, off_x, mirrored)):
        the pixels resampled to full_h x full_w, from (off_y, off_x) on, give the sample; the same
        draws as sample()."""
        img = self._decoded(index)
        width, height = augment.image_size(img)
        pixels = img if isinstance(img, np.ndarray) else np.asarray(img)
        (left, top, right, bottom), geometry = self.geometry(width, height, stream, random, seed)
        return np.ascontiguousarray(pixels[top:bottom, left:right]), geometry

    def geometry(self, width, height, stream, random, seed):
        """((left, top, right, bottom), (full_h, full_w, off_y, off_x, mirrored)) of a width x height
        image: its crop, and where the crop resampled to full_h x full_w lands (from (off_y, off_x) on,
        the sample's size): the training draws of (seed, stream), or the evaluation's resize of the whole
        image and its center crop."""
        if random:
            rng = augment.sample_generator(seed, stream)
            box, mirrored = augment.train_draws(width, height, rng, self.scale, self.ratio, self.flip)
            return box, (self.size[0], self.size[1], 0, 0, mirrored)
        w, h = augment.resize_shorter(width, height, max(self.resize_size, *self.size))
        left, top, _, _ = augment.center_crop_box(w, h, self.size)
        return (0, 0, width, height), (h, w, top, left, False)

    def encoded(self, index):
        """The bytes of file `index` for a GPU decoder, or None to have it decoded on the host (region()):
        only a whole JPEG file goes to the GPU (SOI at the start, EOI at the end: a truncated one goes to
        the host, whose decoder refuses it the way on_error says) that this worker has not found
        undecodable already."""
        if index in self.bad and not self._repaired(index):
            return None
        try:
            data = read_regular(os.path.join(self.root, self.files[index]), IMAGE_FILE_BYTES)
        except OSError:
            return None             # (the host path reports it; a FIFO is refused there too, never waited on)
        return data if data[:2] == _JPEG and data[-2:] == _EOI else None

    def _decoded(self, index):
        """The RGB image (or pixels) of `index`, or (skipping) of the next decodable file of its class."""
        label = int(self.labels[index])
        lo, hi = int(self.first[label]), int(self.first[label + 1])
        i = index
        for _ in range(hi - lo):
            if i not in self.bad or self._repaired(i):
                path = os.path.join(self.root, self.files[i])
                try:
                    return decode_rgb(path, self.decoder)
                except Exception as exc:        # Pillow raises OSError, ValueError, SyntaxError, ...
                    self._failed(i, path, exc)
            i = lo + (i - lo + 1) % (hi - lo)
        raise DataError(f"{self.root}: no file of class {label} can be decoded ({hi - lo} tried: "
                        f"{', '.join(repr(f) for f in self.files[lo:min(hi, lo + 3)])}{', ...' if hi - lo > 3 else ''}"
                        f"; {self.bad.get(lo, '')})")

    def _failed(self, i, path, exc):
        # (Pillow names the buffer it was given, '<_io.BytesIO object at 0x...>': a reason that changed from
        # run to run and said nothing of the file)
        why = _BUFFER_NAME.sub("the file's bytes", f"{type(exc).__name__}: {exc}")
        if self.on_error == "raise":
            raise DataError(f"{path}: cannot be decoded ({why}); ImageFolder(on_error='skip') skips such "
                            f"files") from exc
        stamp = self._stamp(i)
        with self.lock:
            new = i not in self.bad
            self.bad[i] = why
            self.bad_stamp[i] = stamp
        if new:
            warnings.warn(f"{path}: cannot be decoded ({why}); skipped (the next image of its class takes "
                          f"its place)", RuntimeWarning, stacklevel=2)

    def _stamp(self, i):
        """File `i`'s (size, modification time), or None when it cannot be read."""
        try:
            st = os.stat(os.path.join(self.root, self.files[i]))
        except OSError:
            return None
        return st.st_size, st.st_mtime_ns

    def _repaired(self, i):
        """Whether file `i`, found undecodable, has changed since (then it is tried again: a file
        repaired during training was skipped for good on the worker that had met it)."""
        stamp = self._stamp(i)
        if stamp is None or stamp == self.bad_stamp.get(i):
            return False
        with self.lock:
            self.bad.pop(i, None)
            self.bad_stamp.pop(i, None)
        return True

    # ---- the device stage ----------------------------------------------------------------------
    @property
    def finish(self):
        """The user's batch function as host_batch calls it, or None."""
        if self._user is None:
            return None
        user = self._user

        def apply(x, streams, xp):
            y = user(x, streams, xp)
            if y is not None and y is not x:
                # the batch's own shape only: a (n, h, w, 1) result broadcast silently over the three
                # channels (a hostile-use probe); its dtype converts as an assignment does
                if getattr(y, "shape", None) != x.shape:
                    raise DataError(f"ImageFolder: batch_transform returned an array of shape "
                                    f"{getattr(y, 'shape', type(y).__name__)}; it must return None (x changed "
                                    f"in place) or an array of the batch's shape {x.shape}")
                # (a complex result lost its imaginary part in the assignment with only NumPy's ComplexWarning,
                # and an object array of numbers or strings failed deep in the assignment)
                kind = getattr(getattr(y, "dtype", None), "kind", None)
                if kind not in ("b", "i", "u", "f"):
                    raise DataError(f"ImageFolder: batch_transform returned an array of dtype "
                                    f"{getattr(y, 'dtype', '?')}; it must return real numbers (the batch is "
                                    f"{x.dtype})")
                x[...] = y
        return apply

    def report(self):
        with self.lock:
            return {"skipped": {self.files[i]: why for i, why in sorted(self.bad.items())}}
