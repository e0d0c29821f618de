"""Reading whole data files as bytes, gzip-compressed or not (detected from the content), and
writing files atomically (a crash leaves the old file or the whole new one, never half of it).

A reader opens only regular files (a FIFO would block it forever, a device never end) and refuses a
file that cannot fit in the memory the system has available before reading it (a sparse file of
64 GiB takes no disk); gzip data is decompressed in pieces, up to a limit (the size an IDX header
announces, or the memory available), so that a small file that decompresses to gigabytes is refused
after the limit, not decompressed whole first.
"""
import gzip
import io
import os
import secrets
import stat
import zlib

from dmath.memory import host_available
from dmath.ops.files import NotRegularFile, open_regular

from ..errors import ConfigError
from .errors import DataError

_GZIP_MAGIC = b"\x1f\x8b"
#: gzip data is decompressed in pieces of this size (the limit is checked between them)
PIECE_BYTES = 16 << 20
#: the decompression limit where the memory available is not known
_UNLIMITED = 1 << 62
#: the longest file name where the file system does not say (Linux's NAME_MAX)
_NAME_MAX = 255


def checked_path(path, what):
    """`path` as a str: a str or an os.PathLike of one; ConfigError otherwise (None, an int, bytes), as
    Model.save says for the same input (a TypeError from deep inside open() named nothing)."""
    try:
        p = os.fspath(path)
    except TypeError:
        p = None
    if not isinstance(p, str):
        raise ConfigError(f"{what}: the path must be a str or os.PathLike (of a str), got {path!r}")
    if not p or "\0" in p:
        # (the system's calls take no NUL: open() raised a bare ValueError naming nothing)
        raise ConfigError(f"{what}: the path must be a non-empty str without NUL characters, got {p!r}")
    return p


