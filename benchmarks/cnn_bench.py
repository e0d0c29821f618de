"""CNN training throughput: dnn against PyTorch eager (one GPU) and DDP (P GPUs), in the same job.

    python benchmarks/cnn_bench.py --device gpu [--nets lenet cifar alexnet] [--batches 256 1024]
        [--dtypes float32 float16] [--out F.json]
    mpiexec -n P python benchmarks/cnn_bench.py --device gpu ...        (strong scaling: global batch fixed)

For every network, global batch and dtype it trains on random images that
are resident on the GPUs on both sides (dnn: a dnn.data.Dataset; PyTorch: a
tensor on each GPU, the rank's share of every batch sliced from it), so the
figure is the training step itself: forward, backward, gradient all-reduce,
SGD with momentum. dnn runs `Model.fit` (every step a replayed plan, one
CUDA graph per worker where the step allows); PyTorch runs the same network
eagerly with cudnn.benchmark=True (DDP when P > 1; float16 through autocast
and a GradScaler, dnn's float16 keeps float32 master weights and dynamic
loss scaling too). Reported per case: images/s of both, their ratio, and
each side's peak device memory less its resident images, reserved (what the
device had to provide: dnn's largest pool high-water mark of any worker over
the timed steps plus the bytes its captured CUDA graphs hold; PyTorch's
max_memory_reserved on GPU 0) and allocated (in buffers at once: dnn's bytes
in use between steps plus the graph's buffers at their peak inside the step;
PyTorch's max_memory_allocated).
Efficiency across GPU counts comes from comparing the JSON of P = 1 and P
(`benchmarks/plots.py cnn` draws it).
"""
import argparse
import gc
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dmath                                    # noqa: E402
import dnn                                      # noqa: E402
from dnn import layers as L                     # noqa: E402
from dmath import backend                       # noqa: E402
from dmath.comm.control import gather_objects   # noqa: E402
from dmath.ops.base import dispatch             # noqa: E402
from dmath.runtime import kernel                # noqa: E402
from common import environment, torch_distributed, write_json  # noqa: E402

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


