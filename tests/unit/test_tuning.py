"""The tuning cache (dmath.tuning) with fake tuners: no GPU, no MPI.

What it must guarantee: a second process reads what the first wrote; a
corrupt, truncated, foreign or mismatched file or entry is ignored with a
warning and never trusted (nor replaced, where it is not ours); concurrent
writers from two processes both end up in the file; DMATH_TUNE's values.
"""
import json
import os
import subprocess
import tempfile
import sys
import textwrap
import time
import warnings

import pytest

from dmath import tuning
from dmath.errors import DMathError

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MACHINE = {"gpu": "NVIDIA H200", "cc": "9.0", "driver": "550.54.15", "cudnn": 91000}
KEY = {"direction": "fprop", "n": 256, "c": 3, "h": 224, "w": 224, "dtype": "float32"}


@pytest.fixture
def path(tmp_path, monkeypatch):
    p = str(tmp_path / "tune.json")
    monkeypatch.setenv("DMATH_TUNE_CACHE", p)
    monkeypatch.delenv("DMATH_TUNE", raising=False)
    tuning._CACHES.clear()
    yield p
    tuning._CACHES.clear()


class FakeTuner:
    """Counts its calls; tune() 'times' and picks plan `best`, adopt() accepts what `builds` allows."""

    def __init__(self, best="plan-b", builds=True):
        self.best, self.builds = best, builds
        self.tuned, self.adopted = [], []

    def adopt(self, value):
        self.adopted.append(value)
        return ("built", value["name"]) if self.builds else None

    def tune(self, how):
        self.tuned.append(how)
        if how == "off":
            return ("built", "plan-a"), None
        return ("built", self.best), {"name": self.best, "ms": 1.25, "candidates": [["plan-a", 2.0], [self.best, 1.25]]}

    def decide(self, key=KEY, machine=MACHINE):
        return tuning.decide("conv", machine, key, self.adopt, self.tune)


def _entries(path):
    with open(path) as f:
        return json.load(f)["entries"]


# ---- DMATH_TUNE and DMATH_TUNE_CACHE ----------------------------------------------------------
def test_mode_values(monkeypatch):
    monkeypatch.delenv("DMATH_TUNE", raising=False)
    assert tuning.mode() == "fast"
    for value in ("off", "fast", "full"):
        monkeypatch.setenv("DMATH_TUNE", value)
        assert tuning.mode() == value
    monkeypatch.setenv("DMATH_TUNE", "")          # empty is unset, as for every setting
    assert tuning.mode() == "fast"
    for bad in ("FAST", "on", "1", "fast "):
        monkeypatch.setenv("DMATH_TUNE", bad)
        with pytest.raises(DMathError, match="DMATH_TUNE must be 'off', 'fast' or 'full'"):
            tuning.mode()


def test_deterministic_runs_choose_by_the_heuristics(path, monkeypatch):
    """DMATH_DETERMINISTIC=1: every choice is the heuristics' whatever DMATH_TUNE says (a timing could
    pick another plan in the next run), and the cache is neither read nor written."""
    FakeTuner().decide()                         # cached: plan-b
    for tune in ("fast", "full"):
        monkeypatch.setenv("DMATH_TUNE", tune)
        monkeypatch.setenv("DMATH_DETERMINISTIC", "1")
        assert tuning.mode() == "off"
        t = FakeTuner(best="plan-d")
        assert t.decide() == (("built", "plan-a"), "off")
        assert t.adopted == [] and len(_entries(path)) == 1
        monkeypatch.setenv("DMATH_DETERMINISTIC", "0")
        assert tuning.mode() == tune
    monkeypatch.setenv("DMATH_DETERMINISTIC", "yes")
    with pytest.raises(DMathError, match="DMATH_DETERMINISTIC"):
        tuning.mode()


