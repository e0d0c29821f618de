"""The figures of benchmarks/results/README.md, from the JSON results beside it.

    python benchmarks/plots.py gemm  RESULT.json ... [--out F.png]   # efficiency against GPU count
    python benchmarks/plots.py cnn   RESULT.json ... [--out F.png]   # efficiency and images/s against PyTorch
    python benchmarks/plots.py scaling RESULT.json ... [--out F.png] # images/s against GPUs (cnn_bench, zoo_bench)
    python benchmarks/plots.py mlp   RESULT.json     [--out F.png]   # time against hidden layers (MagmaDNN's table)
    python benchmarks/plots.py remap RESULT.json ... [--out F.png]   # remap GB/s against the raw collective
    python benchmarks/plots.py readme                                # all four from the committed H200 results

Every figure shows a ratio or a peer measured in the same run: parallel
efficiency is dmath's rate over P times the single-GPU rate, so 1.0 is
perfect scaling. Needs matplotlib (the `plot` extra).
"""
import argparse
import collections
import glob
import json
import math
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(ROOT, "benchmarks", "results")
sys.path.insert(0, ROOT)
from dnn.callbacks import pyplot  # noqa: E402  (the lazy import with a clear error)

COLORS = {"float64": "tab:blue", "float32": "tab:green", "float16": "tab:red"}
MARKS = {"RowBlock": "o", "Block2D": "s", "BlockCyclic": "^", "ColBlock": "D"}


def _rows(paths):
    rows = []
    for p in paths:
        with open(p) as f:
            rows.extend(json.load(f)["results"])
    return rows


def _save(fig, out):
    folder = os.path.dirname(os.path.abspath(out))
    os.makedirs(folder, exist_ok=True)          # (--out into a folder not made yet)
    fig.tight_layout()
    fig.savefig(out, dpi=90)
    print(f"wrote {out}")


def gemm(paths, out, sizes=None):
    rows = [r for r in _rows(paths) if sizes is None or r["n"] in sizes]
    plt = pyplot()
    sizes = sorted({r["n"] for r in rows})
    fig, axes = plt.subplots(1, len(sizes), figsize=(5.2 * len(sizes), 3.8), squeeze=False, sharey=True)
    for ax, n in zip(axes[0], sizes):
        series = collections.defaultdict(dict)
        for r in rows:
            if r["n"] == n:
                series[(r["dtype"], r["layout"])][r["workers"]] = r["efficiency_cold"]
        for (dtype, lay), pts in sorted(series.items()):
            ps = sorted(pts)
            ax.plot(ps, [pts[p] for p in ps], marker=MARKS.get(lay, "x"), color=COLORS.get(dtype),
                    label=f"{dtype} {lay}")
        ax.axhline(1.0, color="black", lw=0.8)
        ax.set_xticks(sorted({r["workers"] for r in rows}))
        ax.set_ylim(0, 1.1)
        ax.set_xlabel("GPUs")
        ax.set_title(f"GEMM n = {n}", fontsize=10)
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("efficiency vs P x 1-GPU cuBLAS")
    axes[0][-1].legend(fontsize=7, loc="lower left")
    _save(fig, out)


def cnn(paths, out):
    rows = _rows(paths)
    plt = pyplot()
    key = lambda r: (r["net"], r["global_batch"], r["dtype"])   # noqa: E731
    base = {key(r): r for r in rows if r["workers"] == 1}
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.8))
    cases = sorted(base)
    counts = sorted({r["workers"] for r in rows})
    width = 0.8 / len(counts)
    for k, p in enumerate(counts):
        ratios = [next((r["dnn_over_torch"] for r in rows if key(r) == c and r["workers"] == p), 0) for c in cases]
        left.bar([i + k * width for i in range(len(cases))], ratios, width,
                 label=f"{p} GPU{'s' if p > 1 else ''} (vs {'DDP' if p > 1 else 'eager'})")
    left.axhline(1.0, color="black", lw=0.8)
    left.set_xticks([i + width * (len(counts) - 1) / 2 for i in range(len(cases))])
    left.set_xticklabels([f"{n}\nb{b} {d[5:]}" for n, b, d in cases], fontsize=7)
    left.set_ylabel("dnn images/s / PyTorch's")
    left.legend(fontsize=7)
    for who, field, style in (("dnn", "dnn_images_per_s", "-o"), ("PyTorch", "torch_images_per_s", "--s")):
        effs = [(c, r["workers"], r[field] / (r["workers"] * base[c][field])) for r in rows
                for c in [key(r)] if r["workers"] > 1 and c in base]
        right.bar([i + (0.4 if who == "PyTorch" else 0) for i, _ in enumerate(effs)], [e for *_, e in effs], 0.4,
                  label=who)
        right.set_xticks([i + 0.2 for i in range(len(effs))])
        right.set_xticklabels([f"{c[0]}\nb{c[1]} {c[2][5:]}" for c, _, _ in effs], fontsize=7)
    right.axhline(1.0, color="black", lw=0.8)
    right.set_ylim(0, 1.1)
    right.set_ylabel(f"efficiency, {max(counts)} GPUs vs 1")
    right.legend(fontsize=7)
    _save(fig, out)


