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

Snapshot: the master stamps the file it checked (host, device, inode, size,
modification time); every worker on the master's host reads only that very
version (one on another host, a node-local copy, one of the same size), with
plain reads from one open descriptor, and checks that it did not change
while it read. from_file returns only after every worker has reported, so
the file may be replaced, rewritten or deleted as soon as it returns; a
worker that met another version makes from_file raise DMathError (the
runtime stays usable). A mapped matrix reads the file on use: the file must
keep its size while the matrix lives (a rewrite in place is seen, a rename
over it is not: the mapping keeps the old file); each command that reads the
matrix first checks the size, and one that shrank raises `FileChanged` on
that worker (the job ends with the reason) instead of SIGBUS.
"""
import errno
import math
import os
import socket
import stat
import tokenize
from typing import NamedTuple

import numpy as np

from .. import backend, memory
from ..backend import canonical_dtype
from ..errors import DMathError, DTypeError, LayoutError, OutOfMemoryError, PlanError, ShapeError
from ..layout import RowBlock
from ..layout import indexset as ix
from ..memory import kinds
from ..runtime import define, runtime
from ..runtime.shard import Shard
from ..comm.control import gather_objects
from .base import as_int, dispatch, new_meta
from .storage import check_kind, check_room, compute_empty, kind_scalar, new_shard, placed, pooled

#: rows converted per read, so that a large file needs little temporary memory
_READ_BYTES = 64 << 20


class FileSpec(NamedTuple):
    """Where a (rows, cols) matrix lies in a file: its byte offset and stored element type, and the
    master's view of the file when it checked it (`stamp`: host, device, inode, size, mtime in ns)."""
    path: str
    offset: int
    file_dtype: str        # a numpy dtype string with byte order, e.g. '<f4', '|u1'
    rows: int
    cols: int
    stamp: tuple = ()

    @property
    def nbytes(self):
        return self.rows * self.cols * np.dtype(self.file_dtype).itemsize


class NotRegularFile(OSError):
    """The path names something other than a regular file (a directory, a FIFO, a device)."""


