"""Where one eager CNN training step's device time goes on worker 0, operation by operation.

    python benchmarks/probes/step_ops.py [--net alexnet] [--batch 256] [--dtype float16] [--device gpu] [--steps 4]

Trains a network of benchmarks/cnn_bench.py or zoo_bench.py on resident random images at
one worker, unrecorded (`record=False`: every command runs through the
runtime, as the first step of a recorded plan does), under `DMATH_PROFILE=1`,
which times every kernel alone with the device synchronised around it, and
prints `dmath.stats()[0]['profile']` per step, by operation. A diagnostic,
not a benchmark: the synchronisation adds each command's launch latency.
--by-kernel (a GPU, PyTorch installed): also the GPU kernels of each
operation, from a CUPTI trace of one step (torch.profiler) in which every
command is preceded by an empty marker kernel: the kernels between two
markers are one command's, so a copy or a fill is named by the operation
that made it.
Public APIs only (the setting is documented in the README's table).
"""
import argparse
import collections
import json
import os
import sys
import tempfile

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
                    help="a network of cnn_bench.py or of zoo_bench.py (these with each GPU's own BatchNorm "
                         "statistics)")
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--dtype", default="float16", choices=["float32", "float16"])
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--device", default=None)
    ap.add_argument("--parallel", default="auto", choices=["data", "model", "auto"])
    ap.add_argument("--by-kernel", action="store_true",
                    help="also the GPU kernels of each operation over one step (needs a GPU and PyTorch)")
    ap.add_argument("--rows", type=int, default=40, help="rows of the --by-kernel table")
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
    if args.by_kernel:
        rows = kernels_by_operation(lambda: model.fit(data, batch_size=args.batch, epochs=1, verbose=0))
        print(f"\nGPU kernels by operation, {args.steps} steps (us a step, launches a step):")
        print(f"{'us/step':>9s} {'n/step':>7s}  operation / kernel")
        for (op, name), (us, count) in rows[:args.rows]:
            print(f"{us / args.steps:9.1f} {count / args.steps:7.1f}  {op} / {name[:90]}")


MARKER = "dm_op_marker"


def kernels_by_operation(run):
    """[((operation, kernel name), (total us, launches))], largest first, of the GPU work of run():
    each command of this process's worker is preceded by an empty marker kernel (DMATH_PROFILE runs
    them one at a time, the device synchronised around each), so the trace's kernels, memcpys and
    memsets between two markers belong to one command."""
    import cupy
    import torch
    from torch.profiler import ProfilerActivity, profile
    from dmath.runtime.execute import Execution
    marker = cupy.RawKernel(f'extern "C" __global__ void {MARKER}() {{}}', MARKER)
    ops = []
    inner = Execution._profiled

    def profiled(self, entry, call):
        self.backend.synchronize_all()
        marker((1,), (1,), ())
        ops.append(entry.op)
        return inner(self, entry, call)
    Execution._profiled = profiled
    try:
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            run()
            dmath.synchronize()
            torch.cuda.synchronize()
    finally:
        Execution._profiled = inner
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "trace.json")
        prof.export_chrome_trace(path)
        with open(path) as f:
            events = json.load(f)["traceEvents"]
    return attribute(events, ops)


def attribute(events, ops):
    """The kernels of a Chrome trace's events (cat kernel, gpu_memcpy, gpu_memset) grouped by the
    command each follows: the k-th marker kernel opens ops[k]. Work before the first marker is
    '(before)'. Returns [((op, name), (us, count))] sorted by time, largest first."""
    work = sorted((e for e in events if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset") and "dur" in e),
                  key=lambda e: float(e["ts"]))
    totals = collections.defaultdict(lambda: [0.0, 0])
    k, current = 0, "(before)"
    for e in work:
        if e["name"] == MARKER:
            current = ops[k] if k < len(ops) else "(unmatched)"
            k += 1
            continue
        slot = totals[(current, e["name"])]
        slot[0] += float(e["dur"])
        slot[1] += 1
    if k != len(ops):
        print(f"(by-kernel: {k} markers in the trace for {len(ops)} commands: the attribution may be off)")
    return sorted(((key, tuple(v)) for key, v in totals.items()), key=lambda kv: -kv[1][0])


if __name__ == "__main__":
    main()
