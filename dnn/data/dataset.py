"""Datasets that live on the workers: placed once, batched, shuffled and augmented there.

    train = dnn.data.Dataset(x, y, augment=dnn.data.Augment(shift=2))     # numpy arrays, placed once
    test = dnn.data.Dataset.from_mnist("/data/mnist", split="test")        # workers read the files
    big = dnn.data.Dataset.from_npy("/shared/x.npy", y, placement="mapped")
    model.fit(train, epochs=5, validation_data=test)

The samples are a matrix of one row per sample, Replicated on every worker,
so each worker takes the samples of its rows of a batch without asking
anyone (dMath's data residency: the master never ships sample bytes per
step). Where they are kept is the placement:

    'device'  device memory (on the CPU backend: the workers' memory)
    'host'    pinned host memory on each worker; each batch is gathered there
              and copied to the device, the next one read ahead
    'mapped'  a .npy file that every worker maps; batches read from it on use
    'auto'    'device' when the set takes at most DEVICE_SHARE of the memory
              every worker has free (dmath.memory.available()), else 'mapped'
              for a file and 'host' for arrays

A model draws batches through a `Feed` (its order, position and counter
matrices, see `Feed`); the order of an epoch depends only on a key of
integers (the seeds and the epoch number), so every worker count gives the
same batches, and augmentation draws depend on each sample's place in the
stream of samples, never on which worker holds it.
"""
import math
import numbers
import os

import numpy as np

import dmath
from dmath.ops.files import open_regular

from ..errors import ConfigError, ShapeError
from ..graph.node import canonical_dtype
from .errors import DataError
from .files import checked_path, find_file
from .idx import IDX_TYPES, MNIST_FILES, read_idx

PLACEMENTS = ("auto", "device", "host", "mapped")
#: 'auto' keeps a dataset on the device when it takes at most this share of every worker's free memory
DEVICE_SHARE = 0.5
#: float16 stores every integer up to this exactly (pixel values, small counts)
_F16_EXACT = 2048
#: the largest float16 (no model's dtype is narrower: samples stored so need no range check)
_F16_MAX = float(np.finfo(np.float16).max)
#: float32 stores every integer up to this exactly (class labels)
_F32_EXACT = 2 ** 24


class Augment:
    """Random augmentation of image samples in training (never in evaluation).

    shift: each image moves by a random (dy, dx) in [-shift, shift]^2 with
    zeros moved in: a random crop of the image padded by `shift` pixels
    (CIFAR's pad-4 crop is shift=4). flip: mirror left-right with
    probability 1/2. The draws of a sample depend on the seed and its place
    in the stream of samples only.
    """

    def __init__(self, shift=0, flip=False):
        if isinstance(shift, bool) or not isinstance(shift, numbers.Integral) or shift < 0:
            raise ConfigError(f"Augment: shift must be a non-negative integer, got {shift!r}")
        if not isinstance(flip, (bool, np.bool_)):
            raise ConfigError(f"Augment: flip must be True or False, got {flip!r}")
        self.shift, self.flip = int(shift), bool(flip)

    @property
    def active(self):
        return bool(self.shift or self.flip)

    def __repr__(self):
        return f"Augment(shift={self.shift}, flip={self.flip})"


def _per_channel(value, what):
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        vals = (float(value),)
    else:
        try:
            vals = tuple(float(v) for v in value)
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"Dataset: {what} must be a number or one number per channel, got {value!r}") from exc
    if not vals or not all(math.isfinite(v) for v in vals):
        raise ConfigError(f"Dataset: {what} must be finite numbers, got {value!r}")
    return vals


class _Store:
    """The placed matrices shared by a dataset and its views (split).

    magnitudes: the largest magnitude of each stored sample (numpy float64, (N,)), for the
    models' range check (Dataset._largest_magnitude); worked out once, when known: from the host
    arrays as they are placed, or by a reduction where the workers keep the samples in memory.
    """

    def __init__(self, x, y, y_kind, label_range, placement, magnitudes=None):
        self.x, self.y, self.y_kind, self.label_range, self.placement = x, y, y_kind, label_range, placement
        self.magnitudes = magnitudes

    def row_magnitudes(self):
        """`magnitudes`, reduced on the workers at the first call where they hold the samples in device
        memory (or in memory on the CPU backend); None for a mapped file (every worker would read the
        whole file once more) and for samples the workers make per batch (ImageFolder)."""
        x = self.x
        if self.magnitudes is None and self.placement != "mapped" and isinstance(x, dmath.Matrix) \
                and (x.memory == "device" or dmath.device() == "cpu"):
            hi = x.max(axis=1).to_numpy().astype(np.float64).ravel()
            lo = x.min(axis=1).to_numpy().astype(np.float64).ravel()
            self.magnitudes = np.maximum(hi, -lo)
        return self.magnitudes