def open_regular(path):
    """`path` opened for reading (binary), which must be a regular file: opened without blocking (a
    FIFO would wait for a writer forever), then checked; NotRegularFile (an OSError) otherwise."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0))
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise NotRegularFile(f"{path}: not a regular file")
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_regular(path, max_bytes=None):
    """The bytes of the regular file at `path` (NotRegularFile, an OSError, for anything else: a FIFO is
    refused without waiting for a writer). One open, fstat and read per file, without a buffered file
    object: an image folder's reader thread reads thousands of small files a second, and the Python
    work per file holds the GIL the step's thread needs (about 12 us a 64 KB file here, against 20
    through open_regular and read). max_bytes: a larger file raises OSError (EFBIG) unread (a
    multi-gigabyte file among images would be pulled into memory whole)."""
    if not isinstance(path, (str, bytes, os.PathLike)):
        raise TypeError(f"read_regular: path must be a str, bytes or os.PathLike, got {type(path).__name__}")
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0))
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise NotRegularFile(f"{path}: not a regular file")
        if max_bytes is not None and st.st_size > max_bytes:
            raise OSError(errno.EFBIG, f"{path}: {st.st_size:,} bytes, more than the {max_bytes:,} this reader "
                                       f"takes")
        data = os.read(fd, st.st_size + 1)        # (+1: a file grown since fstat is not cut short)
        if len(data) == st.st_size:
            return data
        parts = [data]                            # a short read, or a file that changed: read to its end
        while True:
            more = os.read(fd, 1 << 20)
            if not more:
                return b"".join(parts)
            parts.append(more)
    finally:
        os.close(fd)


def npy_spec(path):
    """The FileSpec of a .npy file (C order; 1-D is one row, N-D is (shape[0], the rest)); raises DMathError."""
    try:
        with open_regular(path) as f:
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
    except (ValueError, OSError, EOFError, SyntaxError, tokenize.TokenError, RecursionError, MemoryError) as exc:
        # NumPy parses the header's dict with the tokenizer and ast.literal_eval: garbage there raises
        # any of these
        raise DMathError(f"{path}: not a readable .npy file ({type(exc).__name__}: {exc})") from exc
    if not isinstance(shape, tuple) or not all(type(d) is int for d in shape):
        raise DMathError(f"{path}: header gives the shape {shape!r}, not a tuple of integers; the file is corrupt")
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


def _stamp(st):
    """What identifies one version of a file: where it is (host, device, inode), its size and mtime."""
    return (socket.gethostname(), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def check_size(spec):
    """The spec stamped with the file's current version (`FileSpec.stamp`); raises DMathError unless
    the file is a regular file that holds the whole matrix (a truncated file is refused, not read)."""
    try:
        # opened, not only looked at: a directory or an unreadable file has a size too, and would
        # then fail on the workers instead of here
        with open_regular(spec.path) as f:
            st = os.fstat(f.fileno())
    except OSError as exc:
        raise DMathError(f"{spec.path}: cannot be read ({exc})") from exc
    if not stat.S_ISREG(st.st_mode):
        raise DMathError(f"{spec.path}: not a regular file")
    _check_length(spec, st.st_size)
    return spec._replace(stamp=_stamp(st))


def _check_length(spec, size):
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
    except (TypeError, ValueError, RecursionError) as exc:
        # NumPy raises TypeError for a spec it does not understand, ValueError for one it understands
        # but refuses (a field at a negative offset, a negative sub-array size), RecursionError for
        # specs nested past the recursion limit
        raise DMathError(f"from_file: unknown or invalid file_dtype {value!r:.200} ({type(exc).__name__}: "
                         f"{exc})") from exc
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
    (default: the file's when it is float16/32/64, else float32; integers
    wider than 16 bits and long doubles need it given); values are converted
    as they are read, and a finite value beyond the dtype's range (it would
    read as inf) raises DMathError. layout None means RowBlock(). memory: the
    memory kind of the pieces read. mapped=True maps the pieces instead of
    reading them: host memory that the OS reads on use (copy-on-write: a
    write never reaches the file); needs dtype equal to the file's, a
    RowBlock or Replicated layout, and memory None or 'host'. A mapped matrix
    is outside the memory limit.
    """
    if runtime().recorder is not None:
        # a replay repeats the workers' reads, not the master's check of their reports: a file changed
        # since would leave the matrix unwritten (uninitialised memory), without a word
        raise PlanError("from_file cannot be recorded into a plan: the master checks what every worker read "
                        "(a file changed or cut short), which a replay would skip; read the file outside the "
                        "record block")
    path = _path(path)
    spec = check_size(_spec(path, shape, offset, file_dtype))
    stored = np.dtype(spec.file_dtype)
    if dtype is None:
        if stored.kind != "f" and stored.itemsize > 2:
            # float32 holds every 8- and 16-bit integer exactly, not wider ones: choosing a rounding
            # for the user would change values without a word
            raise DMathError(f"from_file: {path} holds {stored} values, which float32 may round; pass dtype= "
                             f"('float64' holds integers up to 2**53 exactly)")
        if stored.kind == "f" and stored.itemsize > 8:
            # as from_numpy refuses a long double array: float32 would round every value, and one
            # beyond its range would read as inf
            raise DTypeError(f"from_file: {path} holds {stored} (long double) values, wider than any dmath dtype; "
                             f"pass dtype= ('float64' rounds them; a value beyond its range is refused)")
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
    else:
        memory = check_kind(memory)
        check_room(memory, out)
    # the kernel gathers every worker's report on the master: this returns once all have read (or
    # mapped) the file, which may then change or vanish
    made, problems = dispatch("from_file", [], [out], static=FROM_FILE.static(spec=spec, mapped=mapped),
                              scalars=(kind_scalar(memory),), pooled=not mapped and pooled(memory))
    if any(problems or ()):
        del made        # frees the matrix (the traceback would otherwise keep it)
        _raise_problems(problems)
    return placed(made[0], memory)


