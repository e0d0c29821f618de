"""Callbacks of Model.fit, and the History it returns.

Every hook gets a logs dict, as Keras passes one: on_epoch_end the epoch's
{'loss', 'accuracy', 'val_loss', 'val_accuracy', 'samples_per_s'} as far as
they apply, on_train_end the last epoch's, the others an empty dict.
Per-batch hooks get no values: reading the loss costs a gather from the
workers, so the model reads it once per epoch (and when the progress bar
redraws). A hook written without the logs argument (`def on_batch_end(self,
batch)`, `LambdaCallback(on_batch_end=lambda batch: ...)`) is called
without it.
"""
import inspect
import math
import numbers
import os
import string
import weakref

import dmath

from ..errors import ConfigError, ModelFileError, TrainingError


class Callback:
    """Base: override the hooks you need. fit sets `self.model` and `self.params` (as Keras):
    {'epochs', 'batch_size', 'verbose', 'metrics': the names the epoch's logs will hold}."""

    model = None
    params = None
    #: whether on_batch_end may change a setting a recorded step computes with (the optimizer or its
    #: hyper-parameters, a layer's configuration): fit then checks them after the hook, at every step
    #: (False for the library's callbacks that only read or save)
    changes_settings = True

    def hooks_batch_end(self):
        """Whether this callback's on_batch_end may change a setting a recorded step computes with:
        fit takes the step's key again after it at every step. True when `changes_settings` and an
        on_batch_end other than the base class's no-op runs, whether written in a subclass or
        stored on the instance (LambdaCallback(on_batch_end=f)): looking at the class alone missed
        the latter, and a momentum or a freeze set from f was ignored for the rest of the epoch."""
        if not self.changes_settings:
            return False
        hook = getattr(self, "on_batch_end")
        return getattr(hook, "__func__", hook) is not Callback.on_batch_end

    def on_train_begin(self, logs=None):
        """Before the first epoch of a fit."""

    def on_epoch_begin(self, epoch, logs=None):
        """Before epoch `epoch` (counted from fit's initial_epoch)."""

    def on_batch_end(self, batch, logs=None):
        """After step `batch` of the epoch; logs hold the batch's size (reading the running loss drains
        the workers: see TerminateOnNaN's check_every). A setting changed here applies from the next
        step (see hooks_batch_end)."""

    def on_epoch_end(self, epoch, logs=None):
        """After epoch `epoch`; logs hold its metrics (loss, accuracy, val_*): set
        `self.model.stop_training = True` to end the fit here."""

    def on_train_end(self, logs=None):
        """After the last epoch (also after a stop)."""

    def epoch_end_reads(self):
        """(1, 1) dmath matrices whose values this callback needs at every epoch's end (default:
        none). fit asks just before the epoch's last read, while the workers still run its last
        steps, and reads them with the epoch's metrics in that one round trip; a read of its own
        in on_epoch_end would find the GPUs drained and keep them idle until it returns. Their
        values reach `epoch_end_values`, in this order, before `on_epoch_end`."""
        return ()

    def epoch_end_values(self, values):
        """The values (floats) of this epoch's `epoch_end_reads` matrices, just before on_epoch_end."""


def call(callbacks, hook, *args, logs=None):
    """Call the method `hook` of every callback with `args` and `logs` (a dict; None: {}), or with
    `args` alone where the hook takes no more (see the module's docstring)."""
    logs = {} if logs is None else logs
    for cb in callbacks:
        fn = getattr(cb, hook)
        if _takes_logs(fn, len(args)):
            fn(*args, logs)
        else:
            fn(*args)


#: function -> {positional arguments given: whether it takes the logs after them}, read once per
#: function (a signature costs microseconds, and on_batch_end runs every step)
_TAKES_LOGS = weakref.WeakKeyDictionary()


def _takes_logs(fn, nargs):
    target, nargs = (fn.__func__, nargs + 1) if inspect.ismethod(fn) else (fn, nargs)
    try:
        known = _TAKES_LOGS.setdefault(target, {})
    except TypeError:           # (a callable that takes no weak reference: its signature is read each time)
        known = {}
    if nargs not in known:
        try:
            inspect.signature(target).bind(*range(nargs + 1))
            known[nargs] = True
        except TypeError:
            known[nargs] = False
        except ValueError:      # (no signature to read: given the logs, as Keras gives them)
            known[nargs] = True
    return known[nargs]


