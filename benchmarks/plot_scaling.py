"""Plot GEMM strong scaling from the JSON files gemm_bench.py writes.

    python benchmarks/plot_scaling.py gemm_p1.json gemm_p2.json gemm_p4.json --out scaling.png

One panel per matrix size: achieved TFLOP/s against the number of GPUs for
each dtype and input layout (cold cache, solid; warm, dotted), with the
ideal line P x the single-GPU rate measured in the same runs (dashed).
Needs matplotlib (`pip install dmath-dnn[plot]`).
"""
import argparse
import collections
import json


def load(paths):
    rows = []
    for p in paths:
        with open(p) as f:
            data = json.load(f)
        if data.get("benchmark") != "gemm_strong_scaling":
            raise SystemExit(f"{p} is not a gemm_bench.py result")
        rows.extend(data["results"])
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("files", nargs="+")
    ap.add_argument("--out", default="gemm_scaling.png")
    args = ap.parse_args()
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    rows = load(args.files)
    sizes = sorted({r["n"] for r in rows})
    fig, axes = plt.subplots(1, len(sizes), figsize=(6.5 * len(sizes), 5), squeeze=False)
    colors = {"float64": "tab:blue", "float32": "tab:green", "float16": "tab:red"}
    marks = {"RowBlock": "o", "Block2D": "s", "BlockCyclic": "^"}
    for ax, n in zip(axes[0], sizes):
        series = collections.defaultdict(list)
        single = collections.defaultdict(list)
        for r in rows:
            if r["n"] == n:
                series[(r["dtype"], r["layout"])].append((r["workers"], r["cold_tflops"], r["warm_tflops"]))
                single[r["dtype"]].append(r["single_tflops"])
        for (dtype, lay), pts in sorted(series.items()):
            pts.sort()
            ps = [p for p, _, _ in pts]
            ax.plot(ps, [c for _, c, _ in pts], marker=marks.get(lay, "x"), color=colors.get(dtype),
                    label=f"{dtype} {lay}")
            ax.plot(ps, [w for _, _, w in pts], linestyle=":", marker=marks.get(lay, "x"), color=colors.get(dtype),
                    alpha=0.5)
        for dtype, rates in single.items():
            base = sum(rates) / len(rates)
            ps = sorted({r["workers"] for r in rows if r["n"] == n})
            ax.plot(ps, [base * p for p in ps], linestyle="--", color=colors.get(dtype), alpha=0.6)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("GPUs")
        ax.set_ylabel("TFLOP/s")
        ax.set_title(f"dmath GEMM, n = {n} (dashed: P x single-GPU cuBLAS; dotted: warm cache)")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(args.out, dpi=120)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
