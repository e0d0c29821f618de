"""Bandwidth of the GPU pooling kernels (dmath.ops.nn.pool) against PyTorch's, on the pools of
GoogLeNet, Inception v3 and ResNet-50 at batch 256, channels-last.

    python benchmarks/probes/pool_kernels.py OUTDIR [--batch 256] [--dtypes float16 float32] [--repeats 20]

One GPU. For each pool (forward: x -> y and argmax; backward: dy and argmax -> dx) it times the
vector kernels with the window compiled in (what dmath runs), the general instance that reads the
window from its arguments (what ran before: pool.COMPILED_WINDOWS = False), and torch's
max_pool2d / avg_pool2d and their backward operators on channels-last tensors, all in this run.
Bandwidth counts the bytes dmath's kernels read and write once each (x, y, argmax forward; dy,
argmax, dx backward; PyTorch's int64 indices are more). The two dmath variants' outputs are checked
bit for bit. Writes OUTDIR/pool_kernels.json and prints a table; the last line sums each column
over the shapes, weighted by how often each network runs them (a step's pooling time).
"""
import argparse
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))
sys.path.insert(0, os.path.dirname(HERE))

import dmath  # noqa: E402
from common import device_ms  # noqa: E402
from dmath.ops.nn import pool  # noqa: E402
from dmath.planning.conv import pool_geometry  # noqa: E402

#: (network, pools per step, channels, height = width, kernel, stride, padding, ceil_mode, mode)
POOLS = [
    ("googlenet", 1, 64, 112, 3, 2, 0, True, "max"),
    ("googlenet", 1, 192, 56, 3, 2, 0, True, "max"),
    ("googlenet", 1, 192, 28, 3, 1, 1, True, "max"),
    ("googlenet", 1, 256, 28, 3, 1, 1, True, "max"),
    ("googlenet", 1, 480, 28, 3, 2, 0, True, "max"),
    ("googlenet", 5, 512, 14, 3, 1, 1, True, "max"),
    ("googlenet", 1, 832, 14, 2, 2, 0, True, "max"),
    ("googlenet", 2, 832, 7, 3, 1, 1, True, "max"),
    ("inception_v3", 1, 64, 147, 3, 2, 0, False, "max"),
    ("inception_v3", 1, 192, 71, 3, 2, 0, False, "max"),
    ("inception_v3", 3, 256, 35, 3, 1, 1, False, "average"),
    ("inception_v3", 1, 288, 35, 3, 2, 0, False, "max"),
    ("inception_v3", 4, 768, 17, 3, 1, 1, False, "average"),
    ("inception_v3", 1, 768, 17, 3, 2, 0, False, "max"),
    ("inception_v3", 2, 1280, 8, 3, 1, 1, False, "average"),
    ("resnet50", 1, 64, 112, 3, 2, 1, False, "max"),
]


def dmath_pool(cp, x, dy, g, n, is_max, dtype):
    """(forward, backward, outputs) closures over fresh output buffers for one pool geometry."""
    out = cp.empty((n, g.out_h * g.out_w * g.channels), dtype)
    am = cp.empty_like(out) if is_max else out
    dx = cp.empty_like(x)

    def forward():
        pool.forward_cuda(x, out, am, g, is_max, True)

    def backward():
        pool.backward_cuda(dy, am if is_max else dy, dx, g, is_max, True)
    return forward, backward, (out, am, dx)


