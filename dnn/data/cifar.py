"""CIFAR-10 binary batches (data_batch_1.bin ... data_batch_5.bin, test_batch.bin).

Each record is 3073 bytes: the label (0..9), then 3072 pixel bytes, the
32x32 red, green and blue planes in turn (CHW order, as dnn wants). The
file size must be a whole number of records and every label a class.
"""
import os

import numpy as np

from .errors import DataError
from .files import checked_path, find_file, read_bytes

IMAGE_SHAPE = (3, 32, 32)
RECORD = 1 + 3 * 32 * 32
CLASSES = 10
TRAIN_FILES = tuple(f"data_batch_{k}.bin" for k in range(1, 6))
TEST_FILE = "test_batch.bin"


def parse_cifar10(raw, what="CIFAR-10 data"):
    """(x float32 (N, 3, 32, 32) in [0, 1], y int64 (N,)) from the bytes of a binary batch."""
    if not raw or len(raw) % RECORD:
        raise DataError(f"{what}: {len(raw)} bytes is not a whole number of {RECORD}-byte CIFAR-10 records")
    records = np.frombuffer(raw, dtype=np.uint8).reshape(-1, RECORD)
    labels = records[:, 0]
    if labels.max() >= CLASSES:
        k = int(np.argmax(labels >= CLASSES))
        raise DataError(f"{what}: record {k} has label {int(labels[k])}, CIFAR-10 labels are 0..9")
    x = records[:, 1:].reshape((-1,) + IMAGE_SHAPE).astype(np.float32) * np.float32(1 / 255)
    return x, labels.astype(np.int64)


def read_cifar10_batch(path):
    """One CIFAR-10 binary batch file (optionally .gz): (x, y) as parse_cifar10."""
    path = checked_path(path, "read_cifar10_batch")
    return parse_cifar10(read_bytes(path), path)


def load_cifar10(directory):
    """((x_train, y_train), (x_test, y_test)) from the binary batches in `directory` (or in its
    cifar-10-batches-bin folder, as the archive unpacks)."""
    directory = checked_path(directory, "load_cifar10")
    inner = os.path.join(directory, "cifar-10-batches-bin")
    if os.path.isdir(inner):
        directory = inner
    train = [read_cifar10_batch(find_file(directory, (name,), "load_cifar10")) for name in TRAIN_FILES]
    test = read_cifar10_batch(find_file(directory, (TEST_FILE,), "load_cifar10"))
    return (np.concatenate([x for x, _ in train]), np.concatenate([y for _, y in train])), test
