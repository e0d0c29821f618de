"""Where a training step from an image folder spends its time on one GPU: a CUPTI timeline of one epoch.

    python benchmarks/probes/folder_timeline.py OUTDIR [--root DIR] [--images 4000] [--batch 256]
        [--order serial|overlap] [--model resnet50] [--dtype float16]

ResNet-50 from `dnn.data.ImageFolder` (nvImageCodec decoding on the GPU) trains
one epoch untimed (tuning, recording, capture), then one epoch under
torch.profiler, which records every CUDA kernel and runtime call of the
process through CUPTI, dmath's and nvImageCodec's alike (torch is only the
recorder here). The summary (OUTDIR/folder_timeline_<order>.json):

- gpu: the epoch's span on the GPU, the time some kernel ran (the union of
  kernel intervals), and per CUDA stream its kernels' total time and count
  (dmath's step runs on one stream, nvImageCodec's kernels on its own);
- host: per thread, the time spent in each blocking CUDA runtime call
  (synchronisations, graph launches, copies), the calls that show a thread
  waiting for the GPU or for a lock in the driver;
- the top kernels of the streams that are not the step's.

Run it with the order of the decoding (DMATH_GPU_DECODE_ORDER) to compare
where each spends the step. At one worker the master is worker 0, so one
process holds the whole pipeline and step.
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

#: runtime calls in which a host thread can wait (for the GPU, or for a lock the driver holds)
BLOCKING = ("Synchronize", "GraphLaunch", "Memcpy", "Malloc", "Free", "LaunchKernel", "EventRecord",
            "StreamWaitEvent", "EventQuery", "HostAlloc")


def union_ms(intervals):
    """Total length (ms) of the union of (start, end) intervals in microseconds."""
    total, end = 0.0, None
    for s, e in sorted(intervals):
        if end is None or s > end:
            total += e - s
            end = e
        elif e > end:
            total += e - end
            end = e
    return total / 1e3


def summarise(trace, steps):
    """The summary of a Chrome trace (torch.profiler's export) of `steps` training steps."""
    events = [e for e in trace.get("traceEvents", []) if e.get("ph") == "X" and "dur" in e]
    # (copies and fills occupy a stream too: counted with the kernels)
    kernels = [e for e in events if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    runtime = [e for e in events if e.get("cat") in ("cuda_runtime", "cuda_driver")]
    out = {"steps": steps, "kernels": len(kernels)}
    if kernels:
        t0 = min(e["ts"] for e in kernels)
        t1 = max(e["ts"] + e["dur"] for e in kernels)
        per_stream = collections.defaultdict(lambda: [0.0, 0])
        for e in kernels:
            s = per_stream[e.get("args", {}).get("stream", -1)]
            s[0] += e["dur"] / 1e3
            s[1] += 1
        busy = union_ms([(e["ts"], e["ts"] + e["dur"]) for e in kernels])
        main = max(per_stream, key=lambda k: per_stream[k][0])
        others = collections.defaultdict(lambda: [0.0, 0])
        for e in kernels:
            if e.get("args", {}).get("stream", -1) != main:
                o = others[e["name"][:80]]
                o[0] += e["dur"] / 1e3
                o[1] += 1
        out["gpu"] = {
            "span_ms": (t1 - t0) / 1e3, "busy_ms": busy, "idle_ms": (t1 - t0) / 1e3 - busy,
            "span_ms_per_step": (t1 - t0) / 1e3 / steps, "busy_ms_per_step": busy / steps,
            "main_stream": main,
            "streams": {str(k): {"kernel_ms": round(v[0], 3), "kernels": v[1]}
                        for k, v in sorted(per_stream.items(), key=lambda kv: -kv[1][0])},
            "top_other_kernels": [{"name": k, "ms": round(v[0], 3), "count": v[1]}
                                  for k, v in sorted(others.items(), key=lambda kv: -kv[1][0])[:15]]}
    host = collections.defaultdict(lambda: collections.defaultdict(lambda: [0.0, 0]))
    for e in runtime:
        if any(b in e["name"] for b in BLOCKING):
            h = host[str(e.get("tid"))][e["name"]]
            h[0] += e["dur"] / 1e3
            h[1] += 1
    out["host"] = {tid: {name: {"ms": round(v[0], 3), "calls": v[1]}
                         for name, v in sorted(calls.items(), key=lambda kv: -kv[1][0])[:8]}
                   for tid, calls in host.items()}
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("outdir")
    ap.add_argument("--root", default="/tmp/folder_timeline_imgs")
    ap.add_argument("--images", type=int, default=4000)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--order", default="serial", choices=("serial", "overlap"))
    ap.add_argument("--model", default="resnet50")
    ap.add_argument("--dtype", default="float16")
    ap.add_argument("--size", type=int, default=224)
    ap.add_argument("--decoder-options", default=None,
                    help="nvImageCodec's decoder options (dmath.gpu.nvimgcodec.OPTIONS); '' lets the hardware JPEG "
                         "engine take the files (with libjpeg's fancy chroma upsampling the timeline shows the CUDA "
                         "decoder's IDCT kernel for 97% of them)")
    a = ap.parse_args()
    os.environ["DMATH_GPU_DECODE_ORDER"] = a.order        # read at init
    import image_folder_bench as bench
    if not os.path.isdir(a.root):
        bench.make_folder(a.root, a.images)
    import torch                                          # the recorder (CUPTI) only
    import dmath
    import dnn
    if a.decoder_options is not None:
        from dmath.gpu import nvimgcodec
        nvimgcodec.OPTIONS = a.decoder_options
    dmath.init(device="gpu")
    if dmath.num_workers() != 1:
        raise SystemExit("one worker: the timeline is of this process")
    folder = dnn.data.ImageFolder(a.root, image_size=a.size, **bench.CONFIGS["gpu_decode"])
    dmath.random.seed(0)
    model = getattr(dnn.models, a.model)(num_classes=bench.CLASSES, input_shape=(3, a.size, a.size), dtype=a.dtype,
                                         optimizer=dnn.optim.SGD(lr=0.01, momentum=0.9))
    model.fit(folder, batch_size=a.batch, epochs=1, verbose=0)
    steps = len(folder) // a.batch
    acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=acts) as prof:
        t = time.perf_counter()
        hist = model.fit(folder, batch_size=a.batch, epochs=1, verbose=0).history
        wall = time.perf_counter() - t
    os.makedirs(a.outdir, exist_ok=True)
    path = os.path.join(a.outdir, f"folder_timeline_{a.order}.trace.json")
    prof.export_chrome_trace(path)
    with open(path) as fh:
        trace = json.load(fh)
    with gzip.open(path + ".gz", "wt") as fh:
        json.dump(trace, fh)
    os.remove(path)
    res = {"order": a.order, "decoder_options": a.decoder_options, "model": a.model, "dtype": a.dtype,
           "batch": a.batch, "gpu_name": torch.cuda.get_device_name(),
           "wall_s": wall, "wall_ms_per_step": 1e3 * wall / max(steps, 1), "samples_per_s": hist["samples_per_s"][-1],
           "pipeline": [p for rep in folder.stats() for p in rep["pipelines"] if p["random"]],
           **summarise(trace, max(steps, 1))}
    with open(os.path.join(a.outdir, f"folder_timeline_{a.order}.json"), "w") as fh:
        json.dump(res, fh, indent=1)
    g = res.get("gpu", {})
    print(f"{a.order}: {res['samples_per_s']:.0f} img/s, {res['wall_ms_per_step']:.1f} ms a step; GPU span "
          f"{g.get('span_ms_per_step', 0):.1f} ms, busy {g.get('busy_ms_per_step', 0):.1f} ms a step")
    print(json.dumps({"streams": g.get("streams"), "host": res["host"]}, indent=1)[:4000])


if __name__ == "__main__":
    main()