class Dataset:
    """Samples (and targets) placed on the workers once; see the module docstring.

    Args:
        x: numpy array (N, ...) of samples (N, C, H, W for images).
        y: None, 1-D class labels (N,), or target rows (N, T).
        sample_shape: the shape of one sample (default: x.shape[1:]).
        dtype: what the samples are stored as (default: x's float dtype;
            integers that float16 holds exactly, such as uint8 pixels, as
            float16; other integers as float32). Batches are converted to
            the model's dtype on the device. Long double samples need it
            given (DataError otherwise, as Dataset.from_npy), and long
            double target rows must be converted (float64 rounds them).
        placement: 'auto', 'device', 'host' (see the module docstring).
        augment: an Augment applied to training batches.
        scale, mean, std: every batch (training and evaluation) becomes
            (scale * x - mean) / std, mean and std per channel (or one value).

    augment, scale, mean and std are attributes that may be changed later
    (checked as in the constructor): a model's next fit, evaluate or predict
    call takes the dataset's batches with the new values, as a new model
    would (a fit running when they change keeps the values it started with).
    """

    def __init__(self, x, y=None, *, sample_shape=None, dtype=None, placement="auto", augment=None,
                 scale=1.0, mean=0.0, std=1.0):
        _ensure_runtime()
        x = _samples(x)
        self._place(x, _targets(y, len(x)), sample_shape, dtype, placement, augment, scale, mean, std)

    def _place(self, x, targets, sample_shape=None, dtype=None, placement="auto", augment=None,
               scale=1.0, mean=0.0, std=1.0):
        """Place checked samples x and targets (from `_targets`) on the workers."""
        placement = _check_placement(placement, allow_mapped=False)
        dtype = _storage_dtype(x, dtype)
        sample_shape = _sample_shape(sample_shape, x)
        flat = x.reshape(len(x), -1)
        top = np.finfo(dtype).max
        if np.dtype(dtype).itemsize < x.dtype.itemsize or x.dtype.kind != "f":
            big = np.flatnonzero((np.abs(flat) > top).any(axis=1))
            if big.size:
                raise DataError(f"Dataset: {big.size} sample(s) hold values beyond {dtype}'s range (+-{top:g}), "
                                f"the first at index {big[0]}: store them as float32 (dtype=) or scale them")
        kind = _memory_kind(placement, flat.shape[0] * flat.shape[1] * np.dtype(dtype).itemsize)
        xm = dmath.from_numpy(flat, layout=dmath.Replicated(), dtype=dtype, memory=kind)
        # each sample's largest magnitude, while the values are at hand (the models' range check)
        magnitudes = None
        if np.finfo(dtype).max > _F16_MAX:
            magnitudes = np.maximum(flat.max(axis=1).astype(np.float64), -flat.min(axis=1).astype(np.float64))
        self._init(_Store(xm, *_place_targets(targets), "device" if kind is None else "host", magnitudes),
                   0, len(x), sample_shape, augment, scale, mean, std)

    # ---- other sources ------------------------------------------------------------------------
    @classmethod
    def from_npy(cls, path, y=None, *, sample_shape=None, dtype=None, placement="auto", augment=None,
                 scale=1.0, mean=0.0, std=1.0):
        """Samples from a .npy file that every worker reads itself (a shared file system).

        placement 'mapped' (or 'auto' when the set does not fit the device)
        maps the file on every worker: batches are read from it on use, the
        next one ahead; it needs the file's own dtype in this machine's
        byte order ('auto' places any other file in host memory instead).
        A 1-D file is N samples of one value. y: labels or targets as numpy
        arrays (small: placed from the master). The master reads only the
        header: the values are not checked for NaN or infinity (a model
        trained on them stops at its non-finite loss). dtype: as Dataset's;
        a file of integers wider than 16 bits or of long doubles needs it
        given (float32 would round them, or turn a long double beyond its
        range into inf), and a finite value beyond its range is refused as
        the workers read it (dmath.from_file: DataError), never read as inf.
        """
        path = checked_path(path, "Dataset.from_npy")
        _ensure_runtime()
        from dmath.ops.files import npy_spec     # the header is checked before anything is sent
        try:
            spec = npy_spec(path)
        except dmath.DMathError as exc:
            raise DataError(str(exc)) from exc
        placement = _check_placement(placement, allow_mapped=True)
        try:
            with open_regular(spec.path) as f:        # (npy_spec found a regular file: it still is one)
                shape = _npy_shape(f)
        except OSError as exc:
            raise DataError(f"{spec.path}: cannot be read ({exc})") from exc
        # samples along the first axis; a 1-D file is N samples of one value, as a 1-D array is
        n, features = (spec.rows, spec.cols) if len(shape) > 1 else (spec.cols, 1)
        if n == 0 or features == 0:
            raise DataError(f"{spec.path}: the file holds no samples (shape {tuple(shape)}); a Dataset needs one")
        sample_shape = _checked_sample_shape(sample_shape, tuple(shape[1:]) or (1,), features, "the file's samples")
        stored = np.dtype(spec.file_dtype)
        if dtype is None and stored.kind in "iu" and stored.itemsize > 2:
            raise DataError(f"{spec.path}: holds {stored} samples, which float32 may round: pass dtype= "
                            f"(float32 holds 8- and 16-bit integers exactly)")
        if dtype is None and stored.kind == "f" and stored.name not in dmath.DTYPES:
            # (the float32 default turned 1e300 into inf with only NumPy's warning)
            raise DataError(f"{spec.path}: holds {stored.name} (long double) samples, wider than any dmath dtype: "
                            f"pass dtype= ('float64' rounds them; a value beyond its range is refused)")
        dtype = _storage_dtype(None, dtype) if dtype is not None else (
            stored.name if stored.name in dmath.DTYPES else "float32")
        nbytes = n * features * np.dtype(dtype).itemsize
        # a mapping is the file's bytes as they are: the same dtype, in this machine's byte order
        mappable = stored == np.dtype(dtype)
        if placement == "auto":
            placement = "device" if _fits(nbytes) else ("mapped" if mappable else "host")
        elif placement == "mapped" and not mappable:
            other = f" or dtype={stored.name!r}" if stored.name in dmath.DTYPES and stored.isnative else ""
            raise ConfigError(f"Dataset.from_npy: placement='mapped' reads the samples as the file stores them "
                              f"({stored.str}), but they would be {dtype}: use placement='host' (converted once "
                              f"into host memory){other}")
        y_matrix, y_kind, label_range = _place_targets(_targets(y, n))
        try:
            if placement == "mapped":
                xm = dmath.from_file(spec.path, (n, features), dtype=dtype, layout=dmath.Replicated(), memory="host",
                                     mapped=True)
            else:
                xm = dmath.from_file(spec.path, (n, features), dtype=dtype, layout=dmath.Replicated(),
                                     memory=_memory_kind(placement, nbytes))
        except dmath.DMathError as exc:
            raise DataError(str(exc)) from exc
        ds = cls.__new__(cls)
        ds._init(_Store(xm, y_matrix, y_kind, label_range, placement), 0, n, sample_shape, augment, scale, mean, std)
        return ds

    @classmethod
    def from_mnist(cls, directory, split="train", *, placement="auto", augment=None):
        """An MNIST split from the standard IDX files in `directory` (x in [0, 1], (1, 28, 28) samples).

        Uncompressed image files are read by every worker itself (stored as
        float16 pixel values 0..255, exact, scaled on the device); gzipped
        ones are decompressed on the master and placed from there.
        """
        directory = checked_path(directory, "Dataset.from_mnist")
        if split not in ("train", "test"):
            raise ConfigError(f"Dataset.from_mnist: split must be 'train' or 'test', got {split!r}")
        _ensure_runtime()
        images = find_file(directory, MNIST_FILES[f"{split}_images"], "Dataset.from_mnist")
        labels = read_idx(find_file(directory, MNIST_FILES[f"{split}_labels"], "Dataset.from_mnist"))
        if labels.ndim != 1 or labels.dtype != np.uint8 or (labels.size and labels.max() > 9):
            raise DataError(f"{directory}: MNIST labels must be a 1-D uint8 array of digits")
        if images.endswith(".gz"):
            pixels = read_idx(images)
            if pixels.ndim != 3 or pixels.dtype != np.uint8 or pixels.shape != (labels.size, 28, 28):
                raise DataError(f"{images}: expected {labels.size} uint8 images of 28x28, the file holds "
                                f"{pixels.dtype} of shape {pixels.shape}")
            return cls(pixels[:, None], labels.astype(np.int64), placement=placement, augment=augment,
                       scale=1 / 255)
        shape, offset = _idx_header(images, np.dtype(">u1"))
        if tuple(shape) != (labels.size, 28, 28):
            raise DataError(f"{images}: expected {labels.size} images of 28x28, the header says {shape}")
        placement = _check_placement(placement, allow_mapped=False)
        n, features = shape[0], shape[1] * shape[2]
        try:
            xm = dmath.from_file(images, shape=(n, features), file_dtype="uint8", offset=offset, dtype="float16",
                                 layout=dmath.Replicated(), memory=_memory_kind(placement, n * features * 2))
        except dmath.DMathError as exc:
            raise DataError(str(exc)) from exc
        y_matrix, y_kind, label_range = _place_targets(_targets(labels.astype(np.int64), n))
        ds = cls.__new__(cls)
        ds._init(_Store(xm, y_matrix, y_kind, label_range, placement), 0, n, (1, shape[1], shape[2]),
                 augment, 1 / 255, 0.0, 1.0)
        return ds

    # ---- views --------------------------------------------------------------------------------
    def _init(self, store, lo, hi, sample_shape, augment, scale, mean, std):
        self._store, self.lo, self.hi = store, lo, hi
        self.sample_shape = tuple(int(v) for v in sample_shape)
        self.augment, self.scale, self.mean, self.std = augment, scale, mean, std

    # The settings below may be changed after models used the dataset (e.g. a corrected
    # normalisation, augmentation switched on for later epochs): a model's next fit, evaluate or
    # predict call on it takes batches with the new values (Model._feed compares `_feed_settings`).
    @property
    def augment(self):
        """The Augment of training batches, or None."""
        return self._augment

    @augment.setter
    def augment(self, augment):
        self._augment = self._checked_augment(augment)

    @property
    def scale(self):
        """Every batch becomes (scale * x - mean) / std."""
        return self._scale

    @scale.setter
    def scale(self, scale):
        if not isinstance(scale, numbers.Real) or isinstance(scale, bool) or not math.isfinite(scale):
            raise ConfigError(f"Dataset: scale must be a finite number, got {scale!r}")
        self._scale = float(scale)

    @property
    def mean(self):
        """Per channel (a tuple of one value, or one per channel)."""
        return self._mean

    @mean.setter
    def mean(self, mean):
        self._mean = self._channel_values(mean, "mean")

    @property
    def std(self):
        """Per channel (a tuple of one value, or one per channel), positive."""
        return self._std

    @std.setter
    def std(self, std):
        vals = self._channel_values(std, "std")
        if min(vals) <= 0:
            raise ConfigError(f"Dataset: std must be positive, got {std!r}")
        self._std = vals

    def _channel_values(self, value, what):
        vals = _per_channel(value, what)
        channels = self.image_shape[0]
        if len(vals) not in (1, channels):
            raise ConfigError(f"Dataset: {what} has {len(vals)} values for {channels} channels")
        return vals

    def _checked_augment(self, augment):
        """`augment` if it is an active Augment that fits the samples, None if inactive; else ConfigError."""
        if augment is None:
            return None
        if not isinstance(augment, Augment):
            raise ConfigError(f"Dataset: augment must be a dnn.data.Augment, got {augment!r}")
        if not augment.active:
            return None
        if len(self.sample_shape) != 3:
            raise ConfigError(f"Dataset: augment needs image samples (C, H, W), got {self.sample_shape}")
        image = self.image_shape
        if augment.shift >= min(image[1], image[2]):
            raise ConfigError(f"Dataset: augment shift {augment.shift} does not fit {image[1]}x{image[2]} images")
        return augment

    def _feed_settings(self):
        """What a Feed copies from this dataset, and its recorded steps compute with: ((shift, flip)
        of the augmentation or None, scale, mean, std), values rather than objects (an Augment
        changed in place counts). A model's Feed made under other settings is made anew (Model._feed):
        a replay would take batches with the old values, silently."""
        augment = self._checked_augment(self._augment)      # (its fields may have been changed in place)
        return ((augment.shift, augment.flip) if augment else None, self.scale, self.mean, self.std)

    def split(self, fraction):
        """(first, last): the last `fraction` of the samples (in their stored order) becomes a second
        dataset, as Keras's validation_split: the first holds floor(n * (1 - fraction)) samples
        (Keras's split_at; the second the other n - split_at: 1 of 5 at 0.1), and either one empty
        is a ConfigError. Both share the placed matrices, nothing is copied. The second never augments."""
        if isinstance(fraction, bool) or not isinstance(fraction, numbers.Real) or not 0 < fraction < 1:
            raise ConfigError(f"validation_split must be a number in (0, 1), got {fraction!r}")
        # Keras's own expression, in floating point as there (round(n * fraction) held out 0 of 5 at 0.1)
        cut = self.lo + int(math.floor(len(self) * (1.0 - float(fraction))))
        if cut <= self.lo or cut >= self.hi:
            raise ConfigError(f"validation_split={fraction} leaves no samples on one side of {len(self)}")
        first, last = (Dataset.__new__(Dataset) for _ in range(2))
        first._init(self._store, self.lo, cut, self.sample_shape, self.augment, self.scale, self.mean, self.std)
        last._init(self._store, cut, self.hi, self.sample_shape, None, self.scale, self.mean, self.std)
        return first, last

    # ---- what models ask ----------------------------------------------------------------------
    def __len__(self):
        return self.hi - self.lo

    @property
    def features(self):
        return self._store.x.shape[1]

    @property
    def image_shape(self):
        """(C, H, W) of a sample; (1, 1, features) for flat samples."""
        return self.sample_shape if len(self.sample_shape) == 3 else (1, 1, self.features)

    @property
    def placement(self):
        return self._store.placement

    @property
    def x(self):
        """The samples matrix (all of the stored rows; this dataset is rows lo..hi-1)."""
        return self._store.x

    @property
    def y(self):
        return self._store.y

    @property
    def y_kind(self):
        """None (no targets), 'labels' (integer classes, (N, 1)) or 'rows' ((N, T) targets)."""
        return self._store.y_kind

    @property
    def label_range(self):
        return self._store.label_range

    def _largest_magnitude(self, dtype):
        """The largest magnitude of this dataset's samples (rows lo..hi-1), for a model of `dtype`
        (batches become that dtype before scale, mean and std apply: a value beyond its range
        becomes infinity). None without a look when the stored dtype holds nothing beyond `dtype`'s
        range, or when the values are not known (`_Store.row_magnitudes`: a mapped file)."""
        x = self._store.x
        if not isinstance(x, dmath.Matrix) or np.finfo(x.dtype).max <= np.finfo(dtype).max:
            return None
        rows = self._store.row_magnitudes()
        return None if rows is None else float(rows[self.lo:self.hi].max())

    @property
    def normalizes(self):
        return self.scale != 1.0 or any(self.mean) or any(s != 1.0 for s in self.std)

    def feed(self, group=None):
        """A new Feed: the order, position and counter matrices a model draws batches through
        (on the workers of `group`, None: all)."""
        return Feed(self, group)

    def __repr__(self):
        return (f"dnn.data.Dataset({len(self)} samples of {self.sample_shape}, targets {self.y_kind}, "
                f"placement {self.placement!r}{', ' + repr(self.augment) if self.augment else ''})")


