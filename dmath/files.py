"""dmath.from_file: a matrix that every worker reads (or memory-maps) itself from a file.

    X = dmath.from_file("train_x.npy", layout=dmath.Replicated())          # each worker reads it all
    X = dmath.from_file("images.idx", shape=(60000, 784), file_dtype="uint8", offset=16,
                        dtype="float16", layout=dmath.Replicated())
    X = dmath.from_file("huge.npy", layout=dmath.Replicated(), mapped=True)  # read on use

The file must be visible to every worker under the same path (a shared or
node-local copy). Only the path travels; the master checks the header and
the size first, so a truncated or malformed file raises DMathError here and
the runtime stays usable.
"""
import os

import numpy as np

from .backend import canonical_dtype
from .errors import DMathError, LayoutError, ShapeError
from .layout import RowBlock
from .matrix import _check_memory, _create, _placed
from .ops.base import as_int, dispatch, new_meta
from .ops.files import FileSpec, check_size, npy_spec
from .ops.storage import kind_scalar


def _file_dtype(value):
    try:
        dt = np.dtype(value)
    except TypeError as exc:
        raise DMathError(f"from_file: unknown file_dtype {value!r}") from exc
    if dt.kind not in "iuf":
        raise DMathError(f"from_file: file_dtype must be an integer or float type, got {dt}")
    return dt


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
    if path.endswith(".npy") or (shape is None and file_dtype is None):
        spec = npy_spec(path)
        if offset is not None or file_dtype is not None:
            raise DMathError("from_file: a .npy file gives its own offset and file_dtype; pass neither")
        if shape is not None:
            rows, cols = (as_int(v, "from_file: shape entry") for v in shape)
            if rows * cols != spec.rows * spec.cols:
                raise ShapeError(f"from_file: {path} holds {spec.rows * spec.cols} values, shape {tuple(shape)} "
                                 f"has {rows * cols}")
            spec = spec._replace(rows=rows, cols=cols)
    else:
        if shape is None or file_dtype is None:
            raise DMathError("from_file: a raw file needs shape=(rows, cols) and file_dtype=")
        rows, cols = (as_int(v, "from_file: shape entry") for v in shape)
        off = as_int(0 if offset is None else offset, "from_file: offset")
        if rows < 0 or cols < 0 or off < 0:
            raise ShapeError(f"from_file: shape and offset must be non-negative, got {shape}, {off}")
        spec = FileSpec(os.path.abspath(path), off, _file_dtype(file_dtype).str, rows, cols)
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
        memory = "host" if memory is None else _check_memory(memory)
        if memory != "host":
            raise DMathError(f"from_file: a mapped matrix lives in host memory (memory='host'), got {memory!r}")
        made = dispatch("from_file", [], [out], static=(spec, True), scalars=(kind_scalar("host"),), pooled=False)
        return _placed(made[0][0], "host")
    return _create(out, "from_file", _check_memory(memory), static=(spec, False))
