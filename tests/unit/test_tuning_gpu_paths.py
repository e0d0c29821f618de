"""The GPU choosers wired to dmath.tuning (dmath.gpu.cudnn's plans, dmath.gpu.cublaslt's algorithms), run on
the CPU against fake libraries: which candidates get built and timed under each DMATH_TUNE, what the
cache holds, and that a cached choice is adopted (one build) or, where it no longer builds or is
refused, tuned again. The libraries' own behaviour is the GPU suite's to test; this is the logic
around them, which otherwise only a GPU would run.
"""
import ctypes
import sys
import types

import pytest

from dmath import backend, tuning
from dmath.gpu import cublaslt, cudnn


# ---- a fake device: a clock that kernels advance, events that read it --------------------------
class Clock:
    def __init__(self):
        self.t = 0.0


class Event:
    def __init__(self, clock):
        self.clock, self.t = clock, None

    def record(self, stream=None):
        self.t = self.clock.t

    def synchronize(self):
        pass


def fake_xp(clock):
    stream = types.SimpleNamespace(ptr=7, synchronize=lambda: None)
    runtime = types.SimpleNamespace(
        getDevice=lambda: 0, driverGetVersion=lambda: 12080, runtimeGetVersion=lambda: 12080,
        getDeviceProperties=lambda dev: {"name": b"NVIDIA H200", "major": 9, "minor": 0})
    cuda = types.SimpleNamespace(Event=lambda: Event(clock), get_current_stream=lambda: stream,
                                 get_elapsed_time=lambda a, b: b.t - a.t, runtime=runtime)
    return types.SimpleNamespace(cuda=cuda)


@pytest.fixture
def device(monkeypatch, tmp_path):
    """A fake GPU backend and a fresh tuning cache file; yields the clock."""
    clock = Clock()
    be = types.SimpleNamespace(xp=fake_xp(clock), is_gpu=True)
    monkeypatch.setattr(backend, "current", lambda: be)
    monkeypatch.setenv("DMATH_TUNE_CACHE", str(tmp_path / "tune.json"))
    monkeypatch.delenv("DMATH_TUNE", raising=False)
    # the fakes' plans take milliseconds, which makes every shape expensive: the first-few rule here,
    # the expensive shapes' rule in the tests that set it
    monkeypatch.setenv("DMATH_TUNE_AMORTIZE", "0")
    tuning._CACHES.clear()
    yield clock
    tuning._CACHES.clear()


# ---- cuDNN -------------------------------------------------------------------------------------
class Plan:
    def __init__(self, name, ms, workspace=0, builds=True, runs=True):
        self.name, self.ms, self.workspace, self.builds, self.runs = name, ms, workspace, builds, runs


class FakeTensor:
    def __getattr__(self, name):        # set_output, set_dim, set_stride, set_data_type chain
        return lambda *a, **k: self


class FakeGraph:
    """The pygraph calls dmath.gpu.cudnn makes, over a list of Plans in the heuristics' order."""

    def __init__(self, lib):
        self.lib, self.plans, self.limit = lib, lib.plans, None
        self.built = set()

    def tensor(self, **kw):
        return FakeTensor()

    conv_fprop = conv_dgrad = conv_wgrad = bias = relu = tensor

    def validate(self):
        pass

    build_operation_graph = validate

    def create_execution_plans(self, modes):
        pass

    def deselect_numeric_notes(self, notes):
        pass

    def deselect_workspace_greater_than(self, nbytes):
        self.limit = nbytes

    def check_support(self):
        pass

    def get_execution_plan_count(self):
        return len(self.plans)

    def get_plan_name_at_index(self, i):
        return self.plans[i].name

    def build_plan_at_index(self, i):
        p = self.plans[i]
        self.lib.builds.append(p.name)
        if not p.builds or (self.limit is not None and p.workspace > self.limit):
            raise RuntimeError(f"{p.name} does not build")
        self.built.add(i)

    def get_workspace_size_plan_at_index(self, i):
        if i not in self.built:
            raise RuntimeError("not built")
        return self.plans[i].workspace

    def execute_plan_at_index(self, pack, workspace, i, handle):
        assert i in self.built
        p = self.plans[i]
        if not p.runs:
            raise RuntimeError(f"{p.name} failed")
        self.lib.runs.append(p.name)
        self.lib.clock.t += p.ms


