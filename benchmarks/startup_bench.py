"""Start-up: the time from `fit` to the end of the first training step, dnn against PyTorch eager.

    python benchmarks/startup_bench.py OUTDIR [--net alexnet] [--batch 256] [--dtype float32]
        [--device gpu] [--cases full-cold off fast-cold fast-warm] [--no-torch]

Every case is a fresh process (the plans a process chose stay in it, so a
warm start is only a new process that finds the tuning cache on disk),
run one after another in this job on the same GPU:

    full-cold   DMATH_TUNE=full, an empty cache: every cuDNN plan timed (dnn before the cache)
    off         DMATH_TUNE=off: the heuristics' first choices, nothing timed or cached
    fast-cold   DMATH_TUNE=fast (the default), an empty cache: a few plans timed per shape
    fast-warm   DMATH_TUNE=fast, the cache fast-cold wrote: nothing timed (run twice)
    torch       PyTorch eager, cudnn.benchmark=True (its algorithms timed at first use)
    torch-heur  PyTorch eager, cudnn.benchmark=False (its heuristics)

Each process reports the seconds of: its imports, dmath.init (or CUDA's
initialisation), building the model, the first `fit` of one batch (the
first step: plans chosen, the step recorded, everything made at first use),
a second one-batch `fit` (a step with nothing left to choose), and the
whole process from its start to the end of the first step. The network is
benchmarks/cnn_bench.py's (AlexNet by default: torchvision's) or zoo_bench.py's
(googlenet, resnet50, inception_v3: without auxiliary heads), on random
images resident on the GPU, SGD with momentum. Writes
OUTDIR/startup_<net>_b<batch>_<dtype>.json with every case's figures and
the ratios of dnn's first step to PyTorch eager's in the same job.
"""
import time

_T0 = time.perf_counter()       # the process's start, as near as Python lets a script see it

import argparse                 # noqa: E402
import json                     # noqa: E402
import os                       # noqa: E402
import shutil                   # noqa: E402
import subprocess               # noqa: E402
import sys                      # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
CASES = ("full-cold", "off", "fast-cold", "fast-warm", "torch", "torch-heur")


def _child_dnn(args):
    t_import = time.perf_counter()
    sys.path.insert(0, HERE)
    import numpy as np
    import dmath
    import dnn
    t_init = time.perf_counter()
    dmath.init(device=args.device)
    t_build = time.perf_counter()
    shape, classes, make, _ = _network(args.net)
    rng = np.random.default_rng(0)
    x = rng.random((args.batch,) + shape, dtype=np.float32)
    y = rng.integers(0, classes, args.batch)
    data = dnn.data.Dataset(x, y)
    dmath.random.seed(0)
    model = make(args.dtype)
    dmath.synchronize()
    t_fit = time.perf_counter()
    model.fit(data, batch_size=args.batch, epochs=1, shuffle=False, verbose=0)
    dmath.synchronize()
    t_first = time.perf_counter()
    model.fit(data, batch_size=args.batch, epochs=1, shuffle=False, verbose=0)
    dmath.synchronize()
    t_second = time.perf_counter()
    sources, padded = {}, []
    if dmath.device() == "gpu":
        report = dmath.nn.explain_conv2d(print_fn=None)[0]
        for row in report["shapes"]:
            src = row.get("source", "cuDNN declined")
            sources[src] = sources.get(src, 0) + 1
        padded = report["padded"]
    return {"import_s": t_init - t_import, "init_s": t_build - t_init, "build_s": t_fit - t_build,
            "first_step_s": t_first - t_fit, "second_step_s": t_second - t_first,
            "process_to_first_step_s": t_first - _T0, "conv_plans_by_source": sources,
            "padding_choices": len(padded)}


def _network(name):
    """(input shape, classes, dnn maker(dtype), torch maker(torch)) of `name`: a network of cnn_bench.py
    (AlexNet, ...) or of zoo_bench.py (GoogLeNet, ResNet-50, Inception v3; without auxiliary heads
    here on both sides). zoo_bench imports dmath: a PyTorch child of a zoo network imports it too."""
    import cnn_bench
    if name in cnn_bench.NETS:
        shape, classes, _ = cnn_bench.NETS[name]
        return (shape, classes, lambda dtype: cnn_bench.dnn_model(name, dtype, "data"),
                lambda torch: cnn_bench.torch_model(torch, name))
    import zoo_bench
    shape = zoo_bench.NETS[name][0]
    mine, theirs = zoo_bench.arguments(name, shape)
    if "aux_logits" in mine:
        mine, theirs = dict(mine, aux_logits=False), dict(theirs, aux_logits=False)

    def dnn_make(dtype):
        import dnn
        return getattr(dnn.models, name)(num_classes=zoo_bench.CLASSES, input_shape=shape, dtype=dtype,
                                         optimizer=dnn.optim.SGD(lr=cnn_bench.LR, momentum=cnn_bench.MOMENTUM),
                                         **mine)

    def torch_make(torch):
        import torchvision
        return getattr(torchvision.models, name)(weights=None, num_classes=zoo_bench.CLASSES, **theirs)
    return shape, zoo_bench.CLASSES, dnn_make, torch_make