def _scaling_row(r):
    """Whether `r` is a row a scaling plot can place: a network, a batch, a dtype and a worker count."""
    def count(v):
        return isinstance(v, int) and not isinstance(v, bool) and v >= 1
    return (isinstance(r, dict) and isinstance(r.get("net"), str) and count(r.get("global_batch"))
            and isinstance(r.get("dtype"), str) and count(r.get("workers")))


def _scaling_rows(paths):
    """{(net, global batch, dtype, batchnorm): {workers: {"dnn", "torch", "compile": images/s}}} from
    cnn_bench's and zoo_bench's JSON; PyTorch is eager at P = 1 and DDP at P > 1, compile its
    torch.compile'd peer (over DDP at P > 1). batchnorm is the first --batchnorm of zoo_bench ('sync':
    statistics over all GPUs; 'local': each GPU's own, as DDP's); a one-GPU row counts for both (one
    GPU's statistics are the batch's), and a 'local' case without a row past one GPU is left out. A
    case measured in several files keeps the first figure of each (files in sorted order:
    cnn_P4_alexnet.json before cnn_P4_alexnet_compile.json); rows with --parallel other than auto or
    an explicit --bucket-mb are left out (comparisons of settings, not of GPU counts)."""
    cases = collections.defaultdict(lambda: collections.defaultdict(dict))
    rows = []
    for p in sorted(paths):
        try:
            with open(p) as f:
                results = json.load(f).get("results")
            rows.extend((p, r) for r in (results if isinstance(results, list) else []))
        except (OSError, ValueError, AttributeError) as exc:
            print(f"scaling: {p} skipped ({exc})")
    for p, r in rows:
        if not _scaling_row(r):
            print(f"scaling: a row of {p} skipped (net, global_batch, dtype and workers expected): {str(r)[:120]}")
            continue
        if r.get("parallel", "auto") != "auto" or r.get("bucket_mb") is not None:
            continue
        peers = r.get("peers") if isinstance(r.get("peers"), dict) else {}
        def figure(name, peers=peers):
            entry = peers.get(name)
            return entry.get("images_per_s") if isinstance(entry, dict) else None
        ddp = "ddp_" if r["workers"] > 1 else ""
        rates = {"dnn": r.get("dnn_images_per_s"), "torch": r.get("torch_images_per_s") or figure(ddp + "eager"),
                 "compile": figure(ddp + "compile")}
        # a rate is a positive finite number; anything else (an out-of-memory None, a corrupt value) is no point
        rates = {k: float(v) for k, v in rates.items()
                 if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0}
        if not rates:
            continue
        norms = ("sync", "local") if r["workers"] == 1 else (r.get("batchnorm", "sync"),)
        for bn in norms:
            point = cases[(r["net"], r["global_batch"], r["dtype"], bn)][r["workers"]]
            for who, rate in rates.items():
                if rate and who not in point:
                    point[who] = rate
    for key in [k for k, pts in cases.items() if k[3] == "local" and max(pts) == 1]:
        del cases[key]
    for key in [k for k, pts in cases.items() if k[3] == "sync" and max(pts) == 1
                and any(o[:3] == k[:3] and o[3] == "local" for o in cases)]:
        del cases[key]      # (one GPU's figure is drawn in the 'local' panel of the same case)
    return cases