def fake_cudnn(monkeypatch, clock, plans):
    lib = types.SimpleNamespace(plans=plans, builds=[], runs=[], clock=clock, __version__="1.99")
    dt = types.SimpleNamespace(HALF=0, FLOAT=1, DOUBLE=2)
    lib.data_type = dt
    lib.heur_mode = types.SimpleNamespace(A=0, FALLBACK=1)
    lib.numerical_note = types.SimpleNamespace(TENSOR_CORE=0, DOWN_CONVERT_INPUTS=1)
    lib.pygraph = lambda **kw: FakeGraph(lib)
    lib.set_stream = lambda handle, ptr: None
    monkeypatch.setattr(cudnn, "_module", lambda: lib)
    monkeypatch.setattr(cudnn, "_state", {"cudnn": lib, "handle": 1, "version": 91000})
    monkeypatch.setattr(cudnn, "_plans", {})
    monkeypatch.setattr(cudnn, "_budget", lambda: 1000)
    buffer = types.SimpleNamespace(data=types.SimpleNamespace(ptr=99), size=1 << 30)
    monkeypatch.setattr(cudnn, "memory", types.SimpleNamespace(empty=lambda shape, dtype: buffer,
                                                               keep_for_capture=lambda ws: None,
                                                               capture_lane=lambda: 0))
    return lib


KEY = cudnn.ConvKey("fprop", 256, 64, 27, 27, 192, 5, 5, 1, 1, 2, 2, 1, 1, 1, "float32", "", True)
PTRS = (1, 2, 3)


def _plans():
    # in the heuristics' order: p1 does not build, p5 runs fastest but is sixth to build, p3 needs
    # more workspace than the budget (1000 bytes), p4 is within 5% of p2 with a smaller workspace
    return [Plan("p0", 3.0), Plan("p1", 1.0, builds=False), Plan("p2", 2.0, workspace=500),
            Plan("p3", 0.5, workspace=5000), Plan("p4", 2.05, workspace=100), Plan("p6", 2.5),
            Plan("p5", 1.5), Plan("p7", 4.0)]


def _fresh(monkeypatch):
    """A new process as far as the choosers know: no plans, the cache re-read from disk."""
    monkeypatch.setattr(cudnn, "_plans", {})
    tuning._CACHES.clear()


def test_cudnn_fast_times_the_first_few_then_reads_the_cache(device, monkeypatch):
    lib = fake_cudnn(monkeypatch, device, _plans())
    cudnn.conv(KEY, PTRS)
    # built in order until four ran: p0, p1 (fails), p2, p3 (over budget: never built), p4, p6
    assert lib.builds == ["p0", "p1", "p2", "p3", "p4", "p6"]
    timed = [n for n in dict.fromkeys(lib.runs)]
    assert timed == ["p0", "p2", "p4", "p6"]
    plan = cudnn._plans[KEY]
    # p2 is the fastest timed; p4 is within NEAR_FASTEST of it with a smaller workspace
    assert plan.choice["name"] == "p4" and plan.source == "fast" and "fastest (2.000 ms)" in plan.why
    assert lib.runs.count("p4") == 1 + cudnn.TIMED_RUNS + 1            # warm-up, timed, the call itself
    row = cudnn.explain()[0]
    assert row["engine"] == "p4" and row["source"] == "fast" and row["ms"] == pytest.approx(2.05)

    _fresh(monkeypatch)
    lib.builds.clear()
    lib.runs.clear()
    cudnn.conv(KEY, PTRS)
    plan = cudnn._plans[KEY]
    assert plan.source == "cache" and plan.choice["name"] == "p4"
    assert lib.builds == ["p4"] and lib.runs == ["p4", "p4"]            # checked once, then the call
    assert plan.choice["ms"] == pytest.approx(2.05) and plan.why.startswith("cached: ")


