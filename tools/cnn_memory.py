"""Where a CNN step's device memory goes on worker 0: the pool, the captured graph, the live matrices.

    python tools/cnn_memory.py [--net alexnet] [--batch 256] [--dtype float32] [--device gpu]

Trains the network of benchmarks/cnn_bench.py on resident random images and
prints `dmath.memory.stats()` of worker 0 after each stage (built, first
epoch: recorded and captured, timed epoch), the bytes of the model's
parameters, and the largest matrices left in the handle table. A diagnostic
for the peak-memory figure of cnn_bench.py, not a benchmark.
"""
import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "benchmarks"))
import dmath                                    # noqa: E402
import dnn                                      # noqa: E402
from cnn_bench import NETS, dnn_model           # noqa: E402
from dmath.runtime import runtime               # noqa: E402

MB = 2 ** 20


def show(stage):
    s = dmath.memory.stats()[0]
    print(f"{stage:28s} in use {s['in_use'] / MB:8.1f} MB  cached {s['cached'] / MB:8.1f}  "
          f"high water {s['high_water'] / MB:8.1f}  graphs {s.get('graphs', 0) / MB:8.1f} "
          f"(in use {s.get('graphs_in_use', 0) / MB:.1f})", flush=True)


class Trace:
    """Wraps worker 0's command execution (rank 0 is the master too): the pool's bytes in use and
    the handle table's bytes after every command, and the table at the peak."""

    def __init__(self, rt):
        self.rt, self.rows, self.peak = rt, [], (0, None, [])
        inner = rt._execute

        def execute(entry, in_handles, out_handles, scalars, payload=None):
            result = inner(entry, in_handles, out_handles, scalars, payload)
            self.note(entry.op)
            return result
        rt._execute = execute

    def note(self, op):
        live = [(sum(p.nbytes for p in s.pieces), h, tuple(s.dist.shape), s.dtype) for h, s in self.rt.table.items()]
        in_use = dmath.memory.local_stats()["in_use"]
        self.rows.append((op, in_use, sum(b for b, *_ in live)))
        if in_use > self.peak[0]:
            self.peak = (in_use, op, sorted(live, reverse=True))

    def report(self):
        self.rt._execute = type(self.rt)._execute.__get__(self.rt)
        print(f"{'command':24s} {'pool in use MB':>15s} {'matrices MB':>12s}")
        for op, in_use, tab in self.rows:
            print(f"{op:24s} {in_use / MB:15.1f} {tab / MB:12.1f}")
        in_use, op, live = self.peak
        print(f"peak {in_use / MB:.1f} MB after {op}; matrices then ({sum(b for b, *_ in live) / MB:.1f} MB):")
        for b, h, shp, dt in live[:25]:
            print(f"  {b / MB:8.1f} MB  handle {h} {shp} {dt}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--net", default="alexnet", choices=list(NETS))
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--batches", type=int, default=4)
    ap.add_argument("--device", default=None)
    ap.add_argument("--trace", action="store_true",
                    help="print the live bytes after every command of one eager training step and what "
                         "is live at its peak (set DMATH_CUDA_GRAPHS=0 on a GPU to trace replays too)")
    args = ap.parse_args()
    dmath.init(device=args.device)
    shape, classes, _ = NETS[args.net]
    rng = np.random.default_rng(0)
    n = args.batch * args.batches
    x = rng.random((n,) + shape, dtype=np.float32)
    data = dnn.data.Dataset(x, rng.integers(0, classes, n))
    print(f"resident images: {x.nbytes / MB:.1f} MB")
    del x
    show("data placed")
    model = dnn_model(args.net, args.dtype, "auto")
    show("model built")
    params = sum(int(np.prod(w.shape)) * np.dtype(w.dtype).itemsize for w in model.params)
    print(f"parameters: {params / MB:.1f} MB")
    if args.trace:
        trace = Trace(runtime())
        model.fit(data, batch_size=args.batch, epochs=1, verbose=0)
        trace.report()
        return
    else:
        model.fit(data, batch_size=args.batch, epochs=1, verbose=0)
    show("first epoch")
    dmath.memory.clear()
    show("after memory.clear()")
    model.fit(data, batch_size=args.batch, epochs=1, verbose=0)
    dmath.synchronize()
    dmath.reset_stats()
    model.fit(data, batch_size=args.batch, epochs=1, verbose=0)
    dmath.synchronize()
    show("timed epoch")
    rt = runtime()
    live = sorted(((sum(p.nbytes for p in s.pieces), h, tuple(s.dist.shape), s.dtype)
                   for h, s in rt.table.items()), reverse=True)
    print(f"{len(live)} matrices, {sum(b for b, *_ in live) / MB:.1f} MB; the largest:")
    for b, h, shp, dt in live[:10]:
        print(f"  {b / MB:8.1f} MB  {shp} {dt}")


if __name__ == "__main__":
    main()
