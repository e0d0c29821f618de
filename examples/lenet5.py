"""LeNet-5 on MNIST: two convolution + pooling stages, then 120 - 84 - 10 dense layers.

    python examples/lenet5.py                           # 5,000 real digits (4,000 train, 1,000 test)
    mpiexec -n 4 python examples/lenet5.py --epochs 3   # data parallel over 4 workers
    python examples/lenet5.py --data ~/mnist            # the full MNIST IDX files

LeCun et al. (1998) with today's defaults: ReLU, max pooling, Adam. The
convolutions are data parallel (the batch in row blocks); `--dense-parallel
model` splits the 120- and 84-unit layers into column blocks ("one weird
trick": convolutions data parallel, fully-connected layers model parallel).
"""
import argparse

import numpy as np

import dmath
import dnn
from dnn import layers as L


def build(dtype, dense_parallel):
    return dnn.Sequential([
        L.Input((1, 28, 28)),
        L.Conv2D(6, 5, padding="same"), L.Activation("relu"), L.Pool2D(2, mode="max"),     # 6 x 14 x 14
        L.Conv2D(16, 5), L.Activation("relu"), L.Pool2D(2, mode="max"),                     # 16 x 5 x 5
        L.Flatten(),
        L.Dense(120, parallel=dense_parallel), L.Activation("relu"),
        L.Dense(84, parallel=dense_parallel), L.Activation("relu"),
        L.Dense(10), L.Output("softmax"),
    ], loss="cross_entropy", dtype=dtype, optimizer=dnn.optim.Adam(lr=0.002))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", help="a folder with the MNIST IDX files (default: the 5,000-digit subset)")
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--dtype", default="float32", choices=["float16", "float32", "float64"])
    ap.add_argument("--dense-parallel", default="data", choices=["data", "model", "auto"])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--save", help="write the trained model to this file")
    args = ap.parse_args()

    dmath.init()
    dmath.random.seed(args.seed)
    if args.data:
        (x, y), (xt, yt) = dnn.data.load_mnist(args.data)
    else:
        x, y = dnn.data.load_mnist_5k()
        perm = np.random.default_rng(args.seed).permutation(len(y))
        (x, y), (xt, yt) = (x[perm[:4000]], y[perm[:4000]]), (x[perm[4000:]], y[perm[4000:]])
    model = build(args.dtype, args.dense_parallel)
    model.summary()
    model.fit(x, y, batch_size=args.batch_size, epochs=args.epochs, validation_data=(xt, yt))
    result = model.evaluate(xt, yt)
    print(f"test accuracy {result['accuracy']:.4f} (loss {result['loss']:.4f}) on {len(yt)} held-out digits, "
          f"{dmath.num_workers()} worker(s)")
    if args.save:
        model.save(args.save)
        print(f"saved to {args.save}")


if __name__ == "__main__":
    main()
