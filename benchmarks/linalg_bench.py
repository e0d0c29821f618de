"""dmath.linalg against one-GPU cuSOLVER (CuPy) or Heat (heat.linalg), in the same job.

    python benchmarks/linalg_bench.py OUTDIR [--device gpu|cpu] [--workers 1 2 4] [--n 32768]
        [--small-n 16384 [8192 ...]] [--svd-n 8192 ...] [--ops cholesky lu qr eigh svd] [--dtype float64] [--blocks 512]
        [--methods auto gather qdwh] [--leaf 0 1024 ...]
        [--reps 3] [--peer auto|cupy|heat|none] [--peer-n N] [--heat-python PY] [--mpiexec MPIEXEC]
    python benchmarks/linalg_bench.py --plot RESULT.json       # the figure of a result file again

The driver (this script without --child) runs, one after the other:
- for every worker count P: `mpiexec -n P python linalg_bench.py --child dmath ...`, which times
  each operation on a matrix that lives on the workers (made there by dmath.random, in the
  factorizations' own layout, so the time is the factorization's; `--input-layout row` makes it
  RowBlock and adds the remap) and checks its result on a random probe vector;
- the peer: on GPUs `python linalg_bench.py --child cupy` (cupy.linalg / cupyx.scipy.linalg:
  cuSOLVER on one GPU, the same data kind and n, or --peer-n where one GPU cannot hold n; an
  out-of-memory peer is recorded, not fatal); on the CPU `mpiexec -n P HEAT_PY
  linalg_bench.py --child heat` for each P (heat.linalg's qr, inv, det, eigh, svd on split=0
  matrices; Heat has no Cholesky and no LU), and SciPy's LAPACK in one process (`--child scipy`,
  `vs_scipy`) as the single-node reference;
eigh and svd run at every --small-n, with every --methods (dmath.linalg's method=: 'qdwh' the
distributed divide and conquer, 'gather' the local solver on worker 0 of the gathered matrix) and,
for qdwh, every --leaf (its leaf_size; 0: the default), each row recording what the divide and
conquer did (splits, leaves, QDWH steps: dmath.linalg.qdwh.last_run);
and writes OUTDIR/linalg_<device>_<date>.json with every time, the nominal TFLOP/s (n^3/3
Cholesky, 2n^3/3 LU, 4n^3/3 QR whose Q is formed on both sides) and the ratios against the peer:
`vs_peer` = peer seconds / dmath seconds; on GPUs also `efficiency` = dmath rate / (P x one-GPU
cuSOLVER rate). Each timed call ends with dmath.synchronize() (the peer: a device synchronize / a
Heat barrier); the median of --reps runs after one warm-up.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))

FLOPS = {"cholesky": lambda n: n ** 3 / 3, "lu": lambda n: 2 * n ** 3 / 3, "qr": lambda n: 4 * n ** 3 / 3,
         "eigh": lambda n: 4 * n ** 3 / 3, "svd": lambda n: 4 * n ** 3, "inv": lambda n: 2 * n ** 3,
         "det": lambda n: 2 * n ** 3 / 3, "cg": None, "svds": None}
#: cg (to an absolute residual of 1e-10, Heat's fixed rule) and svds (rank 10, 10 oversamples, one
#: power iteration: Heat's rsvd) have no nominal flop count: compared by time only
SMALL = ("eigh", "svd")


def _sizes(op, args):
    """The orders op runs at: every --svd-n for svd (default --small-n), every --small-n for eigh,
    else --n."""
    if op == "svd" and args.svd_n:
        return list(args.svd_n)
    return list(args.small_n) if op in SMALL else [args.n]


def _variants(op, args):
    """(method, leaf_size) pairs op runs with: eigh and svd with every --methods (qdwh with every
    --leaf, 0 meaning the default); the other operations once, (None, None)."""
    if op not in SMALL:
        return [(None, None)]
    out = []
    for m in args.methods:
        out.extend([(m, leaf or None) for leaf in args.leaf] if m == "qdwh" else [(m, None)])
    return out


# ---- dmath child -------------------------------------------------------------------------------
def child_dmath(args):
    import dmath
    from dmath import linalg as la
    from dmath.linalg.panels import work_layout
    from common import environment, median_time
    dmath.init(device=args.device)
    P = dmath.num_workers()
    rows = []
    from dmath.linalg import qdwh
    for op, n, (method, leaf) in [(op, n, v) for op in args.ops for n in _sizes(op, args)
                                  for v in _variants(op, args)]:
        for nb in (args.blocks if op in ("cholesky", "lu", "qr", "inv", "det") else [None]):
            lay = dmath.RowBlock() if (args.input_layout == "row" or nb is None) else work_layout(nb, P)
            dmath.random.seed(1)
            if op == "cholesky":
                # diagonally dominant: its lower triangle is that of a positive definite matrix
                A = dmath.random.rand((n, n), dtype=args.dtype, layout=lay)
                A += dmath.eye(n, dtype=args.dtype, layout=lay) * float(n)
            elif op == "cg":
                B = dmath.random.rand((n, n), dtype=args.dtype, layout=lay)
                # symmetric, its spectrum shifted past the semicircle of radius ~0.41 sqrt(n): positive
                # definite, condition ~ sqrt(n) (tens of CG steps, not the handful of n * I)
                A = (B + B.T) * 0.5 + dmath.eye(n, dtype=args.dtype, layout=lay) * float(np.sqrt(n))
                del B
                rhs = dmath.ones((n, 1), dtype=args.dtype)
            elif op in ("eigh",):
                B = dmath.random.randn((n, n), dtype=args.dtype, layout=lay)
                A = B + B.T
                del B
            else:
                A = dmath.random.randn((n, n), dtype=args.dtype, layout=lay)
            run = {"cholesky": lambda: la.cholesky(A, block=nb), "lu": lambda: la.lu(A, block=nb),
                   "qr": lambda: la.qr(A, block=nb), "eigh": lambda: la.eigh(A, method=method, leaf_size=leaf),
                   "svd": lambda: la.svd(A, method=method, leaf_size=leaf),
                   "inv": lambda: la.inv(A, block=nb), "det": lambda: la.det(A, block=nb),
                   "cg": lambda: la.cg(A, rhs, tol=0.0, atol=1e-10)[0],
                   "svds": lambda: la.svds(A, k=10, oversample=10, n_iter=1)}[op]

            def timed():
                out = run()
                dmath.synchronize()
                return out

            qdwh.last_run.clear()
            seconds = median_time(timed, args.reps, warmup=1)
            err = _check_dmath(dmath, op, A, run(), n)
            rows.append({"op": op, "n": n, "block": nb, "workers": P, "seconds": seconds,
                         "tflops": _rate(op, n, seconds), "probe_residual": err, "input_layout": repr(lay)})
            if method is not None:
                rows[-1]["method"] = method
                if qdwh.last_run:        # the divide and conquer ran ('auto' may have gathered)
                    rows[-1]["method_ran"] = "qdwh"
                    rows[-1]["leaf_size"] = qdwh.last_run["leaf"]
                    rows[-1]["dc"] = {"splits": qdwh.last_run["splits"], "refused": qdwh.last_run["refused"],
                                      "leaves": qdwh.last_run["leaves"], "owners": qdwh.last_run["owners"],
                                      "qdwh_steps": qdwh.last_run["steps"]}
                else:
                    rows[-1]["method_ran"] = "gather"
            print(json.dumps(rows[-1]), flush=True)
            del A
    _write(args.json, {"environment": environment(dmath), "rows": rows})


def _rate(op, n, seconds):
    """Nominal TFLOP/s, or None for an operation without a nominal count."""
    return None if FLOPS[op] is None else FLOPS[op](n) / seconds / 1e12


def _check_dmath(dmath, op, A, out, n):
    """A relative residual on a random probe vector x (n numbers to the master, never n^2)."""
    x = dmath.from_numpy(np.random.default_rng(0).standard_normal((n, 1)), dtype=A.dtype.name)
    Ax = (A @ x).to_numpy()[:, 0]
    scale = np.linalg.norm(Ax) + 1e-300
    if op == "cholesky":
        # the lower triangle's symmetric matrix: A_sym x = L (L^T x)
        lhs = (out @ (out.T @ x)).to_numpy()[:, 0]
        from dmath.linalg.decompose import triangle
        Lo = triangle(A, lower=True)
        sym = (Lo @ x + triangle(A, lower=True, k=-1).T @ x).to_numpy()[:, 0]
        return float(np.linalg.norm(lhs - sym) / np.linalg.norm(sym))
    if op == "lu":
        perm, L, U = out
        return float(np.linalg.norm((L @ (U @ x)).to_numpy()[:, 0] - Ax[perm]) / scale)
    if op == "qr":
        Q, R = out
        return float(np.linalg.norm((Q @ (R @ x)).to_numpy()[:, 0] - Ax) / scale)
    if op == "eigh":
        w, V = out
        v0 = V[:, 0:1]
        return float(np.linalg.norm((A @ v0).to_numpy() - w[0] * v0.to_numpy()) / max(abs(w).max(), 1e-300))
    if op == "svd":
        U, s, Vh = out
        return float(np.linalg.norm((U @ ((Vh @ x) * dmath.from_numpy(s[:, None], dtype=A.dtype.name))).to_numpy()[:, 0]
                                    - Ax) / scale)
    if op == "inv":
        return float(np.linalg.norm((out @ (A @ x)).to_numpy() - x.to_numpy()) / np.linalg.norm(x.to_numpy()))
    if op == "cg":
        return float(np.linalg.norm((A @ out).to_numpy() - 1.0) / np.sqrt(n))
    if op == "svds":
        U, s, Vh = out
        return float(np.linalg.norm((A @ Vh[0:1, :].T).to_numpy() - s[0] * U[:, 0:1].to_numpy()) / s[0])
    return 0.0


# ---- CuPy child (one GPU) -------------------------------------------------------------------------
def child_cupy(args):
    import cupy
    import cupyx.scipy.linalg as cla
    rows = []
    for op, n in [(op, n) for op in args.ops for n in _sizes(op, args)]:
        if FLOPS[op] is None:
            continue
        if args.peer_n and op not in SMALL:
            n = args.peer_n         # the largest n that fits one GPU, where the workers' n does not
        try:
            rows.append(_cupy_row(cupy, cla, op, n, args))
        except cupy.cuda.memory.OutOfMemoryError as exc:
            rows.append({"op": op, "n": n, "workers": 1, "error": f"out of memory: {exc}"})
        print(json.dumps(rows[-1]), flush=True)
        cupy.get_default_memory_pool().free_all_blocks()
    _write(args.json, {"peer": "cupy " + cupy.__version__ + " (cuSOLVER, one GPU)", "rows": rows})


def _cupy_row(cupy, cla, op, n, args):
    rng = cupy.random.default_rng(1)
    if op == "cholesky":
        A = rng.random((n, n), dtype=args.dtype)
        A = cupy.tril(A) + cupy.tril(A, -1).T + n * cupy.eye(n, dtype=args.dtype)
    elif op == "eigh":
        A = rng.standard_normal((n, n), dtype=args.dtype)
        A = A + A.T
    else:
        A = rng.standard_normal((n, n), dtype=args.dtype)
    run = {"cholesky": lambda: cupy.linalg.cholesky(A), "lu": lambda: cla.lu_factor(A, check_finite=False),
           "qr": lambda: cupy.linalg.qr(A), "eigh": lambda: cupy.linalg.eigh(A),
           "svd": lambda: cupy.linalg.svd(A, full_matrices=False), "inv": lambda: cupy.linalg.inv(A),
           "det": lambda: cupy.linalg.det(A)}[op]
    times = []
    for r in range(args.reps + 1):
        cupy.cuda.Device().synchronize()
        t0 = time.perf_counter()
        out = run()
        cupy.cuda.Device().synchronize()
        if r:
            times.append(time.perf_counter() - t0)
        del out
    seconds = float(np.median(times))
    return {"op": op, "n": n, "workers": 1, "seconds": seconds, "tflops": _rate(op, n, seconds)}


# ---- SciPy child (one process, CPU) -------------------------------------------------------------
def child_scipy(args):
    """LAPACK through SciPy in one process: the CPU's single-node reference, beside Heat."""
    import scipy
    import scipy.linalg as sla
    rows = []
    for op, n in [(op, n) for op in args.ops for n in _sizes(op, args)]:
        if FLOPS[op] is None:
            continue            # cg and svds: compared with Heat only
        rng = np.random.default_rng(1)
        A = rng.standard_normal((n, n)).astype(args.dtype)
        if op == "cholesky":
            A = np.tril(A) + np.tril(A, -1).T + n * np.eye(n, dtype=args.dtype)
        elif op == "eigh":
            A = A + A.T
        run = {"cholesky": lambda: sla.cholesky(A, lower=True, check_finite=False),
               "lu": lambda: sla.lu_factor(A, check_finite=False), "qr": lambda: np.linalg.qr(A),
               "eigh": lambda: np.linalg.eigh(A), "svd": lambda: np.linalg.svd(A, full_matrices=False),
               "inv": lambda: np.linalg.inv(A), "det": lambda: np.linalg.det(A)}[op]
        times = []
        for r in range(args.reps + 1):
            t0 = time.perf_counter()
            run()
            if r:
                times.append(time.perf_counter() - t0)
        seconds = float(np.median(times))
        rows.append({"op": op, "n": n, "workers": 1, "seconds": seconds, "tflops": _rate(op, n, seconds)})
        print(json.dumps(rows[-1]), flush=True)
    _write(args.json, {"peer": f"scipy {scipy.__version__} / numpy {np.__version__} (LAPACK, one process)",
                       "rows": rows})


