"""Choices made by timing (cuDNN plans, cuBLASLt algorithms), kept on disk between runs.

Timing every candidate of every shape at every start made the first step of
AlexNet take tens of seconds. Two settings fix that:

    DMATH_TUNE=off|fast|full     how a choice nobody has cached is made
        off    the library heuristics' first choice; nothing is timed, the cache is neither read
               nor written (a reproducible baseline: it rules the cache out)
        fast   (default) a cached choice when there is one; else only the heuristics' first
               FAST_CANDIDATES candidates are timed, within DMATH_TUNE_BUDGET_MS per shape,
               and the choice is written to the cache
        full   every candidate is timed at every start (the cache is not read) and the choice is
               written to the cache, refreshing it
    DMATH_TUNE_CACHE=PATH        the cache file (default ~/.cache/dmath/tune.json, under
                                 $XDG_CACHE_HOME when set; a directory means DIR/tune.json);
                                 set to the empty string, no file is read or written

The file is JSON (never pickle: a cache is data, and loading it must not run
code). Each entry holds its kind (which tuner), the machine it was timed on
(GPU model, compute capability, driver, CUDA and library versions), the
key (op, shapes, dtype, layout) and the chosen value; it is stored under a
digest of the first three. An entry is used only on a machine whose
fingerprint, kind and key equal the stored ones field by field, so one file
can serve several GPU models (a home directory shared by a cluster) and a
driver or library update simply misses. A corrupt, truncated or foreign
file, or an entry whose stored fields do not match its digest, is ignored
with a `TuneCacheWarning` and never trusted; a cached choice that fails to
build or run falls back to tuning (the callers' `adopt`).

The digest is the entry's name, not a seal: it leaves out the value, since
a lookup knows only the kind, machine and key it asks for, and whoever can
edit the file can compute a SHA-256 as well. So each caller checks the value
it adopts (its structure and types, and that the choice builds and runs
here), and a value it cannot use is tuned again. Reading never trusts the
file's shape either: JSON nested past the recursion limit, a NaN or a number
no float holds (1e999 reads as infinity) make the file corrupt, and an
entry whose fields cannot be digested is dropped as malformed.

Several processes share the file. Writers merge: each takes an exclusive
lock on PATH.lock (flock, released by the kernel if the process dies),
re-reads the file, adds its entries and replaces the file atomically
(temporary file in the same directory, fsync, os.replace, fsync of the
directory), so concurrent writers of different entries all end up in it
and a reader never sees half a file. A choice never waits for the lock:
`put` writes at once when the lock is free, else keeps the entry pending
(in memory, used at once by this process) for its next write, which takes
every pending entry in one rewrite; what is still pending at exit is
written then (`flush_all`: Python's exit handlers, and a worker's shutdown),
waiting at most LOCK_TIMEOUT_S. Each choice had waited for the lock: with
seven processes of three jobs tuning on one host (each write a rewrite and
two fsyncs), a test's choices queued past its 120 s limit. A non-regular PATH (a symlink, a
device, a directory) or a file that is not a dmath tuning cache is never
replaced.

One process tunes a shape, the others read its choice. In 'fast', a
process about to tune an uncached key first takes that key's claim: an
exclusive flock on PATH.claims/<digest>.lock, held while it tunes. The
workers of a job meet the same new shapes at the same moment (the same
command on every worker); the first to take the claim tunes, and the
others mark the key waited for (PATH.claims/<digest>.wait) and wait for the
claim. The holder stores its choice and, seeing the mark, writes the file
at once (waiting for its lock, at most LOCK_TIMEOUT_S) before it lets go;
the others then read the choice from the file (checked as any entry is,
then by the caller's adopt) and use it. So every
worker runs the same plans from the first step, where each had timed its
own and chosen differently (the data-parallel step then waited for the
slowest worker's plans at every step of a cold run). No collective is
involved, so workers whose shapes or caches differ never wait for each
other: a claim only serialises processes tuning the very same key, a
waiter holds no claim while it waits, and claims nest in one order only
(the channel padding's choice around its convolutions'). A claim held
past CLAIM_WAIT_S (a process stopped while tuning) is passed over and the
waiter tunes on its own; one whose holder died is released by the kernel.
Claims need a writable cache directory; without one each process tunes on
its own, as with DMATH_TUNE=full (which times everything everywhere) and
with no cache file. A process keeps the first value it stored or read for
a key for its lifetime: a worker that read another's later choice for a
second model would compute other bits than for its first (found at 2 GPUs:
a ResNet-18 trained twice the same way ended with weights past the GPU
tolerance apart).
"""
import atexit
import errno
import hashlib
import json
import math
import os
import re
import socket
import stat
import tempfile
import time
import warnings
import weakref

