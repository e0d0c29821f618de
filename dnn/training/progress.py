"""What Model.fit shows: a tqdm bar during an epoch, and one Keras-style line per epoch.

fit runs on the master (rank 0) only, so only rank 0 ever draws. The bar
goes to stderr (tqdm's habit) and is drawn through pipes too: under
`mpiexec` a rank's output is a pipe to the launcher, which a terminal still
shows live. Reading the loss for the bar means a gather from the workers,
so it is read at most every `interval` seconds. The per-epoch line goes to
stdout, so a log keeps one line per epoch. tqdm is optional (the `progress`
extra); without it verbose=1 prints the per-epoch lines only.
"""
import sys
import time

try:
    from tqdm.auto import tqdm
except ImportError:          # the bar is optional; the per-epoch lines are not
    tqdm = None


def epoch_line(epoch, epochs, logs):
    """'epoch 2/5 - loss 0.1234 - accuracy 0.9650 - val_loss ... - 12345 samples/s' (Keras' order)."""
    parts = [f"epoch {epoch + 1}/{epochs}"]
    parts += [f"{k} {v:.4f}" for k, v in logs.items() if k != "samples_per_s" and v is not None]
    if logs.get("samples_per_s"):
        parts.append(f"{logs['samples_per_s']:.0f} samples/s")
    return " - ".join(parts)


class ProgressBar:
    """verbose 0: silent; 1: a tqdm bar (when tqdm is installed) and a line per epoch; 2: the lines only."""

    def __init__(self, epoch, epochs, total, verbose=1, stream=None, bar_stream=None, interval=0.5):
        self.epoch, self.epochs, self.verbose, self.interval = epoch, epochs, verbose, interval
        self.stream = stream or sys.stdout
        self.bar = None
        if verbose == 1 and tqdm is not None:
            out = bar_stream or sys.stderr
            tty = getattr(out, "isatty", lambda: False)()
            # a pipe may end in a log file: fewer redraws there
            self.bar = tqdm(total=total, desc=f"epoch {epoch + 1}/{epochs}", unit="sample", file=out,
                            leave=False, mininterval=interval if tty else 10 * interval, dynamic_ncols=tty,
                            ascii=not tty)
        self.done = 0
        self.last = time.perf_counter()

    def update(self, done, read_metrics):
        """`done` samples so far; read_metrics() -> (loss, accuracy) is called only when the bar shows it."""
        if self.bar is None:
            return
        now = time.perf_counter()
        if now - self.last >= self.interval:
            self.last = now
            loss, acc = read_metrics()
            self.bar.set_postfix({"loss": f"{loss:.4f}"} if acc is None else
                                 {"loss": f"{loss:.4f}", "accuracy": f"{acc:.4f}"}, refresh=False)
        self.bar.update(done - self.done)
        self.done = done

    def finish(self, logs):
        if self.bar is not None:
            self.bar.close()
        if self.verbose:
            self.stream.write(epoch_line(self.epoch, self.epochs, logs) + "\n")
            self.stream.flush()