# ---- Heat child (CPU) ------------------------------------------------------------------------------
def _heat():
    """Import heat. Heat 1.8 imports torchvision at import time for its image-data helpers only (never
    in heat.linalg); where no torchvision matching the installed torch can be had (the project's CPU
    torch 2.13 needs the CPU torchvision wheel from PyTorch's own index), an empty stand-in module
    lets heat import, and heat.linalg runs as released."""
    try:
        import torchvision  # noqa: F401
    except Exception:                # noqa: BLE001  (a CUDA torchvision against a CPU torch raises at import)
        import types

        class _Empty(types.ModuleType):
            def __getattr__(self, name):
                if name.startswith("__"):
                    raise AttributeError(name)
                return type(name, (), {})
        tv, tr, trt, ds = (_Empty(n) for n in ("torchvision", "torchvision.transforms",
                                               "torchvision.transforms.transforms", "torchvision.datasets"))
        trt.__all__ = []
        tr.transforms, tv.transforms, tv.datasets = trt, tr, ds
        for mod in (tv, tr, trt, ds):
            sys.modules[mod.__name__] = mod
    import heat
    return heat


def child_heat(args):
    ht = _heat()
    comm = ht.MPI_WORLD
    rows = []
    for op, n in [(op, n) for op in args.ops for n in _sizes(op, args)]:
        if op in ("cholesky", "lu"):
            continue            # heat.linalg has neither
        ht.random.seed(1)
        A = ht.random.randn(n, n, dtype=ht.float64 if args.dtype == "float64" else ht.float32, split=0)
        if op == "eigh":
            A = A + ht.resplit(A.T, 0)
        if op == "cg":
            B = ht.random.rand(n, n, dtype=A.dtype, split=0)
            A = (B + ht.resplit(B.T, 0)) * 0.5 + ht.eye(n, dtype=A.dtype, split=0) * float(np.sqrt(n))
            rhs, x0 = ht.ones(n, dtype=A.dtype, split=0), ht.zeros(n, dtype=A.dtype, split=0)
        run = {"qr": lambda: ht.linalg.qr(A), "eigh": lambda: ht.linalg.eigh(A), "svd": lambda: ht.linalg.svd(A),
               "inv": lambda: ht.linalg.inv(A), "det": lambda: ht.linalg.det(A),
               "cg": lambda: ht.linalg.cg(A, rhs, x0),
               "svds": lambda: ht.linalg.rsvd(A, 10, n_oversamples=10, power_iter=1)}.get(op)
        if run is None:
            continue
        try:
            times = []
            for r in range(args.reps + 1):
                comm.Barrier()
                t0 = time.perf_counter()
                run()
                comm.Barrier()
                if r:
                    times.append(time.perf_counter() - t0)
            seconds = float(np.median(times))
            rows.append({"op": op, "n": n, "workers": comm.size, "seconds": seconds, "tflops": _rate(op, n, seconds)})
        except Exception as exc:            # noqa: BLE001  (recorded: what Heat cannot do is a result)
            rows.append({"op": op, "n": n, "workers": comm.size, "error": f"{type(exc).__name__}: {exc}"})
        if comm.rank == 0:
            print(json.dumps(rows[-1]), flush=True)
    if comm.rank == 0:
        _write(args.json, {"peer": f"heat {ht.__version__} (heat.linalg, split=0)", "rows": rows})