def read_epoch_end(metrics, hooks):
    """(mean loss, accuracy) of the epoch from `metrics`, read with every callback's epoch_end_reads
    matrices (asked now, while the workers still run the epoch's last steps: a read of a callback's
    own after this one would keep the drained GPUs idle), whose values go to its epoch_end_values."""
    wanted = [(cb, _epoch_end_reads(cb)) for cb in hooks]
    (loss, acc), values = metrics.read_with([m for _, mats in wanted for m in mats])
    for cb, mats in wanted:
        if mats:
            cb.epoch_end_values(values[:len(mats)])
            values = values[len(mats):]
    return loss, acc


def _epoch_end_reads(cb):
    """cb.epoch_end_reads() as a checked list of (1, 1) dmath matrices."""
    mats = cb.epoch_end_reads()
    try:
        mats = list(mats) if mats is not None else []
    except TypeError as exc:
        raise ConfigError(f"{type(cb).__name__}.epoch_end_reads must return a list of (1, 1) dmath matrices, "
                          f"got {mats!r}") from exc
    for m in mats:
        if not isinstance(m, dmath.Matrix) or tuple(m.shape) != (1, 1):
            what = f"a {m.shape} matrix" if isinstance(m, dmath.Matrix) else type(m).__name__
            raise ConfigError(f"{type(cb).__name__}.epoch_end_reads must return (1, 1) dmath matrices (each one "
                              f"value), got {what}")
    return mats


class History(Callback):
    """What fit returns: `history[key]` lists the value of each epoch; `epoch` the epoch indices. It
    reads as a mapping of the metric names (iteration, len, keys, items, `in`), as `history.history`."""

    def __init__(self):
        self.history = {}
        self.epoch = []

    def on_epoch_end(self, epoch, logs=None):
        self.epoch.append(epoch)
        for k, v in (logs or {}).items():
            self.history.setdefault(k, []).append(v)

    def __getitem__(self, key):
        return self.history[key]

    def __contains__(self, key):
        return key in self.history

    def __iter__(self):
        # the metric names, as iterating `history` gives them (without this, Python's fallback
        # iteration called __getitem__(0, 1, ...) and `list(h)` raised KeyError: 0)
        return iter(self.history)

    def __len__(self):
        return len(self.history)

    def keys(self):
        """The metric names ('loss', 'accuracy', 'val_loss', ...)."""
        return self.history.keys()

    def items(self):
        """(metric name, per-epoch values) pairs."""
        return self.history.items()

    def __repr__(self):
        return f"History({self.history})"

    def plot(self, path=None):
        """Training curves: loss (and val_loss) and accuracy (and val_accuracy) against the epoch.

        Returns the matplotlib Figure; with `path` it is also written there
        (PNG, SVG, ... by the suffix). Needs matplotlib (the `plot` extra).
        """
        return plot_curves(self.epoch, self.history, path)


def pyplot():
    """matplotlib.pyplot (imported on first use: matplotlib stays optional), or an ImportError that
    says how to get it. Without a display matplotlib picks a file-only backend itself."""
    try:
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise ImportError("plots need matplotlib: pip install 'dmath-dnn[plot]' (or pip install matplotlib)") \
            from exc
    return plt


def plot_curves(epochs, history, path=None):
    """The figure of History.plot from epoch numbers and {'loss': [...], 'val_loss': [...], ...}."""
    plt = pyplot()
    panels = [k for k in ("loss", "accuracy") if k in history or f"val_{k}" in history]
    fig, axes = plt.subplots(1, max(len(panels), 1), figsize=(5 * max(len(panels), 1), 3.6), squeeze=False)
    x = [e + 1 for e in epochs]
    for ax, key in zip(axes[0], panels):
        for name, style in ((key, "-o"), (f"val_{key}", "--s")):
            if name in history:
                ax.plot(x, history[name], style, label=name, markersize=4)
        ax.set_xlabel("epoch")
        ax.set_ylabel(key)
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    if path is not None:
        try:
            fig.savefig(path, dpi=100)
        except OSError as exc:      # a directory that does not exist or is a file: name the path
            plt.close(fig)
            raise ConfigError(f"cannot write the training curves to {os.fspath(path)!r}: {exc}") from exc
    return fig


class PlotHistory(Callback):
    """Write the training curves to `path` (a PNG) at the end of every epoch: a run can be watched."""

    def __init__(self, path):
        self.path = path
        self.history = History()

    def on_epoch_end(self, epoch, logs=None):
        self.history.on_epoch_end(epoch, logs)
        pyplot().close(self.history.plot(self.path))


