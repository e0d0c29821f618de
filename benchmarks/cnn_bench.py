"""CNN training throughput: dnn against PyTorch eager (one GPU) and DDP (P GPUs), in the same job.

    python benchmarks/cnn_bench.py --device gpu [--nets lenet cifar alexnet] [--batches 256 1024]
        [--dtypes float32 float16] [--peers eager compile] [--out F.json]
    mpiexec -n P python benchmarks/cnn_bench.py --device gpu ...        (strong scaling: global batch fixed)

For every network, global batch and dtype it trains on random images that
are resident on the GPUs on both sides (dnn: a dnn.data.Dataset; PyTorch: a
tensor on each GPU, the rank's share of every batch sliced from it), so the
figure is the training step itself: forward, backward, gradient all-reduce,
SGD with momentum. dnn runs `Model.fit` (every step a replayed plan, one
CUDA graph per worker where the step allows); PyTorch runs the same network
eagerly with cudnn.benchmark=True (DDP when P > 1; float16 through autocast
and a GradScaler, dnn's float16 keeps float32 master weights and dynamic
loss scaling too), and with `--peers eager compile` also torch.compile'd
(over DDP when P > 1; `--compile-only` names the cases). Reported per case:
images/s of both (and of every peer), their ratio, and each side's peak
device memory less its resident images, reserved (what the
device had to provide: dnn's largest pool high-water mark of any worker over
the timed steps plus the bytes its captured CUDA graphs hold; PyTorch's
max_memory_reserved on GPU 0) and allocated (in buffers at once: dnn's bytes
in use between steps plus the graph's buffers at their peak inside the step;
PyTorch's max_memory_allocated; the peer gathers each step's batch in a
new random order every epoch as dnn's fit(shuffle=True) does, so both count
a batch buffer: `--peer-batches view` slices it in order instead, as before
session 27), and the wall seconds of each side's
measurement, warm-up, tuning and compilation included (wall_s).
Efficiency across GPU counts comes from comparing the JSON of P = 1 and P
(`benchmarks/plots.py cnn` and `scaling` draw it). The JSON is rewritten
after every measurement, so a job cut short keeps the cases it finished.
"""
import argparse
import gc
import os
import sys
import time
import traceback

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dmath                                    # noqa: E402
import dnn                                      # noqa: E402
from dnn import layers as L                     # noqa: E402
from dmath import backend                       # noqa: E402
from dmath.comm.control import gather_objects   # noqa: E402
from dmath.ops.base import dispatch             # noqa: E402
from dmath.runtime import kernel                # noqa: E402
from common import at_least_two, environment, positive_int, torch_distributed, write_json  # noqa: E402

#: network -> (input shape, classes, layer list as (kind, args)) shared by both sides
NETS = {
    "lenet": ((1, 28, 28), 10, [("conv", 6, 5, 1, 2), ("pool", 2, 2), ("conv", 16, 5, 1, 0), ("pool", 2, 2),
                                ("flat",), ("dense", 120), ("dense", 84), ("out", 10)]),
    "cifar": ((3, 32, 32), 10, [("conv", 32, 5, 1, 2), ("pool", 2, 2), ("conv", 32, 5, 1, 2), ("pool", 2, 2),
                                ("conv", 64, 5, 1, 2), ("pool", 2, 2), ("flat",), ("dense", 64), ("out", 10)]),
    # torchvision's AlexNet (224 x 224 images: the 6 x 6 adaptive pool is the identity)
    "alexnet": ((3, 224, 224), 1000, [("conv", 64, 11, 4, 2), ("pool", 3, 2), ("conv", 192, 5, 1, 2), ("pool", 3, 2),
                                      ("conv", 384, 3, 1, 1), ("conv", 256, 3, 1, 1), ("conv", 256, 3, 1, 1),
                                      ("pool", 3, 2), ("flat",), ("drop",), ("dense", 4096), ("drop",),
                                      ("dense", 4096), ("out", 1000)]),
}
LR, MOMENTUM = 0.01, 0.9


