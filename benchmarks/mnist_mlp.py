"""The MagmaDNN paper's MNIST test (its Table 1): dense 784 - 528 x L - 10, dnn against PyTorch eager.

    python benchmarks/mnist_mlp.py [--device cpu|gpu] [--layers 1 2 3 4 8] [--out F.json]
    mpiexec -n P python benchmarks/mnist_mlp.py ...      (data parallel over P workers)

Sigmoid hidden layers of 528 units, softmax cross-entropy, SGD with learning
rate 0.05 and weight decay 0.001, batches of 100, 5 epochs over 60,000
MNIST-shaped samples (random pixels and labels: the time does not depend on
the values). For every L it times `model.fit` (dnn: every step after the
first is a replay of the recorded step) and the same network, loss and
optimizer in PyTorch eager on the same device in the same run (on the
master's GPU, or the CPU with PyTorch's threads), and reports seconds per
run, the dnn/PyTorch ratio, and the added time per hidden layer (the slope
of a least-squares line through the L points, as in the paper's table).
Under mpiexec the PyTorch peer is DistributedDataParallel over the same
GPUs, each rank taking its share of every batch of 100.
"""
import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dmath                                    # noqa: E402
import dnn                                      # noqa: E402
from dnn import layers as L                     # noqa: E402
from dmath.comm.control import gather_objects   # noqa: E402
from dmath.ops.base import dispatch             # noqa: E402
from dmath.runtime import kernel                # noqa: E402
from common import environment, torch_distributed, write_json      # noqa: E402


def build(hidden, units, dtype):
    layers = [L.Input((784,))]
    for _ in range(hidden):
        layers += [L.Dense(units), L.Activation("sigmoid")]
    layers += [L.Dense(10), L.Output("softmax")]
    return dnn.Sequential(layers, loss="cross_entropy", dtype=dtype,
                          optimizer=dnn.optim.SGD(lr=0.05, weight_decay=0.001))


def time_dnn(data, hidden, units, epochs, batch, dtype):
    """Seconds of `epochs` epochs of fit over the resident dataset, after one warm-up epoch (which
    records the step and captures it; PyTorch's peer has its tensors on the device too)."""
    model = build(hidden, units, dtype)
    model.fit(data, batch_size=batch, epochs=1, shuffle=False, verbose=0)
    dmath.synchronize()
    t0 = time.perf_counter()
    hist = model.fit(data, batch_size=batch, epochs=epochs, shuffle=False, verbose=0)
    dmath.synchronize()
    return time.perf_counter() - t0, float(hist.history["loss"][-1])


@kernel("bench_torch_ddp_mlp")
def _torch_ddp(call):
    """The PyTorch peer as DDP over the dmath workers' GPUs; static = (hidden, units, epochs, batch,
    dtype, samples, port). Every rank makes the same data and takes its share of each batch."""
    hidden, units, epochs, batch, dtype, samples, port = call.entry.static
    rng = np.random.default_rng(0)
    x = rng.random((samples, 784), dtype=np.float32)
    y = rng.integers(0, 10, samples)
    p, r = call.world.size, call.rank
    share = batch // p
    keep = np.concatenate([np.arange(s + r * share, s + (r + 1) * share) for s in range(0, samples, batch)])
    result = time_torch(x[keep], y[keep], hidden, units, epochs, share, dtype, "gpu", call=call, port=port)
    results = gather_objects(call.world, result)
    if call.rank == 0:
        call.result = results[0]
    return []