from . import settings
from .errors import DMathError

MODES = ("off", "fast", "full")
#: 'fast' times at most this many candidates per shape (the heuristics' first ones that build)
FAST_CANDIDATES = 4
#: 'fast' stops timing a shape's candidates once DMATH_TUNE_BUDGET_MS went by (building included),
#: after at least one candidate was timed: about 0.3 s a shape times the heuristics' first four
#: (where cuDNN compiles an engine at run time, its building is most of that); a network of 70
#: convolution shapes then spends some 18 s of its first step choosing

#: 'fast' times up to this many candidates of an expensive shape: one whose fastest plan so far, run
#: DMATH_TUNE_AMORTIZE times (as a training run would in its first minutes), outlasts the budget. It
#: keeps timing while the time spent stays below those runs: the tuning is paid back by the runs if
#: the next plan is faster. cuDNN's heuristics ranked an sm80 kernel first for one of GoogLeNet's
#: batch-256 convolutions (0.68 ms a call on an H200, a step's largest convolution) while batch 1024's
#: choice of the same layer was a Hopper kernel
MORE_CANDIDATES = 16
#: the file format's name and version (a file with other ones is foreign)
FORMAT, VERSION = "dmath-tune-cache", 1
#: a cache file larger than this is not read (a cache of a few thousand shapes is a few MB)
MAX_BYTES = 64 << 20
#: seconds a writer waits for the lock before it gives up writing (with a warning)
LOCK_TIMEOUT_S = 30.0
#: seconds a process waits for another one's claim on a key before it tunes the key itself
CLAIM_WAIT_S = 300.0


class TuneCacheWarning(UserWarning):
    """The tuning cache file was ignored (or could not be written): why, and the path."""


def mode():
    """DMATH_TUNE: 'off', 'fast' (when unset) or 'full'; settings.SettingError (a DMathError) else.
    'off' under DMATH_DETERMINISTIC=1: a choice made by timing could differ from one run to the next."""
    if settings.value("DMATH_DETERMINISTIC"):
        return "off"
    return settings.value("DMATH_TUNE")


def cache_path():
    """The cache file's path from DMATH_TUNE_CACHE, or None when it is set to the empty string."""
    value = settings.raw("DMATH_TUNE_CACHE")
    if value is None:
        base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        return os.path.join(base, "dmath", "tune.json")
    if value == "":
        return None
    value = os.path.expanduser(value)
    if value.endswith(os.sep) or os.path.isdir(value):
        return os.path.join(value, "tune.json")
    return value


def _canonical(obj):
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), allow_nan=False)


def digest(kind, machine, key):
    """The entry name of (kind, machine, key): a SHA-256 of their canonical JSON."""
    return hashlib.sha256(_canonical([kind, machine, key]).encode()).hexdigest()


def _warn(message):
    warnings.warn(message, TuneCacheWarning, stacklevel=3)