def dnn_model(net, dtype, parallel, channels_last=None):
    shape, _, spec = NETS[net]
    layers = [L.Input(shape)]
    for kind, *a in spec:
        if kind == "conv":
            layers += [L.Conv2D(a[0], a[1], stride=a[2], padding=a[3]), L.Activation("relu")]
        elif kind == "pool":
            layers.append(L.Pool2D(a[0], stride=a[1]))
        elif kind == "flat":
            layers.append(L.Flatten())
        elif kind == "drop":
            layers.append(L.Dropout(0.5))
        elif kind == "dense":
            layers += [L.Dense(a[0], parallel=parallel), L.Activation("relu")]
        else:
            layers += [L.Dense(a[0], parallel=parallel), L.Output("softmax")]
    return dnn.Sequential(layers, loss="cross_entropy", dtype=dtype, channels_last=channels_last,
                          optimizer=dnn.optim.SGD(lr=LR, momentum=MOMENTUM))


def torch_model(torch, net):
    nn = torch.nn
    shape, _, spec = NETS[net]
    mods, c, h, w = [], *shape
    for kind, *a in spec:
        if kind == "conv":
            mods += [nn.Conv2d(c, a[0], a[1], stride=a[2], padding=a[3]), nn.ReLU(inplace=True)]
            c, h, w = a[0], (h + 2 * a[3] - a[1]) // a[2] + 1, (w + 2 * a[3] - a[1]) // a[2] + 1
        elif kind == "pool":
            mods.append(nn.MaxPool2d(a[0], stride=a[1]))
            h, w = (h - a[0]) // a[1] + 1, (w - a[0]) // a[1] + 1
        elif kind == "flat":
            mods.append(nn.Flatten())
            c, h, w = c * h * w, 1, 1
        elif kind == "drop":
            mods.append(nn.Dropout(0.5))
        elif kind == "dense":
            mods += [nn.Linear(c, a[0]), nn.ReLU(inplace=True)]
            c = a[0]
        else:
            mods.append(nn.Linear(c, a[0]))
    return nn.Sequential(*mods)


#: steps in every timed epoch (--steps-per-epoch): the resident images are that many batches
STEPS_PER_EPOCH = [8]
#: the resident images' float32 bytes at most (the master builds them; a GPU holds them all)
RESIDENT_BYTES = 8 * 2 ** 30


def resident_batches(batch, shape):
    """Distinct batches of random images of `shape` resident on the GPUs, which is the timed epochs'
    steps: STEPS_PER_EPOCH, as few as RESIDENT_BYTES allows (at least two). Every epoch ends with a
    read of its metrics, which drains the GPUs: with two steps an epoch (the figures before session
    28 at batch 1024) that transition weighed a few percent on a 4-GPU step, where a training run of
    hundreds of steps an epoch does not pay it and the PyTorch loop, one long epoch, never drains."""
    fits = RESIDENT_BYTES // (batch * 4 * int(np.prod(shape)))
    return int(max(2, min(STEPS_PER_EPOCH[0], fits)))


def kernel_profile(run, rows=40):
    """run() under PyTorch's profiler (CUPTI sees every CUDA kernel of the process, CuPy's and cuDNN's
    included): the table of GPU time by kernel, or None without PyTorch or without a GPU."""
    try:
        import torch
        from torch.profiler import ProfilerActivity, profile
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        run()
        torch.cuda.synchronize()
    return prof.key_averages().table(sort_by="cuda_time_total", row_limit=rows, max_name_column_width=70)


#: gradient bucket size of every dnn model timed (Model.bucket_mb; None: the default), from --bucket-mb
BUCKET_MB = None
#: [the workers' dmath.stats() after the last time_model's timed steps] (streams_bench.py reads them)
LAST_STATS = [None]


def time_dnn(net, batch, dtype, steps, parallel, profile_kernels=False, channels_last=None):
    """(images/s, (peak reserved, peak allocated) bytes less the resident images, Dense strategies) of fit
    over `steps` batches."""
    shape, classes, _ = NETS[net]
    return time_model(lambda: dnn_model(net, dtype, parallel, channels_last), shape, classes,
                      resident_batches(batch, shape), batch, steps, profile_kernels)


