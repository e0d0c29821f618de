"""Where a data-parallel step loses time against one GPU: a CUPTI timeline of worker 0's GPU.

    [mpiexec -n P] python benchmarks/probes/scaling_timeline.py OUTDIR --net googlenet --batch 1024
        [--dtype float16] [--batchnorm local] [--bucket-mb MB] [--steps-per-epoch 8]

A network of benchmarks/zoo_bench.py trains at global batch --batch on P GPUs
(random images resident on the GPUs) for two untimed epochs (tuning,
recording, capture), then one epoch under torch.profiler, which records
every kernel of the process through CUPTI, those replayed from CUDA graphs
and NCCL's included (torch is only the recorder). The master is worker 0,
so the timeline is GPU 0's. Run it at P = 1 with the per-GPU batch
(batch / P) to have the step without communication beside it.

The summary (OUTDIR/scaling_timeline_<net>_P<P>_b<batch>.json), per step:
the span of the epoch's kernels, the time some compute kernel ran, the time
some NCCL kernel ran, the NCCL time not hidden by compute (`nccl_exposed`),
the idle time; NCCL's kernels a step and the part of their time that
compute overlapped; the compute kernels' total by name (compare with P = 1 for the
slow-down of kernels that share the GPU with NCCL's).
"""
import argparse
import collections
import gzip
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))

from folder_timeline import union_ms     # noqa: E402


def intersect_ms(a, b):
    """Length (ms) of the intersection of two sets of (start, end) intervals in microseconds."""
    return union_ms(a) + union_ms(b) - union_ms(a + b)


def is_nccl(e):
    return "nccl" in e["name"].lower()