class TuneCache:
    """The entries of one cache file, read lazily and re-read when the file changes; `put` merges."""

    def __init__(self, path):
        self.path = path
        self._entries = {}
        # every entry this process stored or used: a process keeps its choice for a key for its
        # lifetime, whatever another process writes for that key later (the workers of a job tune
        # the same shapes at once: a model built after another one must make the first one's
        # choices, or the two compute different bits), and what it could not write stays in use
        self._mine = {}
        self._pending = {}          # entries to write at the next chance (the lock was busy): name -> entry
        self._seen = None           # the (inode, size, mtime) of the file as last read; None: never read
        # why this process writes the file no more (its lock was held past LOCK_TIMEOUT_S: every later
        # choice would wait as long again), or None
        self.unwritable = None
        _ALL.add(self)

    # ---- reading ----------------------------------------------------------------------------
    def _signature(self):
        try:
            st = os.lstat(self.path)
        except OSError:
            return ()
        return (st.st_ino, st.st_size, st.st_mtime_ns, st.st_mode)

    def _refresh(self):
        sig = self._signature()
        if sig != self._seen:
            self._seen = sig
            self._entries = {**self._load()[0], **self._mine}

    def _load(self):
        """(entries, replaceable) of the file now: entries that passed every check (each warning
        said what was dropped); replaceable: whether a writer may replace the file (it is missing,
        a dmath cache, or one cut short)."""
        try:
            st = os.lstat(self.path)
        except (FileNotFoundError, NotADirectoryError):
            return {}, True
        except OSError as exc:
            _warn(f"tuning cache {self.path} not read: {exc}")
            return {}, False
        if not stat.S_ISREG(st.st_mode):
            _warn(f"tuning cache {self.path} is not a regular file: ignored, and never replaced")
            return {}, False
        if st.st_size > MAX_BYTES:
            _warn(f"tuning cache {self.path} is {st.st_size:,} bytes (over {MAX_BYTES:,}): not a dmath cache, "
                  f"ignored")
            return {}, False
        try:
            fd = os.open(self.path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
            with os.fdopen(fd, "rb") as f:
                raw = f.read(MAX_BYTES + 1)
        except OSError as exc:
            _warn(f"tuning cache {self.path} not read: {exc}")
            return {}, False
        if not raw.strip():
            return {}, True
        ours = _OURS.match(raw) is not None
        try:
            doc = json.loads(raw.decode("utf-8"), parse_constant=_refuse_constant, parse_float=_finite_float)
        except (UnicodeDecodeError, ValueError, RecursionError) as exc:
            # (RecursionError: arrays or objects nested deeper than the interpreter's recursion limit,
            # which the decoder raises cleanly; no cache this module writes is nested more than a few deep)
            what = "truncated or corrupt" if ours else "not a dmath tuning cache"
            _warn(f"tuning cache {self.path} is {what} ({type(exc).__name__}: {exc}): ignored"
                  + ("; the next choice written replaces it" if ours else "; never replaced"))
            return {}, ours
        if not isinstance(doc, dict) or doc.get("format") != FORMAT or not isinstance(doc.get("entries"), dict):
            _warn(f"tuning cache {self.path} is not a dmath tuning cache (no format {FORMAT!r}): ignored, "
                  f"never replaced")
            return {}, False
        if doc.get("version") != VERSION:
            _warn(f"tuning cache {self.path} has format version {doc.get('version')!r}, this dmath reads "
                  f"{VERSION}: ignored; the next choice written replaces it")
            return {}, True
        entries, bad = {}, 0
        for name, entry in doc["entries"].items():
            if _valid(name, entry):
                entries[name] = entry
            else:
                bad += 1
        if bad:
            _warn(f"tuning cache {self.path}: {bad} entr{'y' if bad == 1 else 'ies'} malformed or not matching "
                  f"their digest: ignored")
        return entries, True

    def get(self, kind, machine, key):
        """The value stored for (kind, machine, key), or None. Re-reads the file when it changed."""
        self._refresh()
        machine, key = _plain(machine), _plain(key)
        entry = self._entries.get(digest(kind, machine, key))
        if entry is None:
            return None
        # the digest matched: the stored fields must be these very ones (a hand-edited or colliding
        # entry is not trusted)
        if entry["kind"] != kind or entry["machine"] != machine or entry["key"] != key:
            _warn(f"tuning cache {self.path}: the entry for {kind} {key} was stored for other fields: ignored")
            return None
        self._mine.setdefault(digest(kind, machine, key), entry)
        return entry["value"]

    # ---- one process tunes a key, the others read its choice ------------------------------------
    def claims_dir(self):
        return self.path + ".claims"

    def claim(self, kind, machine, key):
        """A context manager holding the claim on (kind, machine, key) (see the module docstring),
        waiting while another process holds it, at most CLAIM_WAIT_S. Its `value` is the choice the
        file holds once the claim is taken (another process's, stored while this one waited), or
        None: then tune, `put`, and call `done()`, which writes the file at once when another
        process waits for the choice. Never raises for the file system: without a claim the
        caller tunes alone."""
        return _Claim(self, kind, _plain(machine), _plain(key))

    def count(self):
        """How many entries the file holds that passed the checks (any machine's)."""
        self._refresh()
        return len(self._entries)

    # ---- writing ----------------------------------------------------------------------------
    def put(self, kind, machine, key, value):
        """Store value for (kind, machine, key), merged into the file under its lock: at once when the
        lock is free, else at this process's next write or its exit (never waiting for the lock here).
        Returns True when the entry was written or is to be (False, with a warning, when this process
        cannot write the file)."""
        machine, key, value = _plain(machine), _plain(key), _plain(value)
        entry = {"kind": kind, "machine": machine, "key": key, "value": value,
                 "written": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                 "by": f"{socket.gethostname()}:{os.getpid()}"}
        name = digest(kind, machine, key)
        self._entries[name] = self._mine[name] = entry
        if self.unwritable is not None:
            return False                              # (kept in this process; warned once already)
        self._pending[name] = entry
        return self._write_pending(wait=False)

    def flush(self):
        """Write the pending entries, waiting for the lock at most LOCK_TIMEOUT_S. Returns True when
        nothing is left pending (False, with a warning, when the file could not be written)."""
        if not self._pending or self.unwritable is not None:
            return not self._pending
        return self._write_pending(wait=True)

    def _write_pending(self, wait):
        """Merge every pending entry into the file under its lock (a busy lock: left pending, unless
        `wait`). False when the file cannot be written (why was warned)."""
        try:
            directory = os.path.dirname(os.path.abspath(self.path))
            os.makedirs(directory, mode=0o700, exist_ok=True)
            with _Lock(self.path + ".lock", LOCK_TIMEOUT_S if wait else None):
                entries, replaceable = self._load()
                if not replaceable:
                    self._pending.clear()             # _load said why; the entries stay in this process
                    return False
                entries.update(self._pending)
                self._write(directory, entries)
                self._pending.clear()
                self._entries = {**entries, **self._mine}
                self._seen = self._signature()
        except LockBusy:
            return True                               # written by a later put, or at exit
        except OSError as exc:
            self._pending.clear()
            if exc.errno == errno.ETIMEDOUT:
                self.unwritable = str(exc)
                _warn(f"tuning cache {self.path} not written: {exc}; this process writes it no more (its choices "
                      "are kept in memory)")
            else:
                _warn(f"tuning cache {self.path} not written: {exc}")
            return False
        return True

    def _write(self, directory, entries):
        text = json.dumps({"format": FORMAT, "version": VERSION, "entries": entries}, indent=1, allow_nan=False)
        fd, tmp = tempfile.mkstemp(prefix=os.path.basename(self.path) + ".", suffix=".tmp", dir=directory)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(text)
                f.flush()
                os.fsync(f.fileno())
            try:
                st = os.lstat(self.path)
            except FileNotFoundError:
                st = None
            if st is not None and not stat.S_ISREG(st.st_mode):
                raise OSError(errno.EEXIST, "not a regular file: not replaced", self.path)
            os.replace(tmp, self.path)
            tmp = None
        finally:
            if tmp is not None:
                os.unlink(tmp)
        try:                            # the rename itself survives a crash only once the directory is synced
            dfd = os.open(directory, os.O_RDONLY)
            try:
                os.fsync(dfd)
            finally:
                os.close(dfd)
        except OSError:
            pass                        # some file systems cannot sync a directory: the data is synced


#: how every file this module writes begins (a file cut short after it is still ours to replace)
_OURS = re.compile(rb'\s*\{\s*"format"\s*:\s*"' + FORMAT.encode() + rb'"')


def _plain(obj):
    """obj as it reads back from JSON (tuples become lists), so that a stored field compares equal."""
    return json.loads(_canonical(obj))


def _refuse_constant(name):
    raise ValueError(f"{name} is not a value a tuning cache holds")


def _finite_float(text):
    """A JSON number with a fraction or exponent as a float; ValueError for one no float holds (json reads
    1e999 as infinity, which this module never writes: its JSON is written with allow_nan=False)."""
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text[:40]} is beyond every float: not a value a tuning cache holds")
    return value


