"""Callbacks of Model.fit, and the History it returns.

A callback's hooks get the epoch's logs: {'loss', 'accuracy', 'val_loss',
'val_accuracy', 'samples_per_s'} as far as they apply. Per-batch hooks get
no values: reading the loss costs a gather from the workers, so the model
reads it once per epoch (and when the progress bar redraws).
"""
import math

from .errors import ConfigError


class Callback:
    """Base: override the hooks you need. `self.model` is set by fit."""

    model = None

    def on_train_begin(self, logs=None):
        pass

    def on_epoch_begin(self, epoch, logs=None):
        pass

    def on_batch_end(self, batch, logs=None):
        pass

    def on_epoch_end(self, epoch, logs=None):
        pass

    def on_train_end(self, logs=None):
        pass


class History(Callback):
    """What fit returns: `history[key]` lists the value of each epoch; `epoch` the epoch indices."""

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
        fig.savefig(path, dpi=100)
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
    """A callback from functions: on_epoch_end=lambda epoch, logs: ..., and so on."""

    def __init__(self, on_train_begin=None, on_epoch_begin=None, on_batch_end=None, on_epoch_end=None,
                 on_train_end=None):
        for name, fn in (("on_train_begin", on_train_begin), ("on_epoch_begin", on_epoch_begin),
                         ("on_batch_end", on_batch_end), ("on_epoch_end", on_epoch_end),
                         ("on_train_end", on_train_end)):
            if fn is not None:
                setattr(self, name, fn)


class EarlyStopping(Callback):
    """Stop training when `monitor` has not improved by min_delta for `patience` epochs."""

    def __init__(self, monitor="val_loss", patience=0, min_delta=0.0, mode="auto"):
        if mode not in ("auto", "min", "max"):
            raise ConfigError(f"EarlyStopping: mode must be 'auto', 'min' or 'max', got {mode!r}")
        self.monitor, self.patience, self.min_delta = monitor, int(patience), abs(float(min_delta))
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
            if self.wait > self.patience:
                self.stopped_epoch = epoch
                self.model.stop_training = True


class ModelCheckpoint(Callback):
    """Save the model after each epoch (only when `monitor` improved, with save_best_only)."""

    def __init__(self, path, monitor="val_loss", save_best_only=False):
        self.path, self.monitor, self.save_best_only = path, monitor, bool(save_best_only)
        self.best = math.inf
        self.sign = -1.0 if "acc" in monitor else 1.0

    def on_epoch_end(self, epoch, logs=None):
        if self.save_best_only:
            if not logs or self.monitor not in logs:
                raise ConfigError(f"ModelCheckpoint: {self.monitor!r} is not in the epoch's logs")
            value = self.sign * logs[self.monitor]
            if value >= self.best:
                return
            self.best = value
        self.model.save(str(self.path).format(epoch=epoch + 1, **(logs or {})))
