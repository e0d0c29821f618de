"""Matrices read by the workers themselves from a file on a shared file system.

The master checks the file (its header, its size) and sends only the path;
each worker reads its own pieces, converting them to the matrix's dtype, or
memory-maps them (copy-on-write: a write stays private to the process and
never reaches the file). The bytes of the matrix never pass through the
master, and a mapped matrix is read only where and when it is used.
"""
import os
from typing import NamedTuple

import numpy as np

from .. import memory
from ..errors import DMathError
from ..layout import indexset as ix
from ..memory import kinds
from ..runtime import kernel
from .storage import compute_empty, new_shard

#: rows converted per read, so that a large file needs little temporary memory
_READ_BYTES = 64 << 20


class FileSpec(NamedTuple):
    """Where a (rows, cols) matrix lies in a file: its byte offset and stored element type."""
    path: str
    offset: int
    file_dtype: str        # a numpy dtype string with byte order, e.g. '<f4', '|u1'
    rows: int
    cols: int

    @property
    def nbytes(self):
        return self.rows * self.cols * np.dtype(self.file_dtype).itemsize


def npy_spec(path):
    """The FileSpec of a .npy file (C order; 1-D is one row, N-D is (shape[0], the rest)); raises DMathError."""
    try:
        with open(path, "rb") as f:
            version = np.lib.format.read_magic(f)
            if version == (1, 0):
                shape, fortran, dtype = np.lib.format.read_array_header_1_0(f)
            elif version in ((2, 0), (3, 0)):
                shape, fortran, dtype = np.lib.format.read_array_header_2_0(f)
            else:
                raise DMathError(f"{path}: .npy format version {version} is not supported")
            offset = f.tell()
    except FileNotFoundError as exc:
        raise DMathError(f"{path}: no such file") from exc
    except (ValueError, OSError, EOFError) as exc:
        raise DMathError(f"{path}: not a readable .npy file ({exc})") from exc
    if fortran:
        raise DMathError(f"{path}: Fortran-ordered arrays are not supported (save it in C order)")
    if dtype.kind not in "iuf" or dtype.hasobject:
        raise DMathError(f"{path}: holds {dtype}; a matrix file holds integers or floats")
    if len(shape) == 0:
        raise DMathError(f"{path}: holds a scalar, not a matrix")
    rows, cols = (1, shape[0]) if len(shape) == 1 else (shape[0], int(np.prod(shape[1:], dtype=np.int64)))
    return FileSpec(os.path.abspath(path), int(offset), dtype.str, int(rows), int(cols))


def check_size(spec):
    """Raise DMathError unless the file holds the whole matrix (a truncated file is refused, not read)."""
    try:
        size = os.path.getsize(spec.path)
    except OSError as exc:
        raise DMathError(f"{spec.path}: cannot be read ({exc})") from exc
    if size < spec.offset + spec.nbytes:
        raise DMathError(f"{spec.path}: {size:,} bytes, too short for a {spec.rows} x {spec.cols} "
                         f"{np.dtype(spec.file_dtype)} matrix at offset {spec.offset} "
                         f"({spec.offset + spec.nbytes:,} bytes); truncated?")


def _mapped(spec):
    if spec.rows * spec.cols == 0:
        return np.zeros((spec.rows, spec.cols), dtype=spec.file_dtype)
    return np.memmap(spec.path, dtype=spec.file_dtype, mode="c", offset=spec.offset, shape=(spec.rows, spec.cols))


def _read_piece(src, piece, out):
    """Copy the piece's block of the mapped file `src` into `out` (any backend), a band of rows at a time."""
    r, c = ix.selection(piece.rows), ix.selection(piece.cols)
    rows_idx = np.arange(src.shape[0])[r]
    step = max(1, _READ_BYTES // max(1, src.shape[1] * src.dtype.itemsize))
    staging = None
    for k in range(0, len(rows_idx), step):
        sel = rows_idx[k:k + step]
        band = src[sel[0]:sel[-1] + 1] if sel[-1] - sel[0] + 1 == len(sel) else src[sel]
        band = band[:, c]
        if isinstance(out, np.ndarray):
            out[k:k + len(sel)] = band
        else:
            if staging is None or staging.shape[0] < len(sel):
                staging = memory.host_empty((min(step, len(rows_idx)), out.shape[1]), out.dtype)
            part = staging[:len(sel)]
            part[...] = band
            out[k:k + len(sel)].set(part)       # synchronous: the staging rows are refilled next


@kernel("from_file")
def _from_file(call):
    """static = (FileSpec, mapped); scalars = (memory kind,). Each worker reads its own pieces."""
    spec, mapped = call.entry.static
    dist, dtype = call.entry.out_dists[0], call.entry.outputs[0].dtype
    kind = kinds.from_code(call.scalars[-1])
    pieces = dist.pieces[call.rank]
    if not pieces:
        return [new_shard([], dist, dtype, kind)]
    check_size(spec)          # the worker's view of the file (another node may see another file)
    src = _mapped(spec)
    if mapped:
        # views of the mapping: nothing is read until a kernel touches the rows
        arrays = [src[ix.selection(p.rows), ix.selection(p.cols)] for p in pieces]
        return [new_shard(arrays, dist, dtype, "host")]
    arrays = [compute_empty(kind, p.shape, dtype) for p in pieces]
    for p, a in zip(pieces, arrays):
        _read_piece(src, p, a)
    return [new_shard(arrays, dist, dtype, kind)]