class Feed:
    """A model's cursor over a dataset: the epoch's order and the counters a recorded step reads.

    order (1, N) float64: the epoch's sample rows (a permutation of the
    dataset's rows); position (1, 1): where the next batch starts in the
    order; drawn (1, 1): samples drawn before this epoch and step (the
    augmentation key). All three live on the workers, Replicated: a step
    reads them on the device and advances position and drawn in place, so
    a replayed step takes the next batch without a message. A Feed keeps
    the dataset's matrices, not the Dataset object: a model holds its feeds
    weakly by dataset, and they go when the dataset does; it copies the
    dataset's settings (augment, scale, mean, std: `settings`), and a model
    makes a new feed when they changed since. group: the
    workers that take batches through this feed (None: all); its matrices
    are Replicated there only, so its commands involve no other worker.
    """

    def __init__(self, dataset, group=None):
        self.store, self.lo, self.n = dataset._store, dataset.lo, len(dataset)
        self.image_shape = dataset.image_shape
        #: the dataset's settings when this feed was made (Dataset._feed_settings): its steps use these
        self.settings = dataset._feed_settings()
        augment, self.scale, self.mean, self.std = self.settings[:4]
        self.augment = Augment(*augment) if augment else None
        self.normalizes = self.scale != 1.0 or any(self.mean) or any(s != 1.0 for s in self.std)
        rep = dmath.Replicated(group)
        self.order = dmath.zeros((1, self.n), dtype="float64", layout=rep)
        self.position = dmath.zeros((1, 1), dtype="float64", layout=rep)
        self.drawn = dmath.zeros((1, 1), dtype="float64", layout=rep)
        self.programs = {}       # (kind, batch) -> the model's dnn.training.programs.Program on this feed

    def start_epoch(self, key, epoch, skip=0):
        """Order the samples by `key` (None: stored order) and rewind (to sample `skip` of the epoch,
        for a run resumed inside it): a few small commands."""
        dmath.random.permutation(self.n, key=() if key is None else key, out=self.order)
        if self.lo:
            self.order += float(self.lo)
        self.position.set((0, 0), float(skip))
        self.drawn.set((0, 0), float(epoch) * self.n + skip)

    def batch_x(self, out, training, seed):
        """Recordable: the next batch's samples into `out`, then transformed; returns the model's input."""
        dmath.nn.take_rows(self.store.x, self.order, self.position, out)
        augment = self.augment if training else None
        if augment is None and not self.normalizes:
            return out
        c, h, w = self.image_shape
        mean = self.mean if len(self.mean) == c else self.mean * c
        std = self.std if len(self.std) == c else self.std * c
        return dmath.nn.transform_images(out, self.image_shape, shift=augment.shift if augment else 0,
                                         flip=bool(augment and augment.flip), scale=self.scale, mean=mean,
                                         std=std, counter=self.drawn if augment else None, seed=seed)

    def batch_y(self, out, one_hot):
        """Recordable: the next batch's targets into `out` (one-hot rows of labels when one_hot)."""
        dmath.nn.take_rows(self.store.y, self.order, self.position, out, one_hot=one_hot)

    def advance(self, batch):
        """Recordable: the next batch starts `batch` samples later."""
        self.position += float(batch)
        self.drawn += float(batch)