class LambdaCallback(Callback):
    """A callback from functions, as Keras': on_epoch_end=lambda epoch, logs: ...,
    on_batch_end=lambda batch, logs: ..., on_train_begin=lambda logs: ..., and so on; a function
    may leave the logs out (on_batch_end=lambda batch: ...)."""

    def __init__(self, on_train_begin=None, on_epoch_begin=None, on_batch_end=None, on_epoch_end=None,
                 on_train_end=None):
        for name, fn in (("on_train_begin", on_train_begin), ("on_epoch_begin", on_epoch_begin),
                         ("on_batch_end", on_batch_end), ("on_epoch_end", on_epoch_end),
                         ("on_train_end", on_train_end)):
            if fn is not None:
                setattr(self, name, fn)


class EarlyStopping(Callback):
    """Stop training when `monitor` has not improved by min_delta for `patience` epochs in a row
    (as Keras: with patience=2, after the second epoch without improvement; 0 stops at the first)."""

    def __init__(self, monitor="val_loss", patience=0, min_delta=0.0, mode="auto"):
        if mode not in ("auto", "min", "max"):
            raise ConfigError(f"EarlyStopping: mode must be 'auto', 'min' or 'max', got {mode!r}")
        _check_monitor(monitor, "EarlyStopping")
        # no coercion: int(2.7) would wait 2 epochs, and a NaN min_delta stopped after the first (no value
        # compares below NaN)
        if isinstance(patience, bool) or not isinstance(patience, numbers.Integral) or patience < 0:
            raise ConfigError(f"EarlyStopping: patience must be a whole number of epochs >= 0, got {patience!r}")
        if isinstance(min_delta, bool) or not isinstance(min_delta, numbers.Real) or not min_delta >= 0 \
                or not math.isfinite(min_delta):
            raise ConfigError(f"EarlyStopping: min_delta must be a finite number >= 0, got {min_delta!r}")
        self.monitor, self.patience, self.min_delta = monitor, int(patience), float(min_delta)
        self.sign = -1.0 if mode == "max" or (mode == "auto" and "acc" in monitor) else 1.0
        self.best, self.wait, self.stopped_epoch = math.inf, 0, None

    def on_train_begin(self, logs=None):
        self.best, self.wait, self.stopped_epoch = math.inf, 0, None

    def on_epoch_end(self, epoch, logs=None):
        if not logs or self.monitor not in logs:
            raise ConfigError(f"EarlyStopping: {self.monitor!r} is not in the epoch's logs {sorted(logs or {})}")
        value = self.sign * logs[self.monitor]
        if value < self.best - self.min_delta:
            self.best, self.wait = value, 0
        else:
            self.wait += 1
            # the patience-th epoch in a row without improvement stops (as Keras; 0 and 1: the first)
            if self.wait >= self.patience:
                self.stopped_epoch = epoch
                self.model.stop_training = True


