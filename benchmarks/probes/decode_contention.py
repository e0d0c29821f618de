"""Why ResNet-50 trains at a fifth of its resident speed from a JPEG folder: GPU decoding against the step.

    python benchmarks/probes/decode_contention.py OUTDIR [--root DIR] [--images 2048] [--batch 256]
        [--epochs 3] [--threads 8]

One GPU, one process (dmath at one worker). On 2026-11-26 (H100) ImageFolder fed ResNet-50 float16
at 907 img/s against 5,137 from resident images, although its tuner saw almost no stall (the step
itself took 266 ms a batch, 50 ms resident) and nvImageCodec alone decoded 5,199 img/s. Suspects:
(1) the decoded images' device memory freed every batch (cudaFree waits for the whole device, the
training graph included, and holds launches from other threads meanwhile); (2) the host threads'
Python work (reading files, parsing headers) holding the GIL the step's thread needs. This probe
times, in one job, on random resident images:
- `train`: the training step alone (img/s of fit);
- `decode_drop` / `decode_keep`: nvImageCodec alone, the decoded images dropped after each batch
  (as the pipeline does) or kept until the end (no frees in the loop);
- `train+decode_drop`, `train+decode_keep`: both at once, the decoder on a thread of its own;
- `train+parse`: the step with host threads only reading and parsing the files (no GPU decode).
A large gap between train+decode_drop and train+decode_keep blames (1); train+parse near train+decode
blames (2). Writes OUTDIR/decode_contention.json.
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


def _files(root):
    out = []
    for d, _, names in os.walk(root):
        out += [os.path.join(d, n) for n in sorted(names) if n.lower().endswith((".jpg", ".jpeg"))]
    return sorted(out)


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
    a = ap.parse_args()
    os.makedirs(a.outdir, exist_ok=True)
    import image_folder_bench
    image_folder_bench.make_folder(a.root, a.images)
    files = _files(a.root)[:a.images]
    blobs = [open(f, "rb").read() for f in files]

    import dmath
    import dnn
    from dmath.gpu import nvimgcodec
    dmath.init(device="gpu")
    mod = nvimgcodec.module()
    if mod is None:
        raise SystemExit(f"nvImageCodec is not available: {nvimgcodec.status()[1]}")
    dec = nvimgcodec.BatchDecoder(mod, 0, a.threads)
    streams = [nvimgcodec.parse(mod, b)[0] for b in blobs]
    nb = len(streams) // a.batch
    kept = []

    def decode(i, keep):
        k = i % nb
        images, failure = dec.decode(streams[k * a.batch:(k + 1) * a.batch])
        if failure:
            raise RuntimeError(failure)
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

    def train():
        hist = model.fit(data, batch_size=a.batch, epochs=a.epochs, verbose=0).history
        return float(np.median(hist["samples_per_s"]))

    import cupy
    name = cupy.cuda.runtime.getDeviceProperties(0)["name"]
    res = {"gpu": name.decode() if isinstance(name, bytes) else str(name), "images": len(files),
           "batch": a.batch, "threads": a.threads}
    res["train"] = train()
    for keep in (False, True):
        name = "decode_keep" if keep else "decode_drop"
        with Background(lambda i: decode(i, keep), a.batch) as bg:
            time.sleep(5.0)
        res[name] = bg.rate()
        kept.clear()
        with Background(lambda i: decode(i, keep), a.batch) as bg:
            res["train+" + name] = train()
        res["train+" + name + ":decode"] = bg.rate()
        kept.clear()
    with Background(parse, a.batch) as bg:
        res["train+parse"] = train()
    res["train+parse:parse"] = bg.rate()
    for k, v in res.items():
        print(f"{k:28s} {v:.0f}" if isinstance(v, float) else f"{k:28s} {v}")
    with open(os.path.join(a.outdir, "decode_contention.json"), "w") as fh:
        json.dump(res, fh, indent=1)


if __name__ == "__main__":
    main()