# ---- helpers -----------------------------------------------------------------------------------
def _ensure_runtime():
    if not dmath.is_initialized():
        dmath.init()


def _array_like(a, what):
    """DataError naming what is expected for inputs NumPy would turn into a 0-d object array (a
    generator, a dict, None): 'at least one sample, got shape ()' did not say what to pass."""
    iterator = hasattr(a, "__next__") and not hasattr(a, "__len__")
    if a is None or isinstance(a, (dict, set)) or iterator:
        raise DataError(f"{what} must be a numpy array (or a list of samples, or a dnn.data.Dataset), got "
                        f"{type(a).__name__}" + (": materialise it first (np.stack(list(it)))" if iterator else ""))


def rectangular(a, what):
    """`a` (an array or nested sequences) as a numpy array; DataError naming `what` when it is ragged
    (samples of several lengths: NumPy's own ValueError spoke of an inhomogeneous shape)."""
    if isinstance(a, np.ndarray):
        return a
    _array_like(a, what)
    try:
        return np.asarray(a)
    except ValueError as exc:
        raise DataError(f"{what} must be a rectangular array (every sample of one shape), got nested sequences "
                        f"of several lengths ({exc})") from None


def _samples(x):
    if isinstance(x, dmath.Matrix):
        raise ConfigError("Dataset: pass the samples as a numpy array (or use Dataset.from_npy)")
    x = rectangular(x, "Dataset: x")
    if x.ndim < 1 or len(x) == 0:
        raise DataError(f"Dataset: x must hold at least one sample, got shape {x.shape}")
    if x.ndim == 1:
        x = x[:, None]
    if x.dtype.kind == "b":
        # (binary features are 0 and 1, as torch.as_tensor(x).float() and Keras read them; they were refused
        # as "not real numbers")
        x = x.astype(np.uint8)
    if x.dtype.kind not in "iuf":
        raise DataError(f"Dataset: samples must be real numbers, got dtype {x.dtype}")
    if x.dtype.kind == "f":
        bad = ~np.isfinite(x.reshape(len(x), -1)).all(axis=1)
        if bad.any():
            rows = np.flatnonzero(bad)
            raise DataError(f"Dataset: {rows.size} sample(s) hold NaN or infinity, the first at index {rows[0]}")
    return x


