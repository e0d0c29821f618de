"""Datasets that stay in a folder of image files: each worker reads and decodes its own samples.

    train = dnn.data.ImageFolder("/data/imagenet/train", image_size=224)            # augmented
    val = dnn.data.ImageFolder("/data/imagenet/val", image_size=224, train=False)   # resize + center crop
    model.fit(train, batch_size=256, epochs=90, validation_data=val)
    print(train.explain())           # threads, where each stage runs, stage times, skipped files

torchvision's `ImageFolder` convention: `root/<class>/.../<image>`, the
classes are the sorted subfolder names (`.classes`, `.class_to_idx`), a
sample's label the index of its class; files ending in .jpg, .jpeg or .png
(any case) are the samples, in sorted order class by class. Links to folders
are followed, each folder read once: a symlink loop, or a folder reached
twice, is refused (`scan`).

Only the file names and labels go through the master, once: every worker
builds a `dnn.data.decode.FolderSource` from them, and at every step reads
and decodes only its own rows of the batch (dmath's `host_batch`), in the
order the epoch's permutation (seed and epoch only) gives, so any worker
count trains on the same batches. The pixels go to the device as uint8; the
normalisation and the cast to the model's dtype happen there. The next
batch is decoded on host threads while the step runs; the number of
threads and where the stages run are tuned from measured stage times
(`explain()`). On GPUs with nvImageCodec installed, JPEG files may be
decoded on the GPU instead (decoder='nvimgcodec', or tried by the tuner
with decoder='auto' and resize_on='auto').
"""
import json
import math
import numbers
import os
import warnings

import numpy as np

import dmath
from dmath.ops import host_batches

from ..errors import ConfigError
from . import augment, decode
from .dataset import Dataset, Feed, _Store, _ensure_runtime
from .errors import DataError
from .files import checked_path

#: the files that are samples (torchvision's IMG_EXTENSIONS, as far as Pillow decodes them here)
EXTENSIONS = (".jpg", ".jpeg", ".png")
#: evaluation resizes the shorter side to image_size / EVAL_CROP before the center crop (256 for 224)
EVAL_CROP = 0.875
_FACTORY = "dnn.data.decode:FolderSource"
#: what each of host_batch's places does, for explain()
PLACE_WORDS = {
    "device": "decode, crop and resize on the host threads, normalise on the device",
    "host": "decode, crop, resize and normalise on the host threads",
    "device_resize": "decode and crop on the host threads, resize and normalise on the device",
    "device_decode": "decode JPEG files on the GPU (nvImageCodec; the other files on the host threads), crop, "
                     "resize and normalise on the device"}


def scan(root, extensions=EXTENSIONS):
    """(classes, files relative to root, labels, others) of an image folder, torchvision's way: the
    samples are the regular files with an image extension, class by class, the folders of a class in
    the sorted order of their paths and the files of each sorted. others: the entries that are not
    samples: files with other extensions, and whatever is not a regular file (a FIFO, socket or
    device, a broken link), whatever its name (a FIFO named x.jpg would block its reader forever).

    Links to folders are followed (torchvision's os.walk(followlinks=True)), and every folder is read
    once: a link to a folder that contains it (root/cat/loop -> ., root/cat/up -> ..: a loop, which
    read the class again and again, or every class under this one) and a folder reached a second time
    (two links to one folder, a link from one class into another: its images would count twice, or
    under two labels) raise DataError naming the links. A link to a folder outside the class is
    followed. A folder that cannot be listed raises DataError (os.walk left it out without a word)."""
    try:
        classes = sorted(e.name for e in os.scandir(root) if e.is_dir())
        top = os.stat(root)
    except OSError as exc:
        raise DataError(f"ImageFolder: cannot list {root!r} ({exc})") from exc
    if not classes:
        raise DataError(f"ImageFolder: {root!r} holds no class folders (root/<class>/<image>)")
    # every folder read so far, by identity (device, inode: a link or a mount reaches it under another
    # path) -> the path (relative to root) it was read as
    origin = (top.st_dev, top.st_ino)
    seen = {origin: os.curdir}
    files, labels, others = [], [], []
    for k, name in enumerate(classes):
        for folder, images, rest in sorted(_walk(root, name, origin, seen, extensions)):
            files += [os.path.join(folder, f) for f in images]
            labels += [k] * len(images)
            others += [os.path.join(folder, f) for f in rest]
    empty = [c for k, c in enumerate(classes) if k not in set(labels)]
    if empty:
        raise DataError(f"ImageFolder: no {'/'.join(extensions)} files in the class folder(s) {empty} of {root!r}")
    return classes, files, labels, others