def summarise(trace, steps):
    """Per-step figures of a Chrome trace (torch.profiler's export) of `steps` training steps."""
    events = [e for e in trace.get("traceEvents", []) if e.get("ph") == "X" and "dur" in e]
    kernels = [e for e in events if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    if not kernels:
        return {"steps": steps, "kernels": 0}
    iv = lambda es: [(e["ts"], e["ts"] + e["dur"]) for e in es]     # noqa: E731
    comm = [e for e in kernels if is_nccl(e)]
    comp = [e for e in kernels if not is_nccl(e)]
    t0, t1 = min(e["ts"] for e in kernels), max(e["ts"] + e["dur"] for e in kernels)
    span = (t1 - t0) / 1e3
    busy, comp_ms, comm_ms = union_ms(iv(kernels)), union_ms(iv(comp)), union_ms(iv(comm))
    per = lambda v: round(v / steps, 3)                             # noqa: E731
    out = {"steps": steps, "kernels": len(kernels), "kernels_per_step": len(kernels) / steps,
           "span_ms": per(span), "busy_ms": per(busy), "compute_ms": per(comp_ms), "nccl_ms": per(comm_ms),
           "nccl_exposed_ms": per(busy - comp_ms), "idle_ms": per(span - busy),
           "compute_kernel_sum_ms": per(sum(e["dur"] for e in comp) / 1e3)}
    # each all-reduce against the compute that ran beside it (NCCL's kernels of the whole epoch)
    comp_iv = iv(comp)
    overlapped = intersect_ms(iv(comm), comp_iv) if comm else 0.0
    out["nccl_kernels_per_step"] = len(comm) / steps
    out["nccl_overlapped_ms"] = per(overlapped)
    out["nccl_kernels"] = [{"name": k, "per_step": v / steps}
                           for k, v in collections.Counter(e["name"][:60] for e in comm).most_common(8)]
    by_name = collections.defaultdict(lambda: [0.0, 0])
    for e in comp:
        b = by_name[e["name"][:90]]
        b[0] += e["dur"] / 1e3
        b[1] += 1
    out["top_compute_kernels"] = [{"name": k, "ms_per_step": round(v[0] / steps, 4), "per_step": v[1] / steps}
                                  for k, v in sorted(by_name.items(), key=lambda kv: -kv[1][0])[:60]]
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("outdir")
    ap.add_argument("--net", default="googlenet")
    ap.add_argument("--batch", type=int, default=1024, help="the global batch")
    ap.add_argument("--dtype", default="float16", choices=["float16", "float32"])
    ap.add_argument("--batchnorm", default="local", choices=["local", "sync"])
    ap.add_argument("--bucket-mb", type=float, default=None)
    ap.add_argument("--steps-per-epoch", type=int, default=8)
    ap.add_argument("--dense-gemm", action="store_true",
                    help="dense layers' gradients by dmath.gemm as before dmath.nn.dense_backward (an A/B of it)")
    a = ap.parse_args()
    import numpy as np
    import torch                                          # the recorder (CUPTI) only
    import dmath
    import dnn
    import cnn_bench
    import zoo_bench
    dmath.init(device="gpu")
    p = dmath.num_workers()
    if a.dense_gemm:
        dnn.ops.dense._data_parallel = lambda *_: False
    shape = cnn_bench.NETS[a.net][0] if a.net in cnn_bench.NETS else zoo_bench.NETS[a.net][0]
    rng = np.random.default_rng(0)
    n = a.batch * a.steps_per_epoch
    data = dnn.data.Dataset(rng.random((n,) + shape, dtype=np.float32), rng.integers(0, zoo_bench.CLASSES, n))
    dmath.random.seed(0)
    if a.net in cnn_bench.NETS:         # AlexNet and the small nets: Dense layers data parallel
        model = cnn_bench.dnn_model(a.net, a.dtype, "data")
    else:
        model = zoo_bench.dnn_model(a.net, a.dtype, shape, "all", a.batchnorm)
    if a.bucket_mb is not None:
        model.bucket_mb = a.bucket_mb
    for _ in range(2):
        model.fit(data, batch_size=a.batch, epochs=1, shuffle=True, verbose=0)
    dmath.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        t = time.perf_counter()
        model.fit(data, batch_size=a.batch, epochs=1, shuffle=True, verbose=0)
        dmath.synchronize()
        wall = time.perf_counter() - t
    os.makedirs(a.outdir, exist_ok=True)
    stem = os.path.join(a.outdir, f"scaling_timeline_{a.net}_P{p}_b{a.batch}"
                        + ("" if a.bucket_mb is None else f"_bucket{a.bucket_mb:g}") + ("_densegemm" if a.dense_gemm else ""))
    prof.export_chrome_trace(stem + ".trace.json")
    with open(stem + ".trace.json") as fh:
        trace = json.load(fh)
    with gzip.open(stem + ".trace.json.gz", "wt") as fh:
        json.dump(trace, fh)
    os.remove(stem + ".trace.json")
    res = {"net": a.net, "workers": p, "dense_gemm": a.dense_gemm, "global_batch": a.batch, "dtype": a.dtype, "batchnorm": a.batchnorm,
           "bucket_mb": model.bucket_mb, "gpu_name": torch.cuda.get_device_name(),
           "wall_ms_per_step": 1e3 * wall / a.steps_per_epoch, "images_per_s": n / wall,
           **summarise(trace, a.steps_per_epoch)}
    with open(stem + ".json", "w") as fh:
        json.dump(res, fh, indent=1)
    print(f"{a.net} P={p} b{a.batch}: {res['images_per_s']:.0f} img/s, {res['wall_ms_per_step']:.2f} ms a step; "
          + ", ".join(f"{k} {res.get(k)}" for k in ("span_ms", "busy_ms", "compute_ms", "nccl_ms", "nccl_exposed_ms",
                                                   "idle_ms", "compute_kernel_sum_ms", "kernels_per_step")))
    print(f"  NCCL kernels a step {res.get('nccl_kernels_per_step')}, overlapped by compute {res.get('nccl_overlapped_ms')} ms")
    dmath.finalize()


if __name__ == "__main__":
    main()
