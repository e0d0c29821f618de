"""Checkpoint size and save/load seconds of AlexNet-sized weights, dnn against torch.save.

    python benchmarks/checkpoint_bench.py [--device cpu|gpu] [--dir D] [--reps 3] [--out F.json]
    mpiexec -n P python benchmarks/checkpoint_bench.py ...

The model has AlexNet's layer shapes (five convolutions, three Dense layers:
61.1 M float32 parameters) with Adam, whose two moments are made as for a
first step, so a checkpoint holds 3 x 61.1 M values plus counters. It times
`model.save` (gather every matrix to the master, CRC, one atomic fsync'ed
file) and `dnn.load` (check, build the model at this worker count, write the
arrays into its layouts), medians of --reps runs, and, when torch is
importable, `torch.save` / `torch.load` of the same arrays as CPU tensors in
one dict (torch's zip format, no fsync) in the same process, with the ratios.
"""
import argparse
import os
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dmath                                    # noqa: E402
import dnn                                      # noqa: E402
from dnn import layers as L                     # noqa: E402
from common import environment, median_time, write_json   # noqa: E402


def alexnet():
    return dnn.Sequential([
        L.Input((3, 224, 224)),
        L.Conv2D(64, 11, stride=4, padding=2), L.Activation("relu"), L.Pool2D(3, stride=2),
        L.Conv2D(192, 5, padding=2), L.Activation("relu"), L.Pool2D(3, stride=2),
        L.Conv2D(384, 3, padding=1), L.Activation("relu"),
        L.Conv2D(256, 3, padding=1), L.Activation("relu"),
        L.Conv2D(256, 3, padding=1), L.Activation("relu"), L.Pool2D(3, stride=2),
        L.Flatten(), L.Dense(4096), L.Activation("relu"), L.Dense(4096), L.Activation("relu"),
        L.Dense(1000), L.Output("softmax")], dtype="float32", optimizer=dnn.optim.Adam(lr=1e-3))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default=None)
    ap.add_argument("--dir", default=None, help="where the files go (default: a temporary folder)")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    dmath.init(device=args.device)
    dmath.random.seed(0)
    model = alexnet()
    model.optimizer.prepare(model.params)          # Adam's moments exist, as after a first step
    params = model.count_params()
    folder = args.dir or tempfile.mkdtemp(prefix="ckpt-bench-")
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, "alexnet.dnn")
    save_s = median_time(lambda: model.save(path), args.reps, warmup=1)
    load_s = median_time(lambda: dnn.load(path), args.reps, warmup=1)
    res = {"benchmark": "checkpoint", "env": environment(dmath), "params": params,
           "dnn": {"bytes": os.path.getsize(path), "save_s": save_s, "load_s": load_s}}
    print(f"AlexNet-sized: {params / 1e6:.1f} M parameters, Adam; {dmath.num_workers()} worker(s), "
          f"{dmath.device()}")
    print(f"dnn checkpoint: {res['dnn']['bytes'] / 2**20:.1f} MiB, save {save_s:.3f} s, load {load_s:.3f} s")
    try:
        import torch
    except ImportError:
        torch = None
        print("torch is not importable here: no peer figures")
    if torch is not None:
        _, arrays = dnn.serialization.read_file(path)
        tensors = {k: torch.from_numpy(np.array(a)) for k, a in arrays.items()}
        tpath = os.path.join(folder, "alexnet.pt")
        tsave = median_time(lambda: torch.save(tensors, tpath), args.reps, warmup=1)
        tload = median_time(lambda: torch.load(tpath), args.reps, warmup=1)
        res["torch"] = {"version": torch.__version__, "bytes": os.path.getsize(tpath), "save_s": tsave,
                        "load_s": tload}
        res["ratio"] = {"bytes": res["dnn"]["bytes"] / res["torch"]["bytes"], "save": save_s / tsave,
                        "load": load_s / tload}
        print(f"torch.save:     {res['torch']['bytes'] / 2**20:.1f} MiB, save {tsave:.3f} s, load {tload:.3f} s")
        print(f"dnn / torch:    size {res['ratio']['bytes']:.3f}, save {res['ratio']['save']:.2f}x, "
              f"load {res['ratio']['load']:.2f}x")
    if args.out:
        write_json(args.out, res)


if __name__ == "__main__":
    main()
