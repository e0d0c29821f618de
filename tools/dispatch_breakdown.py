"""Where one eager operation's time goes on the master, stage by stage (one process, no MPI).

    python tools/dispatch_breakdown.py [--device gpu] [--n 256]

Each line times a prefix of the dispatch path with everything after it
stubbed out or done once, so consecutive lines differ by one stage: the
public call, the master half's planning, `dispatch`, `Runtime.call`, the
kernel, and the array library's own launch (`dispatch_known` and `Runtime.call_entry`:
the path of a master half whose cached plan keeps the command's Entry; `dispatch` and
`Runtime.call`: of one that builds the signature). A diagnostic for issue-level
dispatch work, not a benchmark with a peer.
"""
import argparse
import time

import dmath
from dmath import backend, memory
from dmath.ops import elementwise as E
from dmath.ops.base import dispatch, dispatch_known
from dmath.runtime import runtime


def per_call(fn, n=20000):
    for _ in range(500):
        fn()
    dmath.synchronize()
    best = 1e9
    for _ in range(3):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        best = min(best, (time.perf_counter() - t0) / n * 1e6)
        dmath.synchronize()
    return best


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default=None)
    ap.add_argument("--n", type=int, default=256)
    args = ap.parse_args()
    dmath.init(device=args.device)
    n = args.n
    x = dmath.random.rand((n, n), layout=dmath.RowBlock())
    w = dmath.random.rand((n, n), layout=dmath.Replicated()) * 0.01
    rt = runtime()
    xp = backend.current().xp
    rows = {}
    rows["dmath.tanh(x)"] = per_call(lambda: dmath.tanh(x))
    rows["x * 0.5"] = per_call(lambda: x * 0.5)
    rows["x @ w"] = per_call(lambda: x @ w)
    p = E.plan("tanh", (x._meta,), False, rt.nworkers)
    static, out = p.args, p.out
    rows["E.plan (cached)"] = per_call(lambda: E.plan("tanh", (x._meta,), False, rt.nworkers))
    rows["dispatch_known (tanh)"] = per_call(lambda: dispatch_known(p.known, "ewise", [x], (x._meta,), p.outputs,
                                                                    static, ()))
    rows["dispatch (tanh)"] = per_call(lambda: dispatch("ewise", [x], (out,), static=static))

    def call():
        handles, _ = rt.call("ewise", [x._handle], (x._meta,), (out,), static)
        rt.release(handles[0])
    rows["Runtime.call + release"] = per_call(call)
    entry = rt.signatures[("ewise", static, (x._meta,), (out,))]

    def call_entry():
        handles, _ = rt.call_entry(entry, [x._handle])
        rt.release(handles[0])
    rows["Runtime.call_entry + release"] = per_call(call_entry)
    spare = rt.new_handles(1)[0]
    rows["Runtime._execute"] = per_call(lambda: rt._execute(entry, [x._handle], [spare], ()))
    from dmath.runtime.core import Call
    shard = rt.table[x._handle]
    rows["kernel(call)"] = per_call(lambda: entry.kernel(Call(rt, entry, [shard], (), None, [x._handle])))
    a = shard.pieces[0]
    o = memory.empty(a.shape, a.dtype)
    rows["memory.empty"] = per_call(lambda: memory.empty(a.shape, "float32"))
    rows["xp.tanh(a, out=o)"] = per_call(lambda: xp.tanh(a, out=o))
    rows["check_failures"] = per_call(lambda: rt.check_failures(between=True))
    for k, v in rows.items():
        print(f"{k:28s} {v:8.2f} us")


if __name__ == "__main__":
    main()