def _child_torch(args):
    t_import = time.perf_counter()
    sys.path.insert(0, HERE)
    import torch
    from cnn_bench import LR, MOMENTUM
    t_init = time.perf_counter()
    gpu = args.device != "cpu"
    dev = torch.device("cuda", 0) if gpu else torch.device("cpu")
    if gpu:
        torch.cuda.init()
        torch.backends.cudnn.benchmark = args.child == "torch"
    t_build = time.perf_counter()
    shape, classes, _, make = _network(args.net)
    gen = torch.Generator(device=dev).manual_seed(0)
    x = torch.rand((args.batch,) + shape, device=dev, generator=gen)
    y = torch.randint(0, classes, (args.batch,), device=dev, generator=gen)
    torch.manual_seed(0)
    model = make(torch).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    lossf = torch.nn.CrossEntropyLoss()
    half = args.dtype == "float16"
    scaler = torch.amp.GradScaler("cuda", enabled=half and gpu)

    def step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda" if gpu else "cpu", dtype=torch.float16, enabled=half and gpu):
            loss = lossf(model(x), y)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        if gpu:
            torch.cuda.synchronize(dev)
    if gpu:
        torch.cuda.synchronize(dev)
    t_fit = time.perf_counter()
    step()
    t_first = time.perf_counter()
    step()
    t_second = time.perf_counter()
    return {"import_s": t_init - t_import, "init_s": t_build - t_init, "build_s": t_fit - t_build,
            "first_step_s": t_first - t_fit, "second_step_s": t_second - t_first,
            "process_to_first_step_s": t_first - _T0}


def _run_case(case, args, cache):
    """One case in a fresh process: its figures (a dict), or {'error': ...}."""
    env = dict(os.environ)
    child = case if case.startswith("torch") else "dnn"
    if child == "dnn":
        env["DMATH_TUNE"] = case.split("-")[0]
        env["DMATH_TUNE_CACHE"] = cache if case.startswith("fast") else (
            cache + ".full" if case == "full-cold" else "")
    cmd = [sys.executable, os.path.abspath(__file__), args.out, "--child", child, "--net", args.net,
           "--batch", str(args.batch), "--dtype", args.dtype] + (["--device", args.device] if args.device else [])
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.timeout)
    wall = time.perf_counter() - t0
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        return {"error": f"exit {proc.returncode}: {proc.stderr[-2000:]}", "wall_s": wall}
    out = json.loads(lines[-1])
    out["wall_s"] = wall
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", help="directory for the JSON (and the tuning cache the cases share)")
    ap.add_argument("--net", default="alexnet")
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--dtype", default="float32", choices=["float32", "float16"])
    ap.add_argument("--device", default=None, choices=["cpu", "gpu"])
    ap.add_argument("--cases", nargs="+", default=list(CASES), choices=CASES)
    ap.add_argument("--no-torch", action="store_true")
    ap.add_argument("--timeout", type=int, default=900, help="seconds per case")
    ap.add_argument("--child", default=None, choices=["dnn", "torch", "torch-heur"], help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps((_child_dnn if args.child == "dnn" else _child_torch)(args)), flush=True)
        return
    os.makedirs(args.out, exist_ok=True)
    cache_dir = os.path.join(os.path.abspath(args.out), "startup-tune-cache")
    shutil.rmtree(cache_dir, ignore_errors=True)             # cold means cold
    os.makedirs(cache_dir)
    cache = os.path.join(cache_dir, "tune.json")
    cases = [c for c in args.cases if not (args.no_torch and c.startswith("torch"))]
    if "fast-warm" in cases and "fast-cold" not in cases:
        cases.insert(cases.index("fast-warm"), "fast-cold")  # a warm start needs the cold one's cache
    results = {}
    for case in cases:
        runs = 2 if case == "fast-warm" else 1
        for i in range(runs):
            name = case if runs == 1 else f"{case}-{i + 1}"
            results[name] = r = _run_case(case, args, cache)
            shown = ", ".join(f"{k} {v:.2f}" for k, v in r.items() if k.endswith("_s"))
            print(f"{name:12s} {r.get('error') or shown}"
                  + (f"; conv plans {r['conv_plans_by_source']}" if r.get("conv_plans_by_source") else ""),
                  flush=True)
    peer = results.get("torch", {}).get("first_step_s")
    ratios = {}
    if peer:
        for name, r in results.items():
            if "first_step_s" in r and not name.startswith("torch"):
                ratios[f"{name}_first_step_over_torch_eager"] = r["first_step_s"] / peer
                ratios[f"{name}_process_over_torch_eager"] = r["process_to_first_step_s"] / results["torch"][
                    "process_to_first_step_s"]
    for k, v in ratios.items():
        print(f"{k}: {v:.2f}")
    sys.path.insert(0, os.path.dirname(HERE))
    from dmath import machine as info
    payload = {"benchmark": "startup", "net": args.net, "batch": args.batch, "dtype": args.dtype,
               "device": args.device or "auto", "gpu": info.report()["gpu"],
               "date": time.strftime("%Y-%m-%d %H:%M:%S"), "cases": results, "ratios": ratios}
    path = os.path.join(args.out, f"startup_{args.net}_b{args.batch}_{args.dtype}.json")
    with open(path + ".tmp", "w") as f:
        json.dump(payload, f, indent=2)
    os.replace(path + ".tmp", path)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