def _storage_dtype(x, dtype):
    if dtype is not None:
        try:
            return canonical_dtype(dtype)
        except ConfigError as exc:
            raise ConfigError(f"Dataset: {exc}") from exc
    if x.dtype.name in dmath.DTYPES:
        return x.dtype.name
    if x.dtype.kind == "f":
        # (as Dataset.from_npy: float32 rounded them, silently, even for a float64 model)
        raise DataError(f"Dataset: the samples are {x.dtype.name} (long double), wider than any dmath dtype: "
                        f"pass dtype= to a Dataset ('float64' rounds them; a value beyond its range is refused) "
                        f"or convert them (x.astype(np.float64))")
    if x.dtype.kind in "iu" and (x.size == 0 or (x.min() >= -_F16_EXACT and x.max() <= _F16_EXACT)):
        return "float16"
    return "float32"


def _sample_shape(sample_shape, x):
    return _checked_sample_shape(sample_shape, tuple(x.shape[1:]), math.prod(x.shape[1:]), "samples")


def _checked_sample_shape(sample_shape, default, features, what):
    """sample_shape (None: `default`) as a tuple of positive ints holding `features` values."""
    if sample_shape is None:
        return default
    try:
        shape = tuple(sample_shape)
    except TypeError:
        raise ConfigError(f"Dataset: sample_shape must be a tuple of positive integers, got {sample_shape!r}") from None
    if not shape or not all(isinstance(d, (int, np.integer)) and not isinstance(d, bool) and d > 0 for d in shape):
        raise ConfigError(f"Dataset: sample_shape must be a tuple of positive integers, got {sample_shape!r}")
    shape = tuple(int(d) for d in shape)
    if math.prod(shape) != features:
        raise ShapeError(f"Dataset: sample_shape {shape} has {math.prod(shape)} values, {what} have {features}")
    return shape


