"""The IDX format of the MNIST files, and the four standard MNIST files.

An IDX file is: two zero bytes, a type code, the number of dimensions d,
then d big-endian uint32 sizes, then the values (big-endian) in row-major
order. The reader checks every part of that before it trusts the data: the
magic bytes, the type code, that the sizes are positive, and that the file
holds exactly the bytes the header announces (a truncated file and one with
trailing bytes are both refused).
"""
import math
import os

import numpy as np

from .errors import DataError
from .files import find_file, read_bytes, write_atomically

#: IDX type code -> big-endian numpy dtype
IDX_TYPES = {0x08: np.dtype(">u1"), 0x09: np.dtype(">i1"), 0x0B: np.dtype(">i2"),
             0x0C: np.dtype(">i4"), 0x0D: np.dtype(">f4"), 0x0E: np.dtype(">f8")}
#: the dtype -> IDX type code (for write_idx)
_CODES = {dt.newbyteorder("="): code for code, dt in IDX_TYPES.items()}

MNIST_FILES = {
    "train_images": ("train-images-idx3-ubyte", "train-images.idx3-ubyte"),
    "train_labels": ("train-labels-idx1-ubyte", "train-labels.idx1-ubyte"),
    "test_images": ("t10k-images-idx3-ubyte", "t10k-images.idx3-ubyte"),
    "test_labels": ("t10k-labels-idx1-ubyte", "t10k-labels.idx1-ubyte"),
}


def parse_idx(raw, what="IDX data"):
    """The array held by the IDX bytes `raw` (native byte order)."""
    if len(raw) < 4:
        raise DataError(f"{what}: {len(raw)} bytes is too short for an IDX header")
    if raw[0] != 0 or raw[1] != 0:
        raise DataError(f"{what}: bad magic number {raw[:4].hex()} (an IDX file starts with two zero bytes)")
    code, ndim = raw[2], raw[3]
    if code not in IDX_TYPES:
        raise DataError(f"{what}: unknown IDX type code 0x{code:02x}")
    if ndim == 0:
        raise DataError(f"{what}: an IDX file with 0 dimensions holds no array")
    header = 4 + 4 * ndim
    if len(raw) < header:
        raise DataError(f"{what}: truncated header ({len(raw)} bytes, the header needs {header})")
    shape = tuple(int(v) for v in np.frombuffer(raw, dtype=">u4", count=ndim, offset=4))
    if 0 in shape:
        raise DataError(f"{what}: header has an empty dimension {shape}")
    dtype = IDX_TYPES[code]
    expected = header + math.prod(shape) * dtype.itemsize      # Python ints: an int64 product wraps
    if len(raw) != expected:
        kind = "truncated" if len(raw) < expected else "longer than its header says"
        raise DataError(f"{what}: {kind}: {len(raw)} bytes, a {shape} array of {dtype.name} needs {expected}")
    data = np.frombuffer(raw, dtype=dtype, offset=header).reshape(shape)
    return data.astype(dtype.newbyteorder("="))


def read_idx(path):
    """The numpy array stored in the IDX file at `path` (gzip-compressed or not)."""
    return parse_idx(read_bytes(path), os.fspath(path))


def write_idx(path, array):
    """Write `array` as an IDX file (uncompressed, atomically: a crash leaves the old file or the
    whole new one); the inverse of read_idx."""
    a = np.asarray(array)
    code = _CODES.get(a.dtype.newbyteorder("="))
    if code is None or a.ndim == 0 or a.ndim > 255:
        raise DataError(f"write_idx: cannot store a {a.ndim}-D array of {a.dtype} as IDX")
    if 0 in a.shape:
        # (read_idx refuses empty dimensions, as a truncated or corrupt header has them)
        raise DataError(f"write_idx: cannot store the empty array of shape {a.shape}: IDX readers refuse it")
    head = bytes([0, 0, code, a.ndim]) + np.asarray(a.shape, dtype=">u4").tobytes()
    try:
        write_atomically(path, [head, np.ascontiguousarray(a, dtype=IDX_TYPES[code]).tobytes()])
    except OSError as exc:
        raise DataError(f"write_idx: cannot write {os.fspath(path)!r} ({exc})") from exc


def _mnist_images(images, labels, what):
    if images.ndim != 3 or images.dtype != np.uint8:
        raise DataError(f"{what}: MNIST images are a 3-D uint8 array, got {images.ndim}-D {images.dtype}")
    if labels.ndim != 1 or labels.dtype != np.uint8:
        raise DataError(f"{what}: MNIST labels are a 1-D uint8 array, got {labels.ndim}-D {labels.dtype}")
    if images.shape[0] != labels.shape[0]:
        raise DataError(f"{what}: {images.shape[0]} images but {labels.shape[0]} labels")
    if labels.size and labels.max() > 9:
        raise DataError(f"{what}: labels must be digits 0..9, found {int(labels.max())}")
    x = (images.astype(np.float32) * np.float32(1 / 255))[:, None, :, :]
    return x, labels.astype(np.int64)


def load_mnist(directory):
    """The four standard MNIST files of `directory` (each optionally .gz):
    ((x_train, y_train), (x_test, y_test)), x float32 (N, 1, 28, 28) in [0, 1], y int64 (N,)."""
    arrays = {key: read_idx(find_file(directory, names, "load_mnist")) for key, names in MNIST_FILES.items()}
    return (_mnist_images(arrays["train_images"], arrays["train_labels"], f"{directory} (training set)"),
            _mnist_images(arrays["test_images"], arrays["test_labels"], f"{directory} (test set)"))
