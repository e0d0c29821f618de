"""Reading whole data files as bytes, gzip-compressed or not (detected from the content)."""
import gzip
import os
import zlib

from .errors import DataError

_GZIP_MAGIC = b"\x1f\x8b"


def decompress_if_gzip(raw, what):
    """`raw` itself, or its gzip decompression when it starts with the gzip magic number."""
    if raw[:2] != _GZIP_MAGIC:
        return raw
    try:
        return gzip.decompress(raw)
    except (OSError, EOFError, zlib.error) as exc:
        raise DataError(f"{what}: corrupt or truncated gzip data ({exc})") from exc


def read_bytes(path):
    """The content of the file at `path`, decompressed when it is gzip data."""
    path = os.fspath(path)
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except FileNotFoundError as exc:
        raise DataError(f"{path}: no such file") from exc
    except OSError as exc:
        raise DataError(f"{path}: cannot be read ({exc})") from exc
    return decompress_if_gzip(raw, path)


def find_file(directory, names, what):
    """The first of `names` (each also tried with '.gz') that exists in `directory`."""
    directory = os.fspath(directory)
    for name in names:
        for candidate in (name, name + ".gz"):
            path = os.path.join(directory, candidate)
            if os.path.isfile(path):
                return path
    raise DataError(f"{what}: none of {', '.join(names)} (or .gz) in {directory}")
