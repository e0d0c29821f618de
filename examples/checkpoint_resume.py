"""Checkpoint-restart at another worker count: the resumed run is the uninterrupted one.

    python examples/checkpoint_resume.py start  --dir ckpt        # epoch 1 at 1 worker, checkpoints
    mpiexec -n 3 python examples/checkpoint_resume.py resume --dir ckpt   # epochs 2-3 at 3 workers
    python examples/checkpoint_resume.py straight --dir ckpt      # epochs 1-3 in one go, compared

A small CNN with dropout, Adam with weight decay and a warm-up, trained in
float64 on the 5,000 real MNIST digits (4,000 train, 1,000 held out),
shuffled. `start` trains one epoch with a ModelCheckpoint that saves every
20 steps (keeping the last 2) and at the epoch's end; `resume` loads the
epoch checkpoint in a new job (any worker count) and fits epochs=3 with
initial_epoch=1; `straight` trains 3 epochs from the same seed and prints
how far its weights are from the resumed run's (a few 1e-15: only the order
of sums differs between worker counts).
"""
import argparse
import os

import numpy as np

import dmath
import dnn
from dnn import layers as L


def data():
    x, y = dnn.data.load_mnist_5k()
    perm = np.random.default_rng(0).permutation(len(y))
    x, y = x[perm].astype(np.float64), y[perm]          # load_mnist_5k already scales pixels to [0, 1]
    return (x[:4000], y[:4000]), (x[4000:], y[4000:])


def build():
    dmath.random.seed(3)
    return dnn.Sequential([
        L.Input((1, 28, 28)), L.Conv2D(8, 5, padding="same"), L.Activation("relu"), L.Pool2D(2),
        L.Flatten(), L.Dense(64), L.Activation("relu"), L.Dropout(0.25), L.Dense(10), L.Output("softmax")],
        dtype="float64",
        optimizer=dnn.optim.Adam(lr=2e-3, weight_decay=1e-4, schedule=dnn.optim.schedules.Warmup(20)))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("phase", choices=("start", "resume", "straight"))
    ap.add_argument("--dir", default="ckpt")
    args = ap.parse_args()
    dmath.init()
    (x, y), val = data()
    os.makedirs(args.dir, exist_ok=True)
    epoch_file = os.path.join(args.dir, "epoch{epoch}.dnn")
    fit = dict(batch_size=100, validation_data=val, verbose=2)
    if args.phase == "start":
        model = build()
        steps = dnn.callbacks.ModelCheckpoint(os.path.join(args.dir, "step{step}.dnn"), unit="step", every=20,
                                              keep=2)
        model.fit(x, y, epochs=1, callbacks=[steps, dnn.callbacks.ModelCheckpoint(epoch_file)], **fit)
        print("kept step checkpoints:", steps.written)
    elif args.phase == "resume":
        model = dnn.load(epoch_file.format(epoch=1))
        print(f"resuming at epoch {model.epochs_trained} on {dmath.num_workers()} worker(s)")
        model.fit(x, y, epochs=3, initial_epoch=1, **fit)
        model.save(os.path.join(args.dir, "resumed.dnn"))
    else:
        model = build()
        model.fit(x, y, epochs=3, **fit)
        resumed = os.path.join(args.dir, "resumed.dnn")
        if os.path.exists(resumed):
            other = dnn.load(resumed)
            diff = max(float(np.abs(a - b).max()) for a, b in zip(model.get_weights(), other.get_weights()))
            print(f"largest difference from the resumed run's weights: {diff:.3g}")


if __name__ == "__main__":
    main()