def time_model(make, shape, classes, per_epoch, batch, steps, profile_kernels=False):
    """time_dnn's figures for the model make() builds (any dnn.Model: benchmarks/zoo_bench.py's too),
    trained on per_epoch resident batches of random images of `shape`."""
    rng = np.random.default_rng(0)
    n = batch * per_epoch
    x = rng.random((n,) + shape, dtype=np.float32)
    y = rng.integers(0, classes, n)
    data = dnn.data.Dataset(x, y)
    resident = x.nbytes + n * 4
    del x
    dmath.random.seed(0)
    model = make()
    if BUCKET_MB is not None:
        model.bucket_mb = BUCKET_MB
    model.fit(data, batch_size=batch, epochs=1, shuffle=True, verbose=0)      # records, captures, tunes
    # parallel='auto' times its candidates at the first steps: warm up until it has chosen, so that no
    # timed step records or switches a strategy
    for _ in range(40):
        report = model.parallel_report.get(batch)
        if report is None or "chosen" in report:
            break
        model.fit(data, batch_size=batch, epochs=1, shuffle=True, verbose=0)
    if model.parallel_report:
        print("  " + model.explain_parallel().replace("\n", "\n  "))
    # what the warm-up left cached (tuning's trial workspaces, the first runs) goes back to the
    # device; clear() drops the captured graph too, so one more epoch captures it again
    dmath.memory.clear()
    model.fit(data, batch_size=batch, epochs=1, shuffle=True, verbose=0)
    dmath.synchronize()
    dmath.reset_stats()
    epochs = max(1, steps // per_epoch)
    t0 = time.perf_counter()
    model.fit(data, batch_size=batch, epochs=epochs, shuffle=True, verbose=0)
    dmath.synchronize()
    secs = time.perf_counter() - t0
    stats = LAST_STATS[0] = dmath.stats()
    # dmath.memory.peak() over the timed steps, as torch's max_memory_reserved / max_memory_allocated:
    # reserved counts the pool's high-water mark and the captured graph's own pool (activations,
    # gradients, workspaces), allocated the most bytes in buffers at once
    peaks = dmath.memory.peak()
    peak = (max(p["reserved"] for p in peaks) - resident, max(p["allocated"] for p in peaks) - resident)
    print(f"  {stats[0]['plan_graphs']} of {stats[0]['plans']} recorded plans run as CUDA graphs"
          + (f"; kept step by step by: {stats[0]['plan_blockers']}" if stats[0]["plan_blockers"] else ""))
    if profile_kernels:
        table = kernel_profile(lambda: (model.fit(data, batch_size=batch, epochs=1, shuffle=True, verbose=0),
                                        dmath.synchronize()))
        print(f"  GPU kernels of one epoch ({per_epoch} steps), dnn:\n{table}")
    if "profile" in stats[0]:       # DMATH_PROFILE=1: where worker 0's time went, by operation
        prof = sorted(stats[0]["profile"].items(), key=lambda kv: -kv[1][1])
        total = sum(v[1] for _, v in prof)
        print("  profile of worker 0: " + ", ".join(f"{op} {v[1] / epochs / per_epoch * 1e3:.2f} ms/step "
                                                     f"({v[0] // (epochs * per_epoch)}x)" for op, v in prof[:12])
              + f"; total {total / epochs / per_epoch * 1e3:.2f} ms/step")
    strategies = sorted({layer.strategy for layer in model.layers if layer.weights and layer.strategy})
    del model, data
    gc.collect()                    # a model's graph has reference cycles: free its plans and graphs now
    dmath.memory.clear()
    return epochs * n / secs, peak, strategies


@kernel("bench_torch_cnn")
def _torch_cnn(call):
    """PyTorch eager or compiled (P = 1), DDP over the dmath workers (P > 1); static = (net, batch, dtype,
    steps, port, profile_kernels, compiled, gather)."""
    net, batch, dtype, steps, port, profile_kernels, compiled, gather = call.entry.static
    shape, classes, _ = NETS[net]
    torch_rate(call, lambda torch: torch_model(torch, net), shape, classes, resident_batches(batch, shape), batch,
               dtype, steps, port, profile_kernels, compiled=compiled, gather=gather)
    return []


def torch_rate(call, build, shape, classes, per_epoch, batch, dtype, steps, port, profile_kernels=False,
               compiled=False, channels_last=False, aux_weight=0.3, gather=True):
    """On every worker: PyTorch trains build(torch) (eager, or torch.compile'd; DDP over the workers
    when P > 1) on resident random images; the master's call.result is (images/s, (peak reserved,
    peak allocated) bytes less the images), or None without PyTorch or where it fails on a worker (out
    of memory, a compile error: printed with its traceback). A model returning (logits,
    aux logits) in training (torchvision's Inception v3) trains both, the aux loss weighted. On the
    CPU backend (--cpu-peers: a check of the scripts, not a figure) the peak bytes are 0.

    gather: each step's batch is gathered from the resident images in a new random order every
    epoch (x[idx], a new tensor), as dnn's fit(shuffle=True) gathers its batch; False: sliced in
    order (a view of the resident tensor, no batch buffer: the figures before session 27, whose
    peer memory left out the batch that dnn's counted)."""
    result = None
    try:
        torch, dev = torch_distributed(call, port) if call.world.size > 1 else _torch_local()
        cuda = dev.type == "cuda"

        def sync():
            if cuda:
                torch.cuda.synchronize(dev)
        torch.backends.cudnn.benchmark = True
        local = batch // call.world.size
        fmt = torch.channels_last if channels_last else torch.contiguous_format
        gen = torch.Generator(device=dev).manual_seed(call.rank)
        x = torch.rand((local * per_epoch,) + shape, device=dev, generator=gen).contiguous(memory_format=fmt)
        y = torch.randint(0, classes, (local * per_epoch,), device=dev, generator=gen)
        torch.manual_seed(0)
        model = build(torch).to(dev, memory_format=fmt)
        if call.world.size > 1:
            model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[dev.index] if cuda else None)
        if compiled:
            # compiled afresh: dynamo's cache would keep an earlier case's graphs and, seeing a
            # second batch size, compile this case with a dynamic batch dimension
            torch._dynamo.reset()
            model = torch.compile(model)
        opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
        lossf = torch.nn.CrossEntropyLoss()
        half = dtype == "float16"
        scaler = torch.amp.GradScaler(dev.type, enabled=half)

        order = [None]

        def epoch(count):
            for step in range(count):
                s = step % per_epoch
                if not gather:
                    xb, yb = x[s * local:(s + 1) * local], y[s * local:(s + 1) * local]
                else:
                    if s == 0 or order[0] is None:
                        order[0] = torch.randperm(local * per_epoch, device=dev, generator=gen)
                    idx = order[0][s * local:(s + 1) * local]
                    xb, yb = x[idx], y[idx]           # (advanced indexing keeps channels_last)
                    if not xb.is_contiguous(memory_format=fmt):
                        xb = xb.contiguous(memory_format=fmt)
                opt.zero_grad(set_to_none=True)
                with torch.autocast(dev.type, dtype=torch.float16, enabled=half):
                    out = model(xb)
                    if isinstance(out, tuple):
                        loss = lossf(out[0], yb) + aux_weight * lossf(out[1], yb)
                    else:
                        loss = lossf(out, yb)
                scaler.scale(loss).backward()
                scaler.step(opt)
                scaler.update()

        epoch(min(steps, 5) if not compiled else min(steps, 10))     # cudnn.benchmark tunes, compile compiles
        sync()
        if cuda:
            torch.cuda.reset_peak_memory_stats(dev)
        t0 = time.perf_counter()
        epoch(steps)
        sync()
        secs = time.perf_counter() - t0
        resident = x.element_size() * x.nelement() + y.element_size() * y.nelement()
        result = (batch * steps / secs, (torch.cuda.max_memory_reserved(dev) - resident,
                                         torch.cuda.max_memory_allocated(dev) - resident) if cuda else (0, 0))
        if profile_kernels and call.rank == 0:
            print(f"  GPU kernels of {per_epoch} steps, PyTorch:\n{kernel_profile(lambda: epoch(per_epoch))}")
        del model, opt, x, y
        if cuda:
            torch.cuda.empty_cache()
    except ImportError:
        result = None
    except Exception as exc:      # noqa: BLE001  out of memory, or a torch.compile that fails: no figure here,
        # and the job goes on to its other cases and peers (the traceback says what failed)
        first = (str(exc).splitlines() or [""])[0]
        if "out of memory" in str(exc).lower():
            print(f"  PyTorch on rank {call.rank}: out of memory ({first})", flush=True)
        else:
            print(f"  PyTorch on rank {call.rank} failed: {type(exc).__name__}: {first}", flush=True)
            traceback.print_exc()
        result = model = opt = x = y = None       # what the failed peer held goes back to the device
        gc.collect()
        import torch
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    results = gather_objects(call.world, result)
    if call.rank == 0:
        call.result = results[0] if all(r is not None for r in results) else None


