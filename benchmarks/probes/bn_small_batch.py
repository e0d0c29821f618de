"""What BatchNorm's GPU kernels cost per image at small batches: GoogLeNet's 57 layers, kernel variants.

    python benchmarks/probes/bn_small_batch.py OUTDIR [--batches 64 256 1024] [--repeats 20]

One GPU. Strong scaling gives each GPU a quarter of the batch, and a step's
time per image grows as the batch shrinks: at one H200, GoogLeNet float16
ran 17,411 img/s at batch 1024 and 13,144 at 256, and its CUPTI timelines
(benchmarks/probes/scaling_timeline.py, session 33) put a third of that
gap in BatchNorm's kernels: the channel sums of a narrow layer (16-48
channels) took 10-17 us a launch whatever the batch (their blocks' rows
were added one after another: 2 V TY dependent adds), and the elementwise
passes of a small layer ran at a third of the memory's bandwidth (one row
per thread, its loads waiting on the constants').

This replays each kind of BatchNorm kernel (forward sums, normalise + relu,
backward sums with the relu's mask recomputed, dx) over all of GoogLeNet's
layer shapes as one CUDA graph per kind (so a launch costs what it costs in
a recorded step, not Python's launch time) for each variant of the knobs:
the sums' block reduction ("serial": session 32's kernels; "tree"), the
rows an elementwise thread loads before writing (DM_EW_ROWS) and the
elementwise grid's blocks per multiprocessor (_EW_BLOCKS_PER_SM). The
elementwise outputs must be bit-identical across variants and the sums
equal to a tolerance (the reduction's order differs): both are checked.
Writes OUTDIR/bn_small_batch.json: per batch and variant, the ms of each
kind over the 57 layers and their total.
"""
import argparse
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))

import numpy as np

import dmath
from dmath import memory
from dmath.ops.nn import norm_cuda

#: GoogLeNet's (torchvision, with BatchNorm) layers: (side, channels) of each BatchNorm's batch
_INCEPTION = {   # side: [1x1, 3x3 reduce, 3x3, "5x5" reduce, "5x5" (a 3x3 in torchvision), pool proj]
    28: [(64, 96, 128, 16, 32, 32), (128, 128, 192, 32, 96, 64)],
    14: [(192, 96, 208, 16, 48, 64), (160, 112, 224, 24, 64, 64), (128, 128, 256, 24, 64, 64),
         (112, 144, 288, 32, 64, 64), (256, 160, 320, 32, 128, 128)],
    7: [(256, 160, 320, 32, 128, 128), (384, 192, 384, 48, 128, 128)],
}
LAYERS = [(112, 64), (56, 64), (56, 192)] + [(side, c) for side, mods in _INCEPTION.items() for m in mods for c in m]

#: the blocks' reduction of dm_bn_sums as session 32 had it (row 0 adds the TY rows one after another)
SERIAL_TAIL = """    if (ty == 0 && active) {
        for (int k = 0; k < 2 * V; ++k) {
            double acc = 0.0;
            for (int j = 0; j < TY; ++j) acc += sm[k * 256 + j * TX + tx];
            partial[((long long)blockIdx.y * 2 + (k & 1)) * C + c0 + (k >> 1)] = acc;
        }
    }
}"""
TREE_START = "    // the block's TY rows added as a tree"
ROWS_LINE = "#define DM_EW_ROWS 4"
#: (name, sums' reduction, DM_EW_ROWS, _EW_BLOCKS_PER_SM); the first is session 32's kernels
VARIANTS = [("serial_r1_b32", "serial", 1, 32), ("tree_r1_b32", "tree", 1, 32), ("tree_r2_b32", "tree", 2, 32),
            ("tree_r4_b32", "tree", 4, 32), ("tree_r1_b8", "tree", 1, 8), ("tree_r2_b8", "tree", 2, 8),
            ("tree_r4_b8", "tree", 4, 8), ("tree_r2_b16", "tree", 2, 16), ("tree_r4_b4", "tree", 4, 4)]


def source(tail, rows):
    """norm_cuda's source with the variant's sums reduction and rows in flight."""
    base = BASE_SOURCE
    assert TREE_START in base and ROWS_LINE in base, "the probe's knobs are no longer in the kernel source"
    if tail == "serial":
        start = base.index(TREE_START)
        end = base.index("\n}", base.index("partial[", start)) + 2
        base = base[:start] + SERIAL_TAIL + base[end:]
    return base.replace(ROWS_LINE, f"#define DM_EW_ROWS {rows}")


BASE_SOURCE = norm_cuda.SOURCE