def test_cache_path(monkeypatch, tmp_path):
    monkeypatch.delenv("DMATH_TUNE_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert tuning.cache_path() == str(tmp_path / "dmath" / "tune.json")
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert tuning.cache_path() == os.path.join(os.path.expanduser("~"), ".cache", "dmath", "tune.json")
    monkeypatch.setenv("DMATH_TUNE_CACHE", "")
    assert tuning.cache_path() is None and tuning.shared() is None
    monkeypatch.setenv("DMATH_TUNE_CACHE", str(tmp_path))
    assert tuning.cache_path() == str(tmp_path / "tune.json")
    monkeypatch.setenv("DMATH_TUNE_CACHE", str(tmp_path / "x.json"))
    assert tuning.cache_path() == str(tmp_path / "x.json")


def test_bad_mode_raises_in_decide(path, monkeypatch):
    monkeypatch.setenv("DMATH_TUNE", "sometimes")
    t = FakeTuner()
    with pytest.raises(DMathError, match="sometimes"):
        t.decide()
    assert t.tuned == [] and not os.path.exists(path)


# ---- decide: the three modes ------------------------------------------------------------------
def test_fast_tunes_once_then_reads(path):
    t = FakeTuner()
    assert t.decide() == (("built", "plan-b"), "fast")
    assert t.tuned == ["fast"]
    tuning._CACHES.clear()                       # as a fresh process would
    t2 = FakeTuner(best="plan-c")
    assert t2.decide() == (("built", "plan-b"), "cache")
    assert t2.tuned == [] and t2.adopted[0]["name"] == "plan-b"
    (entry,) = _entries(path).values()
    assert entry["kind"] == "conv" and entry["machine"] == MACHINE and entry["key"] == KEY
    assert entry["value"]["candidates"] == [["plan-a", 2.0], ["plan-b", 1.25]]


def test_off_neither_reads_nor_writes(path, monkeypatch):
    FakeTuner().decide()                         # cached: plan-b
    monkeypatch.setenv("DMATH_TUNE", "off")
    t = FakeTuner()
    assert t.decide() == (("built", "plan-a"), "off")
    assert t.tuned == ["off"] and t.adopted == []
    assert len(_entries(path)) == 1


def test_full_retimes_and_refreshes(path, monkeypatch):
    FakeTuner(best="plan-b").decide()
    monkeypatch.setenv("DMATH_TUNE", "full")
    t = FakeTuner(best="plan-d")
    assert t.decide() == (("built", "plan-d"), "full")
    assert t.adopted == []
    monkeypatch.setenv("DMATH_TUNE", "fast")
    tuning._CACHES.clear()
    assert FakeTuner().decide() == (("built", "plan-d"), "cache")


def test_cached_choice_that_fails_to_build_is_retuned(path):
    FakeTuner(best="plan-b").decide()
    tuning._CACHES.clear()
    t = FakeTuner(best="plan-e", builds=False)   # the cached plan does not build here any more
    assert t.decide() == (("built", "plan-e"), "fast")
    assert len(t.adopted) == 1 and t.tuned == ["fast"]
    (entry,) = _entries(path).values()
    assert entry["value"]["name"] == "plan-e"    # the fresh choice replaced the broken one


def test_no_cache_file_when_disabled(tmp_path, monkeypatch):
    monkeypatch.setenv("DMATH_TUNE_CACHE", "")
    monkeypatch.chdir(tmp_path)
    t = FakeTuner()
    assert t.decide() == (("built", "plan-b"), "fast")
    assert t.decide()[1] == "fast" and t.tuned == ["fast", "fast"]
    assert os.listdir(tmp_path) == []


def test_keys_and_machines_are_separate_entries(path):
    FakeTuner(best="plan-b").decide()
    other_gpu = dict(MACHINE, gpu="NVIDIA H100 80GB HBM3")
    t = FakeTuner(best="plan-f")
    assert t.decide(machine=other_gpu) == (("built", "plan-f"), "fast")
    t = FakeTuner(best="plan-g")
    assert t.decide(key=dict(KEY, dtype="float16")) == (("built", "plan-g"), "fast")
    assert FakeTuner().decide() == (("built", "plan-b"), "cache")
    assert len(_entries(path)) == 3


def test_tuples_read_back_equal(path):
    cache = tuning.TuneCache(path)
    cache.put("lt", {"gpu": "x", "v": (1, 2)}, {"shape": (3, 4)}, {"algo": (5, 6)})
    again = tuning.TuneCache(path)
    assert again.get("lt", {"gpu": "x", "v": (1, 2)}, {"shape": (3, 4)}) == {"algo": [5, 6]}


# ---- a second process -------------------------------------------------------------------------
# a process choosing for one key: its tune picks argv[1], after sleeping argv[2] seconds (if given)
_CHILD = textwrap.dedent("""
    import json, sys, time
    from dmath import tuning
    calls = []
    def adopt(value):
        return value["name"]
    def tune(how):
        calls.append(how)
        time.sleep(float(sys.argv[2]) if len(sys.argv) > 2 else 0.0)
        return sys.argv[1], {"name": sys.argv[1]}
    choice, source = tuning.decide("conv", {"gpu": "G"}, {"n": 1}, adopt, tune)
    print(json.dumps({"choice": choice, "source": source, "tuned": calls}))
""")


def _child(path, arg, **env):
    out = subprocess.run([sys.executable, "-c", _CHILD, arg], capture_output=True, text=True, timeout=120,
                         env=dict(os.environ, PYTHONPATH=ROOT, DMATH_TUNE_CACHE=path, **env), check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_second_process_reads_what_the_first_wrote(path):
    first = _child(path, "plan-x")
    assert first == {"choice": "plan-x", "source": "fast", "tuned": ["fast"]}
    second = _child(path, "plan-y")
    assert second == {"choice": "plan-x", "source": "cache", "tuned": []}


def test_a_process_keeps_its_choice_when_another_writes_one_for_the_same_key(path):
    """Two workers of a job time the same shape at once and may choose differently; each keeps its
    own choice (stored or first read) for the rest of its life, so that a second model it builds
    computes the first one's bits, while a process that never chose reads the file's latest."""
    mine, other = tuning.TuneCache(path), tuning.TuneCache(path)
    assert mine.put("conv", MACHINE, KEY, {"name": "plan-a"})
    assert other.get("conv", MACHINE, KEY) == {"name": "plan-a"}      # read, and so kept by `other` too
    third = tuning.TuneCache(path)
    assert third.put("conv", MACHINE, KEY, {"name": "plan-c"})          # a third process's later choice
    assert mine.get("conv", MACHINE, KEY) == {"name": "plan-a"}
    assert other.get("conv", MACHINE, KEY) == {"name": "plan-a"}
    assert tuning.TuneCache(path).get("conv", MACHINE, KEY) == {"name": "plan-c"}
    assert mine.get("conv", MACHINE, dict(KEY, n=999)) is None          # other keys: the file as it is
    assert len(_entries(path)) == 1


_WRITER = textwrap.dedent("""
    import sys
    from dmath import tuning
    cache = tuning.TuneCache(sys.argv[1])
    for i in range(int(sys.argv[3])):
        assert cache.put("conv", {"gpu": "G"}, {"writer": sys.argv[2], "i": i}, {"name": f"p{i}"})
""")


def test_concurrent_writers_keep_both_entries(path):
    n = 40
    procs = [subprocess.Popen([sys.executable, "-c", _WRITER, path, w, str(n)], env=dict(os.environ, PYTHONPATH=ROOT))
             for w in ("a", "b")]
    assert [p.wait(timeout=300) for p in procs] == [0, 0]
    entries = _entries(path)
    assert len(entries) == 2 * n
    cache = tuning.TuneCache(path)
    for w in ("a", "b"):
        for i in range(n):
            assert cache.get("conv", {"gpu": "G"}, {"writer": w, "i": i}) == {"name": f"p{i}"}
    leftovers = [f for f in os.listdir(os.path.dirname(path)) if f.endswith(".tmp")]
    assert leftovers == []


# ---- files not to trust -----------------------------------------------------------------------
def _write(path, text):
    with open(path, "w") as f:
        f.write(text)


def test_corrupt_file_ignored_and_not_replaced(path):
    _write(path, "\x00\x01 not json at all")
    t = FakeTuner()
    with pytest.warns(tuning.TuneCacheWarning, match="not a dmath tuning cache.*never replaced"):
        assert t.decide() == (("built", "plan-b"), "fast")
    assert t.adopted == [] and t.tuned == ["fast"]
    with open(path) as f:
        assert f.read() == "\x00\x01 not json at all"


def test_truncated_file_ignored_then_replaced(path):
    FakeTuner().decide()
    with open(path) as f:
        text = f.read()
    _write(path, text[: len(text) // 2])            # a cache cut short (a full disk, a copy interrupted)
    tuning._CACHES.clear()
    t = FakeTuner(best="plan-h")
    with pytest.warns(tuning.TuneCacheWarning, match="truncated or corrupt"):
        assert t.decide() == (("built", "plan-h"), "fast")
    assert t.adopted == []
    (entry,) = _entries(path).values()              # rewritten whole
    assert entry["value"]["name"] == "plan-h"


def test_foreign_json_ignored_and_not_replaced(path):
    _write(path, json.dumps({"format": "someone-else", "entries": {}}))
    t = FakeTuner()
    with pytest.warns(tuning.TuneCacheWarning, match="not a dmath tuning cache"):
        assert t.decide()[1] == "fast"
    with open(path) as f:
        assert json.load(f) == {"format": "someone-else", "entries": {}}


def test_other_version_ignored(path):
    name = tuning.digest("conv", MACHINE, KEY)
    _write(path, json.dumps({"format": tuning.FORMAT, "version": 99, "entries": {
        name: {"kind": "conv", "machine": MACHINE, "key": KEY, "value": {"name": "plan-z"}}}}))
    t = FakeTuner()
    with pytest.warns(tuning.TuneCacheWarning, match="format version 99"):
        assert t.decide() == (("built", "plan-b"), "fast")
    assert t.adopted == []


def test_entry_whose_fields_do_not_match_is_not_trusted(path):
    """An entry filed under this machine's digest but stored for another GPU (edited, or a collision)
    is dropped with a warning; the well-formed entries of the same file are still used."""
    good_key = dict(KEY, n=128)
    forged = {"kind": "conv", "machine": dict(MACHINE, gpu="Some Other GPU"), "key": KEY, "value": {"name": "evil"}}
    good = {"kind": "conv", "machine": MACHINE, "key": good_key, "value": {"name": "plan-k"}}
    _write(path, json.dumps({"format": tuning.FORMAT, "version": tuning.VERSION, "entries": {
        tuning.digest("conv", MACHINE, KEY): forged,
        tuning.digest("conv", MACHINE, good_key): good,
        "0" * 64: "not an entry"}}))
    t = FakeTuner()
    with pytest.warns(tuning.TuneCacheWarning, match="2 entries malformed or not matching"):
        assert t.decide() == (("built", "plan-b"), "fast")
    assert all(v["name"] != "evil" for v in t.adopted) and t.tuned == ["fast"]
    assert FakeTuner().decide(key=good_key) == (("built", "plan-k"), "cache")


def test_get_checks_the_stored_fields(path):
    """Even an entry that passed the load checks is compared field by field with the request."""
    cache = tuning.TuneCache(path)
    cache.put("conv", MACHINE, KEY, {"name": "plan-b"})
    name = tuning.digest("conv", MACHINE, KEY)
    cache._entries[name] = dict(cache._entries[name], machine=dict(MACHINE, gpu="other"))
    cache._seen = cache._signature()
    with pytest.warns(tuning.TuneCacheWarning, match="stored for other fields"):
        assert cache.get("conv", MACHINE, KEY) is None


def test_a_file_nested_too_deeply_to_read_is_ignored_then_replaced(path):
    """JSON nested 200,000 deep (a valid beginning, then brackets) makes the decoder exceed the
    recursion limit: a corrupt file like any other, not a RecursionError out of the first choice."""
    _write(path, '{"format":"dmath-tune-cache","version":1,"entries":' + "[" * 200_000 + "]" * 200_000 + "}")
    t = FakeTuner()
    with pytest.warns(tuning.TuneCacheWarning, match="truncated or corrupt.*RecursionError"):
        assert t.decide() == (("built", "plan-b"), "fast")
    assert t.adopted == [] and t.tuned == ["fast"]
    (entry,) = _entries(path).values()              # it began as ours: rewritten whole
    assert entry["value"]["name"] == "plan-b"


def test_a_number_beyond_every_float_makes_the_file_corrupt(path):
    """1e999 reads as infinity in Python's json, which no cache this module writes holds (it writes
    with allow_nan=False): refused at parse time as the literals NaN and Infinity are, where it
    escaped as a ValueError from the digest of the entry."""
    good_key = dict(KEY, n=128)
    good = {"kind": "conv", "machine": MACHINE, "key": good_key, "value": {"name": "plan-k"}}
    text = json.dumps({"format": tuning.FORMAT, "version": tuning.VERSION, "entries": {
        tuning.digest("conv", MACHINE, good_key): good,
        "x": {"kind": "conv", "machine": {"a": 12345}, "key": {}, "value": {}}}}).replace("12345", "1e999")
    for number in ("1e999", "-1e999", "Infinity", "NaN"):
        _write(path, text.replace("1e999", number))
        tuning._CACHES.clear()
        t = FakeTuner()
        with pytest.warns(tuning.TuneCacheWarning, match=f"truncated or corrupt.*{number}"):
            assert t.decide(key=good_key) == (("built", "plan-b"), "fast")
        assert t.adopted == []


def test_an_entry_that_cannot_be_digested_is_malformed_not_a_crash():
    """The per-entry check returns False for fields the canonical JSON refuses (a non-finite float,
    nesting past the recursion limit) instead of raising out of the file's reading."""
    deep = {}
    for _ in range(100_000):
        deep = {"d": deep}
    for machine in ({"a": float("inf")}, {"a": float("nan")}, deep):
        assert tuning._valid("0" * 64, {"kind": "conv", "machine": machine, "key": KEY, "value": {}}) is False
    assert tuning._valid(tuning.digest("conv", MACHINE, KEY),
                         {"kind": "conv", "machine": MACHINE, "key": KEY, "value": {}}) is True


def test_inf_entries_among_good_ones_cost_one_warning(path, monkeypatch):
    """An entry whose fields cannot be digested (here let through by a parser that accepts 1e999)
    is counted among the malformed ones: one warning for the file; its good entries are used."""
    monkeypatch.setattr(tuning, "_finite_float", float)
    good_key = dict(KEY, n=128)
    good = {"kind": "conv", "machine": MACHINE, "key": good_key, "value": {"name": "plan-k"}}
    _write(path, json.dumps({"format": tuning.FORMAT, "version": tuning.VERSION, "entries": {
        tuning.digest("conv", MACHINE, good_key): good,
        "x": {"kind": "conv", "machine": {"a": 12345}, "key": {}, "value": {}},
        "y": {"kind": "conv", "machine": MACHINE, "key": {"n": 12345}, "value": {}}}}).replace("12345", "1e999"))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert FakeTuner().decide(key=good_key) == (("built", "plan-k"), "cache")
    messages = [str(w.message) for w in caught if issubclass(w.category, tuning.TuneCacheWarning)]
    assert len(messages) == 1 and "2 entries malformed" in messages[0]


@pytest.mark.parametrize("kind", ["symlink", "fifo"])
def test_non_regular_file_is_not_read_or_replaced(path, tmp_path, kind):
    if kind == "symlink":
        target = tmp_path / "elsewhere.json"
        FakeTuner().decide()
        os.replace(path, target)
        os.symlink(target, path)
        tuning._CACHES.clear()              # a new process (this one keeps the choice it made)
    else:
        os.mkfifo(path)
    t = FakeTuner()
    with pytest.warns(tuning.TuneCacheWarning, match="not a regular file"):
        assert t.decide() == (("built", "plan-b"), "fast")
    assert t.adopted == [] and t.tuned == ["fast"]
    assert os.path.islink(path) if kind == "symlink" else not os.path.isfile(path)


def test_unwritable_location_warns(tmp_path, monkeypatch):
    """A cache that cannot be written (here its directory would be inside a regular file) costs a
    warning, not the run: the choice is made all the same."""
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    monkeypatch.setenv("DMATH_TUNE_CACHE", str(blocker / "tune.json"))
    tuning._CACHES.clear()
    try:
        with pytest.warns(tuning.TuneCacheWarning, match="not written"):
            assert FakeTuner().decide() == (("built", "plan-b"), "fast")
    finally:
        tuning._CACHES.clear()
    assert blocker.read_text() == "x"


def _hold_lock(path):
    """A process holding the cache's lock until killed."""
    holder = subprocess.Popen([sys.executable, "-c", (
        "import fcntl, os, sys, time; fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT); "
        "fcntl.flock(fd, fcntl.LOCK_EX); print('held', flush=True); time.sleep(60)"), str(path) + ".lock"],
        stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "held"
    return holder


def test_a_busy_lock_never_stalls_a_choice_and_the_next_write_takes_everything(tmp_path):
    """While another process holds the lock, put returns at once and keeps the entry pending (used by
    this process); the first put after the lock is free writes every pending entry in one rewrite."""
    path = tmp_path / "tune.json"
    holder = _hold_lock(path)
    try:
        cache = tuning.TuneCache(str(path))
        t0 = time.monotonic()
        with warnings.catch_warnings():
            warnings.simplefilter("error")            # no warning: nothing went wrong
            for k in range(20):
                assert cache.put("conv", {"gpu": "x"}, {"shape": k}, {"k": k}) is True
        assert time.monotonic() - t0 < 0.5            # no waits for the lock
        assert cache.get("conv", {"gpu": "x"}, {"shape": 5}) == {"k": 5}     # used at once here
        assert not path.exists()
    finally:
        holder.kill()
        holder.wait()
    assert cache.put("conv", {"gpu": "x"}, {"shape": 20}, {"k": 20}) is True
    assert len(_entries(str(path))) == 21
    other = tuning.TuneCache(str(path))
    assert other.get("conv", {"gpu": "x"}, {"shape": 7}) == {"k": 7}


def test_pending_entries_are_written_at_exit():
    """flush_all (at exit, and at a worker's shutdown) writes what a busy lock left pending."""
    code = textwrap.dedent("""
        import fcntl, os, sys
        from dmath import tuning
        path = sys.argv[1]
        fd = os.open(path + ".lock", os.O_RDWR | os.O_CREAT)
        fcntl.flock(fd, fcntl.LOCK_EX)              # held by this process through another descriptor
        cache = tuning.TuneCache(path)
        assert cache.put("conv", {"gpu": "G"}, {"n": 1}, {"name": "p"})
        assert not os.path.exists(path)
        os.close(fd)                                # released: the exit handler writes the entry
    """)
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "tune.json")
        subprocess.run([sys.executable, "-c", code, path], check=True, timeout=120,
                       env=dict(os.environ, PYTHONPATH=ROOT))
        assert tuning.TuneCache(path).get("conv", {"gpu": "G"}, {"n": 1}) == {"name": "p"}


def test_a_lock_held_too_long_at_the_final_write_costs_one_wait(tmp_path, monkeypatch):
    """A cache whose lock another process holds past LOCK_TIMEOUT_S when this one must write (flush,
    at exit) is written no more by this process: one wait and one warning, its choices kept in
    memory, every later put returns at once; the file is left as it was."""
    path = tmp_path / "tune.json"
    monkeypatch.setattr(tuning, "LOCK_TIMEOUT_S", 0.2)
    holder = _hold_lock(path)
    try:
        cache = tuning.TuneCache(str(path))
        assert cache.put("conv", {"gpu": "x"}, {"shape": 1}, [1]) is True
        with pytest.warns(tuning.TuneCacheWarning, match="writes it no more"):
            assert cache.flush() is False
        t0 = time.monotonic()
        with warnings.catch_warnings():
            warnings.simplefilter("error")            # no second warning
            for k in range(20):
                assert cache.put("conv", {"gpu": "x"}, {"shape": 2 + k}, [k]) is False
            assert cache.flush() is True              # (nothing pending: nothing to write)
        assert time.monotonic() - t0 < 0.2
        assert cache.get("conv", {"gpu": "x"}, {"shape": 5}) == [3]     # kept in this process
        assert not path.exists()
    finally:
        holder.kill()
        holder.wait()


# ---- timed: the fast mode's few candidates and budget -----------------------------------------
def test_timed_fast_stops_after_few():
    asked = []

    def measure(c):
        asked.append(c)
        return None if c % 3 == 0 else float(c)      # every third candidate cannot run
    out = tuning.timed(iter(range(20)), measure, "fast", few=3, runs=0)
    assert out == [(1, 1.0), (2, 2.0), (4, 4.0)] and asked == [0, 1, 2, 3, 4]
    asked.clear()
    assert len(tuning.timed(range(20), measure, "full", few=3, runs=0)) == 13 and len(asked) == 20


def test_timed_fast_budget_after_one(monkeypatch):
    clock = iter(range(0, 1000, 10))                 # every reading of the clock: 10 s later
    monkeypatch.setattr(tuning.time, "perf_counter", lambda: next(clock))
    out = tuning.timed(range(10), lambda c: None if c < 2 else 1.0, "fast", few=5, budget_s=5)
    assert out == [(2, 1.0)]                          # over budget from the start: stops once one was timed
    out = tuning.timed(range(10), lambda c: 1.0, "fast", few=5, budget_s=25)
    assert [c for c, _ in out] == [0, 1, 2]


def test_timed_fast_times_more_of_an_expensive_shape(monkeypatch):
    """A shape whose fastest plan, run `runs` times, outlasts the budget is timed past the first few (up
    to MORE_CANDIDATES) while the time spent stays below those runs; a cheap one stops at the few."""
    clock = iter(range(0, 10000))                     # every reading of the clock: 1 s later
    monkeypatch.setattr(tuning.time, "perf_counter", lambda: next(clock))
    ms = {c: 2.0 if c < 4 else 1.0 for c in range(40)}
    # 1000 runs of 2 ms: 2 s > the 0.5 s budget, so more candidates while under 2 s (then 1 ms: 1 s)
    out = tuning.timed(range(40), ms.get, "fast", few=1, budget_s=0.5, runs=1000)
    assert [c for c, _ in out] == [0, 1]              # the second reading (2 s) reaches the allowance
    out = tuning.timed(range(40), ms.get, "fast", few=1, budget_s=0.5, runs=10_000)
    assert [c for c, _ in out] == list(range(10))     # 10 runs of 1 ms... 20 s at 2 ms: stops at 10 s, 1 ms
    monkeypatch.setattr(tuning.time, "perf_counter", lambda: 0.0)
    out = tuning.timed(range(40), ms.get, "fast", few=2, budget_s=0.5, runs=10_000)
    assert len(out) == tuning.MORE_CANDIDATES        # no time passes: capped by the count
    out = tuning.timed(range(40), ms.get, "fast", few=2, budget_s=0.5, runs=100)
    assert len(out) == 2                              # 100 runs of 2 ms fit the budget: the first few only
    out = tuning.timed(range(40), ms.get, "fast", few=2, budget_s=0.5, runs=0)
    assert len(out) == 2


def test_init_refuses_a_bad_mode_before_starting():
    out = subprocess.run([sys.executable, "-c", "import dmath; dmath.init('cpu')"], capture_output=True, text=True,
                         timeout=120, env=dict(os.environ, PYTHONPATH=ROOT, DMATH_TUNE="always"))
    assert out.returncode != 0
    assert "DMATH_TUNE must be 'off', 'fast' or 'full', got 'always'" in out.stderr


def test_info_reports_the_settings(path, monkeypatch):
    from dmath import machine as info
    FakeTuner().decide()
    FakeTuner().decide(key=dict(KEY, n=64))
    assert info.report()["tuning"] == {"mode": "fast", "cache": path, "entries": 2}
    monkeypatch.setenv("DMATH_TUNE", "sometimes")
    assert info.report()["tuning"]["mode"].startswith("invalid: DMATH_TUNE must be")
    monkeypatch.setenv("DMATH_TUNE_CACHE", "")
    assert info.report()["tuning"]["cache"].startswith("off")


# ---- one process tunes a key, the others wait for its choice ------------------------------------
def _slow_tuners(path, names, seconds, **env):
    procs = [subprocess.Popen([sys.executable, "-c", _CHILD, name, str(seconds)], stdout=subprocess.PIPE,
                              text=True, env=dict(os.environ, PYTHONPATH=ROOT, DMATH_TUNE_CACHE=path, **env))
             for name in names]
    outs = [p.communicate(timeout=120)[0] for p in procs]
    assert [p.returncode for p in procs] == [0] * len(procs)
    return [json.loads(o.strip().splitlines()[-1]) for o in outs]


def test_one_process_tunes_a_new_key_and_the_others_take_its_choice(path):
    """The workers of a job meet a new shape at once: one tunes it (its claim), the others wait and
    take its choice from the file, so all run the same plan (each had timed and chosen its own)."""
    results = _slow_tuners(path, ["plan-a", "plan-b", "plan-c"], 1.5)
    tuned = [r for r in results if r["tuned"]]
    assert len(tuned) == 1 and tuned[0]["source"] == "fast"
    assert {r["choice"] for r in results} == {tuned[0]["choice"]}
    assert sorted(r["source"] for r in results) == ["cache", "cache", "fast"]
    assert len(_entries(path)) == 1
    assert [f for f in os.listdir(path + ".claims") if not f.endswith(".lock")] == []    # no wait mark left


def test_full_mode_and_no_cache_take_no_claims(path, tmp_path):
    results = _slow_tuners(path, ["plan-a", "plan-b"], 0.3, DMATH_TUNE="full")
    assert all(r["tuned"] == ["full"] and r["source"] == "full" for r in results)
    assert not os.path.exists(path + ".claims")
    results = _slow_tuners("", ["plan-a", "plan-b"], 0.3)
    assert all(r["tuned"] == ["fast"] for r in results)


def _hold_claim(path, key_digest, seconds):
    """A process holding a key's claim for `seconds`, then exiting without a choice (as one that died)."""
    os.makedirs(path + ".claims", exist_ok=True)
    holder = subprocess.Popen([sys.executable, "-c", (
        "import fcntl, os, sys, time; fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT); "
        "fcntl.flock(fd, fcntl.LOCK_EX); print('held', flush=True); time.sleep(float(sys.argv[2]))"),
        os.path.join(path + ".claims", key_digest + ".lock"), str(seconds)], stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "held"
    return holder


def test_a_claim_whose_holder_ends_without_a_choice_is_taken_and_the_key_tuned(path):
    holder = _hold_claim(path, tuning.digest("conv", MACHINE, KEY), 0.8)
    try:
        t0 = time.monotonic()
        t = FakeTuner()
        assert t.decide() == (("built", "plan-b"), "fast")
        assert time.monotonic() - t0 > 0.5 and t.tuned == ["fast"]
        assert os.path.exists(os.path.join(path + ".claims", tuning.digest("conv", MACHINE, KEY) + ".wait")) is False
    finally:
        holder.kill()
        holder.wait()


def test_a_claim_held_past_the_wait_is_passed_over(path, monkeypatch):
    monkeypatch.setattr(tuning, "CLAIM_WAIT_S", 0.3)
    holder = _hold_claim(path, tuning.digest("conv", MACHINE, KEY), 60)
    try:
        t0 = time.monotonic()
        t = FakeTuner()
        assert t.decide() == (("built", "plan-b"), "fast")
        assert 0.25 < time.monotonic() - t0 < 10 and t.tuned == ["fast"]
        assert tuning.TuneCache(path).get("conv", MACHINE, KEY) == {"name": "plan-b", "ms": 1.25,
                                                                     "candidates": [["plan-a", 2.0], ["plan-b", 1.25]]}
    finally:
        holder.kill()
        holder.wait()


def test_claims_without_a_writable_directory_tune_alone(path):
    with open(path + ".claims", "w") as f:      # a file where the claims' directory would be
        f.write("x")
    t = FakeTuner()
    assert t.decide() == (("built", "plan-b"), "fast")
    assert t.tuned == ["fast"] and len(_entries(path)) == 1


def test_a_waiter_that_cannot_use_the_choice_tunes_its_own(path, monkeypatch):
    """The choice read after the claim does not build here (adopt refuses it): tuned as if none."""
    name = tuning.digest("conv", MACHINE, KEY)
    holder = _hold_claim(path, name, 0.5)
    tuning.TuneCache(path).put("conv", MACHINE, KEY, {"name": "plan-elsewhere"})
    try:
        t = FakeTuner(builds=False)
        # the value is in the file before the claim is asked: adopt refuses it once, the claim is waited
        # for, the file holds the same value: tuned here, and written
        assert t.decide() == (("built", "plan-b"), "fast")
        assert t.tuned == ["fast"] and t.adopted == [{"name": "plan-elsewhere"}]
    finally:
        holder.kill()
        holder.wait()
