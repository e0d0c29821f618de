"""The IDX format of the MNIST files, and the four standard MNIST files.

An IDX file is: two zero bytes, a type code, the number of dimensions d,
then d big-endian uint32 sizes, then the values (big-endian) in row-major
order. The reader checks every part of that before it trusts the data: the
magic bytes, the type code, that the sizes are positive, and that the file
holds exactly the bytes the header announces (a truncated file and one with
trailing bytes are both refused).
"""
import gzip
import io
import math
import os
import zlib

import numpy as np

from .errors import DataError
from .files import (PIECE_BYTES, check_fits_memory, checked_path, find_file, is_gzip, open_data_file,
                    write_atomically)

#: IDX type code -> big-endian numpy dtype
IDX_TYPES = {0x08: np.dtype(">u1"), 0x09: np.dtype(">i1"), 0x0B: np.dtype(">i2"),
             0x0C: np.dtype(">i4"), 0x0D: np.dtype(">f4"), 0x0E: np.dtype(">f8")}
#: the dtype -> IDX type code (for write_idx)
_CODES = {dt.newbyteorder("="): code for code, dt in IDX_TYPES.items()}


def _numpy_max_dims():
    """The most dimensions a numpy array may have (64 in numpy 2, 32 before)."""
    n = 32
    while n < 255:
        try:
            np.empty((1,) * (n + 1), dtype=np.uint8)
        except ValueError:
            break
        n += 1
    return n


#: the most dimensions a header may announce (numpy's limit; the format's byte allows 255)
MAX_DIMS = _numpy_max_dims()

MNIST_FILES = {
    "train_images": ("train-images-idx3-ubyte", "train-images.idx3-ubyte"),
    "train_labels": ("train-labels-idx1-ubyte", "train-labels.idx1-ubyte"),
    "test_images": ("t10k-images-idx3-ubyte", "t10k-images.idx3-ubyte"),
    "test_labels": ("t10k-labels-idx1-ubyte", "t10k-labels.idx1-ubyte"),
}


def parse_idx(raw, what="IDX data"):
    """The array held by the IDX bytes `raw` (native byte order)."""
    return _read_idx(io.BytesIO(raw), what, len(raw))


def _read_idx(f, what, size):
    """The array of the IDX data the binary stream `f` holds, header first: nothing past the header is
    read before the header is checked. size: the bytes `f` holds (a file's size: compared with what the
    header announces before any value is read), or None where only the end tells (gzip data: no more
    than the header announces and one byte are decompressed, so a small file that decompresses to
    gigabytes is refused after one byte too many)."""
    head = f.read(4)
    if len(head) < 4:
        raise DataError(f"{what}: {len(head)} bytes is too short for an IDX header")
    if head[0] != 0 or head[1] != 0:
        raise DataError(f"{what}: bad magic number {head.hex()} (an IDX file starts with two zero bytes)")
    code, ndim = head[2], head[3]
    if code not in IDX_TYPES:
        raise DataError(f"{what}: unknown IDX type code 0x{code:02x}")
    if ndim == 0:
        raise DataError(f"{what}: an IDX file with 0 dimensions holds no array")
    if ndim > MAX_DIMS:
        # (the format's byte allows 255; numpy's arrays stop at 64)
        raise DataError(f"{what}: the header announces {ndim} dimensions; arrays have at most {MAX_DIMS}")
    header = 4 + 4 * ndim
    dims = f.read(4 * ndim)
    if len(dims) < 4 * ndim:
        raise DataError(f"{what}: truncated header ({4 + len(dims)} bytes, the header needs {header})")
    shape = tuple(int(v) for v in np.frombuffer(dims, dtype=">u4"))
    if 0 in shape:
        raise DataError(f"{what}: header has an empty dimension {shape}")
    dtype = IDX_TYPES[code]
    expected = header + math.prod(shape) * dtype.itemsize      # Python ints: an int64 product wraps
    if size is not None and size != expected:
        kind = "truncated" if size < expected else "longer than its header says"
        raise DataError(f"{what}: {kind}: {size} bytes, a {shape} array of {dtype.name} needs {expected}")
    check_fits_memory(what, expected - header, f"the header announces a {shape} array of {dtype.name}:")
    if size is None:
        values = gunzip_rest(f, what, expected - header, shape, dtype)
    else:
        values = f.read(expected - header)
        if len(values) != expected - header:          # (the file shrank since its size was taken)
            raise DataError(f"{what}: truncated: {header + len(values)} bytes, a {shape} array of {dtype.name} "
                            f"needs {expected}")
    data = np.frombuffer(values, dtype=dtype).reshape(shape)
    return data.astype(dtype.newbyteorder("="))