class ModelCheckpoint(Callback):
    """Save a checkpoint (Model.save: everything needed to resume) every `every` epochs or steps.

    path: the file name, formatted with {epoch} (1-based: epochs completed), {batch} (batches done in
        the epoch being trained, 0 at an epoch's end), {step} (optimizer steps taken) and, at an
        epoch's end, the epoch's logs ({val_loss:.3f}). Its directory is made at the first save; a
        field that will not be known when a file is due is refused here, before training starts.
    unit: 'epoch' or 'step' (a step checkpoint inside an epoch resumes at its batch:
        dnn.load(path).fit(..., same batch_size) continues from there).
    keep: keep the last `keep` files this callback wrote (older ones are deleted); None keeps all.
    save_best_only: per epoch only, save when `monitor` improved.
    """

    changes_settings = False

    def __init__(self, path, monitor="val_loss", save_best_only=False, every=1, unit="epoch", keep=None):
        if unit not in ("epoch", "step"):
            raise ConfigError(f"ModelCheckpoint: unit must be 'epoch' or 'step', got {unit!r}")
        if isinstance(every, bool) or not isinstance(every, numbers.Integral) or every < 1:
            raise ConfigError(f"ModelCheckpoint: every must be a positive integer, got {every!r}")
        if keep is not None and (isinstance(keep, bool) or not isinstance(keep, numbers.Integral) or keep < 1):
            raise ConfigError(f"ModelCheckpoint: keep must be None or a positive integer, got {keep!r}")
        if save_best_only and unit != "epoch":
            raise ConfigError("ModelCheckpoint: save_best_only compares epoch logs; use it with unit='epoch'")
        _check_monitor(monitor, "ModelCheckpoint")
        self.fields = _check_path_fields(path, unit)
        self.path, self.monitor, self.save_best_only = path, monitor, bool(save_best_only)
        self.every, self.unit, self.keep = int(every), unit, keep
        self.best = math.inf
        self.sign = -1.0 if "acc" in monitor else 1.0
        self.written = []       # the files this callback wrote, oldest first

    def on_train_begin(self, logs=None):
        """Refuse, before any step, a path field or a monitored value that the epoch's logs of
        this fit will not hold (e.g. {val_loss} without validation data)."""
        known = (self.params or {}).get("metrics")
        if known is None:           # not started by fit: nothing to check against
            return
        # a schedule no file could load back: refused before the first step, not at the first save
        from ..optim import schedules
        schedules.check_saveable(self.model.optimizer.schedule)
        missing = [f for f in self.fields if f not in ("epoch", "batch", "step") and f not in known]
        if missing:
            raise ConfigError(f"ModelCheckpoint: path {os.fspath(self.path)!r} names "
                              f"{', '.join('{' + f + '}' for f in missing)}, which this fit's epoch logs will "
                              f"not hold; they hold {known} (val_* need validation data)")
        if self.save_best_only and self.monitor not in known:
            raise ConfigError(f"ModelCheckpoint: monitor {self.monitor!r} is not among this fit's epoch logs "
                              f"{known} (val_* need validation data)")

    def on_batch_end(self, batch, logs=None):
        if self.unit == "step" and self.model.optimizer.iterations % self.every == 0:
            epoch = self.model.position[0] if self.model.position else self.model.epochs_trained
            self._save(epoch=epoch, batch=batch + 1)

    def on_epoch_end(self, epoch, logs=None):
        if self.unit != "epoch" or (epoch + 1) % self.every:
            return
        if self.save_best_only:
            if not logs or self.monitor not in logs:
                raise ConfigError(f"ModelCheckpoint: {self.monitor!r} is not in the epoch's logs")
            value = self.sign * logs[self.monitor]
            # not an improvement unless a finite number below the best: NaN compares False with
            # everything, and saving at a NaN epoch would overwrite the best file with NaN weights
            if not (math.isfinite(value) and value < self.best):
                return
            self.best = value
        self._save(epoch=epoch + 1, batch=0, **(logs or {}))

    def _save(self, **fields):
        path = os.fspath(self.path).format(step=self.model.optimizer.iterations, **fields)
        directory = os.path.dirname(path)
        if directory:
            # made here, not at construction: the user may create it meanwhile
            try:
                os.makedirs(directory, exist_ok=True)
            except OSError as exc:      # a parent that is a file, a read-only or virtual file system
                raise ModelFileError(f"ModelCheckpoint: cannot make the directory {directory!r} of the "
                                     f"checkpoint {path!r}: {exc}") from exc
        self.model.save(path)
        if path in self.written:
            self.written.remove(path)
        self.written.append(path)
        while self.keep is not None and len(self.written) > self.keep:
            old = self.written.pop(0)
            try:
                os.remove(old)
            except FileNotFoundError:
                pass


def _check_path_fields(path, unit):
    """The names of the fields of `path`; ConfigError unless it is a str.format pattern whose fields
    ModelCheckpoint can fill: epoch, batch and step, and with unit='epoch' also the names of the
    epoch's logs (which on_train_begin checks against the fit's)."""
    try:
        fields = [f for _, f, _, _ in string.Formatter().parse(os.fspath(path)) if f is not None]
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"ModelCheckpoint: path must be a file name pattern, got {path!r} ({exc})") from exc
    names = []
    for field in fields:
        name = field.split(".")[0].split("[")[0]
        if not name or name.isdigit():
            raise ConfigError(f"ModelCheckpoint: path {path!r}: fields are named ({{epoch}}, {{step}}, ...), "
                              f"not positional ({{{field}}})")
        if unit == "step" and name not in ("epoch", "batch", "step"):
            raise ConfigError(f"ModelCheckpoint: path {path!r} names {{{name}}}, which a step checkpoint does "
                              f"not know: use {{epoch}}, {{batch}} and {{step}} (epoch logs come with "
                              f"unit='epoch')")
        names.append(name)
    # a format spec, conversion or index the values cannot take ({epoch:q}, {epoch[0]}, {epoch!z}) would
    # only fail at the first save, after training: format once with values of the fields' types
    # (epoch, batch and step are ints, the logs floats)
    sample = {name: 0.5 for name in names}
    sample.update(epoch=1, batch=0, step=1)
    try:
        os.fspath(path).format(**sample)
    except (ValueError, TypeError, KeyError, IndexError, AttributeError) as exc:
        raise ConfigError(f"ModelCheckpoint: path {path!r} cannot be formatted with the values it will get "
                          f"(integers for epoch, batch and step, floats for the logs): {exc!r}") from exc
    return names


def _check_monitor(monitor, who):
    if not isinstance(monitor, str):
        raise ConfigError(f"{who}: monitor must be the name of an epoch log such as 'val_loss', got {monitor!r}")


