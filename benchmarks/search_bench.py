"""Hyperparameter search throughput: trials per minute on 1 worker group against P groups.

    mpiexec -n P python benchmarks/search_bench.py [--device cpu] [--trials 8] [--epochs 2]
                                                   [--hidden 256] [--reps 5] [--out F.json]

The trials are MLPs (784-hidden-10, SGD with momentum, float32) trained on
the real MNIST digits of dnn.data.load_mnist_5k (3,000 to train, 1,000 to
validate); the configurations differ in learning rate and momentum only, so
every trial does the same work and the ideal speedup of G groups is G. In
one job it times, --reps runs of each (after one warm-up run):

    sequential  the peer: for each configuration, dmath.random.seed, build,
                fit and evaluate, one after another on worker 0 alone
    1 group     dnn.search.grid inside dmath.on_group((0,)): one group of
                one worker (the master), the trials one after another
    P groups    dnn.search.grid with workers_per_trial=1: P groups of one
                worker, the trials concurrent
    1 x P       dnn.search.grid with workers_per_trial=P: one group of P
                workers, each trial data parallel over all of them

and reports trials per minute and the speedups over the 1-group search,
from the fastest of the runs (the arrangements take turns in each round, see
`timed`; on a machine shared with other jobs the fastest run is the one
least disturbed by them; the medians are in the JSON too). It
checks that every configuration gets the same results in every arrangement
of one-worker groups (a trial equals its configuration trained alone).
More ranks than cores oversubscribes the machine; the JSON records both.
"""
import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dmath                                    # noqa: E402
import dnn                                      # noqa: E402
from dnn import layers as L                     # noqa: E402
from common import environment, write_json      # noqa: E402


def digits():
    x, y = dnn.data.load_mnist_5k()
    perm = np.random.default_rng(0).permutation(len(y))
    x, y = x[perm], y[perm]
    return (x[:3000], y[:3000]), (x[4000:], y[4000:])


def builder(hidden):
    def build(p):
        return dnn.Sequential([L.Input((1, 28, 28)), L.Flatten(), L.Dense(hidden), L.Activation("relu"),
                               L.Dense(10), L.Output("softmax")],
                              optimizer=dnn.optim.SGD(lr=p["lr"], momentum=p["momentum"]), dtype="float32")
    return build


def space(trials):
    """`trials` configurations of equal cost: learning rates times two momenta."""
    rates = [round(0.2 / 2 ** k, 5) for k in range((trials + 1) // 2)]
    return {"lr": rates, "momentum": [0.9, 0.5]} if trials > 1 else {"lr": rates, "momentum": [0.9]}


def sequential(build, configs, train, val, epochs, batch):
    """The peer: each configuration fitted and evaluated alone on worker 0, one after another (the
    samples placed once, as the search places them)."""
    out = []
    with dmath.on_group((0,)):
        train, val = dnn.data.Dataset(*train), dnn.data.Dataset(*val)
        for p in configs:
            dmath.random.seed(0)
            model = build(p)
            h = model.fit(train, batch_size=batch, epochs=epochs, validation_data=val, verbose=0)
            out.append((p, h.history["val_loss"][-1]))
    return out


def timed(runs, reps):
    """{name: (seconds of each run, the last result)}: one warm-up run of each, then `reps` rounds that
    run every arrangement once in turn, so that a machine shared with other jobs loads them alike."""
    for fn in runs.values():
        fn()
    out = {name: ([], None) for name in runs}
    for _ in range(reps):
        for name, fn in runs.items():
            t0 = time.perf_counter()
            result = fn()
            out[name] = (out[name][0] + [time.perf_counter() - t0], result)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--trials", type=int, default=8)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--batch", type=int, default=50)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    dmath.init(device=args.device)
    P = dmath.num_workers()
    build = builder(args.hidden)
    train, val = digits()
    sp = space(args.trials)
    configs = dnn.search.grid_configs(sp)
    kw = dict(epochs=args.epochs, batch_size=args.batch, validation_data=val, verbose=0)

    def search(groups_of, scope=None):
        if scope is None:
            return dnn.search.grid(build, sp, *train, workers_per_trial=groups_of, **kw)
        with dmath.on_group(scope):
            return dnn.search.grid(build, sp, *train, workers_per_trial=groups_of, **kw)

    runs = {"sequential": lambda: sequential(build, configs, train, val, args.epochs, args.batch),
            "1 group": lambda: search(1, (0,))}
    if P > 1:
        runs[f"{P} groups"] = lambda: search(1)
        runs[f"1 x {P}"] = lambda: search(P)
    res = {"benchmark": "search", "env": environment(dmath), "cores": os.cpu_count(),
           "oversubscribed": P > (os.cpu_count() or 1), "trials": len(configs), "epochs": args.epochs,
           "batch_size": args.batch, "hidden": args.hidden, "train_samples": len(train[1]),
           "val_samples": len(val[1]), "reps": args.reps, "runs": {}}
    res["load_average_before"] = os.getloadavg()
    results = {}
    for name, (times, out) in timed(runs, args.reps).items():
        best = min(times)
        results[name] = out
        res["runs"][name] = {"best_s": best, "median_s": float(np.median(times)), "times_s": times,
                             "trials_per_min": len(configs) / best * 60}
    res["load_average_after"] = os.getloadavg()
    base = res["runs"]["1 group"]["trials_per_min"]
    for name, r in res["runs"].items():
        r["speedup_vs_1_group"] = r["trials_per_min"] / base
    # the check: a configuration's result does not depend on which one-worker group trained it
    alone = {tuple(p.items()): v for p, v in results["sequential"]}
    for name in runs.keys() - {"sequential", f"1 x {P}"}:
        got = {tuple(r["params"].items()): r["val_loss"] for r in results[name]}
        assert got == alone, (name, got, alone)
    res["best"] = results["1 group"][0]
    print(f"search of {len(configs)} MLP trials ({args.epochs} epochs of {len(train[1])} digits), {P} worker(s), "
          f"{os.cpu_count()} core(s){' (oversubscribed)' if res['oversubscribed'] else ''}:")
    for name, r in res["runs"].items():
        print(f"  {name:>11}: {r['best_s']:6.2f} s (median {r['median_s']:5.2f})  "
              f"{r['trials_per_min']:6.1f} trials/min  "
              f"x{r['speedup_vs_1_group']:.2f} vs 1 group")
    print(f"  best: {res['best']['params']} val_accuracy {res['best']['val_accuracy']:.4f}")
    if args.out:
        write_json(args.out, res)


if __name__ == "__main__":
    main()