def _walk(root, top, origin, seen, extensions):
    """[(folder, sorted sample names, sorted other names)] of the folder `top` (relative to `root`, whose
    identity is `origin`) and every folder under it, links followed; `seen` (identity -> path) gains
    them. See scan()."""
    out = []
    stack = [(top, (origin,))]      # (a folder, the identities of the folders that contain it)
    while stack:
        rel, above = stack.pop()
        path = os.path.join(root, rel)
        try:
            st = os.stat(path)
            with os.scandir(path) as it:
                entries = sorted(it, key=lambda e: e.name)
        except OSError as exc:
            raise DataError(f"ImageFolder: cannot list {path!r} ({exc})") from exc
        key = (st.st_dev, st.st_ino)
        if key in above:
            where = "the root folder" if seen[key] == os.curdir else repr(seen[key])
            raise DataError(f"ImageFolder: {rel!r} in {root!r} leads to {where} ({os.path.realpath(path)}), a "
                            f"folder that contains it: following it would loop (its images read again and again"
                            f"{', and other classes under this one' if where == 'the root folder' else ''}); "
                            f"remove the link")
        if key in seen:
            raise DataError(f"ImageFolder: {seen[key]!r} and {rel!r} in {root!r} are one folder "
                            f"({os.path.realpath(path)}, reached through a link): its images would be read twice"
                            f"{' (under two labels)' if seen[key].split(os.sep)[0] != rel.split(os.sep)[0] else ''}; "
                            f"remove the link")
        seen[key] = rel
        images, rest, folders = [], [], []
        for e in entries:
            try:
                is_dir, is_file = e.is_dir(), e.is_file()     # (both follow links)
            except OSError:
                is_dir = is_file = False
            if is_dir:
                folders.append(os.path.join(rel, e.name))
            elif is_file and e.name.lower().endswith(extensions):
                images.append(e.name)
            else:
                rest.append(e.name)
        out.append((rel, images, rest))
        # (the sorted order, depth first: which of two paths to one folder is read first is fixed)
        stack += [(f, above + (key,)) for f in reversed(folders)]
    return out


def _size(value, what):
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        value = (value, value)
    try:
        h, w = value
    except (TypeError, ValueError):
        raise ConfigError(f"ImageFolder: {what} must be a positive integer or (height, width), got {value!r}") \
            from None
    if not all(isinstance(v, numbers.Integral) and not isinstance(v, bool) and v > 0 for v in (h, w)):
        raise ConfigError(f"ImageFolder: {what} must be a positive integer or (height, width), got {value!r}")
    return int(h), int(w)


def _pair(value, what, positive=False, low=None):
    try:
        a, b = (float(v) for v in value)
    except (TypeError, ValueError):
        raise ConfigError(f"ImageFolder: {what} must be a pair (low, high), got {value!r}") from None
    if not (math.isfinite(a) and math.isfinite(b)) or a > b or (positive and a <= 0) or (low is not None and a < low):
        raise ConfigError(f"ImageFolder: {what} must be finite with low <= high"
                          f"{' and positive' if positive else ''}, got {value!r}")
    return a, b


def _channels(value, what):
    try:
        vals = tuple(float(v) for v in value)
    except TypeError:
        vals = (float(value),) * 3
    if len(vals) != 3 or not all(math.isfinite(v) for v in vals):
        raise ConfigError(f"ImageFolder: {what} must be 3 finite numbers (RGB), got {value!r}")
    return vals


def _function_ref(fn):
    """'module:qualname' of a module-level function every worker can import, or None."""
    if fn is None:
        return None
    if isinstance(fn, str):
        ref = fn
    else:
        mod, qual = getattr(fn, "__module__", None), getattr(fn, "__qualname__", "")
        if not callable(fn) or mod is None or "<" in qual:
            raise ConfigError(f"ImageFolder: batch_transform must be a module-level function (the workers import "
                              f"it by name), got {fn!r}")
        ref = f"{mod}:{qual}"
    try:
        host_batches.resolve(ref)
    except (ImportError, AttributeError, ValueError) as exc:
        raise ConfigError(f"ImageFolder: batch_transform {ref!r} cannot be imported ({exc})") from exc
    return ref