def _path(path):
    try:
        path = os.fspath(path)
    except TypeError as exc:
        raise DMathError(f"from_file: path must be a str or os.PathLike, got {path!r}") from exc
    if not isinstance(path, str):
        raise DMathError(f"from_file: path must be a str or os.PathLike, got the bytes {path!r}")
    return path


def _raise_problems(problems):
    """DMathError when some worker read another version of the file than the master checked, or
    met a value that the matrix's dtype cannot hold. `problems`: each worker's (what, text) or None.

    The matrix is then dropped (the caller holds no reference): every worker read, or failed to
    read, before the kernel gathered these reports, so nothing reads the file after this returns.
    """
    bad = [(rank, problem) for rank, problem in enumerate(problems or ()) if problem]
    if not bad:
        return
    # a file that changed explains any value in it: that is the report then
    changed = [(rank, text) for rank, (what, text) in bad if what == "changed"]
    if changed:
        raise DMathError("from_file: the file changed while the workers read it; nothing was made:\n"
                         + "\n".join(f"  worker {rank}: {text}" for rank, text in changed))
    unmapped = [(rank, text) for rank, (what, text) in bad if what == "map"]
    if unmapped:
        raise OutOfMemoryError("from_file: the file could not be mapped (a copy-on-write mapping counts "
                               "against the memory the kernel lets a process commit: a file larger than "
                               "that is refused under Linux's default overcommit rule); read it with "
                               "mapped=False in a distributed layout, or map a smaller file; nothing was "
                               "made:\n" + "\n".join(f"  worker {rank}: {text}" for rank, text in unmapped))
    raise DMathError("from_file: the file holds values beyond the range of the matrix's dtype (they would "
                     "read as inf); pass a wider dtype=; nothing was made:\n"
                     + "\n".join(f"  worker {rank}: {text}" for rank, (_, text) in bad))


# ---- kernel -------------------------------------------------------------------------------
class FileChanged(DMathError):
    """The file is not the version the master checked, or changed while a worker read it."""


class OutOfRange(DMathError):
    """A finite value of the file lies beyond the range of the matrix's dtype (it would read as inf)."""


class MapRefused(DMathError):
    """The operating system refused to map the file (ENOMEM: more than the process may commit)."""


def _may_overflow(stored, dtype):
    """Whether some finite value of the file's type `stored` lies beyond the largest of the float `dtype`
    (pure): a wider float (float64 into float32, a long double into float64), or an integer type
    past float16's 65504."""
    top = np.finfo(dtype).max
    if stored.kind == "f":
        return bool(np.finfo(stored).max > top)
    info = np.iinfo(stored)
    return info.max > float(top) or info.min < -float(top)      # (Python int against float: exact)


def _check_range(band, converted, spec, row, columns):
    """OutOfRange when a finite value of `band` (as the file stores it) became inf in `converted` (the
    same rows in the matrix's dtype); `row`: the band's first row in the file, `columns`: the file's
    column of each of the band's columns. The file's own infinities and NaNs are values: read as they are."""
    inf = np.isinf(converted)
    if not inf.any():
        return
    bad = inf & np.isfinite(band)
    if not bad.any():
        return
    i, j = (int(k) for k in np.argwhere(bad)[0])
    v = band[i, j]
    if v.dtype.kind == "f":
        # 7 significant digits, whatever the width (float() would make a long double past float64 inf);
        # NumPy leaves a dot before the exponent where it trims every digit after it ('1.e+300')
        text = np.format_float_scientific(v, precision=6, trim="-").replace(".e", "e")
    else:
        text = str(int(v))
    raise OutOfRange(f"{spec.path}: the value {text} at row {row + i}, column {int(columns[j])} lies beyond the "
                     f"range of {converted.dtype} ({int(bad.sum())} such value(s) in rows {row} to "
                     f"{row + band.shape[0] - 1})")


def _verified(attribute):
    """Shard's `attribute` (a property or slot), read after `verify()` (see MappedShard)."""
    return property(lambda shard: (shard.verify(), attribute.__get__(shard))[1], attribute.__set__)