def _write(path, payload):
    if path:
        with open(path, "w") as f:
            json.dump(payload, f, indent=2)


# ---- driver ----------------------------------------------------------------------------------------
def _child_cmd(kind, args, json_path, python=sys.executable):
    cmd = [python, os.path.abspath(__file__), "--child", kind, "--json", json_path, "--device", args.device,
           "--n", str(args.n), "--small-n", *map(str, args.small_n), "--svd-n", *map(str, args.svd_n or [0]),
           "--dtype", args.dtype,
           "--reps", str(args.reps), "--input-layout", args.input_layout, "--peer-n", str(args.peer_n),
           "--ops", *args.ops, "--blocks", *map(str, args.blocks), "--methods", *args.methods,
           "--leaf", *map(str, args.leaf)]
    return cmd


def _run(cmd, env=None):
    print("+", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True, env=env)


def driver(args):
    os.makedirs(args.outdir, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix="linalg_bench_")
    result = {"args": vars(args), "dmath": {}, "peer": {}}
    for P in args.workers:
        path = os.path.join(tmp, f"dmath_{P}.json")
        _run([*args.mpiexec.split(), "-n", str(P), *_child_cmd("dmath", args, path)])
        with open(path) as f:
            result["dmath"][str(P)] = json.load(f)
    peer = args.peer if args.peer != "auto" else ("cupy" if args.device == "gpu" else "heat")
    if peer == "cupy":
        path = os.path.join(tmp, "cupy.json")
        try:
            _run(_child_cmd("cupy", args, path))
            with open(path) as f:
                result["peer"]["1"] = json.load(f)
        except (subprocess.CalledProcessError, OSError) as exc:
            result["peer"]["1"] = {"error": f"{type(exc).__name__}: {exc}"}
    elif peer == "heat":
        path = os.path.join(tmp, "scipy.json")
        _run(_child_cmd("scipy", args, path))
        with open(path) as f:
            result["scipy"] = json.load(f)
        env = dict(os.environ)
        # Heat's Python must load the MPI library of this job's mpiexec: the mpich wheel puts it in
        # this environment's lib/, where another environment's mpi4py does not look
        env["LD_LIBRARY_PATH"] = os.pathsep.join(p for p in (os.path.join(sys.prefix, "lib"),
                                                              env.get("LD_LIBRARY_PATH")) if p)
        for P in args.workers:
            path = os.path.join(tmp, f"heat_{P}.json")
            try:
                _run([*args.mpiexec.split(), "-n", str(P), *_child_cmd("heat", args, path, args.heat_python)], env)
                with open(path) as f:
                    result["peer"][str(P)] = json.load(f)
            except (subprocess.CalledProcessError, OSError) as exc:
                result["peer"][str(P)] = {"error": f"{type(exc).__name__}: {exc}"}
    result["summary"] = _summary(result, peer)
    for line in result["summary"]:
        print(line)
    name = f"linalg_{args.device}_{time.strftime('%Y-%m-%d_%H%M%S')}.json"
    out = os.path.join(args.outdir, name)
    with open(out, "w") as f:
        json.dump(result, f, indent=2)
    print(f"wrote {out}")
    try:
        plot(out)
    except Exception as exc:            # noqa: BLE001  (the figure is optional: matplotlib may be absent)
        print(f"no figure: {exc}")


