"""Reading whole data files as bytes, gzip-compressed or not (detected from the content), and
writing files atomically (a crash leaves the old file or the whole new one, never half of it)."""
import gzip
import os
import secrets
import stat
import zlib

from dmath.ops.files import NotRegularFile

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


def write_target(path):
    """The path a write to `path` must replace: a symlink is followed to its (final) target, which
    must be a regular file or not exist yet. A rename over anything else (a device such as
    /dev/null, a FIFO, a socket, a directory) would replace it with a regular file; NotRegularFile."""
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
    (mkstemp's 0o600 would survive the rename: a file no one else could read)."""
    while True:
        tmp = os.path.join(directory, f"{name}.{secrets.token_hex(6)}.tmp")
        try:
            return os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0), 0o666), tmp
        except FileExistsError:
            continue