def _check_placement(placement, allow_mapped):
    ok = PLACEMENTS if allow_mapped else tuple(p for p in PLACEMENTS if p != "mapped")
    if placement not in ok:
        raise ConfigError(f"Dataset: placement must be one of {ok}, got {placement!r}"
                          + ("" if allow_mapped else " ('mapped' needs a file: Dataset.from_npy)"))
    return placement


def _fits(nbytes):
    return nbytes <= DEVICE_SHARE * min(dmath.memory.available())


def _memory_kind(placement, nbytes):
    """The memory kind of the samples: None (the default, device) or 'host'."""
    if placement == "auto":
        placement = "device" if _fits(nbytes) else "host"
    return None if placement == "device" else "host"


def _targets(y, n):
    """(rows (n, T) numpy, kind, (min, max) of the labels or values) of the targets y, checked;
    (None, None, None) for none.

    kind 'labels': integer classes, (n,) or (n, 1), stored as one value per sample;
    'rows': anything else, T values per sample.
    """
    if y is None:
        return None, None, None
    if isinstance(y, dmath.Matrix):
        raise ConfigError("Dataset: pass the targets as a numpy array")
    y = rectangular(y, "Dataset: y")
    if y.ndim == 0 or len(y) != n:
        raise ShapeError(f"Dataset: y holds {0 if y.ndim == 0 else len(y)} targets for {n} samples; expected one "
                         f"target per sample (a class label or a row of values): y of length {n}, got shape "
                         f"{y.shape}")
    if y.dtype.kind not in "iufb":
        raise DataError(f"Dataset: targets must be numbers (class labels or target rows), got dtype {y.dtype}")
    # one whole number per sample, (n,) or (n, 1) (Keras' sparse labels), is a class label; whole floats
    # only up to 2**53 (beyond, they are not exact integers, and past 2**63 int64 would wrap them)
    flat = y.reshape(n) if y.ndim == 2 and y.shape[1] == 1 else y
    if flat.ndim == 1 and flat.dtype.kind in "iu" and n and max(-int(flat.min()), int(flat.max())) > 2 ** 53:
        # (uint64 labels past 2**63 became negative as int64, silently: 2**64 - 1 was label -1; int64 ones
        # past 2**53 met dmath's DTypeError, which suggested rounding them)
        k = int(np.argmax(np.abs(flat.astype(np.float64))))
        raise DataError(f"Dataset: label {int(flat[k])} at index {k} is beyond 2**53, the largest whole number "
                        f"a target is stored exactly as (float64); class labels are 0..classes-1")
    if flat.ndim == 1 and (flat.dtype.kind in "iub" or (n and np.all(np.isfinite(flat)) and np.all(np.mod(flat, 1) == 0)
                                                      and np.all(np.abs(flat) <= 2.0 ** 53))):
        labels = flat.astype(np.int64)
        lo, hi = (int(labels.min()), int(labels.max())) if n else (0, 0)
        return labels[:, None], "labels", (lo, hi)
    rows = y.reshape(n, -1)
    if rows.dtype.kind == "f" and rows.dtype.name not in dmath.DTYPES:
        # (they were stored as float32, silently; whole-number labels above are exact as int64)
        raise DataError(f"Dataset: the targets are {rows.dtype.name} (long double), wider than any dmath dtype: "
                        f"convert them (y.astype(np.float64) rounds them)")
    if rows.dtype.kind == "f" and not np.isfinite(rows).all():
        bad = np.flatnonzero(~np.isfinite(rows).all(axis=1))
        raise DataError(f"Dataset: {bad.size} target row(s) hold NaN or infinity, the first at index {bad[0]}")
    return rows, "rows", ((float(rows.min()), float(rows.max())) if rows.size else None)