def _torch_local():
    import torch
    if not backend.current().is_gpu:
        return torch, torch.device("cpu")
    dev = torch.device("cuda", backend.current().device_id)
    torch.cuda.set_device(dev)
    return torch, dev


def wanted(specs, net, batch, dtype):
    """Whether the case (net, batch, dtype) is one of `specs` ("batch", "batch:dtype" or "net:batch:dtype";
    None: every case)."""
    forms = {1: (str(batch),), 2: (str(batch), dtype), 3: (net, str(batch), dtype)}
    return specs is None or any(tuple(s.split(":")) == forms.get(len(s.split(":"))) for s in specs)


def peer_entry(res, ips):
    """A PyTorch peer's figures in the JSON (None: it has none here, as after running out of memory)."""
    return None if res is None else {"images_per_s": res[0], "peak_bytes": res[1][0],
                                     "peak_allocated_bytes": res[1][1], "dnn_over_peer": ips / res[0] if ips else None}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nets", nargs="+", default=["lenet", "cifar", "alexnet"], choices=list(NETS))
    ap.add_argument("--batches", type=positive_int, nargs="+", default=[256])
    ap.add_argument("--dtypes", nargs="+", default=["float32"], choices=["float32", "float16"])
    ap.add_argument("--steps", type=positive_int, default=None, help="timed steps (default: 64 small nets, 24 AlexNet)")
    ap.add_argument("--parallel", default="auto", choices=["data", "model", "auto"],
                    help="the Dense layers' strategy (convolutions are always data parallel)")
    ap.add_argument("--device", default=None, choices=["cpu", "gpu"])
    ap.add_argument("--no-torch", action="store_true")
    ap.add_argument("--peers", nargs="+", default=["eager"], choices=["eager", "compile"],
                    help="PyTorch peers: eager (DDP when P > 1; the torch_* fields) and torch.compile'd")
    ap.add_argument("--compile-only", nargs="+", default=None, metavar="CASE",
                    help="run the compile peer only in these cases: batch, batch:dtype or net:batch:dtype")
    ap.add_argument("--cpu-peers", action="store_true",
                    help="run the PyTorch peers on the CPU backend too (checks the script; no figure)")
    ap.add_argument("--channels-last", default="auto", choices=["auto", "on", "off"],
                    help="dnn's convolutions on channels-last rows (auto: on GPUs with cuDNN)")
    ap.add_argument("--only", nargs="*", default=None,
                    help="cases to run as net:batch:dtype (default: every combination)")
    ap.add_argument("--port", type=int, default=29533)
    ap.add_argument("--bucket-mb", type=float, default=None,
                    help="dnn's gradient buckets (Model.bucket_mb; 0: one all-reduce per weight; default 25)")
    ap.add_argument("--kernel-profile", action="store_true",
                    help="print the GPU time of every kernel of one dnn epoch and one PyTorch epoch (needs PyTorch)")
    ap.add_argument("--peer-batches", default="gather", choices=["gather", "view"],
                    help="the PyTorch peer's batches: gathered in a new random order every epoch, as dnn's "
                         "fit(shuffle=True) (default), or views of the resident tensor in order (no batch "
                         "buffer; the peer's figures before session 27)")
    ap.add_argument("--steps-per-epoch", type=at_least_two, default=STEPS_PER_EPOCH[0],
                    help="steps of each timed epoch, resident batches of random images (fewer where they would pass "
                         "8 GiB of float32), at least 2")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    global BUCKET_MB
    BUCKET_MB = args.bucket_mb
    STEPS_PER_EPOCH[0] = args.steps_per_epoch
    dmath.init(device=args.device)
    p = dmath.num_workers()
    cases = [(n, b, d) for n in args.nets for b in args.batches for d in args.dtypes]
    if args.only:
        cases = [tuple(c.split(":")) for c in args.only]
        cases = [(n, int(b), d) for n, b, d in cases]
    rows = []
    channels_last = {"auto": None, "on": True, "off": False}[args.channels_last]
    print(dnn_header := f"{p} worker(s), {dmath.device()}; Dense layers parallel={args.parallel}; "
                        f"channels_last={args.channels_last}; the PyTorch peer's batches: {args.peer_batches}")

    def save(rows):
        """The JSON so far (rewritten after every measurement; the cuDNN plans of the cases run)."""
        if not args.out:
            return
        reports = dmath.nn.explain_conv2d(print_fn=None)
        write_json(args.out, {"benchmark": "cnn", "environment": environment(dmath), "header": dnn_header,
                              "peer_batches": args.peer_batches,
                              "cudnn": reports[0]["status"], "conv_plans_worker0": reports[0]["shapes"],
                              "conv_padding_worker0": reports[0]["padded"],
                              "results": rows})
    for net, batch, dtype in cases:
        steps = args.steps or (24 if net == "alexnet" else 64)
        steps = max(steps, resident_batches(batch, NETS[net][0]))
        t0 = time.perf_counter()
        ips, peak, strategies = time_dnn(net, batch, dtype, steps, args.parallel, args.kernel_profile,
                                         channels_last)
        wall = {"dnn": time.perf_counter() - t0}
        torch_res = None
        row = {"net": net, "global_batch": batch, "dtype": dtype, "workers": p, "steps": steps,
               "parallel": args.parallel, "bucket_mb": args.bucket_mb, "dnn_images_per_s": ips, "dnn_peak_bytes": peak[0],
               "dnn_peak_allocated_bytes": peak[1], "dense_strategies": strategies,
               "torch_images_per_s": None, "torch_peak_bytes": None, "torch_peak_allocated_bytes": None,
               "dnn_over_torch": None, "torch_peer": None, "peers": {}, "wall_s": wall}
        rows.append(row)
        save(rows)                      # the dnn figure is kept even if a peer does not finish
        peers = [] if args.no_torch or (dmath.device() != "gpu" and not args.cpu_peers) else args.peers
        for peer_kind in peers:
            if peer_kind == "compile" and not wanted(args.compile_only, net, batch, dtype):
                continue
            t0 = time.perf_counter()
            res = dispatch("bench_torch_cnn", static=(net, batch, dtype, steps, args.port, args.kernel_profile,
                                                      peer_kind == "compile", args.peer_batches == "gather"))[1]
            wall[peer_kind] = time.perf_counter() - t0
            row["peers"][("ddp_" if p > 1 else "") + peer_kind] = peer_entry(res, ips)
            if peer_kind == "eager" and res:
                torch_res = res
                row.update({"torch_images_per_s": res[0], "torch_peak_bytes": res[1][0],
                            "torch_peak_allocated_bytes": res[1][1], "dnn_over_torch": ips / res[0],
                            "torch_peer": "DDP" if p > 1 else "eager"})
            save(rows)
        peer = "-" if not torch_res else f"{torch_res[0]:9.0f} ({row['torch_peer']}), ratio {row['dnn_over_torch']:.2f}"
        peer += "".join(f"; {k} {v['images_per_s']:.0f} (x{v['dnn_over_peer']:.2f})"
                        for k, v in row["peers"].items() if v and "compile" in k)
        print(f"{net:8s} b{batch:<5d} {dtype}: dnn {ips:9.0f} img/s ({strategies}); PyTorch {peer}; "
              f"peak MB reserved/allocated dnn {peak[0] / 2**20:.0f}/{peak[1] / 2**20:.0f}"
              + (f" torch {torch_res[1][0] / 2**20:.0f}/{torch_res[1][1] / 2**20:.0f}" if torch_res else ""),
              flush=True)
    save(rows)


if __name__ == "__main__":
    main()