def test_cudnn_fast_times_more_plans_of_an_expensive_shape(device, monkeypatch):
    """1000 runs of the fastest plan so far (2 ms: 2 s) outlast the budget: 'fast' goes on past the
    first four, and p5 (1.5 ms, sixth to build) is chosen."""
    monkeypatch.setenv("DMATH_TUNE_AMORTIZE", "1000")
    lib = fake_cudnn(monkeypatch, device, _plans())
    cudnn.conv(KEY, PTRS)
    assert [n for n in dict.fromkeys(lib.runs)] == ["p0", "p2", "p4", "p6", "p5", "p7"]
    assert cudnn._plans[KEY].choice["name"] == "p5" and cudnn._plans[KEY].source == "fast"


def test_cudnn_cached_plan_that_no_longer_builds_is_retuned(device, monkeypatch):
    lib = fake_cudnn(monkeypatch, device, _plans())
    cudnn.conv(KEY, PTRS)
    _fresh(monkeypatch)
    lib.plans[4].builds = False                                        # p4 (cached) gone: a new cuDNN
    cudnn.conv(KEY, PTRS)
    plan = cudnn._plans[KEY]
    assert plan.source == "fast" and plan.choice["name"] == "p5"       # timed p0 p2 p6 p5
    _fresh(monkeypatch)
    lib.plans[6].runs = False                                          # p5 (cached) builds but fails to run
    cudnn.conv(KEY, PTRS)
    assert cudnn._plans[KEY].source == "fast" and cudnn._plans[KEY].choice["name"] == "p2"


def test_cudnn_full_times_every_plan_and_ignores_the_cache(device, monkeypatch):
    lib = fake_cudnn(monkeypatch, device, _plans())
    cudnn.conv(KEY, PTRS)                                              # fast: caches p4
    _fresh(monkeypatch)
    monkeypatch.setenv("DMATH_TUNE", "full")
    lib.builds.clear()
    cudnn.conv(KEY, PTRS)
    plan = cudnn._plans[KEY]
    assert plan.source == "full" and plan.choice["name"] == "p5"       # p3 is faster but over the budget
    assert lib.builds == ["p0", "p1", "p2", "p3", "p4", "p6", "p5", "p7"]
    _fresh(monkeypatch)
    monkeypatch.setenv("DMATH_TUNE", "fast")
    cudnn.conv(KEY, PTRS)
    assert cudnn._plans[KEY].source == "cache" and cudnn._plans[KEY].choice["name"] == "p5"


def test_cudnn_off_takes_the_first_that_builds_untimed(device, monkeypatch, tmp_path):
    monkeypatch.setenv("DMATH_TUNE", "off")
    lib = fake_cudnn(monkeypatch, device, _plans())
    lib.plans[0].builds = False
    cudnn.conv(KEY, PTRS)
    plan = cudnn._plans[KEY]
    assert plan.choice["name"] == "p2" and plan.choice["ms"] is None and plan.source == "off"
    assert lib.builds == ["p0", "p1", "p2"] and lib.runs == ["p2"]     # the call only: nothing timed
    assert "untimed" in cudnn.describe(cudnn.explain())
    assert not (tmp_path / "tune.json").exists()


def test_cudnn_large_workspace_is_the_calls_own(device, monkeypatch):
    """A workspace up to DMATH_CUDNN_WORKSPACE_KEEP is the worker's one kept buffer; a larger one is
    allocated for each call (freed with it: inside a capture, from the graph's pool) and never kept."""
    monkeypatch.setenv("DMATH_TUNE", "off")
    fake_cudnn(monkeypatch, device, [Plan("small", 1.0, workspace=100)])
    made, kept = [], []
    monkeypatch.setattr(cudnn, "memory", types.SimpleNamespace(
        empty=lambda shape, dtype: made.append(shape) or types.SimpleNamespace(
            data=types.SimpleNamespace(ptr=99), size=shape[0]),
        keep_for_capture=kept.append, capture_lane=lambda: 0))
    monkeypatch.setattr(cudnn.settings, "current", types.SimpleNamespace(
        cudnn_workspace_keep=200, tf32=True, deterministic=False))
    for _ in range(3):
        cudnn.conv(KEY, PTRS)
    assert made == [(100,)] and cudnn.workspace_bytes() == 100 and len(kept) == 3   # one buffer, kept
    big = KEY._replace(direction="wgrad")
    cudnn._module().plans[0].workspace = 300
    made.clear()
    kept.clear()
    for _ in range(3):
        cudnn.conv(big, PTRS)
    assert made == [(300,)] * 3 and kept == []           # each call its own; nothing kept for a capture
    assert cudnn.workspace_bytes() == 100                # the shared buffer did not grow to it