def _valid(name, entry):
    """True when an entry read from a file is well formed and stored under its own digest."""
    if not isinstance(entry, dict):
        return False
    kind, machine, key, value = (entry.get(f) for f in ("kind", "machine", "key", "value"))
    if not (isinstance(kind, str) and isinstance(machine, dict) and isinstance(key, dict)
            and isinstance(value, dict)):
        return False
    try:
        return name == digest(kind, machine, key)
    except (ValueError, RecursionError):
        # fields the canonical JSON refuses (a non-finite float) or cannot nest that deep: such an entry
        # was not written here, and the file's reading must not fail on it (its caller counts it malformed)
        return False


class LockBusy(Exception):
    """The lock file is held by another process, and the caller would not wait."""


class _Lock:
    """An exclusive flock on a lock file (created if missing, never a symlink), waited for at most
    `timeout` seconds (None: not at all, LockBusy when it is held). The file stays: removing it would
    let two writers lock two different files."""

    def __init__(self, path, timeout=None):
        self.path, self.timeout = path, timeout
        self.fd = None

    def __enter__(self):
        import fcntl
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o600)
        deadline = time.monotonic() + (self.timeout or 0.0)
        while True:
            try:
                fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return self
            except BlockingIOError:
                if self.timeout is None:
                    os.close(self.fd)
                    raise LockBusy(self.path) from None
                if time.monotonic() > deadline:
                    os.close(self.fd)
                    raise OSError(errno.ETIMEDOUT, f"lock held for over {self.timeout:g} s", self.path)
                time.sleep(0.01)

    def __exit__(self, *exc):
        os.close(self.fd)               # closing releases the flock
        return False