def file_kind(mode):
    """What a file of st_mode `mode` is, in words ("a directory", "a FIFO", ...)."""
    for test, words in ((stat.S_ISREG, "a regular file"), (stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"),
                        (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"),
                        (stat.S_ISBLK, "a block device"), (stat.S_ISLNK, "a symbolic link")):
        if test(mode):
            return words
    return "not a regular file"


def open_data_file(path):
    """`path` (a str) opened for reading, binary, which must be a regular file: DataError naming the
    path and what it is otherwise (opened without blocking: a FIFO is refused at once)."""
    try:
        return open_regular(path)
    except FileNotFoundError as exc:
        raise DataError(f"{path}: no such file") from exc
    except NotRegularFile as exc:
        try:
            kind = file_kind(os.stat(path).st_mode)
        except OSError:
            kind = "something else"
        raise DataError(f"{path}: is {kind}, not a regular file: a data file is read only from a regular file") \
            from exc
    except OSError as exc:
        raise DataError(f"{path}: cannot be read ({exc})") from exc


def check_fits_memory(what, nbytes, whose="the file's"):
    """DataError when `nbytes` (to be held in memory, for `what`) exceed the memory the system has
    available: reading them would only end in a MemoryError or the kernel's OOM killer."""
    available = host_available()
    if available and nbytes > available:
        raise DataError(f"{what}: {whose} {nbytes:,} bytes are more than the {available:,} bytes of memory "
                        f"available: it cannot be read into memory here")


def is_gzip(head):
    """Whether data starting with the bytes `head` is gzip data."""
    return head[:2] == _GZIP_MAGIC


def gunzip(stream, what, limit, over=None):
    """The bytes of the gzip data read from the binary `stream`, decompressed in pieces: at most
    `limit` bytes; more raise DataError (`over`: its message, default: more than the memory
    available). A corrupt or truncated stream raises DataError."""
    out = bytearray()
    try:
        with gzip.GzipFile(fileobj=stream, mode="rb") as z:
            while True:
                piece = z.read(min(PIECE_BYTES, limit + 1 - len(out)))
                if not piece:
                    return out
                out += piece
                if len(out) > limit:
                    raise DataError(over or f"{what}: decompresses to more than the {limit:,} bytes of memory "
                                            f"available: it cannot be read into memory here")
    except (OSError, EOFError, zlib.error) as exc:
        raise DataError(f"{what}: corrupt or truncated gzip data ({exc})") from exc
    except MemoryError as exc:
        raise DataError(f"{what}: not enough memory to decompress it ({len(out):,} bytes so far)") from exc


def decompress_if_gzip(raw, what):
    """`raw` itself, or (a bytearray) its gzip decompression when it starts with the gzip magic number:
    at most as many bytes as the memory available holds."""
    if not is_gzip(raw):
        return raw
    return gunzip(io.BytesIO(raw), what, host_available() or _UNLIMITED)


def read_bytes(path):
    """The content of the regular file at `path` (bytes-like), decompressed when it is gzip data;
    DataError for anything else, and for a file (or its decompression) too large for the memory
    available."""
    with open_data_file(path) as f:
        if is_gzip(f.read(2)):
            f.seek(0)
            return gunzip(f, path, host_available() or _UNLIMITED)
        f.seek(0)
        size = os.fstat(f.fileno()).st_size
        check_fits_memory(path, size)
        try:
            return f.read()
        except MemoryError as exc:
            raise DataError(f"{path}: not enough memory to read its {size:,} bytes") from exc
        except OSError as exc:
            raise DataError(f"{path}: cannot be read ({exc})") from exc


def find_file(directory, names, what):
    """The first of `names` (each also tried with '.gz') that exists in `directory` (a regular file)."""
    directory = checked_path(directory, what)
    for name in names:
        for candidate in (name, name + ".gz"):
            path = os.path.join(directory, candidate)
            if os.path.isfile(path):
                return path
    raise DataError(f"{what}: none of {', '.join(names)} (or .gz) in {directory}")


def write_target(path):
    """The path a write to `path` must replace: a symlink is followed to its (final) target, which
    must be a regular file or not exist yet. A rename over anything else (a device such as
    /dev/null, a FIFO, a socket, a directory) would replace it with a regular file; NotRegularFile."""
    if path.endswith(os.sep) or (os.altsep and path.endswith(os.altsep)):
        # realpath drops the slash: "d/ck.dnn/" wrote the file d/ck.dnn, which no read of the path
        # given could open
        raise NotRegularFile(f"{path} ends with a path separator, so it names a directory: only a regular "
                             f"file or a new path is written")
    real = os.path.realpath(path)
    try:
        st = os.stat(real)
    except FileNotFoundError:
        return real
    if not stat.S_ISREG(st.st_mode):
        raise NotRegularFile(f"{path}{' (-> ' + real + ')' if real != os.path.abspath(path) else ''} is not a "
                             f"regular file: only a regular file or a new path is written")
    return real


def write_atomically(path, chunks):
    """Write the byte strings `chunks` to `path`, atomically: into a new file beside it, fsync'ed,
    renamed over `path`, then the directory fsync'ed so that the rename itself is durable. The
    temporary file is removed when anything fails; OSError propagates for the caller to word
    (NotRegularFile: see write_target). A symlink is written through: its target is replaced, the
    link stays.

    The file keeps the permission bits of the one it replaces, as `cp` over a file does (a read-only
    0o444 checkpoint stays read-only; renaming over it needs only a writable directory, as a rename
    always does); a new file gets 0o666 less the umask, as `open` would make it. Owner and group are
    a new file's (only root may give a file away)."""
    path = write_target(os.fspath(path))
    directory = os.path.dirname(path)
    keep = _permission_bits(path)
    fd, tmp = _new_temporary(directory, os.path.basename(path))
    try:
        with os.fdopen(fd, "wb") as f:
            if keep is not None:
                # the rename puts a new inode in place: the old file's mode would go with the old inode
                _set_mode(f.fileno(), tmp, keep)
            for chunk in chunks:
                f.write(chunk)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    try:
        dfd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
    except OSError:   # some filesystems cannot fsync a directory; the file itself is synced
        pass


def _permission_bits(path):
    """The permission bits (0o777) of the existing file `path`, or None when there is none. Not the
    set-id and sticky bits: writing to a file clears its set-id bits anyway (for all but root), and
    nothing written here is a program."""
    try:
        return os.stat(path).st_mode & 0o777
    except FileNotFoundError:
        return None


def _set_mode(fd, path, mode):
    """chmod the open file `fd` (named `path`) to `mode`, exactly: a chmod, unlike a creation, is not
    narrowed by the umask. By descriptor where the platform can (no name to race on)."""
    if hasattr(os, "fchmod"):
        os.fchmod(fd, mode)
    else:
        os.chmod(path, mode)


def _new_temporary(directory, name):
    """(fd, path) of a new file beside `name` in `directory`, created with mode 0o666 less the umask
    (mkstemp's 0o600 would survive the rename: a file no one else could read). Named `<name>.<random>.tmp`,
    with `name` cut short where that would pass the file system's longest name (a valid 254-character
    name is written too); O_EXCL and a new random part on a clash keep it unique."""
    limit = _name_max(directory)
    while True:
        suffix = f".{secrets.token_hex(6)}.tmp"
        stem = name
        while stem and len(os.fsencode(stem + suffix)) > limit:
            stem = stem[:-1]               # (by characters: a multi-byte character is never cut in two)
        tmp = os.path.join(directory, stem + suffix)
        try:
            return os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0), 0o666), tmp
        except FileExistsError:
            continue


def _name_max(directory):
    """The longest file name (in bytes) the file system of `directory` takes."""
    try:
        return int(os.pathconf(directory or ".", "PC_NAME_MAX"))
    except (OSError, ValueError, AttributeError):
        return _NAME_MAX