def test_cudnn_nothing_fits_is_refused_and_remembered(device, monkeypatch):
    lib = fake_cudnn(monkeypatch, device, [Plan("big", 1.0, workspace=10 ** 6)])
    with pytest.raises(cudnn.Refused):
        cudnn.conv(KEY, PTRS)
    with pytest.raises(cudnn.Refused, match="declined .* before"):
        cudnn.conv(KEY, PTRS)
    assert lib.runs == []


def test_cache_is_keyed_by_the_machine(device, monkeypatch):
    lib = fake_cudnn(monkeypatch, device, _plans())
    cudnn.conv(KEY, PTRS)
    _fresh(monkeypatch)
    monkeypatch.setitem(cudnn._state, "version", 91100)                # another cuDNN: a miss
    cudnn._state.pop("machine")
    lib.builds.clear()
    cudnn.conv(KEY, PTRS)
    assert cudnn._plans[KEY].source == "fast" and len(lib.builds) > 1
    machine = cudnn.fingerprint()
    assert machine["gpu"] == "NVIDIA H200" and machine["cc"] == "9.0" and machine["cudnn"] == 91100
    assert machine["cuda_driver"] == 12080 and machine["cudnn_frontend"] == "1.99"


# ---- cuBLASLt ------------------------------------------------------------------------------------
class FakeLt:
    """The cuBLASLt entry points dmath.gpu.cublaslt calls, over algorithms numbered 1.. in the heuristic's
    order, each with a time; an algorithm's words are (its number, 0, ...)."""

    def __init__(self, clock, times, accepted=None):
        self.clock, self.times = clock, times
        self.accepted = set(times) if accepted is None else accepted
        self.asked, self.runs, self.checked = [], [], []
        for name in ("cublasLtMatmulDescCreate", "cublasLtMatmulDescSetAttribute", "cublasLtMatmulDescDestroy",
                     "cublasLtMatrixLayoutCreate", "cublasLtMatrixLayoutDestroy", "cublasLtMatmulPreferenceCreate",
                     "cublasLtMatmulPreferenceSetAttribute", "cublasLtMatmulPreferenceDestroy"):
            setattr(self, name, lambda *a: 0)

    def cublasLtGetVersion(self):
        return 130000

    def cublasLtMatmulAlgoGetHeuristic(self, handle, desc, a, b, c, d, pref, count, results, found):
        self.asked.append(count)
        algos = sorted(self.times)[:count]
        for i, algo in enumerate(algos):
            results[i].algo.data[0] = algo
            results[i].state = 0
        found._obj.value = len(algos)
        return 0

    def cublasLtMatmulAlgoCheck(self, handle, desc, a, b, c, d, algo, result):
        number = algo._obj.data[0]
        self.checked.append(number)
        if number not in self.accepted:
            return 15                                   # CUBLAS_STATUS_NOT_SUPPORTED
        result._obj.workspace_size = 1024
        return 0

    def cublasLtMatmul(self, handle, desc, alpha, b_ptr, a, a_ptr, b, beta, out_ptr, c, out2, d, algo, ws, size,
                       stream):
        number = ctypes.cast(algo, ctypes.POINTER(cublaslt._Algo)).contents.data[0] if isinstance(
            algo, ctypes.c_void_p) else algo._obj.data[0]
        self.runs.append(number)
        self.clock.t += self.times[number]
        return 0


@pytest.fixture
def lt(device, monkeypatch):
    fake = FakeLt(device, {1: 3.0, 2: 1.0, 3: 2.0, 4: 1.5, 5: 0.5, 6: 0.1})
    monkeypatch.setitem(cublaslt._STATE, "lib", fake)
    monkeypatch.setitem(cublaslt._STATE, 0, (ctypes.c_void_p(1), ctypes.c_void_p(2)))
    monkeypatch.setitem(sys.modules, "cupy", types.SimpleNamespace(cuda=backend.current().xp.cuda))
    for k in [k for k in cublaslt._STATE if isinstance(k, tuple)]:
        monkeypatch.delitem(cublaslt._STATE, k)
    yield fake