class TerminateOnNaN(Callback):
    """Stop training with TrainingError when it has gone numerically wrong (on by default in fit).

    Checked every `check_every` batches (one small gather) and at the end of
    every epoch: the running loss is NaN or infinite; at an epoch's end, also
    a weight holding NaN or infinity, or a non-finite validation loss; with
    float16 and dynamic loss scaling, `max_skipped` steps in a row skipped
    for inf/NaN gradients (the scale then only shrinks: the inputs or the
    learning rate are wrong). Keras's TerminateOnNaN only stops; this one
    raises, so that a script does not go on with a broken model. Pass
    `fit(..., terminate_on_nan=False)` to train without it.
    """

    changes_settings = False

    def __init__(self, check_every=50, max_skipped=30):
        for name, v in (("check_every", check_every), ("max_skipped", max_skipped)):
            if isinstance(v, bool) or not isinstance(v, numbers.Integral) or v < 1:
                raise ConfigError(f"TerminateOnNaN: {name} must be a positive integer, got {v!r}")
        self.check_every, self.max_skipped = int(check_every), int(max_skipped)
        self.epoch = 0
        self._values, self._nflags = None, 0     # this epoch's end-of-epoch reads (epoch_end_values)

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_batch_end(self, batch, logs=None):
        if (batch + 1) % self.check_every == 0:
            self._check_running(f"after batch {batch + 1} of epoch {self.epoch}")

    def epoch_end_reads(self):
        # the weights' finiteness (one flag per worker group) and the float16 skip count, read with
        # the epoch's metrics: on their own, after the epoch's read, they held 4 GPUs idle for 6 ms
        # an epoch (ResNet-50, benchmarks/probes/epoch_edge.py)
        self._values = None
        weights = self._weights()
        by_group = {}
        for w in weights:
            by_group.setdefault(tuple(w.value.layout.members(dmath.num_workers())), []).append(w.value)
        flags = [dmath.nn.all_finite(ms) for ms in by_group.values()]
        scaler = self.model.loss_scale
        self._nflags = len(flags)
        return flags + ([scaler.skipped] if scaler is not None else [])

    def epoch_end_values(self, values):
        self._values = list(values)

    def on_epoch_end(self, epoch, logs=None):
        where = f"at the end of epoch {epoch}"
        values, self._values = self._values, None
        for key in ("loss", "val_loss"):
            value = (logs or {}).get(key)
            if value is not None and not math.isfinite(value):
                self._stop(f"the {key} is {value} {where}")
        weights = self._weights()
        if values is None:              # called outside fit's epoch end: read here
            self._check_skips(where)
            finite = not weights or _all_finite([w.value for w in weights])
        else:
            flags, skipped = values[:self._nflags], values[self._nflags:]
            if skipped:
                self._check_skips(where, int(skipped[0]))
            finite = all(f == 1.0 for f in flags)
        if not finite:
            bad = next(w for w in weights if not _all_finite([w.value]))
            self._stop(f"the weight {bad.name} holds NaN or infinity {where}")

    def _weights(self):
        return [w for layer in self.model.layers for w in layer.weights if w.value.size]

    def _check_running(self, where):
        scaler = self.model.loss_scale
        # the running sums and the skip count in one read (a drain of the workers every check_every batches)
        (loss, _), extra = self.model.train_metrics.read_with([scaler.skipped] if scaler is not None else [])
        if not math.isfinite(loss):
            self._stop(f"the loss is {loss} {where}")
        if extra:
            self._check_skips(where, int(extra[0]))

    def _check_skips(self, where, skipped=None):
        scaler = self.model.loss_scale
        if scaler is not None:
            n = scaler.skipped_in_a_row() if skipped is None else skipped
            if n >= self.max_skipped:
                self._stop(f"the last {n} steps were all skipped {where}: their float16 gradients held inf "
                           f"or NaN at every loss scale down to {scaler.value():g}")

    def _stop(self, what):
        self.model.stop_training = True
        raise TrainingError(
            f"training stopped: {what}. Usual causes: inputs with huge values (normalise them), a "
            f"learning rate too large, or float16 where float32 is needed. fit(..., "
            f"terminate_on_nan=False) trains on regardless")


def _all_finite(matrices):
    """Whether every value of the matrices is finite (decided on the workers, one value read; one
    per matrix when they live on different worker groups)."""
    try:
        return dmath.nn.all_finite(matrices).get((0, 0)) == 1.0
    except dmath.LayoutError:
        return all(dmath.nn.all_finite([m]).get((0, 0)) == 1.0 for m in matrices)
