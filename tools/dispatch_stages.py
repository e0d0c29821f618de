"""Where the eager chain's time goes on the master and on a worker, stage by stage (a diagnostic).

    mpiexec -n P python tools/dispatch_stages.py [--device gpu] [--n 256] [--ops 4000] [--by-op]

Wraps the runtime's stages (the master's failure probe, control send, own
share and release; a worker's receive, decode and run) with timers on every
rank before `dmath.init`, runs a workload, and prints each stage's calls and
microseconds per operation on the master and on worker 1 (collected by a
kernel). The wrappers add about 0.2 us per stage, so read differences, not
totals. Workloads: `tanh` (one elementwise function over and over), `chain`
(chain_bench.py's y = tanh((y @ W) * 0.5 + x)). Not a benchmark: no peer.
"""
import argparse
import time

import dmath
from dmath.comm import control
from dmath.comm.control import gather_objects
from dmath.ops.base import dispatch
from dmath.runtime import core, kernel

ACC = {}


def _wrap(owner, name, label):
    """Time every call of owner.name into ACC[label] (label: a string, or a function of the call's
    positional arguments that returns one)."""
    fn = getattr(owner, name)
    pc = time.perf_counter
    label_of = label if callable(label) else None

    def timed(*a, **k):
        t0 = pc()
        try:
            return fn(*a, **k)
        finally:
            slot = ACC.setdefault(label_of(a) if label_of else label, [0, 0.0])
            slot[0] += 1
            slot[1] += pc() - t0
    setattr(owner, name, timed)


def _count_rounds():
    """Count the polling rounds of the control channel's waits (a wait whose request is done at the
    first test counts one)."""
    def wait(req, nbytes=0):
        rounds = [0]

        def test():
            rounds[0] += 1
            return req.Test()
        control.poll(test, nbytes)
        ACC.setdefault("control Test calls", [0, 0.0])[0] += rounds[0]
    control.wait = wait


@kernel("stages_report")
def _report(call):
    """Every rank: its stage totals (then cleared); the master gets worker 1's."""
    mine = {k: tuple(v) for k, v in ACC.items()}
    ACC.clear()
    got = gather_objects(call.world, mine)
    if call.rank == 0:
        call.result = got
    return []


def _op_label(args):
    """`_execute`'s label per operation: (self, entry, ...) -> '_execute ewise:tanh', '_execute gemm'."""
    entry = args[1]
    fn = getattr(entry.static, "fn", None)
    return f"_execute {entry.op}" + (f":{fn}" if fn else "")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default=None)
    ap.add_argument("--n", type=int, default=256)
    ap.add_argument("--ops", type=int, default=4000)
    ap.add_argument("--by-op", action="store_true",
                    help="time each rank's own share (_execute) per operation (ewise by function)")
    args = ap.parse_args()
    R, C = core.Runtime, control.ControlChannel
    execute = _op_label if args.by_op else "_execute"
    for owner, name, label in ((R, "check_failures", "check_failures"), (C, "send", "ctl.send"),
                               (R, "_execute", execute), (R, "release", "release"),
                               (C, "recv", "ctl.recv (waits)"), (R, "_run", "_run")):
        _wrap(owner, name, label)
    _count_rounds()
    dmath.init(device=args.device)
    P, n = dmath.num_workers(), args.n
    x = dmath.random.rand((n, n), layout=dmath.RowBlock())
    w = dmath.random.rand((n, n), layout=dmath.Replicated()) * 0.01

    def tanh(k):
        for _ in range(k):
            dmath.tanh(x)

    def chain(k):
        v = x
        for _ in range(k // 4):
            v = dmath.tanh((v @ w) * 0.5 + x)

    print(f"{P} process(es), device {dmath.device()}, n={n}, us per operation")
    for name, fn in (("tanh", tanh), ("chain", chain)):
        fn(500)
        dmath.synchronize()
        dispatch("stages_report")
        t0 = time.perf_counter()
        fn(args.ops)
        dmath.synchronize()
        per = (time.perf_counter() - t0) / args.ops * 1e6
        got = dispatch("stages_report")[1]
        print(f"{name}: {per:.2f} us per op (wrapped)")
        for rank in (0, 1) if P > 1 else (0,):
            for k, (calls, s) in sorted(got[rank].items()):
                if calls >= args.ops // (8 if args.by_op else 2):      # (by op: a chain op is 1/4 of them)
                    # (Test calls: a count, no time)
                    spent = f"  us/op {s / args.ops * 1e6:7.2f}  us/call {s / calls * 1e6:7.2f}" if s else ""
                    print(f"  rank {rank} {k:22s} calls/op {calls / args.ops:5.2f}{spent}")


if __name__ == "__main__":
    main()
