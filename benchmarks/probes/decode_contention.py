"""Why ResNet-50 trains at a fifth of its resident speed from a JPEG folder: GPU decoding against the step.

    python benchmarks/probes/decode_contention.py OUTDIR [--root DIR] [--images 2048] [--batch 256]
        [--epochs 3] [--threads 8]

One GPU, one process (dmath at one worker). On 2026-11-26 (H100) ImageFolder fed ResNet-50 float16
at 907 img/s against 5,137 from resident images, although its tuner saw almost no stall: the step
itself took ~190-270 ms a batch (50 ms resident) while nvImageCodec alone decodes 13,000-18,000
img/s. This probe times, in one job, on random resident images:
- `train`: the training step alone (img/s of fit);
- `decode_drop` / `decode_keep`: nvImageCodec alone, the decoded images dropped after each batch
  (as the pipeline does) or kept until the end (no frees in the loop);
- `train+decode_drop`, `train+decode_keep`: both at once, the decoder on a thread of its own;
- `train+parse`: the step with host threads only reading and parsing the files (no GPU decode);
- `--variants`: other decoder settings (backends, upsampling) beside the step;
- `--compute-stream`, `--switch-interval`, `--sync-each-step`: the training side changed.

What it found (H100, ResNet-50 float16 b256, 2026-11-26; JSON in benchmarks/results/probes/): the step
keeps its speed (5,090-5,190 img/s) and the decoder falls from 13,000-18,000 img/s alone to
805-815 img/s beside it -- the same figure whatever changed: images kept or dropped (no cudaFree),
decoded into reused images (no cudaMalloc), the caller's decoder stream at the highest priority
(no test of the decoding's priority: nvImageCodec decodes on streams of its own), the
hardware engine alone, the hybrid (CPU Huffman) backend (1,197), libjpeg's or nvJPEG's upsampling,
dmath computing on a non-blocking stream instead of the legacy one, the GIL's switch interval at
0.1 ms, MPI polling without spinning; host threads only parsing cost the step nothing. A fixed
share of the step's time (one decoded batch per ~6 steps) points at the decoder's small dependent
kernels queueing behind the step's on the same (default) priority, which DMATH_GPU_DECODE_ORDER=serial
avoids, or at a lock the decoder's CUDA calls wait for while the training thread holds it (a graph
launch blocked in the driver on a full launch queue, a thread spinning in cudaEventSynchronize).
With `--sync-each-step` (no step queued behind the running one; the wait polls an event from
Python) the decoder beside the step reached 1,391 img/s, the step 4,973 (5,023 alone): steps queued
ahead of the decoder's kernels are much of what holds it up. Training from a folder has since
been measured with a CUPTI timeline (probes/folder_timeline.py): the step there was not a CUDA
graph at all (now captured in segments around the batch's host stage).
"""
import argparse
import json
import os
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))

from image_folder_bench import jpeg_files  # noqa: E402