def torch_pool(torch, x, kernel, stride, padding, ceil_mode, is_max):
    """PyTorch's forward and backward operators (no autograd bookkeeping) on the same batch."""
    F, aten = torch.nn.functional, torch.ops.aten
    if is_max:
        y, idx = F.max_pool2d(x, kernel, stride, padding, ceil_mode=ceil_mode, return_indices=True)
        dy = torch.randn_like(y)
        return (lambda: F.max_pool2d(x, kernel, stride, padding, ceil_mode=ceil_mode, return_indices=True),
                lambda: aten.max_pool2d_with_indices_backward(dy, x, [kernel] * 2, [stride] * 2, [padding] * 2,
                                                              [1, 1], ceil_mode, idx))
    y = F.avg_pool2d(x, kernel, stride, padding, ceil_mode=ceil_mode)
    dy = torch.randn_like(y)
    return (lambda: F.avg_pool2d(x, kernel, stride, padding, ceil_mode=ceil_mode),
            lambda: aten.avg_pool2d_backward(dy, x, [kernel] * 2, [stride] * 2, [padding] * 2, ceil_mode, True,
                                             None))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("outdir")
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--dtypes", nargs="+", default=["float16", "float32"])
    ap.add_argument("--repeats", type=int, default=20)
    args = ap.parse_args()
    dmath.init(device="gpu")
    import cupy as cp
    try:
        import torch
        torch.backends.cudnn.benchmark = True
    except ImportError:
        torch = None
    rows, n = [], args.batch
    for dtype in args.dtypes:
        totals = {}
        for net, per_step, c, hw, k, s, p, ceil_mode, mode in POOLS:
            is_max = mode == "max"
            g = pool_geometry((c, hw, hw), k, s, p, "probe", ceil_mode)
            x = cp.random.standard_normal((n, hw * hw * c), dtype="float32").astype(dtype)
            dy = cp.random.standard_normal((n, g.out_h * g.out_w * c), dtype="float32").astype(dtype)
            item = x.dtype.itemsize
            out_bytes = n * g.out_h * g.out_w * c * item
            # forward reads x and writes y (and argmax); backward reads dy (and argmax) and writes dx
            fwd_bytes = bwd_bytes = x.nbytes + out_bytes * (2 if is_max else 1)
            row = {"dtype": dtype, "net": net, "per_step": per_step, "channels": c, "size": hw, "kernel": k,
                   "stride": s, "padding": p, "ceil_mode": ceil_mode, "mode": mode,
                   "fwd_mb": fwd_bytes / 1e6, "bwd_mb": bwd_bytes / 1e6}
            outputs = {}
            for variant, compiled in (("compiled", True), ("general", False)):
                pool.COMPILED_WINDOWS = compiled
                fwd, bwd, outs = dmath_pool(cp, x, dy, g, n, is_max, dtype)
                row[f"{variant}_fwd_ms"] = device_ms(cp, fwd, args.repeats)
                row[f"{variant}_bwd_ms"] = device_ms(cp, bwd, args.repeats)
                outputs[variant] = [o.copy() for o in outs]
            pool.COMPILED_WINDOWS = True
            row["same_bits"] = all(bool(cp.array_equal(a.view("u1"), b.view("u1")))
                                   for a, b in zip(outputs["compiled"], outputs["general"]))
            if torch is not None:
                xt = torch.randn((n, c, hw, hw), dtype=getattr(torch, dtype), device="cuda").contiguous(
                    memory_format=torch.channels_last)
                tf, tb = torch_pool(torch, xt, k, s, p, ceil_mode, is_max)
                sync = torch.cuda.synchronize
                row["torch_fwd_ms"] = timed_torch(torch, tf, args.repeats, sync)
                row["torch_bwd_ms"] = timed_torch(torch, tb, args.repeats, sync)
                del xt
            for key in [k_ for k_ in row if k_.endswith("_ms")]:
                totals[key] = totals.get(key, 0.0) + per_step * row[key]
            fw = fwd_bytes / row["compiled_fwd_ms"] / 1e9
            bw = bwd_bytes / row["compiled_bwd_ms"] / 1e9
            row["compiled_fwd_tb_s"], row["compiled_bwd_tb_s"] = fw, bw
            print(f"{dtype} {net} {mode} {k}x{k}/s{s}/p{p} {c}x{hw}x{hw}: fwd {row['compiled_fwd_ms']:.3f} ms "
                  f"({fw:.2f} TB/s; general {row['general_fwd_ms']:.3f}; torch {row.get('torch_fwd_ms', 0):.3f}) "
                  f"bwd {row['compiled_bwd_ms']:.3f} ms ({bw:.2f} TB/s; general {row['general_bwd_ms']:.3f}; "
                  f"torch {row.get('torch_bwd_ms', 0):.3f}) same bits {row['same_bits']}", flush=True)
            rows.append(row)
            del x, dy, outputs
            cp.get_default_memory_pool().free_all_blocks()
        print(f"{dtype} weighted sums (ms a step, all three networks' pools): "
              + ", ".join(f"{k} {v:.3f}" for k, v in totals.items()), flush=True)
    os.makedirs(args.outdir, exist_ok=True)
    with open(os.path.join(args.outdir, "pool_kernels.json"), "w") as f:
        json.dump({"probe": "pool_kernels", "device": cp.cuda.runtime.getDeviceProperties(0)["name"].decode(),
                   "batch": n, "rows": rows}, f, indent=1)


def timed_torch(torch, fn, repeats, sync):
    fn()
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(repeats):
        fn()
    stop.record()
    sync()
    return start.elapsed_time(stop) / repeats


if __name__ == "__main__":
    main()
