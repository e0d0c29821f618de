"""Asynchronous SGD on real digits: each worker group trains on batches of its own, a parameter store
on worker 0 applies the gradients as they arrive; synchronous SGD alongside for comparison.

    mpiexec -n 4 python examples/asgd_mnist.py                        # 4 groups of 1 worker, staleness <= 3
    mpiexec -n 4 python examples/asgd_mnist.py --groups 2 --max-staleness 1
    mpiexec -n 2 python examples/asgd_mnist.py --max-staleness 0      # sequential SGD: equals the synchronous run

Both runs start from the same weights with the same optimizer and batch
size. The epoch lines of the asynchronous run add the largest and the mean
staleness of the gradients the store applied (measured on the workers).
Staleness acts like extra momentum: with many groups, lower the momentum or
the learning rate.
"""
import argparse

import numpy as np

import dmath
import dnn
from dnn import layers as L


def build(lr, momentum):
    dmath.random.seed(0)                 # the same initial weights for both runs
    return dnn.Sequential([L.Input((1, 28, 28)), L.Flatten(), L.Dense(528), L.Activation("relu"), L.Dense(10),
                           L.Output("softmax")], optimizer=dnn.optim.SGD(lr=lr, momentum=momentum))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--groups", type=int, default=None, help="worker groups (default: one per worker)")
    ap.add_argument("--max-staleness", type=int, default=None, help="default: groups - 1")
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--momentum", type=float, default=0.0)
    args = ap.parse_args()

    dmath.init()                         # ranks > 0 serve from here on: only rank 0 loads data
    x, y = dnn.data.load_mnist_5k()      # sorted by label: shuffle before splitting
    perm = np.random.default_rng(0).permutation(len(y))
    x, y = x[perm], y[perm]
    train, test = dnn.data.Dataset(x[:4000], y[:4000]), dnn.data.Dataset(x[4000:], y[4000:])

    results = {}
    for asynchronous in (False, True):
        name = "asynchronous" if asynchronous else "synchronous"
        print(f"--- {name} SGD on {dmath.num_workers()} worker(s)")
        model = build(args.lr, args.momentum)
        options = dict(asynchronous=True, groups=args.groups, max_staleness=args.max_staleness) \
            if asynchronous else {}
        hist = model.fit(train, batch_size=args.batch_size, epochs=args.epochs, validation_data=test, verbose=2,
                         **options)
        seconds = sum(len(train) / s for s in hist["samples_per_s"])
        results[name] = (model.evaluate(test)["accuracy"], seconds)
    for name, (acc, seconds) in results.items():
        print(f"{name:>12}: held-out accuracy {acc:.4f} after {args.epochs} epochs, {seconds:.2f} s of training")


if __name__ == "__main__":
    main()
