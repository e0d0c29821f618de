"""Bandwidth of BatchNorm's statistics pass (norm_cuda.channel_sums, mode 3) by kernel variant.

    python benchmarks/probes/bn_sums_variants.py OUTDIR [--repeats 20]

One GPU. In ResNet-50's kernel tables (session 24, H100) the statistics pass read its batch at about
2.1 TB/s in float16 and 2.4 TB/s in float32 (thread rows U = 4, 2 blocks per SM) where the other BatchNorm passes reach 2.9-3.1. This
times the pass on ResNet-50's batch shapes (256 images) for each variant of two knobs: the rows each
thread loads before summing them (U, compiled in: 4 today) and the blocks per multiprocessor
(_SUM_BLOCKS_PER_SM; the statistics of float32 and float64 take _STATS_BLOCKS_PER_SM_WIDE, 4 since
this probe), and, for reference, the backward sums (mode 2, relu mask from y)
and a device-to-device copy of the batch (what the memory system gives). Results are bit-identical
across variants (same summation order per thread: checked). Writes OUTDIR/bn_sums_variants.json.
"""
import argparse
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))
sys.path.insert(0, os.path.dirname(HERE))

import numpy as np  # noqa: E402

import dmath  # noqa: E402
from common import device_ms  # noqa: E402
from dmath.ops.nn import norm_cuda  # noqa: E402

#: (rows = images x pixels, channels) of ResNet-50's BatchNorms at batch 256
SHAPES = [(256 * 112 * 112, 64), (256 * 56 * 56, 64), (256 * 56 * 56, 256), (256 * 28 * 28, 512),
          (256 * 14 * 14, 1024), (256 * 7 * 7, 2048)]
U_LINE = "constexpr int U = MODE == 3 ? 4 : 2;"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("outdir")
    ap.add_argument("--repeats", type=int, default=20)
    args = ap.parse_args()
    dmath.init(device="gpu")
    import cupy as cp
    assert U_LINE in norm_cuda.SOURCE, "the probe's knob is no longer in the kernel source"
    base_source = norm_cuda.SOURCE
    base_blocks = (norm_cuda._SUM_BLOCKS_PER_SM, norm_cuda._STATS_BLOCKS_PER_SM_WIDE)
    rows = []
    for dtype in ("float16", "float32"):
        for m, c in SHAPES:
            x = cp.random.standard_normal((m, c), dtype=np.float32).astype(dtype)
            dy = cp.random.standard_normal((m, c), dtype=np.float32).astype(dtype)
            mean = cp.zeros(c, np.float32)
            nbytes = x.nbytes
            copy_ms = device_ms(cp, lambda: cp.copyto(dy, x), args.repeats)
            dy = cp.random.standard_normal((m, c), dtype=np.float32).astype(dtype)
            row = {"dtype": dtype, "rows": m, "channels": c, "mb": nbytes / 1e6,
                   "copy_tb_s": 2 * nbytes / copy_ms / 1e9, "variants": {}}
            want = None
            for u in (4, 8):
                norm_cuda.SOURCE = base_source.replace(U_LINE, f"constexpr int U = MODE == 3 ? {u} : 2;")
                for blocks in (2, 4, 8):
                    norm_cuda._SUM_BLOCKS_PER_SM = norm_cuda._STATS_BLOCKS_PER_SM_WIDE = blocks
                    got = norm_cuda.channel_sums(3, x, mean)
                    # the grid's row count changes the partial sums' split: compare at a tolerance
                    if want is None:
                        want = got
                    ok = bool(cp.allclose(got, want, rtol=1e-12, atol=1e-9 * float(abs(want).max())))
                    ms = device_ms(cp, lambda: norm_cuda.channel_sums(3, x, mean), args.repeats)
                    row["variants"][f"U{u}_b{blocks}"] = {"ms": ms, "tb_s": nbytes / ms / 1e9, "agrees": ok}
            norm_cuda.SOURCE = base_source
            norm_cuda._SUM_BLOCKS_PER_SM, norm_cuda._STATS_BLOCKS_PER_SM_WIDE = base_blocks
            ms = device_ms(cp, lambda: norm_cuda.channel_sums(2, x, mean, dy, x), args.repeats)
            row["backward_sums_tb_s"] = 3 * nbytes / ms / 1e9
            best = max(row["variants"], key=lambda k: row["variants"][k]["tb_s"])
            print(f"{dtype} ({m}, {c}) {nbytes / 1e6:.0f} MB: copy {row['copy_tb_s']:.2f} TB/s, backward sums "
                  f"{row['backward_sums_tb_s']:.2f}; stats " + ", ".join(
                      f"{k} {v['tb_s']:.2f}{'' if v['agrees'] else '(!)'}" for k, v in row["variants"].items())
                  + f"; best {best}", flush=True)
            rows.append(row)
            del x, dy
            cp.get_default_memory_pool().free_all_blocks()
    os.makedirs(args.outdir, exist_ok=True)
    with open(os.path.join(args.outdir, "bn_sums_variants.json"), "w") as f:
        json.dump({"probe": "bn_sums_variants", "device": cp.cuda.runtime.getDeviceProperties(0)["name"].decode(),
                   "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
