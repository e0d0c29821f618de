"""Mini-batches of numpy arrays, shuffled per epoch, prepared by a background thread.

The thread does the host work of a batch (gathering the shuffled rows,
converting the dtype, flattening images, one-hot encoding labels) up to
`prefetch` batches ahead, so that it overlaps the training step. Device
writes stay in the calling thread: the dmath runtime takes commands from the
master's main thread only. With `target=(X, Y)` every batch is written in
place into those dmath matrices (Matrix.assign) before it is yielded, which
is how a recorded training step receives its next batch.
"""
import numbers
import queue
import threading

import numpy as np

from ..errors import ConfigError
from .errors import DataError

_END = object()


class _Failure:
    """An exception raised in the prefetch thread, carried to the consumer."""

    def __init__(self, exc):
        self.exc = exc


def _nonnegative_int(value, what):
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 0:
        raise ConfigError(f"DataLoader: {what} must be a non-negative integer, got {value!r}")
    return int(value)


def _bool(value, what):
    # a truthy string ("no") or a number is refused: bool("no") would turn the option on
    if not isinstance(value, bool):
        raise ConfigError(f"DataLoader: {what} must be True or False, got {value!r}")
    return value


def _converted(xb, dtype):
    """The batch xb as `dtype`, refusing values the conversion would not keep: a finite value beyond a
    float dtype's range (1e6 became inf as float16, with only NumPy's RuntimeWarning) and, for an integer
    dtype, NaN, infinity or a value outside its range (300 wrapped to 44 as int8)."""
    with np.errstate(over="ignore", invalid="ignore"):
        out = xb.astype(dtype, copy=False)
    if xb.dtype.kind not in "biuf" or out is xb:
        return out
    wide = xb.reshape(len(xb), -1)
    if dtype.kind == "f" and xb.dtype.kind == "f":
        bad = np.isfinite(wide) & ~np.isfinite(out.reshape(len(xb), -1))
        what = f"beyond {dtype}'s range"
    elif dtype.kind == "f":
        bad = np.abs(wide.astype(np.float64)) > np.finfo(dtype).max
        what = f"beyond {dtype}'s range"
    elif dtype.kind in "iu":
        info = np.iinfo(dtype)
        if xb.dtype.kind == "f":
            bad = ~np.isfinite(wide) | (wide < info.min) | (wide > info.max)
        else:
            bad = (wide < info.min) | (wide > info.max)
        what = f"NaN, infinite or outside {dtype}'s range {info.min}..{info.max}"
    else:
        return out
    rows = np.flatnonzero(bad.any(axis=1))
    if rows.size:
        raise DataError(f"DataLoader: {rows.size} sample(s) of a batch hold values {what} (converting {xb.dtype} to "
                        f"{dtype} would change them silently); pass another dtype= or scale the data")
    return out