def _place_targets(targets):
    """(matrix or None, kind, label range) of checked targets: Replicated on every worker."""
    rows, kind, label_range = targets
    if rows is None:
        return None, None, None
    if kind == "labels":
        # (whole numbers: class labels or regression targets alike; a classification loss checks
        # its range, cross_entropy refuses negative ones)
        dtype = "float32" if max(-label_range[0], label_range[1]) < _F32_EXACT else "float64"
    else:
        # (by name: a big-endian '>f8' is not == np.float64, and its rows were stored as float32)
        dtype = "float64" if rows.dtype.name == "float64" else "float32"
    return dmath.from_numpy(rows, layout=dmath.Replicated(), dtype=dtype), kind, label_range


def _npy_shape(f):
    version = np.lib.format.read_magic(f)
    read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
    return read(f)[0]


def _idx_header(path, expected):
    """(shape, data offset) of an uncompressed IDX file holding `expected` values; checks its size."""
    try:
        with open_regular(path) as f:
            head = f.read(4)
            if len(head) < 4 or head[0] or head[1] or IDX_TYPES.get(head[2]) != expected or head[3] == 0:
                raise DataError(f"{path}: not an IDX file of {expected.name} values (header {head.hex()})")
            dims = np.frombuffer(f.read(4 * head[3]), dtype=">u4")
            size = os.fstat(f.fileno()).st_size
    except OSError as exc:
        raise DataError(f"{path}: cannot be read ({exc})") from exc
    if dims.size != head[3] or 0 in dims:
        raise DataError(f"{path}: truncated or empty IDX header")
    offset = 4 + 4 * head[3]
    need = offset + math.prod(int(d) for d in dims) * expected.itemsize     # Python ints: an int64 product wraps
    if size != need:
        raise DataError(f"{path}: {size:,} bytes, the IDX header announces {need:,}")
    return tuple(int(d) for d in dims), offset


def as_dataset(x, y, what="x", check=None):
    """`x` itself when it is a Dataset (then y must be None), else a Dataset of the arrays (x, y).

    check(features, targets kind, values per target, label range) runs
    before arrays are placed on the workers (a mistake then sends nothing).
    """
    if isinstance(x, Dataset):
        if y is not None:
            raise ConfigError(f"{what}: a Dataset carries its own targets; pass y=None")
        if check is not None:
            check(x.features, x.y_kind, x.y.shape[1] if x.y is not None else 0, x.label_range)
        return x
    _ensure_runtime()
    x = _samples(x)
    targets = _targets(y, len(x))
    if check is not None:
        rows, kind, label_range = targets
        check(math.prod(x.shape[1:]), kind, rows.shape[1] if rows is not None else 0, label_range)
    ds = Dataset.__new__(Dataset)
    ds._place(x, targets)
    return ds
