"""Training throughput of the zoo's branchy networks: dnn against PyTorch eager, torch.compile and
DDP (eager and compiled), in the same job.

    python benchmarks/zoo_bench.py OUTDIR [--nets googlenet resnet50 inception_v3] [--batches 256 1024]
        [--dtypes float32 float16] [--peers eager compile syncbn] [--compile-only 256 ...] [--only NET:B:DTYPE ...]
        [--fuse all relu none] [--batchnorm sync local]
    mpiexec -n P python benchmarks/zoo_bench.py OUTDIR ...     (strong scaling: the global batch is fixed)

Each case (network, global batch, dtype) trains dnn.models' network through
`Model.fit` (recorded steps replayed as one CUDA graph per worker, channels-
last rows on cuDNN) and torchvision's same network (channels_last,
cudnn.benchmark; DDP over the same GPUs when P > 1; float16 through autocast
and a GradScaler; the peer `syncbn`, P > 1 only, is DDP with SyncBatchNorm: batch
statistics over the whole global batch, what dnn's BatchNorm computes at any worker count, where
DDP's default BatchNorm keeps each GPU's own) on random images resident on the GPUs (both sides
gather each step's batch in a new random order every epoch; `--peer-batches view` slices the peers'
in order, as before session 27; dnn's timed epochs are `--steps-per-epoch` steps, 8 by default: every
epoch ends with a read that drains the GPUs, a cost that a real epoch of hundreds of steps spreads
thin and that PyTorch's loop never pays), SGD with momentum;
Inception v3 at 299x299 with its auxiliary head on both sides (aux loss
weight 0.3), GoogLeNet without its auxiliary heads (the paper's Table 1
network; the heads are training-only side branches). Reported per case: images/s of dnn and of every peer, the ratios, and
peak memory per GPU (reserved and allocated, less the resident images; see
benchmarks/cnn_bench.py, whose timing both sides reuse), the wall seconds of
each measurement (wall_s: warm-up, tuning and compilation included); a case that runs out
of memory on one side is recorded without that side's figure. --fuse measures dnn once per
fusion setting (Model's fuse: 'all' is fuse=True, a residual block's BatchNorm, Add and relu as
one kernel and an Inception module's concatenation written in place by its branches' batch
norms; 'relu' folds the relus only; 'none' nothing); the first gives the case's figures,
the others go to its `fuse_variants` with their ratio to the first, all in the same job;
--batchnorm sync local measures dnn's BatchNorm with the global batch's statistics (the case's
figure, like the peer `syncbn`) and with each GPU's own (`batchnorm_variants`, like DDP's default)
in the same way. Writes
OUTDIR/zoo_P<workers>_<nets>.json (one job per network keeps each under ten
minutes), rewritten after every measurement so that a job cut short keeps
what it finished; strong-scaling efficiency comes from the files of P = 1, 2
and 4 (`benchmarks/plots.py scaling` draws it).
"""
import argparse
import gc
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dmath                                    # noqa: E402
import dnn                                      # noqa: E402
from dmath.ops.base import dispatch             # noqa: E402
from dmath.runtime import kernel                # noqa: E402
import cnn_bench                                # noqa: E402
from cnn_bench import LR, MOMENTUM, peer_entry, resident_batches, time_model, torch_rate, wanted   # noqa: E402
from common import at_least_two, environment, positive_int, write_json      # noqa: E402

#: network -> (input shape, dnn.models keyword arguments, torchvision keyword arguments)
NETS = {
    "googlenet": ((3, 224, 224), {"aux_logits": False}, {"aux_logits": False, "init_weights": True}),
    "resnet50": ((3, 224, 224), {}, {}),
    "inception_v3": ((3, 299, 299), {"aux_logits": True}, {"aux_logits": True, "init_weights": True}),
}


def arguments(net, shape):
    """(dnn.models kwargs, torchvision kwargs) of `net` for images of `shape`: Inception v3's
    auxiliary head needs about 299x299, so a smaller --image-size leaves it out on both sides."""
    _, mine, theirs = NETS[net]
    if net == "inception_v3" and shape[1] < 299:
        mine, theirs = dict(mine, aux_logits=False), dict(theirs, aux_logits=False)
    return mine, theirs
CLASSES = 1000
AUX_WEIGHT = 0.3


#: --fuse's names -> Model's fuse argument
FUSE = {"all": True, "relu": "relu", "none": False}
#: dnn's SGD steps the weights of a dtype together (dmath.nn.sgd_update_many), or one command each (--foreach off)
FOREACH = [True]


def dnn_model(net, dtype, shape, fuse="all", batchnorm="sync"):
    kwargs, _ = arguments(net, shape)
    kwargs = dict(kwargs, fuse=FUSE[fuse])
    opt = dnn.optim.SGD(lr=LR, momentum=MOMENTUM, foreach=FOREACH[0])
    if kwargs.get("aux_logits"):
        kwargs = dict(kwargs, aux_weight=AUX_WEIGHT)
    # --batchnorm local: each GPU's own statistics, as DDP's BatchNorm
    return getattr(dnn.models, net)(num_classes=CLASSES, input_shape=shape, dtype=dtype, optimizer=opt,
                                    sync_batchnorm=batchnorm == "sync", **kwargs)