class DataLoader:
    """Iterate over (x_batch, y_batch) numpy pairs, one epoch per iteration.

    x: array (N, ...); y: array (N, ...) or None (then y_batch is None).
    batch_size: samples per batch. shuffle: a new order every epoch, drawn
    from (seed, epoch), so a run is reproducible; epochs count the
    iterations started (or set them with set_epoch). drop_last: skip a final
    short batch. prefetch: batches prepared ahead by a background thread
    (0: prepare in the caller). dtype: convert x batches to this dtype.
    target: None, or (X, Y) dmath matrices (Y may be None) that receive
    every batch in place: X is (batch_size, features) and gets x_batch
    flattened per sample; Y is (batch_size, classes) and gets the one-hot
    rows of integer labels (or y_batch as is when y is 2-D). Every batch must
    then be full: pass drop_last=True unless batch_size divides N.
    """

    def __init__(self, x, y=None, batch_size=32, shuffle=False, seed=0, drop_last=False, prefetch=2,
                 dtype=None, target=None):
        self.x = np.asarray(x)
        self.y = None if y is None else np.asarray(y)
        if self.x.ndim == 0 or len(self.x) == 0:
            raise DataError(f"DataLoader: x must hold at least one sample, got shape {self.x.shape}")
        if self.y is not None and (self.y.ndim == 0 or len(self.y) != len(self.x)):
            raise DataError(f"DataLoader: x has {len(self.x)} samples, y has shape {self.y.shape}")
        self.batch_size = _nonnegative_int(batch_size, "batch_size")
        if self.batch_size == 0:
            raise ConfigError("DataLoader: batch_size must be at least 1")
        self.shuffle = _bool(shuffle, "shuffle")
        self.seed = _nonnegative_int(seed, "seed")
        self.drop_last = _bool(drop_last, "drop_last")
        self.prefetch = _nonnegative_int(prefetch, "prefetch")
        try:
            self.dtype = None if dtype is None else np.dtype(dtype)
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"DataLoader: dtype must be a NumPy dtype such as 'float32', got {dtype!r}") from exc
        self.epoch = 0
        self.target = self._check_target(target)

    # ---- configuration -------------------------------------------------------------------
    def _check_target(self, target):
        if target is None:
            return None
        try:
            tx, ty = target
        except (TypeError, ValueError) as exc:
            raise ConfigError("DataLoader: target must be a pair (X, Y) of dmath matrices (Y may be None)") from exc
        features = int(np.prod(self.x.shape[1:], dtype=np.int64))
        if not hasattr(tx, "assign") or tuple(tx.shape) != (self.batch_size, features):
            raise ConfigError(f"DataLoader: target X must be a dmath.Matrix of shape {(self.batch_size, features)}, "
                              f"got {getattr(tx, 'shape', type(tx).__name__)}")
        if ty is not None:
            if self.y is None:
                raise ConfigError("DataLoader: a target Y needs labels y")
            if not hasattr(ty, "assign") or ty.shape[0] != self.batch_size:
                raise ConfigError(f"DataLoader: target Y must be a dmath.Matrix with {self.batch_size} rows")
            self._check_label_target(ty.shape[1])
        if len(self.x) % self.batch_size and not self.drop_last:
            raise ConfigError(f"DataLoader: {len(self.x)} samples do not fill batches of {self.batch_size}; "
                              f"a target needs full batches: pass drop_last=True")
        return tx, ty

    def _check_label_target(self, width):
        if self.y.ndim == 1:
            if not np.issubdtype(self.y.dtype, np.integer):
                raise DataError(f"DataLoader: labels for a one-hot target must be integers, got {self.y.dtype}")
            if self.y.min() < 0 or self.y.max() >= width:
                raise DataError(f"DataLoader: labels must be in [0, {width}) for a target Y of {width} columns, "
                                f"got {self.y.min()}..{self.y.max()}")
        elif int(np.prod(self.y.shape[1:])) != width:
            raise ConfigError(f"DataLoader: y rows have {int(np.prod(self.y.shape[1:]))} values, "
                              f"target Y has {width} columns")

    def set_epoch(self, epoch):
        """The epoch the next iteration runs (its shuffled order)."""
        self.epoch = _nonnegative_int(epoch, "epoch")

    def __len__(self):
        full, rest = divmod(len(self.x), self.batch_size)
        return full + (1 if rest and not self.drop_last else 0)

    # ---- batches -------------------------------------------------------------------------
    def order(self, epoch):
        """The sample order of `epoch` (a permutation when shuffling)."""
        if not self.shuffle:
            return np.arange(len(self.x))
        return np.random.default_rng([self.seed, epoch]).permutation(len(self.x))

    def _batch_indices(self, order):
        for start in range(0, len(self) * self.batch_size, self.batch_size):
            yield order[start:start + self.batch_size]

    def _make(self, idx):
        """The host work of one batch (runs in the prefetch thread)."""
        xb = self.x[idx]
        if self.dtype is not None:
            try:
                xb = _converted(xb, self.dtype)
            except DataError:
                raise                                   # values the conversion would change: said already
            except (TypeError, ValueError) as exc:      # e.g. a text value that is no number
                raise DataError(f"DataLoader: a batch of x ({xb.dtype}) cannot be converted to {self.dtype}: "
                                f"{exc}") from exc
        yb = None if self.y is None else self.y[idx]
        if self.target is None:
            return xb, yb, None, None
        tx, ty = self.target
        x_rows = np.ascontiguousarray(xb.reshape(len(idx), -1), dtype=tx.dtype)
        y_rows = None
        if ty is not None:
            if yb.ndim == 1:
                y_rows = np.zeros(ty.shape, dtype=ty.dtype)
                y_rows[np.arange(len(idx)), yb] = 1
            else:
                y_rows = np.ascontiguousarray(yb.reshape(len(idx), -1), dtype=ty.dtype)
        return xb, yb, x_rows, y_rows

    def _deliver(self, item):
        xb, yb, x_rows, y_rows = item
        if self.target is not None:
            tx, ty = self.target
            tx.assign(x_rows)
            if ty is not None:
                ty.assign(y_rows)
        return xb, yb

    def __iter__(self):
        indices = self._batch_indices(self.order(self.epoch))
        self.epoch += 1
        if self.prefetch == 0:
            for idx in indices:
                yield self._deliver(self._make(idx))
            return
        yield from self._prefetched(indices)

    def _prefetched(self, indices):
        ready = queue.Queue(maxsize=self.prefetch)
        stop = threading.Event()

        def put(item):
            # give up when the consumer has gone (it stopped iterating early)
            while not stop.is_set():
                try:
                    ready.put(item, timeout=0.05)
                    return True
                except queue.Full:
                    continue
            return False

        def produce():
            try:
                for idx in indices:
                    if not put(self._make(idx)):
                        return
                put(_END)
            except BaseException as exc:  # noqa: B036 - every failure must reach the consumer
                put(_Failure(exc))

        worker = threading.Thread(target=produce, name="dnn-data-prefetch", daemon=True)
        worker.start()
        try:
            while True:
                item = ready.get()
                if item is _END:
                    return
                if isinstance(item, _Failure):
                    raise item.exc
                yield self._deliver(item)
        finally:
            stop.set()
            worker.join()
