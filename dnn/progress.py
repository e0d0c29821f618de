"""The progress bar of Model.fit: epoch, batches, loss, accuracy, samples/s.

Reading the loss means a gather from the workers, so the bar redraws at most
every `interval` seconds, and only on a terminal; elsewhere (a log file, a
CI job) it prints one line per epoch.
"""
import sys
import time


class ProgressBar:
    """verbose 0: silent; 1: a bar redrawn in place on a terminal (one line per epoch otherwise);
    2: one line per epoch."""

    WIDTH = 24

    def __init__(self, epoch, epochs, total, verbose=1, stream=None, interval=0.5):
        self.epoch, self.epochs, self.total = epoch, epochs, total
        self.verbose, self.interval = verbose, interval
        self.stream = stream or sys.stdout
        self.live = verbose == 1 and getattr(self.stream, "isatty", lambda: False)()
        self.start = self.last = time.perf_counter()

    def update(self, done, read_metrics):
        """`done` samples so far; read_metrics() -> (loss, accuracy) is called only when redrawing."""
        if not self.live:
            return
        now = time.perf_counter()
        if now - self.last < self.interval and done < self.total:
            return
        self.last = now
        loss, acc = read_metrics()
        self._write(done, {"loss": loss, "accuracy": acc, "samples_per_s": done / max(now - self.start, 1e-9)},
                    end="")

    def finish(self, logs):
        if self.verbose:
            self._write(self.total, logs, end="\n")

    def _write(self, done, logs, end):
        filled = int(self.WIDTH * done / max(self.total, 1))
        bar = "=" * filled + (">" if filled < self.WIDTH else "") + "." * max(self.WIDTH - filled - 1, 0)
        parts = [f"epoch {self.epoch + 1}/{self.epochs} [{bar}] {done}/{self.total}"]
        parts += [f"{k} {v:.4f}" for k, v in logs.items() if k not in ("samples_per_s",) and v is not None]
        if logs.get("samples_per_s"):
            parts.append(f"{logs['samples_per_s']:.0f} samples/s")
        self.stream.write(("\r" if self.live else "") + " - ".join(parts) + end)
        self.stream.flush()