def _places(normalize_on, resize_on, gpu, gpu_decode=False):
    """host_batch's candidate places for the options (the first is tried first). resize_on='auto'
    tries the device resize only on GPUs: on the CPU backend the device is the host, where Pillow
    resizes on the decoding threads, overlapped with the step, and NumPy would not. gpu_decode: the
    place 'device_decode' is a candidate too ('only': the one place; see _gpu_decoding)."""
    if gpu_decode == "only":
        return ("device_decode",)
    if normalize_on not in ("auto", "device", "host"):
        raise ConfigError(f"ImageFolder: normalize_on must be 'auto', 'device' or 'host', got {normalize_on!r}")
    if resize_on not in ("auto", "device", "host"):
        raise ConfigError(f"ImageFolder: resize_on must be 'auto', 'device' or 'host', got {resize_on!r}")
    if resize_on == "device" and normalize_on == "host":
        raise ConfigError("ImageFolder: resize_on='device' normalises on the device too; normalize_on='host' "
                          "contradicts it")
    places = []
    if resize_on != "device":
        places += [p for p in ("device", "host") if normalize_on in ("auto", p)]
    if (resize_on == "device" or (resize_on == "auto" and gpu)) and normalize_on != "host":
        places.append("device_resize")
    if gpu_decode:
        places.append("device_decode")
    return tuple(places)


def _gpu_decoding(decoder, normalize_on, resize_on, gpu, status):
    """Whether the place 'device_decode' (JPEG files decoded on the GPU by nvImageCodec, then cropped,
    resized and normalised there) is among the candidates: ('only' | True | False, why). Raises a
    ConfigError where decoder='nvimgcodec' cannot run. status: a callable -> (ok, why) of nvImageCodec
    on this GPU, called only where the answer matters (it imports the module and starts a decoder).

    decoder='auto' tries it where the resize may run on the device (resize_on 'auto' or 'device': a
    GPU-decoded image is resized there, and its pixels differ from the host decoder's by the IDCT's
    rounding, so the default resize_on='host' keeps every batch Pillow's) and the normalisation too."""
    if decoder == "nvimgcodec":
        if not gpu:
            raise ConfigError("ImageFolder: decoder='nvimgcodec' decodes on the GPU: it needs dmath's GPU backend "
                              "(this run is on the CPU backend); decoder='auto', 'pillow' or 'simplejpeg' decode "
                              "on the host")
        if normalize_on == "host":
            raise ConfigError("ImageFolder: decoder='nvimgcodec' normalises on the device; normalize_on='host' "
                              "contradicts it")
        ok, why = status()
        if not ok:
            raise ConfigError(f"ImageFolder: decoder='nvimgcodec' cannot decode here: {why}")
        return "only", f"decoder='nvimgcodec' ({why})"
    if decoder != "auto":
        return False, f"decoder={decoder!r} decodes on the host"
    if not gpu:
        return False, "the CPU backend"
    if normalize_on == "host":
        return False, "normalize_on='host' (a GPU-decoded image is normalised on the device)"
    if resize_on == "host":
        return False, ("resize_on='host' (a GPU-decoded image is resized on the device: resize_on='auto' makes it "
                       "a candidate)")
    ok, why = status()
    return (True, why) if ok else (False, why)


