"""Can a channels-last convolution read its filter in the weights' own (K, C, kh, kw) order?

    python benchmarks/probes/conv_filter_layout.py OUTDIR [--net googlenet] [--batch 256] [--dtype float16]

dmath keeps a convolution's kernel as a (K, C*kh*kw) matrix in PyTorch's order. A channels-last
convolution hands cuDNN (K, kh, kw, C) filters, so every call of a kernel wider than 1x1 copies
it (forward and data gradient) and copies its weight gradient back: three copies a step per such
convolution (GoogLeNet at 256 images on one H200: 60 copies, 0.33 ms of an 18 ms step; a 1x1
kernel is the same memory in both orders). PyTorch stores channels-last weights physically in
that order instead. This probe asks the cheaper question first: for each convolution of the net
wider than 1x1 (the shapes one training step ran), every cuDNN plan of the same graph with the
filter tensor described in KCRS strides (the weights as they are, no copy) against the KRSC one
dmath builds, and the copy itself (one GPU; each side's best of the heuristics' first 8 plans).

OUTDIR/conv_filter_layout_<net>_b<batch>_<dtype>.json: per shape the best KRSC plan (ms,
workspace), the copy's ms, the best KCRS plan or why cuDNN refused it, and the sums a step.
"""
import argparse
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))


#: plans timed per shape and filter order, and the seconds allowed for them (building included)
PLANS, BUDGET_S = 8, 3.0


def best(plan, ptrs, budget):
    """(ms, workspace, plans timed) of the fastest of the heuristics' first PLANS plans of `plan` on these
    buffers (within BUDGET_S: runtime-compiled engines take long to build)."""
    from dmath import tuning
    timed = tuning.timed(plan._fitting(budget), lambda c: plan._time(c, ptrs), "fast", few=PLANS,
                         budget_s=BUDGET_S, runs=0)
    if not timed:
        return None, None, 0
    c, ms = min(timed, key=lambda cm: cm[1])
    return ms, c["workspace"], len(timed)


