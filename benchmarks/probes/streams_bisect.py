"""Which step of a captured training step breaks when it runs on a side stream (DMATH_GRAPH_STREAMS).

    mpiexec -n P python benchmarks/probes/streams_bisect.py OUTDIR [--model buckets|googlenet|inception_like]
        [--dtype float64] [--streams 4] [--bucket-mb 25]

A model trains (2 epochs of 4 steps from seed 7: recorded, replayed, captured,
launched) with one stream, twice (the noise floor: run-to-run differences of
the same capture), then with --streams streams where only the first K steps of
each program are planned freely and the rest run on the capture stream in
order (`dmath.runtime.streams.SIDE_LIMIT`). K = 0 is one stream's program; the
smallest K whose weights depart from one stream's (past 100 x the noise floor,
and past 1e-9 relative) names step K - 1 of the training program as the first
whose side-stream placement changes the result. Bisected on K; each trial is
a fresh model (its programs planned again). Prints and writes
OUTDIR/streams_bisect_<model>_P<P>.json: the noise floor, every trial, the
step found with its operation, stream, waits and what it reads and writes, and
the steps around it.

This is a debugging aid for the experimental setting, run on GPUs (a CPU run
plans the streams but executes step by step, so every trial matches).
"""
import argparse
import json
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))

import dmath  # noqa: E402
from dmath.runtime.registry import kernel  # noqa: E402


@kernel("probe_streams_bisect")
def _set(call):
    """Every rank plans the programs defined next with up to scalars[0] streams, the first
    scalars[1] steps free (-1: all)."""
    from dmath import settings
    from dmath.runtime import streams
    settings.current.graph_streams = int(call.scalars[0])
    streams.SIDE_LIMIT[0] = None if int(call.scalars[1]) < 0 else int(call.scalars[1])
    return []


def build(name, dtype, bucket_mb):
    import dnn
    from dnn import layers as L
    if name == "buckets":               # tests/dist/dnn/test_dnn_buckets.py's model
        m = dnn.Sequential([L.Input((1, 8, 8)), L.Conv2D(4, 3, padding=1, activation="relu"), L.BatchNorm(),
                            L.Pool2D(2), L.Flatten(), L.Dense(32, activation="relu"), L.Dense(16, activation="tanh"),
                            L.Dense(5), L.Output("softmax")],
                           dtype=dtype, optimizer=dnn.optim.SGD(lr=0.05, momentum=0.9))
        m.bucket_mb = bucket_mb
        return m, (1, 8, 8), 96
    if name == "googlenet":
        return dnn.models.googlenet(num_classes=5, input_shape=(3, 32, 32), dtype=dtype, dropout=0.0,
                                    optimizer=dnn.optim.SGD(lr=0.02, momentum=0.9)), (3, 32, 32), 32
    # the inception-like model of the streams test (two modules of four branches), from the test itself
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(HERE)), "tests", "dist", "dnn"))
    from test_dnn_graph_streams import _inception_like
    return _inception_like(dtype), (3, 8, 8), 32


def trial(a, streams, limit):
    """(weights, the master's programs: [(op per step, StreamPlan or None)]) of one training run."""
    import dnn
    from dmath.ops.base import dispatch
    from dmath.runtime import runtime
    dispatch("probe_streams_bisect", scalars=[streams, -1 if limit is None else limit])
    dmath.random.seed(7)
    model, shape, n = build(a.model, a.dtype, a.bucket_mb)
    rng = np.random.default_rng(3)
    x, y = rng.normal(size=(n,) + shape), rng.integers(0, 5, n)
    data = dnn.data.Dataset(x, y)
    before = set(runtime().programs)
    model.fit(data, batch_size=n // 4, epochs=2, shuffle=False, verbose=0)
    rt = runtime()
    progs = []
    for key, rep in rt.programs.items():
        if key in before:
            continue
        ops = [rt.entries[s.sig_id].op for s in rep.program.steps]
        progs.append((key, ops, rep.streams, rep.program))
    weights = [np.asarray(w, dtype=np.float64) for w in model.get_weights()]
    dispatch("probe_streams_bisect", scalars=[1, -1])
    return weights, progs


def diff(w, ref):
    """The largest relative difference of weights `w` from `ref`."""
    return max(float(np.max(np.abs(a - b)) / (np.max(np.abs(b)) + 1e-30)) for a, b in zip(w, ref))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("outdir")
    ap.add_argument("--model", default="buckets", choices=("buckets", "googlenet", "inception_like"))
    ap.add_argument("--dtype", default="float64")
    ap.add_argument("--streams", type=int, default=4)
    ap.add_argument("--bucket-mb", type=float, default=25)
    a = ap.parse_args()
    dmath.init()
    P = dmath.num_workers()
    ref, _ = trial(a, 1, None)
    again, _ = trial(a, 1, None)
    noise = diff(again, ref)
    tol = max(100 * noise, 1e-9)
    full, progs = trial(a, a.streams, None)
    key, ops, splan, program = max(progs, key=lambda p: len(p[1]))
    n = len(ops)
    trials = [{"limit": None, "rel_diff": diff(full, ref)}]
    print(f"P={P} {a.model} {a.dtype}: noise {noise:.3g}; {a.streams} streams, no limit: {trials[0]['rel_diff']:.3g} "
          f"(largest program: {n} steps, {splan.describe() if splan else 'no plan'})", flush=True)
    found = None
    if trials[0]["rel_diff"] > tol:
        lo, hi = 0, n               # f(lo) matches (K = 0: one stream's order), f(hi) departs
        while hi - lo > 1:
            mid = (lo + hi) // 2
            w, _ = trial(a, a.streams, mid)
            d = diff(w, ref)
            trials.append({"limit": mid, "rel_diff": d})
            print(f"  K={mid}: {d:.3g}", flush=True)
            if d > tol:
                hi = mid
            else:
                lo = mid
        found = hi - 1
    out = {"P": P, "model": a.model, "dtype": a.dtype, "streams": a.streams, "noise": noise, "tolerance": tol,
           "program_steps": n, "plan": splan.describe() if splan else None, "trials": trials}
    if found is not None and splan is not None:
        rt = __import__("dmath.runtime", fromlist=["runtime"]).runtime()

        def step(i):
            s = program.steps[i]
            k = len(rt.entries[s.sig_id].inputs)
            return {"index": i, "op": ops[i], "stream": splan.stream[i], "waits": list(splan.waits[i]),
                    "reads": list(s.handles[:k]), "writes": list(s.handles[k:]), "frees": list(s.frees)}
        out["first_bad_step"] = step(found)
        out["around"] = [step(i) for i in range(max(0, found - 6), min(n, found + 4))]
        print("first step whose side-stream placement changes the result:", json.dumps(out["first_bad_step"]))
        for r in out["around"]:
            print("  ", json.dumps(r))
    os.makedirs(a.outdir, exist_ok=True)
    with open(os.path.join(a.outdir, f"streams_bisect_{a.model}_P{P}.json"), "w") as fh:
        json.dump(out, fh, indent=1)


if __name__ == "__main__":
    main()
