"""Data for dnn: file readers, synthetic sets and a prefetching batch loader.

    from dnn import data
    (x, y), (xt, yt) = data.load_mnist("/path/to/mnist")       # the four IDX files, .gz or not
    x, y = data.load_mnist_5k()                                 # 5,000 real digits, no dataset site needed
    x, y = data.read_csv("train.csv", label_column=0)           # MagmaDNN's read_csv_to_tensor
    (x, y), (xt, yt) = data.load_cifar10("/path/to/cifar-10-batches-bin")
    x, y = data.synthetic_classification(1000, (1, 8, 8), classes=3, seed=0)
    train = data.Dataset(x, y, augment=data.Augment(shift=1))  # placed on the workers once (see dataset.py)
    for xb, yb in data.DataLoader(x, y, batch_size=100, shuffle=True, seed=1): ...
    folder = data.ImageFolder("/data/imagenet/train", image_size=224)  # decoded by the workers (image_folder.py)

Images come as float32 (N, C, H, W) in [0, 1] and labels as int64 (N,).
Every reader checks its input and raises DataError rather than return data
it cannot trust; nothing is ever unpickled.
"""
from .cifar import load_cifar10, read_cifar10_batch
from .csv_reader import read_csv
from .errors import DataError
from .idx import load_mnist, read_idx, write_idx
from .dataset import Augment, Dataset, Feed
from .image_folder import ImageFolder
from .loader import DataLoader
from .mnist_5k import load_mnist_5k
from .synthetic import synthetic_classification

__all__ = ["DataError", "read_idx", "write_idx", "load_mnist", "read_csv", "read_cifar10_batch", "load_cifar10",
           "synthetic_classification", "load_mnist_5k", "DataLoader", "Dataset", "Augment", "Feed",
           "ImageFolder"]
