"""Matrices read by the workers themselves from a file on a shared file system.

The master checks the file (its header, its size) and sends only the path;
each worker reads its own pieces, converting them to the matrix's dtype, or
memory-maps them (copy-on-write: a write stays private to the process and
never reaches the file). The bytes of the matrix never pass through the
master, and a mapped matrix is read only where and when it is used.

    X = dmath.from_file("train_x.npy", layout=dmath.Replicated())          # each worker reads it all
    X = dmath.from_file("images.idx", shape=(60000, 784), file_dtype="uint8", offset=16,
                        dtype="float16", layout=dmath.Replicated())
    X = dmath.from_file("huge.npy", layout=dmath.Replicated(), mapped=True)  # read on use

The file must be visible to every worker under the same path (a shared or
node-local copy). The master checks the header and the size first, so a
truncated or malformed file raises DMathError there and the runtime stays
usable.
"""
import math
import os
import stat
from typing import NamedTuple

import numpy as np

from .. import memory
from ..backend import canonical_dtype
from ..errors import DMathError, LayoutError, ShapeError
from ..layout import RowBlock
from ..layout import indexset as ix
from ..memory import kinds
from ..runtime import define
from .base import as_int, dispatch, new_meta
from .storage import check_kind, compute_empty, create, kind_scalar, new_shard, placed

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
    if any(int(d) < 0 for d in shape):
        raise DMathError(f"{path}: header gives the negative shape {shape}; the file is corrupt")
    # Python ints: an int64 product wraps around, and a corrupt header would then describe a small
    # matrix that check_size accepts
    rows, cols = (1, int(shape[0])) if len(shape) == 1 else (int(shape[0]), math.prod(int(d) for d in shape[1:]))
    return FileSpec(os.path.abspath(path), int(offset), dtype.str, rows, cols)


def check_size(spec):
    """Raise DMathError unless the file holds the whole matrix (a truncated file is refused, not read)."""
    try:
        # opened, not only looked at: a directory or an unreadable file has a size too, and would
        # then fail on the workers, ending the runtime, instead of here
        with open(spec.path, "rb") as f:
            if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                raise DMathError(f"{spec.path}: not a regular file")
            size = os.fstat(f.fileno()).st_size
    except OSError as exc:
        raise DMathError(f"{spec.path}: cannot be read ({exc})") from exc
    if size < spec.offset + spec.nbytes:
        raise DMathError(f"{spec.path}: {size:,} bytes, too short for a {spec.rows} x {spec.cols} "
                         f"{np.dtype(spec.file_dtype)} matrix at offset {spec.offset} "
                         f"({spec.offset + spec.nbytes:,} bytes); truncated?")


class FromFileArgs(NamedTuple):
    """Static arguments of `from_file`."""
    spec: FileSpec     # the file, where the matrix lies in it, its stored element type
    mapped: bool       # map the pieces (copy-on-write host memory) instead of reading them


FROM_FILE = define("from_file", FromFileArgs)


# ---- master half --------------------------------------------------------------------------
def _file_dtype(value):
    try:
        dt = np.dtype(value)
    except TypeError as exc:
        raise DMathError(f"from_file: unknown file_dtype {value!r}") from exc
    if dt.kind not in "iuf":
        raise DMathError(f"from_file: file_dtype must be an integer or float type, got {dt}")
    return dt


def _shape_pair(shape):
    """from_file's shape= as (rows, cols) of ints; ShapeError unless it is a pair."""
    try:
        n = len(shape)
    except TypeError:
        n = None
    if n != 2:
        raise ShapeError(f"from_file: shape must be (rows, cols), got {shape!r}")
    return tuple(as_int(v, "from_file: shape entry") for v in shape)


def _spec(path, shape, offset, file_dtype):
    """The FileSpec of the call: from a .npy header (reshaped to `shape` if given), or of a raw file."""
    if path.endswith(".npy") or (shape is None and file_dtype is None):
        spec = npy_spec(path)
        if offset is not None or file_dtype is not None:
            raise DMathError("from_file: a .npy file gives its own offset and file_dtype; pass neither")
        if shape is not None:
            rows, cols = _shape_pair(shape)
            if rows * cols != spec.rows * spec.cols:
                raise ShapeError(f"from_file: {path} holds {spec.rows * spec.cols} values, shape {tuple(shape)} "
                                 f"has {rows * cols}")
            spec = spec._replace(rows=rows, cols=cols)
        return spec
    if shape is None or file_dtype is None:
        raise DMathError("from_file: a raw file needs shape=(rows, cols) and file_dtype=")
    rows, cols = _shape_pair(shape)
    off = as_int(0 if offset is None else offset, "from_file: offset")
    if rows < 0 or cols < 0 or off < 0:
        raise ShapeError(f"from_file: shape and offset must be non-negative, got {shape}, {off}")
    return FileSpec(os.path.abspath(path), off, _file_dtype(file_dtype).str, rows, cols)


def from_file(path, shape=None, dtype=None, *, offset=None, file_dtype=None, layout=None, memory=None,
              mapped=False):
    """A matrix whose pieces every worker reads from the file at `path` (the master sends only the path).

    path: a .npy file (shape, element type and offset from its header; a 1-D
    array is one row, an N-D array (n, rest...) is the (n, prod(rest))
    matrix), or a raw binary file with shape, file_dtype and offset given
    (C order, e.g. the pixels of an IDX file after its header). shape
    reshapes a .npy array of the same size. dtype: the matrix's dtype
    (default: the file's when it is float16/32/64, else float32); values are
    converted as they are read. layout None means RowBlock(). memory: the
    memory kind of the pieces read. mapped=True maps the pieces instead of
    reading them: host memory that the OS reads on use (copy-on-write: a
    write never reaches the file); needs dtype equal to the file's, a
    RowBlock or Replicated layout, and memory None or 'host'. A mapped matrix
    is outside the memory limit.
    """
    path = os.fspath(path)
    spec = _spec(path, shape, offset, file_dtype)
    check_size(spec)
    stored = np.dtype(spec.file_dtype)
    if dtype is None:
        dtype = stored.name if stored.kind == "f" and stored.name in ("float16", "float32", "float64") else "float32"
    dtype = canonical_dtype(dtype)
    out = new_meta(layout, (spec.rows, spec.cols), dtype)
    if mapped:
        if stored != np.dtype(dtype):       # also refuses a byte order other than the machine's
            raise DMathError(f"from_file: mapped=True reads the file as it is: dtype {dtype} differs from the "
                             f"file's {stored}")
        if not (type(out.layout) is RowBlock or out.layout.replicated) or out.layout.partial:
            raise LayoutError(f"from_file: mapped=True maps whole rows: use RowBlock or Replicated, got {out.layout}")
        memory = "host" if memory is None else check_kind(memory)
        if memory != "host":
            raise DMathError(f"from_file: a mapped matrix lives in host memory (memory='host'), got {memory!r}")
        made = dispatch("from_file", [], [out], static=FROM_FILE.static(spec=spec, mapped=True),
                        scalars=(kind_scalar("host"),), pooled=False)
        return placed(made[0][0], "host")
    return create(out, "from_file", check_kind(memory), static=FROM_FILE.static(spec=spec, mapped=False))


# ---- kernel -------------------------------------------------------------------------------
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


@FROM_FILE.kernel()
def _from_file(call):
    """scalars = (memory kind,). Each worker reads its own pieces (or maps them)."""
    spec, mapped = call.entry.static.spec, call.entry.static.mapped
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