def time_torch(x, y, hidden, units, epochs, batch, dtype, device, call=None, port=None):
    try:
        import torch
    except ImportError:
        return None, None
    if call is not None:
        torch, dev = torch_distributed(call, port)
    else:
        dev = torch.device("cuda", 0) if device == "gpu" else torch.device("cpu")
    tdt = getattr(torch, dtype)
    mods = []
    width = 784
    for _ in range(hidden):
        mods += [torch.nn.Linear(width, units), torch.nn.Sigmoid()]
        width = units
    mods.append(torch.nn.Linear(width, 10))
    net = torch.nn.Sequential(*mods).to(dev, tdt)
    if call is not None:
        net = torch.nn.parallel.DistributedDataParallel(net, device_ids=[dev.index])
    opt = torch.optim.SGD(net.parameters(), lr=0.05, weight_decay=0.001)
    lossf = torch.nn.CrossEntropyLoss()
    xt = torch.as_tensor(x, device=dev, dtype=tdt)
    yt = torch.as_tensor(y, device=dev)
    n = x.shape[0]

    def epoch(count):
        for s in range(0, count, batch):
            opt.zero_grad(set_to_none=True)
            loss = lossf(net(xt[s:s + batch]), yt[s:s + batch])
            loss.backward()
            opt.step()
        return loss

    epoch(10 * batch)                           # warm-up
    if dev.type == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(epochs):
        loss = epoch(n)
    last = float(loss)
    if dev.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - t0, last


def slope(ls, ts):
    ls, ts = np.asarray(ls, float), np.asarray(ts, float)
    return float(np.polyfit(ls, ts, 1)[0]) if len(ls) > 1 else None


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, nargs="+", default=[1, 2, 3, 4, 8])
    ap.add_argument("--samples", type=int, default=60000)
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--batch", type=int, default=100)
    ap.add_argument("--units", type=int, default=528)
    ap.add_argument("--dtype", default="float32", choices=["float16", "float32", "float64"])
    ap.add_argument("--device", default=None, choices=["cpu", "gpu"])
    ap.add_argument("--no-torch", action="store_true")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    dmath.init(device=args.device)
    device = dmath.device()
    rng = np.random.default_rng(0)
    x = rng.random((args.samples, 784), dtype=np.float32)
    y = rng.integers(0, 10, args.samples)
    data = dnn.data.Dataset(x, y)           # placed on the workers once
    rows = []
    for hidden in args.layers:
        t_dnn, loss_dnn = time_dnn(data, hidden, args.units, args.epochs, args.batch, args.dtype)
        if args.no_torch:
            t_torch, loss_torch = None, None
        elif dmath.num_workers() > 1 and device == "gpu":
            t_torch, loss_torch = dispatch("bench_torch_ddp_mlp", static=(
                hidden, args.units, args.epochs, args.batch, args.dtype, args.samples, 29541))[1]
        else:
            t_torch, loss_torch = time_torch(x, y, hidden, args.units, args.epochs, args.batch, args.dtype, device)
        row = {"hidden_layers": hidden, "dnn_s": t_dnn, "dnn_final_loss": loss_dnn,
               "torch_s": t_torch, "torch_final_loss": loss_torch,
               "torch_peer": ("DDP" if dmath.num_workers() > 1 else "eager") if t_torch else None,
               "torch_over_dnn": (t_torch / t_dnn) if t_torch else None}
        rows.append(row)
        print(f"L={hidden}: dnn {t_dnn:7.2f} s   PyTorch {row['torch_peer'] or ''} "
              f"{'-' if t_torch is None else f'{t_torch:7.2f} s'}   ratio "
              f"{'-' if t_torch is None else f'{t_torch / t_dnn:.2f}'}", flush=True)
    result = {"workers": dmath.num_workers(), "device": device, "dtype": args.dtype, "samples": args.samples,
              "epochs": args.epochs, "batch": args.batch, "rows": rows,
              "dnn_s_per_added_layer": slope([r["hidden_layers"] for r in rows], [r["dnn_s"] for r in rows]),
              "torch_s_per_added_layer": slope([r["hidden_layers"] for r in rows if r["torch_s"]],
                                               [r["torch_s"] for r in rows if r["torch_s"]])}
    print(f"added time per hidden layer: dnn {result['dnn_s_per_added_layer']}, "
          f"PyTorch {result['torch_s_per_added_layer']}")
    if args.out:
        write_json(args.out, {"benchmark": "mnist_mlp", "environment": environment(dmath), "results": result})


if __name__ == "__main__":
    main()