def _args(m=1024, n=1024, k=1024):
    from dmath.gpu.blas import _GpuArgs
    return _GpuArgs("float32", "float32", 0, 0, m, n, k, k, n, n)


def _algo_of(matmul):
    return matmul._heuristic.algo.data[0]


def test_cublaslt_fast_times_the_first_few_then_reads_the_cache(lt, monkeypatch):
    monkeypatch.setenv("DMATH_TUNE_AMORTIZE", "0")                    # the first few only
    mm = cublaslt.matmul(_args())
    assert _algo_of(mm) == 1 and not mm.settled                       # the heuristic's first until settled
    mm.settle(10, 20, 30, 7)
    assert mm.settled and mm.source == "fast" and _algo_of(mm) == 2 and mm.ms == pytest.approx(1.0)
    assert lt.asked[-1] == tuning.FAST_CANDIDATES
    assert sorted(set(lt.runs)) == [1, 2, 3, 4]                        # 5 and 6 are past the first four
    mm.run(10, 20, 30, None, None, 7)
    assert lt.runs[-1] == 2

    tuning._CACHES.clear()
    lt.runs.clear()
    again = cublaslt.matmul(_args())
    again.settle(10, 20, 30, 7)
    assert again.source == "cache" and _algo_of(again) == 2 and lt.runs == [] and lt.checked[-1] == 2


def test_cublaslt_fast_times_more_candidates_of_an_expensive_product(lt, monkeypatch):
    """The fake's algorithms take 1 ms and more: 1000 runs of the fastest outlast the 300 ms budget, so
    'fast' asks for MORE_CANDIDATES and times past the first four (the fake's clock does not advance)."""
    monkeypatch.setenv("DMATH_TUNE_AMORTIZE", "1000")
    mm = cublaslt.matmul(_args())
    mm.settle(10, 20, 30, 7)
    assert lt.asked[-1] == tuning.MORE_CANDIDATES
    assert sorted(set(lt.runs)) == [1, 2, 3, 4, 5, 6] and _algo_of(mm) == 6 and mm.ms == pytest.approx(0.1)
    monkeypatch.setenv("DMATH_TUNE_AMORTIZE", "50")                   # 50 runs of 1 ms: within the budget
    tuning._CACHES.clear()
    monkeypatch.setenv("DMATH_TUNE_CACHE", "")
    lt.runs.clear()
    cheap = cublaslt.matmul(_args(m=1024, n=1024, k=512))
    cheap.settle(10, 20, 30, 7)
    assert sorted(set(lt.runs)) == [1, 2, 3, 4] and _algo_of(cheap) == 2


def test_cublaslt_cached_algorithm_refused_is_retuned(lt, monkeypatch):
    cublaslt.matmul(_args()).settle(10, 20, 30, 7)
    tuning._CACHES.clear()
    lt.accepted.discard(2)                                             # a cuBLASLt that no longer takes it
    mm = cublaslt.matmul(_args())
    mm.settle(10, 20, 30, 7)
    assert mm.source == "fast" and _algo_of(mm) == 2                  # timed again (the fake still runs it)
    assert lt.checked == [2]


def test_cublaslt_full_and_off(lt, monkeypatch):
    monkeypatch.setenv("DMATH_TUNE", "full")
    mm = cublaslt.matmul(_args())
    mm.settle(10, 20, 30, 7)
    assert mm.source == "full" and _algo_of(mm) == 6 and lt.asked[-1] == cublaslt.FULL_CANDIDATES
    monkeypatch.setenv("DMATH_TUNE", "off")
    lt.runs.clear()
    mm = cublaslt.matmul(_args(512, 512, 2048))
    mm.settle(10, 20, 30, 7)
    assert mm.source == "off" and _algo_of(mm) == 1 and lt.runs == []


def test_cublaslt_small_products_are_not_timed(lt):
    mm = cublaslt.matmul(_args(128, 256, 256))                        # 2 m n k = ONE_KERNEL_FLOPS
    mm.settle(10, 20, 30, 7)
    assert mm.settled and mm.source == "heuristic" and lt.runs == [] and lt.asked == [1]