def resident_batches(net, batch):
    """Distinct batches of images resident on the GPUs: an epoch's steps (AlexNet's images are 600 KB
    each: at most 2048 of them). Epochs end with a read of the metrics, which drains the GPU."""
    return max(2, min(8, 2048 // batch)) if net == "alexnet" else 8


def kernel_profile(run, rows=25):
    """run() under PyTorch's profiler (CUPTI sees every CUDA kernel of the process, CuPy's and cuDNN's
    included): the table of GPU time by kernel, or None without PyTorch."""
    try:
        import torch
        from torch.profiler import ProfilerActivity, profile
    except ImportError:
        return None
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        run()
        torch.cuda.synchronize()
    return prof.key_averages().table(sort_by="cuda_time_total", row_limit=rows, max_name_column_width=70)


def time_dnn(net, batch, dtype, steps, parallel, profile_kernels=False, channels_last=None):
    """(images/s, (peak reserved, peak allocated) bytes less the resident images, Dense strategies) of fit
    over `steps` batches."""
    shape, classes, _ = NETS[net]
    return time_model(lambda: dnn_model(net, dtype, parallel, channels_last), shape, classes,
                      resident_batches(net, batch), batch, steps, profile_kernels)


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
    model.fit(data, batch_size=batch, epochs=1, shuffle=True, verbose=0)      # records, captures, tunes
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
    stats = dmath.stats()
    # reserved: the pool's high-water mark over the timed steps (in use plus cached) plus what the
    # captured step's graph holds in its own pool (activations, gradients, workspaces), as torch's
    # max_memory_reserved; allocated: the bytes in use between steps plus the graph's buffers at their
    # peak inside the step, as torch's max_memory_allocated
    peak = (max(s["pool"]["high_water"] + s["pool"].get("graphs", 0) for s in stats) - resident,
            max(s["pool"]["in_use"] + s["pool"].get("graphs_peak", 0) for s in stats) - resident)
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
    """PyTorch eager (P = 1) or DDP over the dmath workers; static = (net, batch, dtype, steps, port)."""
    net, batch, dtype, steps, port, profile_kernels = call.entry.static
    shape, classes, _ = NETS[net]
    torch_rate(call, lambda torch: torch_model(torch, net), shape, classes, resident_batches(net, batch), batch,
               dtype, steps, port, profile_kernels)
    return []


def torch_rate(call, build, shape, classes, per_epoch, batch, dtype, steps, port, profile_kernels=False,
               compiled=False, channels_last=False, aux_weight=0.3):
    """On every worker: PyTorch trains build(torch) (eager, or torch.compile'd; DDP over the workers
    when P > 1) on resident random images; the master's call.result is (images/s, (peak reserved,
    peak allocated) bytes less the images), or None without PyTorch. A model returning (logits,
    aux logits) in training (torchvision's Inception v3) trains both, the aux loss weighted."""
    result = None
    try:
        torch, dev = torch_distributed(call, port) if call.world.size > 1 else _torch_local()
        torch.backends.cudnn.benchmark = True
        local = batch // call.world.size
        fmt = torch.channels_last if channels_last else torch.contiguous_format
        gen = torch.Generator(device=dev).manual_seed(call.rank)
        x = torch.rand((local * per_epoch,) + shape, device=dev, generator=gen).contiguous(memory_format=fmt)
        y = torch.randint(0, classes, (local * per_epoch,), device=dev, generator=gen)
        torch.manual_seed(0)
        model = build(torch).to(dev, memory_format=fmt)
        if call.world.size > 1:
            model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[dev.index])
        if compiled:
            model = torch.compile(model)
        opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
        lossf = torch.nn.CrossEntropyLoss()
        half = dtype == "float16"
        scaler = torch.amp.GradScaler("cuda", enabled=half)

        def epoch(count):
            for step in range(count):
                s = step % per_epoch
                xb, yb = x[s * local:(s + 1) * local], y[s * local:(s + 1) * local]
                opt.zero_grad(set_to_none=True)
                with torch.autocast("cuda", dtype=torch.float16, enabled=half):
                    out = model(xb)
                    if isinstance(out, tuple):
                        loss = lossf(out[0], yb) + aux_weight * lossf(out[1], yb)
                    else:
                        loss = lossf(out, yb)
                scaler.scale(loss).backward()
                scaler.step(opt)
                scaler.update()

        epoch(min(steps, 5) if not compiled else min(steps, 10))     # cudnn.benchmark tunes, compile compiles
        torch.cuda.synchronize(dev)
        torch.cuda.reset_peak_memory_stats(dev)
        t0 = time.perf_counter()
        epoch(steps)
        torch.cuda.synchronize(dev)
        secs = time.perf_counter() - t0
        resident = x.element_size() * x.nelement() + y.element_size() * y.nelement()
        result = (batch * steps / secs, (torch.cuda.max_memory_reserved(dev) - resident,
                                         torch.cuda.max_memory_allocated(dev) - resident))
        if profile_kernels and call.rank == 0:
            print(f"  GPU kernels of {per_epoch} steps, PyTorch:\n{kernel_profile(lambda: epoch(per_epoch))}")
        del model, opt, x, y
        torch.cuda.empty_cache()
    except ImportError:
        result = None
    except RuntimeError as exc:           # torch.cuda.OutOfMemoryError: this peer has no figure here
        if "out of memory" not in str(exc).lower():
            raise
        print(f"  PyTorch on rank {call.rank}: out of memory ({str(exc).splitlines()[0]})", flush=True)
        result = None
        import torch
        torch.cuda.empty_cache()
    results = gather_objects(call.world, result)
    if call.rank == 0:
        call.result = results[0] if all(r is not None for r in results) else None


def _torch_local():
    import torch
    dev = torch.device("cuda", backend.current().device_id)
    torch.cuda.set_device(dev)
    return torch, dev


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nets", nargs="+", default=["lenet", "cifar", "alexnet"], choices=list(NETS))
    ap.add_argument("--batches", type=int, nargs="+", default=[256])
    ap.add_argument("--dtypes", nargs="+", default=["float32"], choices=["float32", "float16"])
    ap.add_argument("--steps", type=int, default=None, help="timed steps (default: 64 small nets, 24 AlexNet)")
    ap.add_argument("--parallel", default="auto", choices=["data", "model", "auto"],
                    help="the Dense layers' strategy (convolutions are always data parallel)")
    ap.add_argument("--device", default=None, choices=["cpu", "gpu"])
    ap.add_argument("--no-torch", action="store_true")
    ap.add_argument("--channels-last", default="auto", choices=["auto", "on", "off"],
                    help="dnn's convolutions on channels-last rows (auto: on GPUs with cuDNN)")
    ap.add_argument("--only", nargs="*", default=None,
                    help="cases to run as net:batch:dtype (default: every combination)")
    ap.add_argument("--port", type=int, default=29533)
    ap.add_argument("--kernel-profile", action="store_true",
                    help="print the GPU time of every kernel of one dnn epoch and one PyTorch epoch (needs PyTorch)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    dmath.init(device=args.device)
    p = dmath.num_workers()
    cases = [(n, b, d) for n in args.nets for b in args.batches for d in args.dtypes]
    if args.only:
        cases = [tuple(c.split(":")) for c in args.only]
        cases = [(n, int(b), d) for n, b, d in cases]
    rows = []
    channels_last = {"auto": None, "on": True, "off": False}[args.channels_last]
    print(dnn_header := f"{p} worker(s), {dmath.device()}; Dense layers parallel={args.parallel}; "
                        f"channels_last={args.channels_last}")
    for net, batch, dtype in cases:
        steps = args.steps or (24 if net == "alexnet" else 64)
        steps = max(steps, resident_batches(net, batch))
        ips, peak, strategies = time_dnn(net, batch, dtype, steps, args.parallel, args.kernel_profile,
                                         channels_last)
        torch_res = None
        if not args.no_torch and dmath.device() == "gpu":
            torch_res = dispatch("bench_torch_cnn", static=(net, batch, dtype, steps, args.port,
                                                            args.kernel_profile))[1]
        row = {"net": net, "global_batch": batch, "dtype": dtype, "workers": p, "steps": steps,
               "dnn_images_per_s": ips, "dnn_peak_bytes": peak[0], "dnn_peak_allocated_bytes": peak[1],
               "dense_strategies": strategies,
               "torch_images_per_s": torch_res[0] if torch_res else None,
               "torch_peak_bytes": torch_res[1][0] if torch_res else None,
               "torch_peak_allocated_bytes": torch_res[1][1] if torch_res else None,
               "dnn_over_torch": ips / torch_res[0] if torch_res else None,
               "torch_peer": ("DDP" if p > 1 else "eager") if torch_res else None}
        rows.append(row)
        peer = "-" if not torch_res else f"{torch_res[0]:9.0f} ({row['torch_peer']}), ratio {row['dnn_over_torch']:.2f}"
        print(f"{net:8s} b{batch:<5d} {dtype}: dnn {ips:9.0f} img/s ({strategies}); PyTorch {peer}; "
              f"peak MB reserved/allocated dnn {peak[0] / 2**20:.0f}/{peak[1] / 2**20:.0f}"
              + (f" torch {torch_res[1][0] / 2**20:.0f}/{torch_res[1][1] / 2**20:.0f}" if torch_res else ""),
              flush=True)
    reports = dmath.nn.explain_conv2d(print_fn=None)
    if args.out:
        write_json(args.out, {"benchmark": "cnn", "environment": environment(dmath), "header": dnn_header,
                              "cudnn": reports[0]["status"], "conv_plans_worker0": reports[0]["shapes"],
                              "conv_padding_worker0": reports[0]["padded"],
                              "results": rows})


if __name__ == "__main__":
    main()