class MappedShard(Shard):
    """A shard of a mapped file: its pieces are views of a private mapping, read on use.

    It holds the file open; every access to its pieces first checks that the file still holds the
    matrix, since touching a mapped page past the end of a file that shrank kills the process
    with SIGBUS (no traceback, no report). A rewrite in place that keeps the size is read on use,
    so the replica cache keeps no copy of it (`read_on_use`: a GEMM at 2 workers gave the old
    contents from its kept operand copy where to_numpy gave the new).
    """
    __slots__ = ("file", "spec")
    read_on_use = True

    def __init__(self, arrays, dist, dtype, file, spec):
        pieces, home = kinds.store(arrays, "host")
        super().__init__(pieces, dist, dtype, "host", home)
        self.file, self.spec = file, spec

    def verify(self):
        """Raise FileChanged unless the mapped file still holds the whole matrix."""
        size = os.fstat(self.file.fileno()).st_size
        if size < self.spec.offset + self.spec.nbytes:
            raise FileChanged(f"{self.spec.path}: the mapped file shrank to {size:,} bytes after it was mapped "
                              f"(the matrix needs {self.spec.offset + self.spec.nbytes:,}); a mapped file must "
                              f"keep its size while the matrix lives")

    # every read of the pieces checks first (the runtime reads `home` of each input of a command)
    pieces = _verified(Shard.pieces)
    home = _verified(Shard.home)


def _open(spec):
    """(file object, fstat) of the file the master checked; FileChanged when it is another version.

    A worker on the master's host must see the very file (device, inode, size, mtime); one on
    another host (a node-local copy) one of the same size.
    """
    try:
        f = open_regular(spec.path)
    except OSError as exc:
        raise FileChanged(f"cannot be opened any more ({exc})") from exc
    st = os.fstat(f.fileno())
    now = _stamp(st)
    same = now == spec.stamp if now[0] == spec.stamp[0] else now[3] == spec.stamp[3]
    if not same:
        f.close()
        raise FileChanged(f"{spec.path} was replaced or modified after the master checked it "
                          f"(size {spec.stamp[3]:,} -> {st.st_size:,} bytes)")
    return f, st


def _pread(fd, buf, offset, path):
    """Fill the byte array `buf` from `offset` of the file; FileChanged when the file ends first."""
    view, got = memoryview(buf), 0
    while got < len(view):
        n = os.preadv(fd, [view[got:]], offset + got)
        if n == 0:
            raise FileChanged(f"{path} ended at {offset + got:,} bytes while it was read (truncated)")
        got += n