class _Claim:
    """TuneCache.claim's context manager: an flock on CLAIMS/<digest>.lock; a process that finds it held
    creates CLAIMS/<digest>.wait before it waits, so the holder knows to write the file at once."""

    def __init__(self, cache, kind, machine, key):
        self.cache, self.kind, self.machine, self.key = cache, kind, machine, key
        stem = os.path.join(cache.claims_dir(), digest(kind, machine, key))
        self.lock_path, self.wait_path = stem + ".lock", stem + ".wait"
        self.lock, self.value = None, None

    def __enter__(self):
        try:
            os.makedirs(self.cache.claims_dir(), mode=0o700, exist_ok=True)
            try:
                self.lock = _Lock(self.lock_path).__enter__()
            except LockBusy:
                # another process is tuning this key: say so, and wait for its choice
                os.close(os.open(self.wait_path, os.O_WRONLY | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o600))
                self.lock = _Lock(self.lock_path, CLAIM_WAIT_S).__enter__()
        except OSError:
            self.lock = None            # no claims here, or one held past CLAIM_WAIT_S: tune alone
        self.value = self.cache.get(self.kind, self.machine, self.key)
        return self

    def done(self):
        """After a put: write the file now if another process waits for this choice."""
        if self.lock is None:
            return
        try:
            os.unlink(self.wait_path)
        except OSError:
            return                      # nobody waits: the entry is written as put writes it
        self.cache.flush()

    def __exit__(self, *exc):
        if self.lock is not None:
            self.lock.__exit__(*exc)
        return False


_CACHES = {}
#: every TuneCache of this process (weakly: a dropped cache is gone), for flush_all
_ALL = weakref.WeakSet()


def flush_all():
    """Write every cache's pending entries (at exit: Python's exit handlers, and a worker's shutdown,
    which leaves without them), waiting for each file's lock at most LOCK_TIMEOUT_S."""
    for cache in list(_ALL):
        cache.flush()


atexit.register(flush_all)


def shared():
    """The process's TuneCache of cache_path(), or None when DMATH_TUNE_CACHE is empty."""
    path = cache_path()
    if path is None:
        return None
    cache = _CACHES.get(path)
    if cache is None:
        cache = _CACHES[path] = TuneCache(path)
    return cache


