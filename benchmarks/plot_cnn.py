"""Plots of cnn_bench results: throughput against PyTorch, and strong-scaling efficiency against GPU count.

    python benchmarks/plot_cnn.py cnn_p1.json cnn_p2.json [--out cnn.png]

Left: dnn's images/s over PyTorch's (eager on one GPU, DDP on several) per
case and GPU count (above 1: dnn is faster). Right: parallel efficiency,
images/s at P GPUs over P times the one-GPU figure, for dnn and PyTorch,
per network and global batch (both measured in the given runs).
"""
import argparse
import json

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("files", nargs="+")
    ap.add_argument("--out", default="cnn.png")
    args = ap.parse_args()
    rows = [r for f in args.files for r in json.load(open(f))["results"]]
    cases = sorted({(r["net"], r["global_batch"], r["dtype"]) for r in rows})
    counts = sorted({r["workers"] for r in rows})
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    width = 0.8 / len(counts)
    for k, p in enumerate(counts):
        ratios = [next((r["dnn_over_torch"] for r in rows if (r["net"], r["global_batch"], r["dtype"]) == c
                        and r["workers"] == p), 0) or 0 for c in cases]
        left.bar([i + k * width for i in range(len(cases))], ratios, width,
                 label=f"{p} GPU{'s' if p > 1 else ''} (vs {'DDP' if p > 1 else 'eager'})")
    left.axhline(1.0, color="black", lw=0.8)
    left.set_xticks([i + width * (len(counts) - 1) / 2 for i in range(len(cases))])
    left.set_xticklabels([f"{n}\nb{b} {d[5:]}" for n, b, d in cases], fontsize=8)
    left.set_ylabel("dnn images/s / PyTorch images/s")
    left.set_title("Training throughput against PyTorch")
    left.legend(fontsize=8)
    base = {(r["net"], r["global_batch"], r["dtype"]): r for r in rows if r["workers"] == 1}
    for c in cases:
        if c not in base:
            continue
        pts = [(r["workers"], r) for r in rows if (r["net"], r["global_batch"], r["dtype"]) == c]
        pts.sort(key=lambda t: t[0])
        ps = [p for p, _ in pts]
        label = f"{c[0]} b{c[1]} {c[2][5:]}"
        line = right.plot(ps, [r["dnn_images_per_s"] / (p * base[c]["dnn_images_per_s"]) for p, r in pts],
                          marker="o", label=f"dnn {label}")[0]
        if all(r.get("torch_images_per_s") for _, r in pts):
            right.plot(ps, [r["torch_images_per_s"] / (p * base[c]["torch_images_per_s"]) for p, r in pts],
                       marker="x", ls="--", color=line.get_color(), label=f"PyTorch {label}")
    right.set_xticks(counts)
    right.set_xlabel("GPUs")
    right.set_ylabel("parallel efficiency")
    right.set_ylim(0, 1.1)
    right.set_title("Strong scaling (global batch fixed)")
    right.legend(fontsize=6, ncol=2)
    fig.tight_layout()
    fig.savefig(args.out, dpi=110)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
