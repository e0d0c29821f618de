"""Where one eager CNN training step's device time goes on worker 0, operation by operation.

    python benchmarks/probes/step_ops.py [--net alexnet] [--batch 256] [--dtype float16] [--device gpu] [--steps 4]

Trains a network of benchmarks/cnn_bench.py or zoo_bench.py on resident random images at
one worker, unrecorded (`record=False`: every command runs through the
runtime, as the first step of a recorded plan does), under `DMATH_PROFILE=1`,
which times every kernel alone with the device synchronised around it, and
prints `dmath.stats()[0]['profile']` per step, by operation. A diagnostic,
not a benchmark: the synchronisation adds each command's launch latency.
Public APIs only (the setting is documented in the README's table).
"""
import argparse
import os
import sys

# The profile is a setting of the runtime: it must be in the environment before dmath reads it.
os.environ["DMATH_PROFILE"] = "1"

import numpy as np                              # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import dmath                                    # noqa: E402
import dnn                                      # noqa: E402
from cnn_bench import NETS, dnn_model           # noqa: E402
import zoo_bench                                # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--net", default="alexnet", choices=list(NETS) + list(zoo_bench.NETS),
                    help="a network of cnn_bench.py or of zoo_bench.py (these with each GPU's own BatchNorm statistics)")
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--dtype", default="float16", choices=["float32", "float16"])
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--device", default=None)
    ap.add_argument("--parallel", default="auto", choices=["data", "model", "auto"])
    args = ap.parse_args()
    dmath.init(device=args.device)
    if args.net in zoo_bench.NETS:
        shape, classes = zoo_bench.NETS[args.net][0], zoo_bench.CLASSES
    else:
        shape, classes, _ = NETS[args.net]
    rng = np.random.default_rng(0)
    n = args.batch * args.steps
    data = dnn.data.Dataset(rng.random((n,) + shape, dtype=np.float32), rng.integers(0, classes, n))
    model = (zoo_bench.dnn_model(args.net, args.dtype, shape, batchnorm="local") if args.net in zoo_bench.NETS
             else dnn_model(args.net, args.dtype, args.parallel))
    model.record = False
    model.fit(data, batch_size=args.batch, epochs=1, verbose=0)     # warm: algorithms chosen, kernels built
    dmath.synchronize()
    dmath.reset_stats()
    model.fit(data, batch_size=args.batch, epochs=1, verbose=0)
    dmath.synchronize()
    profile = dmath.stats()[0]["profile"]
    total = sum(s for _, s in profile.values())
    print(f"{args.net} b{args.batch} {args.dtype}, {args.steps} eager steps on {dmath.device()}, "
          f"worker 0 of {dmath.num_workers()}: {total / args.steps * 1e3:.2f} ms of kernels per step")
    print(f"{'ms/step':>8s} {'n/step':>7s}  operation")
    for op, (count, seconds) in sorted(profile.items(), key=lambda kv: -kv[1][1]):
        print(f"{seconds / args.steps * 1e3:8.3f} {count / args.steps:7.1f}  {op}")


if __name__ == "__main__":
    main()