class ImageFolder(Dataset):
    """An image folder as a dnn.data Dataset, decoded by the workers at every step (module docstring).

    Args:
        root: the folder (root/<class>/.../<image>), visible to every worker
            under the same path.
        image_size: the side (or (height, width)) of the samples.
        train: augment training batches as torchvision's ImageNet recipe
            (RandomResizedCrop(image_size, crop_scale, crop_ratio), a
            horizontal flip with probability 1/2 when flip); evaluation
            batches, and every batch of a train=False folder, are
            Resize(resize_size) + CenterCrop(image_size).
        resize_size: the shorter side (an int) before the center crop
            (default image_size / 0.875: 256 for 224).
        mean, std: per channel, of pixels scaled to [0, 1] (default
            ImageNet's); every batch is (v / 255 - mean) / std.
        batch_transform: a module-level function f(x, streams, xp) applied
            to every training batch after normalisation, on the device: x
            the (m, 3, H, W) array of this worker's samples (in the model's
            dtype, changed in place or returned), streams their places in
            the stream of samples drawn (int64, for per-sample draws that
            do not depend on the worker count), xp the array module. The
            workers import it by name: define it at the top level of a
            module (or of the script, before dmath.init()).
        on_error: 'skip' (a file that cannot be decoded is replaced by the
            next decodable image of its class, with a warning, and counted
            in explain()) or 'raise' (the step fails with a DataError naming
            the file; on several workers it reaches the master as
            dmath.WorkerError). Files with other extensions are not samples,
            nor is what is not a regular file (a FIFO named x.jpg would
            block its reader): left out with a warning ('skip') or refused
            with a DataError ('raise'). A symlink loop, or a folder reached
            twice through links, is refused (see scan()).
        threads: decoding threads per worker (0: tuned at run time).
        normalize_on: 'auto' (tuned), 'device' or 'host' (see explain()).
        resize_on: 'host' (Pillow, on the decoding threads), 'device' (one
            kernel resizes the batch's crops on the device: the host only
            decodes and crops; Pillow's filter, within one grey level of
            Pillow's pixels; normalize_on must allow the device) or 'auto'
            (on GPUs: tried against the host, the faster kept; on the CPU
            backend the host).
        decoder: 'auto' (JPEG files through simplejpeg where it is installed
            on the workers, the rest through Pillow; on a GPU with
            nvImageCodec and resize_on 'auto' or 'device', decoding on the
            GPU is tried as well and kept where it measures faster),
            'pillow', 'simplejpeg' (installed on the master too), or
            'nvimgcodec': JPEG files decoded on the GPU by nvImageCodec
            (nvJPEG, batched; the hardware JPEG engine where the GPU has
            one), then cropped, resized, mirrored, normalised and cast
            there whatever resize_on says; the host threads only read the
            files and decode the others (PNG, CMYK or truncated JPEG, a
            file the GPU refuses) as 'auto' does. GPU backend only: pip
            install 'nvidia-nvimgcodec-cu12[nvjpeg]' (the gpu-images
            extra; CUDA 13: 'nvidia-nvimgcodec-cu13[nvjpeg]'). Pillow and
            simplejpeg give the same pixels (libjpeg-turbo's accurate DCT);
            nvJPEG's differ from them by the IDCT's rounding (a grey level
            or two).
    """

    def __init__(self, root, image_size=224, train=True, *, resize_size=None, crop_scale=(0.08, 1.0),
                 crop_ratio=(3 / 4, 4 / 3), flip=True, mean=augment.IMAGENET_MEAN, std=augment.IMAGENET_STD,
                 batch_transform=None, on_error="skip", threads=0, normalize_on="auto", resize_on="host",
                 decoder="auto"):
        augment.pillow()                # (a DataError now, not on the workers, when Pillow is missing)
        size = _size(image_size, "image_size")
        if resize_size is None:
            resize = int(round(max(size) / EVAL_CROP))
        elif isinstance(resize_size, numbers.Integral) and not isinstance(resize_size, bool) and resize_size > 0:
            resize = int(resize_size)
        else:
            raise ConfigError(f"ImageFolder: resize_size (the shorter side before the center crop) must be a positive "
                              f"integer, got {resize_size!r}")
        if resize < max(size):
            raise ConfigError(f"ImageFolder: resize_size {resize} is smaller than the crop {size}")
        if not isinstance(train, (bool, np.bool_)) or not isinstance(flip, (bool, np.bool_)):
            raise ConfigError(f"ImageFolder: train and flip must be True or False, got {train!r}, {flip!r}")
        crop_scale = _pair(crop_scale, "crop_scale", positive=True)
        if crop_scale[1] > 1:
            raise ConfigError(f"ImageFolder: crop_scale is a share of the image's area, at most 1; got {crop_scale}")
        crop_ratio = _pair(crop_ratio, "crop_ratio", positive=True)
        mean, std = _channels(mean, "mean"), _channels(std, "std")
        if min(std) <= 0:
            raise ConfigError(f"ImageFolder: std must be positive, got {std}")
        if on_error not in ("skip", "raise"):
            raise ConfigError(f"ImageFolder: on_error must be 'skip' or 'raise', got {on_error!r}")
        if isinstance(threads, bool) or not isinstance(threads, numbers.Integral) or threads < 0:
            raise ConfigError(f"ImageFolder: threads must be 0 (tuned) or a positive integer, got {threads!r}")
        _ensure_runtime()
        gpu = dmath.device() == "gpu"
        _places(normalize_on, resize_on, gpu)        # (the placement options checked before the decoder)
        if decoder not in decode.DECODERS:
            raise ConfigError(f"ImageFolder: decoder must be one of {decode.DECODERS}, got {decoder!r}")
        if decoder == "simplejpeg" and decode.simplejpeg is None:
            raise ConfigError("ImageFolder: decoder='simplejpeg' needs the simplejpeg package (pip install "
                              "simplejpeg); decoder='auto' uses it where it is installed, else Pillow")
        gpu_decode, gpu_why = _gpu_decoding(decoder, normalize_on, resize_on, gpu, host_batches.gpu_decode_status)
        places = _places(normalize_on, resize_on, gpu, gpu_decode)
        ref = _function_ref(batch_transform)
        root = os.path.abspath(checked_path(root, "ImageFolder"))
        classes, files, labels, others = scan(root)
        if others:
            # (scan: an entry with an image's name that is no sample is not a regular file)
            irregular = [o for o in others if o.lower().endswith(EXTENSIONS)]
            other = [o for o in others if not o.lower().endswith(EXTENSIONS)]
            parts = []
            if other:
                parts.append(f"{len(other)} file(s) are not {'/'.join(EXTENSIONS)} images, e.g. {other[0]!r}")
            if irregular:
                parts.append(f"{len(irregular)} path(s) named like images are not regular files (a FIFO, socket or "
                             f"device, or a broken link), e.g. {irregular[0]!r}")
            msg = f"ImageFolder: in {root!r}, " + "; ".join(parts)
            if on_error == "raise":
                raise DataError(msg + " (on_error='skip' leaves them out)")
            warnings.warn(msg + "; left out", RuntimeWarning, stacklevel=2)
        description = json.dumps({
            "root": root, "files": files, "labels": labels, "image_size": list(size), "resize_size": resize,
            "crop_scale": list(crop_scale), "crop_ratio": list(crop_ratio), "flip": bool(flip),
            "on_error": on_error, "batch_transform": ref, "decoder": decoder}).encode("utf-8")
        try:
            table = host_batches.host_source(_FACTORY, description, len(files))
        except dmath.DMathError as exc:
            raise DataError(f"ImageFolder: {exc}") from exc
        self.root, self.classes, self.files = root, classes, files
        self.class_to_idx = {c: k for k, c in enumerate(classes)}
        self.targets = labels
        self.ignored = others
        self.image_size, self.resize_size, self.train = size, resize, bool(train)
        self.crop_scale, self.crop_ratio, self.flip = crop_scale, crop_ratio, bool(flip)
        self.pixel_mean, self.pixel_std = mean, std
        self.on_error, self.threads, self.places = on_error, int(threads), places
        self.batch_transform, self.decoder = ref, decoder
        #: (whether the GPU decodes: 'only', True (a candidate of the tuner) or False, why)
        self.gpu_decoding = (gpu_decode, gpu_why)
        store = _Store(table, table, "labels", (0, len(classes) - 1), "files")
        # the pixels are normalised by host_batch: the Dataset's own affine step stays the identity
        self._init(store, 0, len(files), (3,) + size, None, 1.0, 0.0, 1.0)

    # ---- what models ask ---------------------------------------------------------------------
    @property
    def features(self):
        """Values per sample: 3 x height x width."""
        return 3 * self.image_size[0] * self.image_size[1]

    def _feed_settings(self):
        """Dataset._feed_settings and what an ImageFeed copies (the transform, pixel statistics,
        threads and places): a model makes a new feed when any of them changed."""
        return super()._feed_settings() + (self.train, self.image_size, tuple(self.pixel_mean),
                                           tuple(self.pixel_std), self.threads, tuple(self.places))

    def feed(self, group=None):
        """A new ImageFeed: a model's cursor whose batches the workers decode (see Dataset.feed)."""
        return ImageFeed(self, group)

    def split(self, fraction):
        """(first, last) as Dataset.split: the last `fraction` of the files (in the folder's order:
        the last classes, so shuffle a folder's classes into both parts by other means) becomes a
        second folder view; the second uses the evaluation transform."""
        first, last = Dataset.split(self, fraction)
        views = []
        for part, train in ((first, self.train), (last, False)):
            view = ImageFolder.__new__(ImageFolder)
            view.__dict__.update(self.__dict__)
            view.lo, view.hi, view.train = part.lo, part.hi, train
            views.append(view)
        return tuple(views)

    def explain(self):
        """What every worker's pipeline measured and chose, as text: decoding threads, where the stages
        run (where the images are decoded: the host threads or the GPU, and whether GPU decoding was a
        candidate), the stage times per batch, and the files skipped."""
        reports = host_batches.report(self.x)
        gpu, why = self.gpu_decoding
        lines = [f"ImageFolder {self.root!r}: {len(self)} images of {len(self.classes)} classes, "
                 f"{self.image_size[0]}x{self.image_size[1]}, on_error={self.on_error!r}",
                 f"  GPU decoding: {'the only place' if gpu == 'only' else 'a candidate' if gpu else 'not a candidate'}"
                 f" ({why}); places {list(self.places)}"]
        for rep in reports:
            for p in rep["pipelines"]:
                lo, hi = p["rows"]
                rows = f"rows {lo}..{hi - 1}" if hi > lo else "no rows"     # (a worker with none: 'rows 0..-1')
                lines.append(
                    f"  worker {rep['rank']} {rows} "
                    f"({'training' if p['random'] else 'evaluation'}, {p['dtype']}): {p['threads']} threads"
                    f"{' (tuned)' if p['threads_tuned'] else ''}, place {p['place']!r}"
                    f"{' (tuned)' if p['place_tuned'] else ''}: {PLACE_WORDS.get(p['place'], '?')}; per batch: "
                    f"host stage {p['host_ms_per_batch']:.1f} ms (in the background), step waited "
                    f"{p['stall_ms_per_batch']:.1f} ms, device stage {p['device_ms_per_batch']:.1f} ms, step "
                    f"{p['step_ms_per_batch']:.1f} ms; {p['batches']} batches")
                parts = p.get("stage_ms_per_batch") or {}
                if parts:                 # (the host stage's own parts, where its place reports them)
                    lines.append("    host stage's parts per batch: "
                                 + ", ".join(f"{k} {v:.1f} ms" for k, v in parts.items()))
                lines += [f"    {d}" for d in p["decisions"]]
                done = p.get("decoded_on", {})
                if done.get("gpu") or done.get("host"):
                    lines.append(f"    place 'device_decode': {done['gpu']} samples decoded on the GPU, "
                                 f"{done['host']} on the host (not JPEG, truncated, or refused by the GPU decoder)")
                lines += [f"    {n}" for n in p.get("notes", [])]
        skipped = self.skipped()
        lines.append(f"  skipped files: {len(skipped)}" + "".join(f"\n    {f}: {why}" for f, why in skipped.items()))
        return "\n".join(lines)

    def stats(self):
        """The per-worker reports behind explain() (a list indexed by rank of dicts)."""
        return host_batches.report(self.x)

    def skipped(self):
        """{file (relative to root): why} of the files some worker could not decode so far."""
        out = {}
        for rep in host_batches.report(self.x):
            out.update(rep["source"].get("skipped", {}))
        return dict(sorted(out.items()))

    def __repr__(self):
        return (f"dnn.data.ImageFolder({self.root!r}, {len(self)} images, {len(self.classes)} classes, "
                f"image_size={self.image_size}, train={self.train})")


class ImageFeed(Feed):
    """A model's cursor over an ImageFolder: a Feed whose batches are decoded by the workers."""

    def __init__(self, folder, group=None):
        super().__init__(folder, group)
        self.folder = (folder.train, folder.image_size, tuple(255.0 * v for v in folder.pixel_mean),
                       tuple(255.0 * v for v in folder.pixel_std), folder.threads, folder.places)

    def batch_x(self, out, training, seed):
        """Recordable: the next batch decoded by the workers into `out`; returns out."""
        train, size, mean, std, threads, places = self.folder
        random = bool(train and training)
        return host_batches.host_batch(self.store.x, self.order, self.position, out, image=(3,) + size,
                                       random=random, mean=mean, std=std,
                                       counter=self.drawn if random else None, seed=seed, threads=threads,
                                       places=places)