@kernel("bench_torch_zoo")
def _torch_zoo(call):
    """torchvision's network on every worker; static = (net, shape, batch, dtype, steps, port, compiled,
    sync_bn, profile_kernels, gather): sync_bn converts its BatchNorm layers to SyncBatchNorm (statistics over the whole batch,
    as dnn's BatchNorm computes them at every worker count; DDP's default keeps each GPU's own)."""
    net, shape, batch, dtype, steps, port, compiled, sync_bn, profile_kernels, gather = call.entry.static
    _, tv_kwargs = arguments(net, shape)

    def build(torch):
        import torchvision
        model = getattr(torchvision.models, net)(weights=None, num_classes=CLASSES, **tv_kwargs)
        return torch.nn.SyncBatchNorm.convert_sync_batchnorm(model) if sync_bn else model
    torch_rate(call, build, shape, CLASSES, resident_batches(batch, shape), batch, dtype, steps, port, profile_kernels,
               compiled=compiled, channels_last=True, aux_weight=AUX_WEIGHT, gather=gather)
    return []


def measure_dnn(net, dtype, shape, batch, steps, fuse, profile_kernels=False, batchnorm="sync"):
    """(images/s, (peak reserved, peak allocated)) of dnn's network under a --fuse and a --batchnorm
    setting (None figures when it runs out of memory); profile_kernels: print the GPU time by kernel
    of one epoch."""
    try:
        ips, peak, _ = time_model(lambda: dnn_model(net, dtype, shape, fuse, batchnorm), shape, CLASSES,
                                  resident_batches(batch, shape), batch, steps, profile_kernels)
    except dmath.OutOfMemoryError as exc:
        ips, peak = None, (None, None)
        print(f"{net} b{batch} {dtype} fuse={fuse}: dnn out of memory ({exc})", flush=True)
    gc.collect()
    dmath.memory.clear()
    return ips, peak


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("outdir", help="directory for zoo_P<workers>_<nets>.json")
    ap.add_argument("--nets", nargs="+", default=list(NETS), choices=list(NETS))
    ap.add_argument("--batches", type=positive_int, nargs="+", default=[256, 1024])
    ap.add_argument("--dtypes", nargs="+", default=["float32", "float16"], choices=["float32", "float16"])
    ap.add_argument("--peers", nargs="*", default=["eager", "compile"], choices=["eager", "compile", "syncbn"],
                    help="PyTorch peers (DDP over the same GPUs when P > 1)")
    ap.add_argument("--compile-only", nargs="+", default=None, metavar="CASE",
                    help="run the compile peer only in these cases: batch, batch:dtype or net:batch:dtype")
    ap.add_argument("--only", nargs="+", default=None, metavar="CASE",
                    help="run only these of the --nets x --batches x --dtypes cases (as --compile-only)")
    ap.add_argument("--cpu-peers", action="store_true",
                    help="run the PyTorch peers on the CPU backend too (checks the script; no figure)")
    ap.add_argument("--steps", type=positive_int, default=24)
    ap.add_argument("--device", default=None, choices=["cpu", "gpu"])
    ap.add_argument("--image-size", type=positive_int, default=None,
                    help="train on size x size images instead of the networks' own (a quick check)")
    ap.add_argument("--port", type=int, default=29541)
    ap.add_argument("--bucket-mb", type=float, default=None,
                    help="dnn's gradient buckets (Model.bucket_mb; 0: one all-reduce per weight; default 25)")
    ap.add_argument("--fuse", nargs="+", default=["all"], choices=list(FUSE),
                    help="dnn's fusion settings to measure, the first the case's figure (Model's fuse)")
    ap.add_argument("--batchnorm", nargs="+", default=["sync"], choices=["sync", "local"],
                    help="dnn's BatchNorm statistics to measure, the first the case's figure: 'sync', over the "
                         "global batch (as DDP with SyncBatchNorm, the peer 'syncbn'); 'local', each GPU's own "
                         "(BatchNorm(synchronized=False), as DDP's default BatchNorm)")
    ap.add_argument("--foreach", choices=["on", "off"], default="on",
                    help="dnn's SGD: the weights of a dtype in few commands and GPU kernels (on), or one each (off)")
    ap.add_argument("--kernel-profile", action="store_true",
                    help="print the GPU time by kernel of one epoch of dnn and of each peer (CUPTI, through "
                         "torch.profiler; after the timed steps)")
    ap.add_argument("--peer-batches", default="gather", choices=["gather", "view"],
                    help="the PyTorch peers' batches: gathered in a new random order every epoch, as dnn's "
                         "fit(shuffle=True) (default), or views of the resident tensor in order (no batch "
                         "buffer; the peers' figures before session 27)")
    ap.add_argument("--steps-per-epoch", type=at_least_two, default=cnn_bench.STEPS_PER_EPOCH[0],
                    help="steps of each timed epoch, resident batches of random images (fewer where they would pass "
                         "8 GiB of float32), at least 2")
    args = ap.parse_args()
    FOREACH[0] = args.foreach == "on"
    cnn_bench.STEPS_PER_EPOCH[0] = args.steps_per_epoch
    cnn_bench.BUCKET_MB = args.bucket_mb
    dmath.init(device=args.device)
    p = dmath.num_workers()
    os.makedirs(args.outdir, exist_ok=True)
    rows = []
    path = os.path.join(args.outdir, f"zoo_P{p}_{'-'.join(args.nets)}.json")

    def save():
        write_json(path, {"benchmark": "zoo", "environment": environment(dmath), "workers": p,
                          "peer_batches": args.peer_batches, "results": rows})
    for net in args.nets:
        shape = NETS[net][0] if args.image_size is None else (3, args.image_size, args.image_size)
        for batch in args.batches:
            if batch % p:
                continue
            for dtype in args.dtypes:
                if not wanted(args.only, net, batch, dtype):
                    continue
                steps = max(args.steps, resident_batches(batch, shape))
                t0 = time.perf_counter()
                ips, peak = measure_dnn(net, dtype, shape, batch, steps, args.fuse[0], args.kernel_profile,
                                        args.batchnorm[0])
                wall = {"dnn": time.perf_counter() - t0}
                row = {"net": net, "global_batch": batch, "dtype": dtype, "workers": p, "steps": steps,
                       "image_shape": list(shape),
                       "steps_per_epoch": resident_batches(batch, shape), "bucket_mb": args.bucket_mb, "fuse": args.fuse[0],
                       "foreach": FOREACH[0], "batchnorm": args.batchnorm[0], "batchnorm_variants": {},
                       "dnn_images_per_s": ips, "dnn_peak_bytes": peak[0],
                       "dnn_peak_allocated_bytes": peak[1], "peers": {}, "fuse_variants": {}, "wall_s": wall}
                rows.append(row)
                save()
                for fuse in args.fuse[1:]:
                    t0 = time.perf_counter()
                    other, other_peak = measure_dnn(net, dtype, shape, batch, steps, fuse, batchnorm=args.batchnorm[0])
                    wall["dnn_fuse_" + fuse] = time.perf_counter() - t0
                    row["fuse_variants"][fuse] = {"images_per_s": other, "peak_bytes": other_peak[0],
                                                  "first_over_this": ips / other if ips and other else None}
                    print(f"{net:12s} b{batch:<5d} {dtype}: dnn fuse={fuse} {other or 0:8.0f} img/s "
                          f"({args.fuse[0]} x{row['fuse_variants'][fuse]['first_over_this'] or 0:.3f})", flush=True)
                    save()
                for bn in args.batchnorm[1:]:
                    t0 = time.perf_counter()
                    other, other_peak = measure_dnn(net, dtype, shape, batch, steps, args.fuse[0], batchnorm=bn)
                    wall["dnn_batchnorm_" + bn] = time.perf_counter() - t0
                    row["batchnorm_variants"][bn] = {"images_per_s": other, "peak_bytes": other_peak[0],
                                                     "first_over_this": ips / other if ips and other else None}
                    print(f"{net:12s} b{batch:<5d} {dtype}: dnn batchnorm={bn} {other or 0:8.0f} img/s "
                          f"({args.batchnorm[0]} x{row['batchnorm_variants'][bn]['first_over_this'] or 0:.3f})",
                          flush=True)
                    save()
                if dmath.device() == "gpu" or args.cpu_peers:
                    for peer in args.peers:
                        if peer == "compile" and not wanted(args.compile_only, net, batch, dtype):
                            continue
                        if peer == "syncbn" and p == 1:
                            continue            # (one GPU: the same as eager)
                        name = ("ddp_" if p > 1 else "") + peer
                        t0 = time.perf_counter()
                        res = dispatch("bench_torch_zoo", static=(net, shape, batch, dtype, steps, args.port,
                                                                   peer == "compile", peer == "syncbn",
                                                                   args.kernel_profile,
                                                                   args.peer_batches == "gather"))[1]
                        row["peers"][name] = peer_entry(res, ips)
                        wall[peer] = time.perf_counter() - t0
                        save()
                # (MB reserved/allocated, as torch's max_memory_reserved/max_memory_allocated)
                peers = "; ".join(f"{k} {v['images_per_s']:.0f} (x{v['dnn_over_peer'] or 0:.2f}, "
                                  f"{v['peak_bytes'] / 2**20:.0f}/{v['peak_allocated_bytes'] / 2**20:.0f} MB)"
                                  for k, v in row["peers"].items() if v)
                print(f"{net:12s} b{batch:<5d} {dtype}: dnn {ips or 0:8.0f} img/s "
                      f"{(peak[0] or 0) / 2**20:.0f}/{(peak[1] or 0) / 2**20:.0f} MB; "
                      f"{peers or 'no PyTorch peer'}", flush=True)
    save()


if __name__ == "__main__":
    main()
