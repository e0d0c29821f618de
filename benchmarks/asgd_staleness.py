"""Asynchronous SGD's accuracy against synchronous SGD's at every max_staleness up to P + 1, under each
staleness rule of dnn.training.asgd (issue 35, item 9).

    mpiexec -n P python benchmarks/asgd_staleness.py OUTDIR [--device cpu|gpu] [--rules both,momentum,lr,none]
        [--epochs 6] [--train 4000] [--lr 0.1] [--momentum 0.9] [--batch-size 50] [--seeds 0]

Data: the 5,000 real MNIST digits (dnn.data.load_mnist_5k) shuffled with seed 0: the first --train to
train on, the last 1,000 held out. Model: a 784-64-10 relu MLP, SGD(lr, momentum), the same initial
weights (dmath.random.seed) for every run. The peer is synchronous SGD with the same settings in the
same job (data parallel over the P workers). For each rule and each max_staleness k in 0..P+1, one
asynchronous fit with one group per worker; reported: held-out accuracy, its difference from the
synchronous one, and the epoch's mean staleness. Writes OUTDIR/asgd_staleness_p<P>_<device>.json.
"""
import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dmath                                    # noqa: E402
import dnn                                      # noqa: E402
from dnn.training import asgd                   # noqa: E402
from dnn import layers as L                     # noqa: E402
from common import environment, write_json      # noqa: E402


def fit(train, test, args, seed, **kwargs):
    dmath.random.seed(seed)
    model = dnn.Sequential([L.Input((1, 28, 28)), L.Flatten(), L.Dense(64), L.Activation("relu"), L.Dense(10),
                            L.Output("softmax")], optimizer=dnn.optim.SGD(lr=args.lr, momentum=args.momentum),
                           seed=seed)
    t0 = time.perf_counter()
    hist = model.fit(train, batch_size=args.batch_size, epochs=args.epochs, verbose=0, **kwargs)
    seconds = time.perf_counter() - t0
    return model.evaluate(test)["accuracy"], hist, seconds


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("outdir")
    ap.add_argument("--device", default=None)
    ap.add_argument("--rules", default="both,momentum,lr,none")
    ap.add_argument("--epochs", type=int, default=6)
    ap.add_argument("--train", type=int, default=4000)
    ap.add_argument("--lr", type=float, default=0.1)
    ap.add_argument("--momentum", type=float, default=0.9)
    ap.add_argument("--batch-size", type=int, default=50)
    ap.add_argument("--seeds", default="0")
    args = ap.parse_args()
    dmath.init(args.device)
    P = dmath.num_workers()
    x, y = dnn.data.load_mnist_5k()
    perm = np.random.default_rng(0).permutation(len(y))
    x, y = x[perm], y[perm]
    train, test = dnn.data.Dataset(x[:args.train], y[:args.train]), dnn.data.Dataset(x[-1000:], y[-1000:])
    runs = []
    for seed in (int(s) for s in args.seeds.split(",")):
        sync, _, sync_s = fit(train, test, args, seed)
        print(f"P={P} seed {seed}: synchronous {sync:.4f} ({sync_s:.1f} s)", flush=True)
        for rule in args.rules.split(","):
            asgd.STALENESS_RULE = rule
            for k in range(P + 2):
                acc, hist, seconds = fit(train, test, args, seed, asynchronous=True, max_staleness=k)
                runs.append({"seed": seed, "rule": rule, "max_staleness": k, "accuracy": acc,
                             "synchronous_accuracy": sync, "minus_synchronous": acc - sync,
                             "mean_staleness": hist["mean_staleness"][-1], "seconds": seconds,
                             "synchronous_seconds": sync_s})
                print(f"P={P} seed {seed} rule {rule:8s} k={k}: {acc:.4f} ({acc - sync:+.4f}), mean staleness "
                      f"{hist['mean_staleness'][-1]:.2f}, {seconds:.1f} s", flush=True)
        asgd.STALENESS_RULE = "both"
    worst = {}
    for r in runs:
        worst[r["rule"]] = min(worst.get(r["rule"], 1.0), r["minus_synchronous"])
    os.makedirs(args.outdir, exist_ok=True)
    write_json(os.path.join(args.outdir, f"asgd_staleness_p{P}_{dmath.device()}.json"),
               {"benchmark": "asgd_staleness", "workers": P, "settings": vars(args), "runs": runs,
                "worst_minus_synchronous": worst, "environment": environment(dmath)})
    print("worst accuracy minus synchronous, per rule:", worst)


if __name__ == "__main__":
    main()