def _tf(rate):
    return "" if rate is None else f"{rate:.3f} TFLOP/s"


def _summary(result, peer):
    """One line per (op, P, block): dmath's time and rate, the peer's, the ratios."""
    lines = []
    for P, run in result["dmath"].items():
        ref = result["peer"].get("1" if peer == "cupy" else P, {})
        peer_rows = {r["op"]: r for r in ref.get("rows", []) if "seconds" in r}
        peer_rows.update({(r["op"], r["n"]): r for r in ref.get("rows", []) if "seconds" in r})
        for r in run["rows"]:
            p = peer_rows.get((r["op"], r["n"]), peer_rows.get(r["op"]))
            how = f"block={r['block']}" if "method" not in r else \
                f"method={r['method']}->{r['method_ran']}" + (f" leaf={r['leaf_size']}" if "leaf_size" in r else "")
            line = (f"{r['op']:9s} n={r['n']:6d} P={P} {how}: {r['seconds']:.3f} s "
                    f"{_tf(r['tflops'])} (probe residual {r['probe_residual']:.1e})")
            if p is not None:
                line += f"; {peer} n={p['n']} {p['seconds']:.3f} s {_tf(p['tflops'])}"
                if p["n"] == r["n"]:
                    r["vs_peer"] = p["seconds"] / r["seconds"]
                    line += f": x{r['vs_peer']:.2f}"
                if peer == "cupy" and r["tflops"] is not None:
                    # rates, so also against the largest n one GPU holds (--peer-n)
                    r["efficiency"] = r["tflops"] / (int(P) * p["tflops"])
                    line += f", efficiency {r['efficiency']:.2f} of P x one GPU"
            lines.append(line)
            ref_rows = {(x["op"], x["n"]): x for x in result.get("scipy", {}).get("rows", [])}
            q = ref_rows.get((r["op"], r["n"]))
            if q is not None and q["n"] == r["n"]:
                r["vs_scipy"] = q["seconds"] / r["seconds"]
                lines[-1] += f"; scipy (1 process) {q['seconds']:.3f} s: x{r['vs_scipy']:.2f}"
    return lines


