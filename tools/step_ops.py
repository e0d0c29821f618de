"""Where one eager CNN training step's time goes on worker 0, command by command.

    python tools/step_ops.py [--net alexnet] [--batch 256] [--dtype float16] [--device gpu] [--steps 4]

Trains the network of benchmarks/cnn_bench.py on resident random images at
one worker, unrecorded (every command runs through the runtime, as the first
step of a recorded plan does), and times each command with the device
synchronised before and after it. Commands are grouped by operation, static
arguments and operand shapes and dtypes, so that "which cast, of what" is
visible, which a kernel-name profile does not say. A diagnostic, not a
benchmark: the synchronisation adds each command's launch latency.

--calls also counts, per command, the array-library calls that copy or
allocate (astype, copy, ascontiguousarray, copyto, take, fill, ...) by the line of
dmath that made them. Under mpiexec it reports worker 0, which runs in the
master's process.
"""
import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "benchmarks"))
import dmath                                    # noqa: E402
import dnn                                      # noqa: E402
from cnn_bench import NETS, dnn_model           # noqa: E402
from dmath.runtime import runtime               # noqa: E402


#: array-library calls that launch a copy (or allocate): counted by --calls
COPIES = frozenset({"astype", "copy", "ascontiguousarray", "copyto", "take", "empty", "zeros", "where",
                    "concatenate", "fill"})


class Calls:
    """Counts, while on, the COPIES calls made from Python code of dmath, by (command, file:line, name)."""

    def __init__(self):
        self.rows, self.op = {}, None

    def hook(self, frame, event, arg):
        if event == "c_call" and self.op is not None and getattr(arg, "__name__", "") in COPIES:
            code = frame.f_code
            if "dmath" in code.co_filename:
                where = f"{code.co_filename.split('dmath/', 1)[-1]}:{frame.f_lineno}"
                key = (self.op, where, arg.__name__)
                self.rows[key] = self.rows.get(key, 0) + 1

    def report(self, steps, top):
        print(f"copying calls per step, by command and line ({sum(self.rows.values()) / steps:.1f} in all):")
        for (op, where, name), n in sorted(self.rows.items(), key=lambda kv: -kv[1])[:top]:
            print(f"{n / steps:7.1f}  {op:28s} {where:34s} {name}")


class Timer:
    """Wraps worker 0's command execution (rank 0 is the master too): seconds per kind of command."""

    def __init__(self, rt, calls=None):
        self.rt, self.rows, self.on, self.calls = rt, {}, False, calls
        inner = rt._execute

        def execute(entry, in_handles, out_handles, scalars, payload=None):
            if not self.on:
                return inner(entry, in_handles, out_handles, scalars, payload)
            shapes = tuple((tuple(rt.table[h].dist.shape), str(rt.table[h].dtype)) for h in in_handles
                           if h in rt.table)
            rt.backend.synchronize_all()
            t0 = time.perf_counter()
            if self.calls is not None:
                self.calls.op = entry.op
                sys.setprofile(self.calls.hook)
            try:
                result = inner(entry, in_handles, out_handles, scalars, payload)
            finally:
                if self.calls is not None:
                    sys.setprofile(None)
                    self.calls.op = None
            rt.backend.synchronize_all()
            key = (entry.op, repr(entry.static)[:70], shapes[:3])
            slot = self.rows.setdefault(key, [0, 0.0])
            slot[0] += 1
            slot[1] += time.perf_counter() - t0
            return result
        rt._execute = execute

    def report(self, steps, top):
        total = sum(s for _, s in self.rows.values())
        print(f"{total / steps * 1e3:.2f} ms of commands per step (synchronised), {len(self.rows)} kinds")
        print(f"{'ms/step':>8s} {'n/step':>7s}  command")
        for key, (n, s) in sorted(self.rows.items(), key=lambda kv: -kv[1][1])[:top]:
            op, static, shapes = key
            print(f"{s / steps * 1e3:8.3f} {n / steps:7.1f}  {op} {static} {shapes}")
        by_op = {}
        for (op, _, _), (n, s) in self.rows.items():
            acc = by_op.setdefault(op, [0, 0.0])
            acc[0] += n
            acc[1] += s
        print("by operation:")
        for op, (n, s) in sorted(by_op.items(), key=lambda kv: -kv[1][1]):
            print(f"{s / steps * 1e3:8.3f} {n / steps:7.1f}  {op}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--net", default="alexnet", choices=list(NETS))
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--dtype", default="float16", choices=["float32", "float16"])
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--top", type=int, default=45)
    ap.add_argument("--device", default=None)
    ap.add_argument("--parallel", default="auto", choices=["data", "model", "auto"])
    ap.add_argument("--calls", action="store_true", help="also count copying array calls per command and line")
    args = ap.parse_args()
    dmath.init(device=args.device)
    shape, classes, _ = NETS[args.net]
    rng = np.random.default_rng(0)
    n = args.batch * args.steps
    data = dnn.data.Dataset(rng.random((n,) + shape, dtype=np.float32), rng.integers(0, classes, n))
    model = dnn_model(args.net, args.dtype, args.parallel)
    model.record = False
    calls = Calls() if args.calls else None
    timer = Timer(runtime(), calls)
    model.fit(data, batch_size=args.batch, epochs=1, verbose=0)     # warm: algorithms chosen, kernels built
    timer.on = True
    model.fit(data, batch_size=args.batch, epochs=1, verbose=0)
    timer.on = False
    print(f"{args.net} b{args.batch} {args.dtype}, {args.steps} eager steps on {dmath.device()}, "
          f"worker 0 of {dmath.num_workers()}")
    timer.report(args.steps, args.top)
    if calls is not None:
        calls.report(args.steps, args.top)


if __name__ == "__main__":
    main()
