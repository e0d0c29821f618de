"""Training throughput of the zoo's branchy networks with the captured step on one CUDA stream and on
several (DMATH_GRAPH_STREAMS, dmath/runtime/streams.py), in the same job.

    python benchmarks/streams_bench.py OUTDIR [--nets googlenet inception_v3] [--batches 256]
        [--dtypes float32 float16] [--streams 1 4] [--steps 16] [--peers eager]
    mpiexec -n P python benchmarks/streams_bench.py OUTDIR ...

Each case (network, global batch, dtype) trains dnn.models' network through
`Model.fit` as benchmarks/zoo_bench.py does (same models, data and timing,
cnn_bench.time_model), once per stream count, the counts alternating within
the case so that a drift of the machine reaches every count alike; every
rank plans the step anew for each count (a new model records new plans).
The peer is the one-stream run of the same job (`streams_over_one`); with
--peers eager, PyTorch eager (DDP when P > 1) runs the case too. Writes
OUTDIR/streams_P<workers>.json after every measurement.
"""
import argparse
import gc
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dmath                                    # noqa: E402
from dmath import settings                      # noqa: E402
from dmath.ops.base import dispatch             # noqa: E402
from dmath.runtime import kernel                # noqa: E402
import zoo_bench                                # noqa: E402  (its PyTorch kernel is registered before init)
import cnn_bench                                # noqa: E402
from cnn_bench import peer_entry, time_model    # noqa: E402
from common import environment, write_json      # noqa: E402


@kernel("bench_graph_streams")
def _graph_streams(call):
    """Every rank plans the plans recorded from now on with up to scalars[0] streams."""
    settings.current.graph_streams = int(call.scalars[0])
    return []


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("outdir", help="directory for streams_P<workers>.json")
    ap.add_argument("--nets", nargs="+", default=["googlenet", "inception_v3"], choices=list(zoo_bench.NETS))
    ap.add_argument("--batches", type=int, nargs="+", default=[256])
    ap.add_argument("--dtypes", nargs="+", default=["float32", "float16"], choices=["float32", "float16"])
    ap.add_argument("--streams", type=int, nargs="+", default=[1, 4], help="stream counts to compare (1 first)")
    ap.add_argument("--rounds", type=int, default=1, help="measurements of each count per case, alternating")
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--peers", nargs="*", default=[], choices=["eager"], help="PyTorch eager too (DDP when P > 1)")
    ap.add_argument("--device", default=None, choices=["cpu", "gpu"])
    ap.add_argument("--image-size", type=int, default=None, help="size x size images (a quick check)")
    ap.add_argument("--port", type=int, default=29543)
    args = ap.parse_args()
    if any(not 1 <= n <= 8 for n in args.streams):
        ap.error("--streams takes counts from 1 to 8")
    dmath.init(device=args.device)
    p = dmath.num_workers()
    os.makedirs(args.outdir, exist_ok=True)
    path = os.path.join(args.outdir, f"streams_P{p}.json")
    rows = []

    def save():
        write_json(path, {"benchmark": "graph_streams", "environment": environment(dmath), "workers": p,
                          "results": rows})
    for net in args.nets:
        shape = zoo_bench.NETS[net][0] if args.image_size is None else (3, args.image_size, args.image_size)
        for batch in args.batches:
            if batch % p:
                continue
            for dtype in args.dtypes:
                per_epoch = zoo_bench.resident_batches(batch, shape)
                steps = max(args.steps, per_epoch)
                rates = {n: [] for n in args.streams}
                row = {"net": net, "global_batch": batch, "dtype": dtype, "workers": p, "steps": steps,
                       "image_shape": list(shape), "images_per_s": {}, "peak_bytes": {}, "plan_streams": {},
                       "peers": {}}
                rows.append(row)
                for _ in range(args.rounds):
                    for n in args.streams:
                        dispatch("bench_graph_streams", scalars=[n])
                        cnn_bench.LAST_STATS[0] = None
                        try:
                            ips, peak, _ = time_model(lambda: zoo_bench.dnn_model(net, dtype, shape), shape,
                                                      zoo_bench.CLASSES, per_epoch, batch, steps)
                        except dmath.OutOfMemoryError as exc:
                            ips, peak = None, (None, None)
                            print(f"{net} b{batch} {dtype} streams {n}: out of memory ({exc})", flush=True)
                        # the most streams a plan of the timed steps was captured on (every rank's)
                        row["plan_streams"][str(n)] = max((s["plan_streams"] for s in cnn_bench.LAST_STATS[0] or ()),
                                                          default=None)
                        gc.collect()
                        dmath.memory.clear()
                        rates[n].append(ips)
                        row["peak_bytes"][str(n)] = peak[0]
                        row["images_per_s"][str(n)] = [r for r in rates[n]]
                        save()
                dispatch("bench_graph_streams", scalars=[1])
                best = {n: max((r for r in rates[n] if r), default=None) for n in args.streams}
                base = best[args.streams[0]]
                row["best_images_per_s"] = {str(n): v for n, v in best.items()}
                row["streams_over_one"] = {str(n): (v / base if v and base else None) for n, v in best.items()}
                if dmath.device() == "gpu":
                    for peer in args.peers:
                        t0 = time.perf_counter()
                        res = dispatch("bench_torch_zoo",
                                       static=(net, shape, batch, dtype, steps, args.port, False))[1]
                        fastest = max(v or 0 for v in best.values())
                        row["peers"][("ddp_" if p > 1 else "") + peer] = peer_entry(res, fastest)
                        row["peer_wall_s"] = time.perf_counter() - t0
                save()
                ratio = row["streams_over_one"]
                figures = ", ".join(f"{n} stream(s) {best[n] or 0:.0f} img/s (x{ratio[str(n)] or 0:.3f})"
                                    for n in args.streams)
                print(f"{net:12s} b{batch:<5d} {dtype}: {figures}", flush=True)
    save()


if __name__ == "__main__":
    main()