def scaling(paths, out):
    """Images/s against GPUs: a panel per measured (network, global batch, dtype), four to a row; dnn,
    PyTorch (eager at 1 GPU, DDP beyond), its torch.compile'd peer dashed where measured, and the linear
    line from dnn's 1-GPU rate. The legend gives each side's efficiency at the most GPUs (rate / (P x 1 GPU))."""
    cases = _scaling_rows(paths)
    if not cases:
        raise SystemExit("scaling: no cnn_bench or zoo_bench rows in " + " ".join(paths))
    plt = pyplot()
    keys = sorted(cases, key=lambda k: (k[0], k[2] != "float32", k[1], k[3]))
    counts = sorted({p for pts in cases.values() for p in pts})
    ncols = min(4, len(keys))
    nrows = -(-len(keys) // ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(3.3 * ncols, 2.7 * nrows), squeeze=False)
    styles = (("dnn", "dnn", "-o"), ("torch", "PyTorch", "-.s"), ("compile", "torch.compile", "--^"))
    for k, (net, batch, dtype, bn) in enumerate(keys):
        ax = axes[k // ncols][k % ncols]
        pts = cases[(net, batch, dtype, bn)]
        ax.set_title(f"{net} b{batch} {dtype}" + (", local BN" if bn == "local" else ""), fontsize=9)
        ax.set_xticks(counts)
        ax.set_xlim(counts[0] - 0.2, counts[-1] + 0.2)
        ax.grid(alpha=0.3)
        top = 0
        for who, label, style in styles:
            ps = [p for p in counts if p in pts and who in pts[p]]
            if not ps:
                continue
            rates = [pts[p][who] for p in ps]
            top = max(top, *rates)
            if ps[0] == 1 and len(ps) > 1:
                label += f" (eff. {rates[-1] / (ps[-1] * rates[0]):.2f} at {ps[-1]})"
            ax.plot(ps, rates, style, color=COLORS.get(dtype) if who == "dnn" else None, label=label)
        base = pts.get(1, {}).get("dnn")
        if base:
            ax.plot(counts, [p * base for p in counts], color="black", lw=0.8, ls=":", label="linear (dnn)")
            top = max(top, counts[-1] * base)
        ax.set_ylim(0, 1.12 * top)
        ax.legend(fontsize=6, loc="best")
        if k % ncols == 0:
            ax.set_ylabel("images/s")
        if k // ncols == nrows - 1 or k + ncols >= len(keys):
            ax.set_xlabel("GPUs")
    for k in range(len(keys), nrows * ncols):
        axes[k // ncols][k % ncols].axis("off")
    _save(fig, out)


def mlp(paths, out):
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(5.2, 3.8))
    for p in paths:
        with open(p) as f:
            res = json.load(f)["results"]
        rows = sorted(res["rows"], key=lambda r: r["hidden_layers"])
        layers = [r["hidden_layers"] for r in rows]
        tag = f"{res['device']}, {res['workers']} worker{'s' if res['workers'] > 1 else ''}"
        ax.plot(layers, [r["dnn_s"] for r in rows], "-o", label=f"dnn ({tag})")
        if all(r.get("torch_s") for r in rows):
            ax.plot(layers, [r["torch_s"] for r in rows], "--s", label=f"PyTorch eager ({tag})")
    ax.set_xlabel("hidden layers (MagmaDNN's MNIST MLP)")
    ax.set_ylabel(f"seconds for {res['epochs']} epochs")
    ax.set_xticks(layers)
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    _save(fig, out)


def remap(paths, out):
    rows = _rows(paths)
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(5.2, 3.8))
    cases = sorted({(r["target"], r["n"]) for r in rows})
    for k, (field, label) in enumerate((("dmath_GBps", "dmath remap"), ("raw_GBps", "raw collective"))):
        ax.bar([i + 0.4 * k for i in range(len(cases))],
               [next(r[field] for r in rows if (r["target"], r["n"]) == c) for c in cases], 0.4, label=label)
    ax.set_xticks([i + 0.2 for i in range(len(cases))])
    ax.set_xticklabels([f"to {t.split('(')[0]}\nn={n}" for t, n in cases], fontsize=8)
    ax.set_ylabel("GB/s moved between workers")
    ax.set_title(f"remap from RowBlock, {rows[0]['workers']} workers\n(raw: NCCL send/recv of the same bytes "
                 "on GPUs, MPI Alltoallv on CPUs)", fontsize=9)
    ax.legend(fontsize=7)
    _save(fig, out)


def readme():
    """The figures of benchmarks/results/README.md from the committed H200 results."""
    r = lambda pattern: sorted(glob.glob(os.path.join(RESULTS, pattern)))   # noqa: E731
    # Only runs whose single-GPU baseline multiplies random data, as dmath does: the older
    # gemm_h200_p2_2026-11-21.json timed cuBLAS on constant data (float64 at n = 32768: 65.7 TF/s
    # against 52 with random data), which would show a dip at 2 GPUs that is the baseline's, not dmath's.
    # So P = 2 appears only once a random-baseline P = 2 run is committed.
    gemm(r("gemm_h200_p1_random_baseline_*.json") + r("gemm_h200_p2_random_baseline_*.json")
         + r("gemm_h200_p4_random_baseline_*.json"), os.path.join(RESULTS, "gemm_efficiency_h200.png"),
         sizes=[32768])     # the size measured with random data on both sides
    cnn(r("cnn_h200_p1_vecpool_*.json") + r("cnn_h200_p2_vecpool_*.json"), os.path.join(RESULTS, "cnn_efficiency_h200.png"))
    mlp(r("mnist_mlp_h200_graphs_*.json"), os.path.join(RESULTS, "mlp_layers_h200.png"))
    remap(r("remap_h200_p4_*.json"), os.path.join(RESULTS, "remap_h200_p4.png"))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("kind", choices=["gemm", "cnn", "scaling", "mlp", "remap", "readme"])
    ap.add_argument("files", nargs="*")
    ap.add_argument("--out")
    args = ap.parse_args()
    if args.kind == "readme":
        return readme()
    if not args.files:
        ap.error(f"{args.kind} needs result files")
    globals()[args.kind](args.files, args.out or f"{args.kind}.png")


if __name__ == "__main__":
    main()