def _read_piece(f, spec, piece, out):
    """Read the piece's block of the file into `out` (any backend), a band of rows at a time.

    Plain reads, not a mapping: a file truncated meanwhile then gives a short read (an error)
    where a mapped page past its end would kill the process with SIGBUS.
    """
    stored = np.dtype(spec.file_dtype)
    cols = piece.cols
    c0, c1 = cols[0][0], cols[-1][1]
    sel = slice(0, c1 - c0) if len(cols) == 1 else ix.to_array(cols) - c0
    row_bytes = spec.cols * stored.itemsize
    span = (c1 - c0) * stored.itemsize
    # whole rows when the piece needs most of each row (one read per band), else each row's span
    whole = 2 * span >= row_bytes
    step = max(1, _READ_BYTES // max(1, span))
    raw = staging = None
    # converting to a narrower float, a finite value may become inf: each band is checked (numpy only warns)
    check = _may_overflow(stored, np.dtype(out.dtype))
    columns = np.arange(c0, c1)[sel]
    k = 0
    for r0, r1 in piece.rows:
        for a in range(r0, r1, step):
            n = min(step, r1 - a)
            if raw is None:
                raw = np.empty(min(step, ix.size(piece.rows)) * (row_bytes if whole else span), dtype=np.uint8)
            if whole:
                buf = raw[:n * row_bytes]
                _pread(f.fileno(), buf, spec.offset + a * row_bytes, spec.path)
                band = buf.view(stored).reshape(n, spec.cols)[:, c0:c1]
            else:
                buf = raw[:n * span]
                for i in range(n):
                    _pread(f.fileno(), buf[i * span:(i + 1) * span],
                           spec.offset + (a + i) * row_bytes + c0 * stored.itemsize, spec.path)
                band = buf.view(stored).reshape(n, c1 - c0)
            band = band[:, sel]
            if isinstance(out, np.ndarray):
                with np.errstate(over="ignore"):
                    out[k:k + n] = band
                if check:
                    _check_range(band, out[k:k + n], spec, a, columns)
            else:
                if staging is None:
                    staging = memory.host_empty((min(step, out.shape[0]), out.shape[1]), out.dtype)
                part = staging[:n]
                with np.errstate(over="ignore"):
                    part[...] = band
                if check:
                    _check_range(band, part, spec, a, columns)
                # CuPy copies from pinned memory asynchronously on the current stream: the staging
                # rows are refilled by the next band, so the host waits for the copy first (a
                # block-cyclic piece's bands overwrote rows still being copied: wrong values)
                gpu = backend.current()
                gpu.copy_to_device(out[k:k + n], part)
                gpu.passed(gpu.mark())
            k += n


@FROM_FILE.kernel()
def _from_file(call):
    """scalars = (memory kind,). Each worker reads its own pieces (or maps them), then every worker
    reports to the master whether it read the version of the file the master checked."""
    spec, mapped = call.entry.static.spec, call.entry.static.mapped
    dist, dtype = call.entry.out_dists[0], call.entry.outputs[0].dtype
    kind = kinds.from_code(call.scalars[-1])
    pieces = dist.pieces[call.rank]
    problem, shard = None, None
    if pieces:
        try:
            shard = _read(spec, mapped, pieces, dist, dtype, kind)
        except FileChanged as exc:
            problem = ("changed", str(exc))
        except OutOfRange as exc:
            problem = ("range", str(exc))
        except MapRefused as exc:
            problem = ("map", str(exc))
    if shard is None:       # no pieces here, or a problem that the master raises (dropping the matrix)
        kind = "host" if mapped else kind
        if mapped and problem is not None:
            # placeholders the master drops at once: a file too large to map is too large to allocate
            arrays = [np.broadcast_to(np.zeros((), dtype), p.shape) for p in pieces]
        else:
            arrays = [compute_empty(kind, p.shape, dtype) for p in pieces]
        shard = new_shard(arrays, dist, dtype, kind)
    call.result = gather_objects(call.world, problem)
    return [shard]


def _read(spec, mapped, pieces, dist, dtype, kind):
    """This worker's shard of the file; FileChanged when the file is not, or stops being, the
    version the master checked."""
    f, st = _open(spec)
    if mapped:
        if spec.nbytes == 0:
            src = np.zeros((spec.rows, spec.cols), dtype=spec.file_dtype)
        else:
            # MAP_PRIVATE (copy-on-write): a write stays in this process and never reaches the file
            try:
                src = np.memmap(f, dtype=spec.file_dtype, mode="c", offset=spec.offset,
                                shape=(spec.rows, spec.cols))
            except OSError as exc:      # a worker that raised here killed the runtime
                f.close()
                raise MapRefused(f"{spec.path}: {exc}") from exc
        # views of the mapping: nothing is read until a kernel touches the rows
        arrays = [src[ix.selection(p.rows), ix.selection(p.cols)] for p in pieces]
        return MappedShard(arrays, dist, dtype, f, spec)
    with f:
        arrays = [compute_empty(kind, p.shape, dtype) for p in pieces]
        for p, a in zip(pieces, arrays):
            if a.size:
                _read_piece(f, spec, p, a)
        after = os.fstat(f.fileno())
    if (after.st_size, after.st_mtime_ns) != (st.st_size, st.st_mtime_ns):
        raise FileChanged(f"{spec.path} was modified while it was read")
    return new_shard(arrays, dist, dtype, kind)