def decide(kind, machine, key, adopt, tune):
    """A choice for (kind, machine, key) under DMATH_TUNE, through the cache.

    adopt(value) turns a cached value into the choice, or returns None when
    it cannot (the value is not of the shape and types tune writes: the
    digest does not cover it; the plan does not build here, the algorithm
    is refused): then the key is tuned as if nothing were cached.
    tune(mode) makes the choice ('off': the heuristics' first, 'fast': a
    few timed, 'full': all timed) and returns (choice, value to cache or
    None). Returns (choice, source) with source 'cache', 'off', 'fast' or
    'full'. In 'fast' an uncached key is tuned under its claim: a process
    that finds another one tuning it waits and takes that one's choice
    (source 'cache'; the module docstring says how).
    """
    how = mode()
    cache = shared() if how != "off" else None
    if how == "fast" and cache is not None:
        value = cache.get(kind, machine, key)
        if value is not None:
            choice = adopt(value)
            if choice is not None:
                return choice, "cache"
        # nobody's yet: tune it here, unless another process is tuning it now (then its choice,
        # adopted after the claim is let go: the other waiters' adopting runs at the same time)
        with cache.claim(kind, machine, key) as claim:
            found = claim.value if claim.value is not None and claim.value != value else None
            if found is None:
                choice, value = tune(how)
                if value is not None:
                    cache.put(kind, machine, key, value)
                    claim.done()
                return choice, how
        choice = adopt(found)
        if choice is not None:
            return choice, "cache"
    choice, value = tune(how)
    if cache is not None and value is not None:
        cache.put(kind, machine, key, value)
    return choice, how


def timed(candidates, measure, how, few=None, budget_s=None, runs=None):
    """[(candidate, ms)] for the candidates `measure` timed, in their order (the heuristics').

    measure(candidate) returns milliseconds, or None when the candidate
    cannot run. 'full' measures every candidate; 'fast' stops after `few`
    (FAST_CANDIDATES) were timed or once `budget_s` (DMATH_TUNE_BUDGET_MS) of
    wall time went by, whichever comes first, but only after one was timed;
    an expensive shape gets more (see more_wanted). `candidates` may be a
    generator that builds each one as it is asked for: the building counts
    against the budget.
    """
    few = FAST_CANDIDATES if few is None else few
    budget_s = settings.current.tune_budget_ms / 1000.0 if budget_s is None else budget_s
    runs = settings.value("DMATH_TUNE_AMORTIZE") if runs is None else runs
    start = time.perf_counter()
    out = []
    for c in candidates:
        ms = measure(c)
        if ms is not None:
            out.append((c, float(ms)))
        if how == "fast" and out and not more_wanted(out, time.perf_counter() - start, few, budget_s, runs):
            break
    return out


def more_wanted(timed_so_far, elapsed_s, few, budget_s, runs):
    """Whether 'fast' times another candidate after `timed_so_far` [(candidate, ms)] took `elapsed_s`:
    the first `few` within `budget_s`; for an expensive shape, whose fastest plan so far run `runs`
    times outlasts budget_s, up to MORE_CANDIDATES within the time of those runs."""
    allowance_s = runs * min(ms for _, ms in timed_so_far) / 1000.0
    if allowance_s > budget_s:
        return len(timed_so_far) < max(few, MORE_CANDIDATES) and elapsed_s < allowance_s
    return len(timed_so_far) < few and elapsed_s < budget_s


def candidates_wanted(how):
    """How many candidates a tuner that lists them up front (cuBLASLt's heuristics) asks for in `how`
    ('fast': the first few, and more for an expensive shape; see timed), or None for every one."""
    if how == "fast":
        return max(FAST_CANDIDATES, MORE_CANDIDATES) if settings.value("DMATH_TUNE_AMORTIZE") else FAST_CANDIDATES
    return None


def gpu_fingerprint(**libraries):
    """The current GPU's identity for cache keys: model, compute capability, driver, CUDA runtime,
    and the given library versions (cudnn=..., cublaslt=...)."""
    from . import backend
    rt = backend.current().xp.cuda.runtime
    dev = rt.getDevice()
    props = rt.getDeviceProperties(dev)
    name = props["name"]
    out = {"gpu": name.decode() if isinstance(name, bytes) else str(name),
           "cc": f"{props['major']}.{props['minor']}",
           "cuda_driver": int(rt.driverGetVersion()), "cuda_runtime": int(rt.runtimeGetVersion()),
           "driver": _driver_release()}
    out.update({k: v if isinstance(v, (int, str)) else str(v) for k, v in libraries.items()})
    return out


def _driver_release():
    """The NVIDIA kernel driver's release ('550.54.15'), which cudaDriverGetVersion does not tell
    apart (it gives the CUDA version the driver supports); '' where it cannot be read."""
    try:
        with open("/proc/driver/nvidia/version") as f:
            match = re.search(r"\b(\d+\.\d+(?:\.\d+)?)\b", f.readline())
    except OSError:
        return ""
    return match.group(1) if match else ""
