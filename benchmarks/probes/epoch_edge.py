"""Where the transition between two epochs of `Model.fit` goes (a diagnostic).

    [mpiexec -n P] python benchmarks/probes/epoch_edge.py OUT.json [--net resnet50] [--batch 1024]
        [--dtype float16] [--image-size 224] [--steps-per-epoch 2] [--epochs 8] [--device gpu]

Trains a zoo network (benchmarks/zoo_bench.py's, each GPU's own BatchNorm
statistics) on resident random images with short epochs and times, on the
master, each part of every epoch edge: the metrics read that ends an epoch
(it waits for the epoch's last step), the callbacks' epoch ends
(TerminateOnNaN reads the weights' finiteness and the float16 skip count),
the next epoch's start (sample order, metric reset) and its first step's
dispatch; and the master's gap from the end of one epoch's last step
dispatch to the next epoch's first. Then, with the GPUs idle, the cost of
each of those reads and commands alone (a round trip each). Besides that
the throughput of the same run: an edge's cost per step is what a short
epoch pays that a long one does not. Wraps a few dnn methods with timers:
a probe of the internals, not a benchmark.
"""
import argparse
import collections
import json
import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import dmath                                    # noqa: E402
import dnn                                      # noqa: E402
from dnn.data.dataset import Feed               # noqa: E402
from dnn.training import callbacks as cbs       # noqa: E402
from dnn.training.programs import Metrics, Program   # noqa: E402
import zoo_bench                                # noqa: E402

TIMES = collections.defaultdict(list)
RUNS = []           # (dispatch start, dispatch end) of every Program.run of a training program


def timed(cls, name, label):
    """Wrap cls.name so that every call's master seconds go to TIMES[label]."""
    inner = getattr(cls, name)

    def wrapper(*args, **kwargs):
        t0 = time.perf_counter()
        try:
            return inner(*args, **kwargs)
        finally:
            TIMES[label].append(time.perf_counter() - t0)
    setattr(cls, name, wrapper)


def track_runs():
    inner = Program.run

    def run(self):
        t0 = time.perf_counter()
        out = inner(self)
        if self.training:
            RUNS.append((t0, time.perf_counter()))
        return out
    Program.run = run


def idle_cost(fn, reps=20):
    """Median master seconds of fn() with the workers idle (after a synchronize each time)."""
    out = []
    for _ in range(reps):
        dmath.synchronize()
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return statistics.median(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--net", default="resnet50", choices=list(zoo_bench.NETS))
    ap.add_argument("--batch", type=int, default=1024)
    ap.add_argument("--dtype", default="float16", choices=["float32", "float16"])
    ap.add_argument("--image-size", type=int, default=None)
    ap.add_argument("--steps-per-epoch", type=int, default=2)
    ap.add_argument("--epochs", type=int, default=8)
    ap.add_argument("--device", default=None, choices=["cpu", "gpu"])
    args = ap.parse_args()
    dmath.init(device=args.device)
    p = dmath.num_workers()
    shape = zoo_bench.NETS[args.net][0] if args.image_size is None else (3, args.image_size, args.image_size)
    n = args.batch * args.steps_per_epoch
    rng = np.random.default_rng(0)
    data = dnn.data.Dataset(rng.random((n,) + shape, dtype=np.float32), rng.integers(0, zoo_bench.CLASSES, n))
    model = zoo_bench.dnn_model(args.net, args.dtype, shape, batchnorm="local")
    for _ in range(2):              # records, captures, tunes; then a warm epoch
        model.fit(data, batch_size=args.batch, epochs=1, verbose=0)
    dmath.synchronize()

    timed(Metrics, "read_with", "metrics read (ends an epoch: waits for its last step)")
    timed(Metrics, "reset", "metrics reset")
    timed(cbs.TerminateOnNaN, "on_epoch_end", "TerminateOnNaN.on_epoch_end")
    timed(cbs.History, "on_epoch_end", "History.on_epoch_end")
    timed(Feed, "start_epoch", "Feed.start_epoch (the sample order)")
    track_runs()
    t0 = time.perf_counter()
    model.fit(data, batch_size=args.batch, epochs=args.epochs, verbose=0)
    dmath.synchronize()
    wall = time.perf_counter() - t0
    spe = args.steps_per_epoch
    first = [RUNS[e * spe][1] - RUNS[e * spe][0] for e in range(1, args.epochs)]
    later = [RUNS[i][1] - RUNS[i][0] for i in range(len(RUNS)) if i % spe]
    gaps = [RUNS[e * spe][0] - RUNS[e * spe - 1][1] for e in range(1, args.epochs)]
    med = {k: statistics.median(v) * 1e3 for k, v in TIMES.items()}
    med["first step's dispatch"] = statistics.median(first) * 1e3
    med["later steps' dispatch"] = statistics.median(later) * 1e3 if later else None
    med["gap between the epochs' dispatches"] = statistics.median(gaps) * 1e3

    # the same reads and commands with the workers idle: their round trips alone
    feed = model._feed(data)
    metrics = model.train_metrics
    weights = [w.value for layer in model.layers for w in layer.weights if w.value.size]
    idle = {"metrics read": idle_cost(metrics.read),
            "all_finite(weights) + read": idle_cost(lambda: dmath.nn.all_finite(weights).get((0, 0))),
            "Feed.start_epoch": idle_cost(lambda: feed.start_epoch(model.shuffle_key(0), 0)),
            "metrics reset": idle_cost(metrics.reset),
            "synchronize": idle_cost(lambda: None)}
    if model.loss_scale is not None:
        idle["loss scale skip count read"] = idle_cost(model.loss_scale.skipped_in_a_row)
    idle = {k: v * 1e3 for k, v in idle.items()}
    step = wall / (args.epochs * spe) * 1e3
    result = {"net": args.net, "workers": p, "device": dmath.device(), "batch": args.batch, "dtype": args.dtype,
              "steps_per_epoch": spe, "epochs": args.epochs, "ms_per_step": step,
              "images_per_s": args.epochs * n / wall, "edge_ms_median": med, "idle_ms_median": idle,
              "weights": len(weights)}
    print(f"{args.net} b{args.batch} {args.dtype}, {p} worker(s), {spe} steps an epoch: {step:.2f} ms a step")
    for k, v in med.items():
        print(f"  edge   {k:55s} {v if v is not None else float('nan'):8.3f} ms")
    for k, v in idle.items():
        print(f"  idle   {k:55s} {v:8.3f} ms")
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
