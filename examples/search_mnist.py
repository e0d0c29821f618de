"""Hyperparameter search on real digits: a grid, then a random search, trials run concurrently.

    mpiexec -n 4 python examples/search_mnist.py                 # 4 groups of 1 worker
    mpiexec -n 4 python examples/search_mnist.py --per-trial 2   # 2 groups of 2 (data parallel inside)
    python examples/search_mnist.py                              # 1 worker: the trials one after another

An MLP on the 5,000 real MNIST digits (4,000 train, 1,000 held out). The
grid tries every learning rate with every hidden width; the random search
draws the learning rate log-uniformly, the width as an integer and the
dropout rate uniformly. Each finished trial prints a line; the best
configurations come first in the returned list (by validation loss).
"""
import argparse

import numpy as np

import dmath
import dnn
from dnn import layers as L


def build(p):
    """A compiled model for hyperparameters p (dnn.search seeds dmath.random before each call)."""
    return dnn.Sequential([
        L.Input((1, 28, 28)), L.Flatten(),
        L.Dense(p["units"]), L.Activation("relu"), L.Dropout(p.get("dropout", 0.0)),
        L.Dense(10), L.Output("softmax")],
        optimizer=dnn.optim.SGD(lr=p["lr"], momentum=0.9), dtype="float32")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--per-trial", type=int, default=1, help="workers per trial (must divide the worker count)")
    ap.add_argument("--epochs", type=int, default=3)
    args = ap.parse_args()
    dmath.init()
    x, y = dnn.data.load_mnist_5k()
    perm = np.random.default_rng(0).permutation(len(y))     # the digits come sorted by label
    x, y = x[perm], y[perm]
    train, val = (x[:4000], y[:4000]), (x[4000:], y[4000:])
    common = dict(epochs=args.epochs, batch_size=64, validation_data=val, workers_per_trial=args.per_trial)
    groups = dmath.num_workers() // args.per_trial
    print(f"{dmath.num_workers()} worker(s): {groups} group(s) of {args.per_trial}")

    print("grid search:")
    grid = dnn.search.grid(build, {"lr": [0.3, 0.1, 0.01], "units": [32, 128]}, *train, **common)
    print("random search:")
    space = {"lr": ("log", 0.003, 0.3), "units": (16, 256), "dropout": (0.0, 0.5)}
    rand = dnn.search.random(build, space, *train, trials=6, seed=1, **common)

    for name, results in (("grid", grid), ("random", rand)):
        best = results[0]
        print(f"best of the {name} search: {best['params']}  val_loss {best['val_loss']:.4f}  "
              f"val_accuracy {best['val_accuracy']:.4f}  ({best['seconds']:.1f} s on worker(s) {best['workers']})")


if __name__ == "__main__":
    main()