def plot(path, out=None):
    """TFLOP/s of each operation against the worker count, with the peer's rate times P (dashed: perfect
    scaling of the one-GPU cuSOLVER rate) or the peer's own rate at each P; written beside the JSON."""
    from dnn.callbacks import pyplot        # the lazy matplotlib import with a clear error
    plt = pyplot()
    with open(path) as f:
        result = json.load(f)
    best = {}
    for P, run in result["dmath"].items():
        for r in run["rows"]:
            key = ((r["op"], r["n"]), int(P))      # eigh and svd may run at several orders
            if r["tflops"] is None:
                continue
            if key not in best or r["tflops"] > best[key]["tflops"]:
                best[key] = r
    ops = sorted({op for op, _ in best})
    if not ops:
        print("no figure: no operation here has a nominal rate (cg and svds are compared by time)")
        return
    fig, axes = plt.subplots(1, len(ops), figsize=(3.2 * len(ops), 3.2), squeeze=False)
    for ax, op in zip(axes[0], ops):
        ps = sorted(P for o, P in best if o == op)
        ax.plot(ps, [best[(op, P)]["tflops"] for P in ps], "o-", label="dmath")
        name, n = op

        def same(r):
            # the peer's rate at its own n (--peer-n) for the factorizations; eigh and svd at theirs
            return r["op"] == name and (r["n"] == n or name not in SMALL)
        for P_key, ref in result["peer"].items():
            for r in ref.get("rows", []):
                if same(r) and r.get("tflops") is not None:
                    if P_key == "1" and result["args"].get("device") == "gpu":
                        ax.plot(ps, [r["tflops"] * P for P in ps], "k--", label="P x one-GPU cuSOLVER")
                    else:
                        ax.plot([int(P_key)], [r["tflops"]], "s", label=f"{ref['peer'].split()[0]} P={P_key}")
        for r in result.get("scipy", {}).get("rows", []):
            if same(r):
                ax.plot([1], [r["tflops"]], "^", label="SciPy, 1 process")
        ax.set_ylim(bottom=0)
        ax.set_title(f"{name} n={n}")
        ax.set_xlabel("workers")
        ax.set_ylabel("TFLOP/s")
        ax.set_xticks(sorted(set(ps) | {1}))
        ax.legend(fontsize=7)
    fig.tight_layout()
    out = out or os.path.splitext(path)[0] + ".png"
    fig.savefig(out, dpi=120)
    print(f"wrote {out}")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("outdir", nargs="?")
    ap.add_argument("--child", choices=["dmath", "cupy", "heat", "scipy"])
    ap.add_argument("--json")
    ap.add_argument("--device", default="gpu", choices=["gpu", "cpu"])
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument("--n", type=int, default=32768)
    ap.add_argument("--small-n", type=int, nargs="+", default=[16384], help="the orders of eigh and svd")
    ap.add_argument("--svd-n", type=int, nargs="+", default=None, help="svd's orders (default: --small-n)")
    ap.add_argument("--ops", nargs="+", default=["cholesky", "lu", "qr", "eigh", "svd"],
                    choices=sorted(FLOPS))
    ap.add_argument("--dtype", default="float64", choices=["float32", "float64"])
    ap.add_argument("--blocks", type=int, nargs="+", default=[512])
    ap.add_argument("--methods", nargs="+", default=["auto"], choices=["auto", "gather", "qdwh"],
                    help="eigh and svd: dmath.linalg's method= values to time")
    ap.add_argument("--leaf", type=int, nargs="+", default=[0],
                    help="method qdwh: the leaf sizes to time (0: the default, dmath.linalg.dc_plan.default_leaf)")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--peer-n", type=int, default=0,
                    help="the one-GPU peer's n for Cholesky, LU and QR (default: --n); for an n one GPU cannot hold")
    ap.add_argument("--input-layout", default="work", choices=["work", "row"])
    ap.add_argument("--peer", default="auto", choices=["auto", "cupy", "heat", "none"])
    ap.add_argument("--heat-python", default="/work/venv-heat/bin/python")
    ap.add_argument("--mpiexec", default="mpiexec")
    ap.add_argument("--plot", metavar="RESULT_JSON", help="only draw the figure of a result file")
    args = ap.parse_args(argv)
    args.svd_n = [n for n in (args.svd_n or []) if n > 0] or None
    if args.plot:
        plot(args.plot)
        return
    if args.child == "dmath":
        child_dmath(args)
    elif args.child == "cupy":
        child_cupy(args)
    elif args.child == "heat":
        child_heat(args)
    elif args.child == "scipy":
        child_scipy(args)
    else:
        if not args.outdir:
            ap.error("OUTDIR is required")
        driver(args)


if __name__ == "__main__":
    main()