class Background:
    """Runs `work(batch_index)` in a loop on a thread of its own until stopped; counts the images."""

    def __init__(self, work, per_batch):
        self.work, self.per_batch = work, per_batch
        self.stop, self.batches = threading.Event(), 0
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        i = 0
        while not self.stop.is_set():
            self.work(i)
            i += 1
            self.batches += 1

    def __enter__(self):
        self.t0 = time.perf_counter()
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join()
        self.seconds = time.perf_counter() - self.t0

    def rate(self):
        return self.batches * self.per_batch / self.seconds


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("outdir")
    ap.add_argument("--root", default="/tmp/imgs")
    ap.add_argument("--images", type=int, default=2048)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--threads", type=int, default=8)
    ap.add_argument("--variants", nargs="+", default=["default"],
                    choices=["default", "plain_upsampling", "hw_only", "cuda_only", "hybrid_only"],
                    help="decoder settings to time against the step (the first also runs the keep/parse cases)")
    ap.add_argument("--compute-stream", default="default", choices=["default", "nonblocking"],
                    help="the stream dmath computes on: CuPy's default (the legacy null stream, which every "
                         "synchronous copy of another library waits for) or a non-blocking one")
    ap.add_argument("--sync-each-step", action="store_true",
                    help="the host waits for every step to finish before it launches the next (metrics read "
                         "each batch): no step queued behind the running one")
    ap.add_argument("--quick", action="store_true", help="only the step alone and beside the first variant")
    ap.add_argument("--switch-interval", type=float, default=None,
                    help="sys.setswitchinterval (seconds): how soon a thread holding the GIL hands it over")
    a = ap.parse_args()
    if a.switch_interval:
        sys.setswitchinterval(a.switch_interval)
    os.makedirs(a.outdir, exist_ok=True)
    import image_folder_bench
    image_folder_bench.make_folder(a.root, a.images)
    files = jpeg_files(a.root)[:a.images]
    blobs = [open(f, "rb").read() for f in files]

    import dmath
    import dnn
    from dmath.gpu import nvimgcodec
    if a.compute_stream == "nonblocking":
        import cupy
        cupy.cuda.Stream(non_blocking=True).use()
    dmath.init(device="gpu")
    mod = nvimgcodec.module()
    if mod is None:
        raise SystemExit(f"nvImageCodec is not available: {nvimgcodec.status()[1]}")
    variants = {"default": {}, "plain_upsampling": {"options": ""},
                "hw_only": {"kinds": ("HW_GPU_ONLY",), "options": ""},
                "cuda_only": {"kinds": ("GPU_ONLY",)}, "hybrid_only": {"kinds": ("HYBRID_CPU_GPU",)}}
    dec = nvimgcodec.BatchDecoder(mod, 0, a.threads, **variants[a.variants[0]])
    streams = [nvimgcodec.parse(mod, b)[0] for b in blobs]
    nb = len(streams) // a.batch
    kept, missed = [], {}

    def decode(i, keep):
        k = i % nb
        images, failure = dec.decode(streams[k * a.batch:(k + 1) * a.batch])
        if failure:        # (counted: a variant whose backend refuses these files shows it in the JSON)
            missed[failure] = missed.get(failure, 0) + 1
        missed["images not decoded"] = missed.get("images not decoded", 0) + sum(x is None for x in images)
        if keep:
            kept.append(images)

    pool = ThreadPoolExecutor(a.threads)

    def parse(i):
        k = i % nb
        chunk = files[k * a.batch:(k + 1) * a.batch]
        list(pool.map(lambda f: nvimgcodec.parse(mod, open(f, "rb").read()), chunk))

    rng = np.random.default_rng(0)
    n = a.batch * 8
    data = dnn.data.Dataset(rng.random((n, 3, 224, 224), dtype=np.float32), rng.integers(0, 10, n))
    dmath.random.seed(0)
    model = dnn.models.resnet50(num_classes=10, dtype="float16", optimizer=dnn.optim.SGD(lr=0.01, momentum=0.9))
    model.fit(data, batch_size=a.batch, epochs=2, verbose=0)           # records, tunes, captures

    class EachStep(dnn.callbacks.Callback):
        def on_batch_end(self, batch, logs=None):
            self.model.train_metrics.read()          # a gather: waits for the step

    def train():
        cbs = [EachStep()] if a.sync_each_step else []
        hist = model.fit(data, batch_size=a.batch, epochs=a.epochs, verbose=0, callbacks=cbs).history
        return float(np.median(hist["samples_per_s"]))

    import cupy
    name = cupy.cuda.runtime.getDeviceProperties(0)["name"]
    res = {"gpu": name.decode() if isinstance(name, bytes) else str(name), "images": len(files),
           "batch": a.batch, "threads": a.threads}
    res["api"] = {k: (getattr(getattr(mod.Decoder, k), "__doc__", None) or "")[:1500]
                  for k in ("__init__", "decode")}
    res["train"] = train()
    first = dec
    for v in a.variants[1:]:
        try:                  # one at a time: a decoder holds the GPU's JPEG engines while it lives
            dec = nvimgcodec.BatchDecoder(mod, 0, a.threads, **variants[v])
        except Exception as exc:  # noqa: BLE001 - a variant this GPU cannot make is reported, not fatal
            res[f"{v}:error"] = f"{type(exc).__name__}: {exc}"
            continue
        with Background(lambda i: decode(i, False), a.batch) as bg:
            time.sleep(3.0)
        res[f"{v}:decode_drop"] = bg.rate()
        with Background(lambda i: decode(i, False), a.batch) as bg:
            res[f"{v}:train+decode_drop"] = train()
        res[f"{v}:train+decode_drop:decode"] = bg.rate()
        del dec
    dec = first
    for keep in (False,) if a.quick else (False, True):
        name = "decode_keep" if keep else "decode_drop"
        with Background(lambda i: decode(i, keep), a.batch) as bg:
            time.sleep(5.0)
        res[name] = bg.rate()
        kept.clear()
        with Background(lambda i: decode(i, keep), a.batch) as bg:
            res["train+" + name] = train()
        res["train+" + name + ":decode"] = bg.rate()
        kept.clear()
    if not a.quick:
        with Background(parse, a.batch) as bg:
            res["train+parse"] = train()
        res["train+parse:parse"] = bg.rate()
    res["compute_stream"] = a.compute_stream
    res["switch_interval"] = sys.getswitchinterval()
    res["sync_each_step"] = a.sync_each_step
    res["missed"] = missed
    for k, v in res.items():
        print(f"{k:28s} {v:.0f}" if isinstance(v, float) else f"{k:28s} {v}")
    with open(os.path.join(a.outdir, "decode_contention.json"), "w") as fh:
        json.dump(res, fh, indent=1)


if __name__ == "__main__":
    main()