def test_cublaslt_malformed_cached_words_are_not_used(lt):
    mm = cublaslt.matmul(_args())
    for bad in ({"algo": [1] * 7}, {"algo": ["x"] * 8}, {"algo": [-1] + [0] * 7}, {}):
        assert mm._adopt(bad) is None
    assert lt.checked == []
    assert mm._adopt({"algo": [5] + [0] * 7, "ms": 0.5}).algo.data[0] == 5 and mm.ms == 0.5


# ---- the channel-padding choice (dmath.ops.nn.conv) ----------------------------------------------
def test_pad_choice_timed_cached_and_off(device, monkeypatch):
    from dmath.ops.nn import conv as nn_conv
    fake_cudnn(monkeypatch, device, _plans())
    calls = []
    refuse = {"padded": False}

    def plain():
        calls.append("plain")

    def padded():
        if refuse["padded"]:
            raise cudnn.Refused("no padded plan")
        calls.append("padded")
    times = {plain: 2.0, padded: 1.0}
    monkeypatch.setattr(nn_conv, "_ms", lambda fn: (fn(), times[fn])[1])
    monkeypatch.setattr(cudnn, "workspace_bytes", lambda: 0)
    assert nn_conv._pad_choice(KEY, plain, padded) == (True, 2.0, 1.0)
    assert calls == ["plain", "padded"]
    tuning._CACHES.clear()
    calls.clear()
    assert nn_conv._pad_choice(KEY, plain, padded) == (True, 2.0, 1.0)      # read back, run once
    assert calls == ["padded"]
    tuning._CACHES.clear()
    calls.clear()
    refuse["padded"] = True                                                  # the cached way refused now
    assert nn_conv._pad_choice(KEY, plain, padded) == (False, 2.0, None)
    monkeypatch.setenv("DMATH_TUNE", "off")
    calls.clear()
    assert nn_conv._pad_choice(KEY, plain, padded) == (False, None, None) and calls == ["plain"]
    refuse["padded"] = False
    calls.clear()
    assert nn_conv._pad_choice(KEY, plain, padded) == (True, None, None) and calls == ["padded"]


def test_cudnn_pick_trades_a_large_workspace_for_a_little_time():
    MB = 1 << 20
    # AlexNet's conv2 weight gradient, float32, one H200 (ms, workspace): batch 1024 and 256
    timed = [("a", 8.5 * MB, 3.264), ("b", 3.4 * MB, 5.01), ("c", 2259 * MB, 2.596), ("d", 3452 * MB, 2.999),
             ("e", 0, 7.388)]
    choice, why = cudnn.pick(timed)
    assert choice == "a" and "spares 256 MiB" in why
    assert cudnn.pick([("a", 8.5 * MB, 0.842), ("c", 571 * MB, 0.689), ("d", 864 * MB, 0.818)])[0] == "a"
    # its conv1 (3 -> 64) at batch 1024: the lean plans are too slow for what they spare
    assert cudnn.pick([("w", 1554 * MB, 3.36), ("x", 1547 * MB, 3.76), ("z", 0, 7.70)])[0] == "w"
    # within NEAR_FASTEST the smallest workspace, as before, where no plan spares LEAN_BYTES
    choice, why = cudnn.pick([("p2", 500, 2.0), ("p4", 100, 2.05), ("p6", 0, 2.5)])
    assert choice == "p4" and why.startswith("smallest workspace within 1.05x")
    # a lean plan past LEAN_SLOWER is not taken; of several lean ones the fastest
    assert cudnn.pick([("big", 2048 * MB, 1.0), ("slow", 0, 1.35)])[0] == "big"
    assert cudnn.pick([("big", 2048 * MB, 1.0), ("l1", 10 * MB, 1.2), ("l2", 0, 1.1)])[0] == "l2"
    # sparing less than LEAN_BYTES keeps the faster plan
    assert cudnn.pick([("big", 300 * MB, 1.0), ("small", 100 * MB, 1.1)])[0] == "big"
    assert cudnn.pick([("only", 4096 * MB, 1.0)])[0] == "only"