def gunzip_rest(z, what, nbytes, shape, dtype):
    """The `nbytes` value bytes that follow the header in the open gzip stream `z` (a GzipFile): read
    in pieces, then one byte more, which must not be there (the end of the stream, its CRC checked)."""
    out = bytearray()
    while len(out) < nbytes:
        piece = z.read(min(PIECE_BYTES, nbytes - len(out)))
        if not piece:
            raise DataError(f"{what}: truncated: {4 + 4 * len(shape) + len(out)} bytes decompressed, a {shape} "
                            f"array of {dtype.name} needs {4 + 4 * len(shape) + nbytes}")
        out += piece
    if z.read(1):
        raise DataError(f"{what}: longer than its header says: more than {4 + 4 * len(shape) + nbytes} bytes "
                        f"decompressed (a {shape} array of {dtype.name} needs {4 + 4 * len(shape) + nbytes}): "
                        f"refused without decompressing the rest")
    return out


def read_idx(path):
    """The numpy array stored in the IDX file at `path` (gzip-compressed or not). The file's size (or,
    compressed, what it decompresses to) must be what its header announces: it is checked before the
    values are read (or no more than that is decompressed), so a file of another size costs no memory."""
    path = checked_path(path, "read_idx")
    with open_data_file(path) as f:
        gz = is_gzip(f.read(2))
        f.seek(0)
        try:
            if not gz:
                return _read_idx(f, path, os.fstat(f.fileno()).st_size)
            try:
                with gzip.GzipFile(fileobj=f, mode="rb") as z:
                    return _read_idx(z, path, None)
            except (OSError, EOFError, zlib.error) as exc:
                raise DataError(f"{path}: corrupt or truncated gzip data ({exc})") from exc
        except MemoryError as exc:
            raise DataError(f"{path}: not enough memory to read it ({os.fstat(f.fileno()).st_size:,} bytes"
                            f"{', gzip-compressed' if gz else ''})") from exc
        except OSError as exc:
            raise DataError(f"{path}: cannot be read ({exc})") from exc


def write_idx(path, array):
    """Write `array` as an IDX file (uncompressed, atomically: a crash leaves the old file or the
    whole new one); the inverse of read_idx."""
    path = checked_path(path, "write_idx")
    a = np.asarray(array)
    code = _CODES.get(a.dtype.newbyteorder("="))
    if code is None or a.ndim == 0:
        raise DataError(f"write_idx: cannot store a {a.ndim}-D array of {a.dtype} as IDX")
    if 0 in a.shape:
        # (read_idx refuses empty dimensions, as a truncated or corrupt header has them)
        raise DataError(f"write_idx: cannot store the empty array of shape {a.shape}: IDX readers refuse it")
    head = bytes([0, 0, code, a.ndim]) + np.asarray(a.shape, dtype=">u4").tobytes()
    try:
        write_atomically(path, [head, np.ascontiguousarray(a, dtype=IDX_TYPES[code]).tobytes()])
    except OSError as exc:
        raise DataError(f"write_idx: cannot write {path!r} ({exc})") from exc


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
    directory = checked_path(directory, "load_mnist")
    arrays = {key: read_idx(find_file(directory, names, "load_mnist")) for key, names in MNIST_FILES.items()}
    return (_mnist_images(arrays["train_images"], arrays["train_labels"], f"{directory} (training set)"),
            _mnist_images(arrays["test_images"], arrays["test_labels"], f"{directory} (test set)"))
