"""GoogLeNet (Inception v1) from the model zoo, trained on the real MNIST digits, and its weights
exchanged with PyTorch by name.

    python examples/googlenet.py                       # 5,000 digits padded to 32x32, 2 epochs on the CPU
    mpiexec -n 2 python examples/googlenet.py
    python examples/googlenet.py --device gpu --dtype float16 --epochs 10
    python examples/googlenet.py --save weights.npz    # torchvision's names: torch.load-free exchange

dnn.models.googlenet builds torchvision's network (nine Inception modules,
each four branches joined by L.Concatenate, batch norm after every
convolution, ceil-mode max pooling) as a dnn.Model graph whose layers carry
torchvision's module names, so `model.state_dict()` holds 'conv1.conv.weight',
'inception3a.branch2.1.bn.running_mean', ... with NumPy values: written to an
.npz file here, it loads into torchvision's googlenet of the same shapes (10
classes, its conv1 taking one channel) with
`net.load_state_dict({k: torch.from_numpy(v) for k, v in np.load(f).items()})`,
and `model.load_state_dict(...)` reads PyTorch's the same way.
"""
import argparse

import numpy as np

import dmath
import dnn
from mnist_mlp import load          # the digits: 4,000 to train on, 1,000 held out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--dtype", default="float32", choices=["float16", "float32", "float64"])
    ap.add_argument("--device", default=None, choices=["cpu", "gpu"])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--save", help="write the trained weights, keyed by torchvision's names, to this .npz file")
    args = ap.parse_args()

    dmath.init(device=args.device)
    dmath.random.seed(args.seed)
    (x, y), (xt, yt) = load(None, args.seed)
    # 28x28 -> 32x32: the smallest images GoogLeNet's pooling takes down to 1x1
    x, xt = (np.pad(a.reshape(-1, 1, 28, 28), ((0, 0), (0, 0), (2, 2), (2, 2))) for a in (x, xt))
    model = dnn.models.googlenet(num_classes=10, input_shape=(1, 32, 32), dtype=args.dtype,
                                 optimizer=dnn.optim.SGD(lr=0.05, momentum=0.9, weight_decay=1e-4))
    print(f"GoogLeNet: {model.count_params():,} parameters, {len(model.layers)} layers")
    model.fit(x, y, batch_size=args.batch_size, epochs=args.epochs, validation_data=(xt, yt))
    result = model.evaluate(xt, yt)
    print(f"test accuracy {result['accuracy']:.4f} (loss {result['loss']:.4f}) on {len(yt)} held-out digits, "
          f"{dmath.num_workers()} worker(s)")
    if args.save:
        np.savez(args.save, **model.state_dict())
        print(f"saved {len(model.state_dict())} tensors under torchvision's names to {args.save}")


if __name__ == "__main__":
    main()