class Layer:
    """One BatchNorm's arrays at a batch: x, dy (random), the outputs and per-channel constants."""

    def __init__(self, cp, batch, side, c, rng):
        m = batch * side * side
        self.x = cp.random.standard_normal((m, c), dtype=np.float32).astype(np.float16)
        self.dy = cp.random.standard_normal((m, c), dtype=np.float32).astype(np.float16)
        self.y = cp.empty_like(self.x)
        self.dx = cp.empty_like(self.x)
        f = lambda lo, hi: cp.asarray(rng.uniform(lo, hi, c).astype(np.float32))
        self.mean, self.scale, self.shift = f(-0.1, 0.1), f(0.5, 2.0), f(-0.5, 0.5)
        self.a, self.b, self.c0 = f(0.5, 2.0), f(-1e-3, 1e-3), f(-1e-3, 1e-3)
        self.stats = cp.stack([self.mean, f(0.5, 2.0)])
        self.gamma, self.beta = f(0.5, 2.0).astype(np.float16), f(-0.5, 0.5).astype(np.float16)

    def kinds(self):
        """The four kernels of a training step's BatchNorm (+ fused relu), as norm.py calls them."""
        relu_from = (self.stats, self.gamma, self.beta)
        return {
            "sums_fwd": lambda: norm_cuda.channel_sums(3, self.x, self.mean, reduce=False),
            "normalize": lambda: norm_cuda.normalize(self.x, self.y, self.mean, self.scale, self.shift, True),
            "sums_bwd": lambda: norm_cuda.channel_sums(2, self.x, self.stats[0], self.dy, None, 0, relu_from,
                                                       reduce=False),
            "dx": lambda: norm_cuda.input_gradient(self.dy, self.x, None, self.dx, self.mean, self.a, self.b,
                                                   self.c0, relu_from=relu_from),
        }


def graph_ms(cp, calls, repeats):
    """Mean ms of one replay of a CUDA graph that runs every call once (each on the capture stream)."""
    owner = memory.pool.current()
    pool, stream = cp.cuda.MemoryPool(), cp.cuda.Stream(non_blocking=True)
    owner.capture_refs = []     # the pool hands out CuPy arrays under the capture's allocator
    try:
        with cp.cuda.using_allocator(pool.malloc), stream:
            pool.malloc(1 << 28)    # an arena on the capture stream, freed at once: no cudaMalloc mid-capture
            stream.begin_capture()
            for call in calls:
                call()
            graph = stream.end_capture()
    finally:
        owner.capture_refs = None
    graph.launch(stream)
    stream.synchronize()
    start, stop = cp.cuda.Event(), cp.cuda.Event()
    start.record(stream)
    for _ in range(repeats):
        graph.launch(stream)
    stop.record(stream)
    stop.synchronize()
    return cp.cuda.get_elapsed_time(start, stop) / repeats


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("outdir")
    ap.add_argument("--batches", type=int, nargs="+", default=[64, 256, 1024])
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--variants", nargs="*", default=None, help="names of VARIANTS to run (default: all)")
    args = ap.parse_args()
    dmath.init(device="gpu")
    import cupy as cp
    variants = [v for v in VARIANTS if args.variants is None or v[0] in args.variants]
    base_blocks = norm_cuda._EW_BLOCKS_PER_SM
    out = {"probe": "bn_small_batch", "device": cp.cuda.runtime.getDeviceProperties(0)["name"].decode(),
           "layers": len(LAYERS), "dtype": "float16", "results": []}
    rng = np.random.default_rng(0)
    cp.random.seed(0)
    for batch in args.batches:
        layers = [Layer(cp, batch, side, c, rng) for side, c in LAYERS]
        want = None
        for name, tail, rows, blocks in variants:
            norm_cuda.SOURCE = source(tail, rows)
            norm_cuda._EW_BLOCKS_PER_SM = blocks
            got = {"sums_fwd": [], "sums_bwd": [], "y": [], "dx": []}
            for layer in layers:
                k = layer.kinds()
                got["sums_fwd"].append(k["sums_fwd"]().sum(axis=0))
                k["normalize"]()
                got["sums_bwd"].append(k["sums_bwd"]().sum(axis=0))
                k["dx"]()
                got["y"].append(layer.y.copy())
                got["dx"].append(layer.dx.copy())
            if want is None:
                want, agrees = got, True
            else:
                agrees = all(bool(cp.array_equal(a, b)) for key in ("y", "dx") for a, b in zip(got[key], want[key]))
                agrees = agrees and all(bool(cp.allclose(a, b, rtol=1e-9, atol=1e-9 * float(abs(b).max() + 1)))
                                        for key in ("sums_fwd", "sums_bwd") for a, b in zip(got[key], want[key]))
            ms = {kind: graph_ms(cp, [layer.kinds()[kind] for layer in layers], args.repeats)
                  for kind in ("sums_fwd", "normalize", "sums_bwd", "dx")}
            total = sum(ms.values())
            out["results"].append({"batch": batch, "variant": name, "sums_tail": tail, "rows_in_flight": rows,
                                   "ew_blocks_per_sm": blocks, "ms": ms, "total_ms": total,
                                   "us_per_image": 1e3 * total / batch, "agrees_with_first": agrees})
            print(f"b{batch} {name:14s} " + " ".join(f"{k} {v:7.3f}" for k, v in ms.items())
                  + f" | total {total:7.3f} ms, {1e3 * total / batch:6.3f} us/img{'' if agrees else ' (DIFFERS)'}",
                  flush=True)
        norm_cuda.SOURCE, norm_cuda._EW_BLOCKS_PER_SM = BASE_SOURCE, base_blocks
        del layers, want, got
        cp.get_default_memory_pool().free_all_blocks()
    os.makedirs(args.outdir, exist_ok=True)
    with open(os.path.join(args.outdir, "bn_small_batch.json"), "w") as f:
        json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
