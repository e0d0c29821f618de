"""MagmaDNN's MNIST multi-layer perceptron: 784 - 528 (sigmoid) x L - 10 (softmax), SGD.

    python examples/mnist_mlp.py                         # 5,000 real digits (4,000 train, 1,000 test)
    python examples/mnist_mlp.py --data ~/mnist          # the full MNIST IDX files
    mpiexec -n 4 python examples/mnist_mlp.py --layers 2 --dtype float16

The settings are those of the MagmaDNN paper's MNIST test (60,000 digits):
learning rate 0.05, weight decay 0.001, batches of 100, 5 epochs; on the
5,000-digit subset pass --lr 0.5. With P workers each batch
is split into row blocks (data parallelism); `--parallel model` splits the
hidden layers' weights into column blocks instead, `auto` lets the cost model
choose per layer.
"""
import argparse

import numpy as np

import dmath
import dnn
from dnn import layers as L


def load(data_dir, seed):
    if data_dir:
        return dnn.data.load_mnist(data_dir)
    x, y = dnn.data.load_mnist_5k()                 # sorted by label: shuffle before splitting
    perm = np.random.default_rng(seed).permutation(len(y))
    x, y = x[perm], y[perm]
    return (x[:4000], y[:4000]), (x[4000:], y[4000:])


def build(hidden_layers, units, dtype, parallel, lr):
    layers = [L.Input((1, 28, 28)), L.Flatten()]
    for _ in range(hidden_layers):
        layers += [L.Dense(units, parallel=parallel), L.Activation("sigmoid")]
    layers += [L.Dense(10), L.Output("softmax")]
    return dnn.Sequential(layers, loss="cross_entropy", dtype=dtype,
                          optimizer=dnn.optim.SGD(lr=lr, weight_decay=0.001))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", help="a folder with the MNIST IDX files (default: the 5,000-digit subset)")
    ap.add_argument("--layers", type=int, default=1, help="hidden layers L (default 1)")
    ap.add_argument("--units", type=int, default=528)
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--lr", type=float, default=0.05, help="learning rate (the paper's 0.05 learns slowly "
                    "from 4,000 digits: 40 steps an epoch; 0.5 reaches 85 to 90%% in 5 epochs)")
    ap.add_argument("--batch-size", type=int, default=100)
    ap.add_argument("--dtype", default="float32", choices=["float16", "float32", "float64"])
    ap.add_argument("--parallel", default="data", choices=["data", "model", "auto"])
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    dmath.init()                                     # ranks > 0 serve from here on: only rank 0 loads data
    dmath.random.seed(args.seed)
    (x, y), (xt, yt) = load(args.data, args.seed)
    model = build(args.layers, args.units, args.dtype, args.parallel, args.lr)
    model.summary()
    model.fit(x, y, batch_size=args.batch_size, epochs=args.epochs, validation_data=(xt, yt))
    result = model.evaluate(xt, yt)
    print(f"test accuracy {result['accuracy']:.4f} (loss {result['loss']:.4f}) on {len(yt)} held-out digits, "
          f"{dmath.num_workers()} worker(s)")


if __name__ == "__main__":
    main()