def filter_order_plan(cudnn, key, budget, kcrs):
    """cudnn.ConvPlan of `key` whose filter tensor has KCRS strides (kcrs) or dmath's KRSC ones."""
    if not kcrs:
        return cudnn.ConvPlan(key, budget)
    w_dims = [key.k, key.c // key.groups, key.kh, key.kw]
    plain = cudnn._strides

    def strides(dims, channels_last):
        return plain(dims, False) if list(dims) == w_dims else plain(dims, channels_last)
    cudnn._strides = strides
    try:
        return cudnn.ConvPlan(key, budget)
    finally:
        cudnn._strides = plain


def buffers(xp, key):
    """Random device buffers of `key` and its pointers in ConvPlan's order (inputs, [bias,] output)."""
    ho, wo = key.out_hw
    dt = key.dtype
    x = xp.random.standard_normal(key.n * key.c * key.h * key.w).astype(dt)
    w = (xp.random.standard_normal(key.k * (key.c // key.groups) * key.kh * key.kw) * 0.05).astype(dt)
    y = xp.random.standard_normal(key.n * key.k * ho * wo).astype(dt)
    b = xp.zeros(key.k, dt)
    if key.direction == "fprop":
        arrays = [x, w] + ([b] if "bias" in key.epilogue else []) + [xp.empty_like(y)]
    elif key.direction == "dgrad":
        arrays = [y, w, xp.empty_like(x)]
    else:
        arrays = [x, y, xp.empty_like(w)]
    return arrays, tuple(a.data.ptr for a in arrays)


def copy_ms(xp, key, runs=20):
    """Milliseconds of the copy of a (K, C, kh, kw) kernel into (K, kh, kw, C), as dmath's conv makes it."""
    cg = key.c // key.groups
    w = xp.random.standard_normal((key.k, cg, key.kh, key.kw)).astype(key.dtype)
    xp.ascontiguousarray(w.transpose(0, 2, 3, 1))
    stream = xp.cuda.get_current_stream()
    start, end = xp.cuda.Event(), xp.cuda.Event()
    start.record(stream)
    for _ in range(runs):
        xp.ascontiguousarray(w.transpose(0, 2, 3, 1))
    end.record(stream)
    end.synchronize()
    return xp.cuda.get_elapsed_time(start, end) / runs


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("outdir")
    ap.add_argument("--net", default="googlenet")
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--dtype", default="float16", choices=["float16", "float32"])
    a = ap.parse_args()
    import numpy as np
    import zoo_bench

    import dmath
    import dnn
    from dmath.gpu import cudnn
    dmath.init(device="gpu")
    if dmath.num_workers() != 1:
        raise SystemExit("conv_filter_layout: run it on one GPU (no mpiexec)")
    xp = dmath.backend.current().xp
    shape = zoo_bench.NETS[a.net][0]
    rng = np.random.default_rng(0)
    data = dnn.data.Dataset(rng.random((a.batch,) + shape, dtype=np.float32),
                            rng.integers(0, zoo_bench.CLASSES, a.batch))
    model = zoo_bench.dnn_model(a.net, a.dtype, shape, "all", "local")
    model.fit(data, batch_size=a.batch, epochs=1, shuffle=False, verbose=0)     # the shapes one step runs
    keys = [cudnn.ConvKey(**row["key"]) for row in cudnn.explain()]
    keys = [k for k in keys if k.channels_last and k.kh * k.kw > 1 and k.groups == 1 and k.dtype == a.dtype]
    budget = cudnn._budget()
    rows, t0 = [], time.perf_counter()
    for key in keys:
        arrays, ptrs = buffers(xp, key)
        row = {"key": key._asdict(), "copy_ms": copy_ms(xp, key)}
        for name, kcrs in (("krsc", False), ("kcrs", True)):
            try:
                ms, ws, count = best(filter_order_plan(cudnn, key, budget, kcrs), ptrs, budget)
                row[name] = {"ms": ms, "workspace": ws, "plans_timed": count}
            except cudnn.Refused as exc:
                row[name] = {"refused": str(exc)[:300]}
        rows.append(row)
        del arrays
        k, kc = row["krsc"].get("ms"), row["kcrs"].get("ms")
        print(f"{key.direction:5s} n{key.n} c{key.c} {key.h}x{key.w} -> k{key.k} {key.kh}x{key.kw}: KRSC "
              f"{k if k is None else round(k, 4)} ms + copy {row['copy_ms']:.4f}; KCRS "
              f"{kc if kc is None else round(kc, 4)}" + ("" if kc is not None else f" ({row['kcrs'].get('refused', '')[:80]})"),
              flush=True)
    both = [r for r in rows if r["krsc"].get("ms") is not None and r["kcrs"].get("ms") is not None]
    summary = {"shapes": len(rows), "kcrs_ran": len(both),
               "krsc_plus_copy_ms": sum(r["krsc"]["ms"] + r["copy_ms"] for r in both),
               "kcrs_ms": sum(r["kcrs"]["ms"] for r in both),
               "kcrs_faster": sum(r["kcrs"]["ms"] < r["krsc"]["ms"] + r["copy_ms"] for r in both),
               "probe_s": time.perf_counter() - t0}
    os.makedirs(a.outdir, exist_ok=True)
    path = os.path.join(a.outdir, f"conv_filter_layout_{a.net}_b{a.batch}_{a.dtype}.json")
    with open(path, "w") as fh:
        json.dump({"net": a.net, "batch": a.batch, "dtype": a.dtype, "gpu": cudnn.fingerprint(),
                   "summary": summary, "rows": rows}, fh, indent=1)
    print(f"{a.net} b{a.batch} {a.dtype}: {summary}; wrote {path}")
    dmath.finalize()


if __name__ == "__main__":
    main()
