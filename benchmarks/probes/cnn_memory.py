"""Where a CNN step's device memory goes on worker 0: the pool and the captured graphs, stage by stage.

    python benchmarks/probes/cnn_memory.py [--net alexnet] [--batch 256] [--dtype float32] [--device gpu]

Trains the network of benchmarks/cnn_bench.py on resident random images and
prints `dmath.memory.stats()` of worker 0 after each stage (data placed,
model built, first epoch: recorded and captured, after `memory.clear()`,
timed epoch) and the bytes of the model's parameters. A diagnostic for the
peak-memory figure of cnn_bench.py, not a benchmark: public APIs only.
"""
import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import dmath                                    # noqa: E402
import dnn                                      # noqa: E402
from cnn_bench import NETS, dnn_model           # noqa: E402

MB = 2 ** 20


def show(stage):
    """One line of worker 0's pool and graph memory after `stage`."""
    s = dmath.memory.stats()[0]
    print(f"{stage:28s} in use {s['in_use'] / MB:8.1f} MB  cached {s['cached'] / MB:8.1f}  "
          f"high water {s['high_water'] / MB:8.1f}  graphs {s.get('graphs', 0) / MB:8.1f} "
          f"(in use {s.get('graphs_in_use', 0) / MB:.1f}, peak {s.get('graphs_peak', 0) / MB:.1f})", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--net", default="alexnet", choices=list(NETS))
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--batches", type=int, default=4)
    ap.add_argument("--device", default=None)
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


if __name__ == "__main__":
    main()
