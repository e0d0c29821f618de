"""The input pipeline alone: augmented batches taken from a resident dataset, against the copy bandwidth.

    python benchmarks/pipeline_bench.py --device gpu [--batch 256] [--images 1024] [--out F.json]

A dnn.data.Dataset of random 3x224x224 float32 images lives on the device;
a recorded plan takes the next batch (dmath.nn.take_rows through the
model's Feed), shifts it by up to --shift pixels (a padded random crop),
mirrors half of it and normalises it per channel, then advances the feed:
what every training step does before its forward pass. Replayed --reps
times it gives batches/s, and the bytes it must move (the gather reads and
writes the batch once, the transform once more: 4 x batch bytes) over the
time, against a device-to-device copy of the same size measured in the
same run (reads plus writes): the fraction of the memory bandwidth the
pipeline reaches.
"""
import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dmath                                    # noqa: E402
import dnn                                      # noqa: E402
from dmath import backend                       # noqa: E402
from dmath.ops.base import dispatch             # noqa: E402
from dmath.runtime import kernel                # noqa: E402
from common import environment, median_time, write_json  # noqa: E402


@kernel("bench_copy")
def _copy(call):
    """Seconds of one device copy of `static[0]` bytes on worker 0 (median of 10)."""
    nbytes = call.entry.static[0]
    if call.rank == 0:
        be = backend.current()
        a = be.xp.ones(nbytes // 4, dtype=np.float32)
        b = be.xp.empty_like(a)

        def run():
            b[...] = a
            be.synchronize()
        call.result = median_time(run, 10, warmup=2)
    return []


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--images", type=int, default=1024)
    ap.add_argument("--shift", type=int, default=4)
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--device", default=None, choices=["cpu", "gpu"])
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    dmath.init(device=args.device)
    shape = (3, 224, 224)
    x = np.random.default_rng(0).random((args.images,) + shape, dtype=np.float32)
    data = dnn.data.Dataset(x, augment=dnn.data.Augment(shift=args.shift, flip=True),
                            mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225))
    del x
    feed = data.feed()
    features = int(np.prod(shape))
    out = dmath.zeros((args.batch, features), dtype="float32")
    steps = args.images // args.batch
    feed.start_epoch((0, 0), 0)
    with dmath.record() as plan:
        y = feed.batch_x(out, True, seed=1)
        feed.advance(args.batch)

    def epoch():
        feed.start_epoch((0, 1), 1)
        for _ in range(steps):
            plan.replay()
        dmath.synchronize()
    epoch()
    dmath.synchronize()
    t0 = time.perf_counter()
    epochs = max(1, args.reps // steps)
    for _ in range(epochs):
        epoch()
    secs = (time.perf_counter() - t0) / (epochs * steps)
    batch_bytes = args.batch * features * 4
    copy_s = dispatch("bench_copy", static=(batch_bytes,))[1]
    row = {"batch": args.batch, "image": shape, "shift": args.shift, "workers": dmath.num_workers(),
           "batches_per_s": 1 / secs, "images_per_s": args.batch / secs,
           "pipeline_GBps": 4 * batch_bytes / secs / 1e9, "copy_GBps": 2 * batch_bytes / copy_s / 1e9}
    row["fraction_of_copy_bandwidth"] = row["pipeline_GBps"] / row["copy_GBps"]
    print(f"{args.batch} x {shape} float32, shift {args.shift}, flip, normalise: {row['batches_per_s']:.0f} "
          f"batches/s ({row['images_per_s']:.0f} images/s), {row['pipeline_GBps']:.0f} GB/s moved against "
          f"{row['copy_GBps']:.0f} GB/s for a copy: {row['fraction_of_copy_bandwidth']:.2f}", flush=True)
    del y
    if args.out:
        write_json(args.out, {"benchmark": "input_pipeline", "environment": environment(dmath), "results": row})


if __name__ == "__main__":
    main()
