"""Convolutions through cuDNN's graph API (NVIDIA's `nvidia-cudnn-frontend` package, the `gpu` extra).

One `ConvPlan` per (direction, shapes, groups, dtype), made at the first use
of that shape and kept for the process: cuDNN's operation graph for the
forward pass, the data gradient or the weight gradient, the execution plans
its heuristics offer in their order, and the one chosen (dMath's "algorithm
selected from timing samples and system constraints"; PyTorch's
cudnn.benchmark). How it is chosen follows DMATH_TUNE (dmath.tuning): the
choice an earlier run timed on this GPU model, driver and cuDNN, read from
the tuning cache (one plan built, run once to check it); else the first few
plans timed on the call's own buffers within a time budget ('fast', the
default), every plan timed ('full'), or the heuristics' first ('off').
Plans whose workspace does not fit the memory the worker has (the pool's
limit or the device's free memory) are never built. `explain()` lists the
choices and how each was made.

Execution runs on the current stream with raw device pointers. A plan's
workspace up to DMATH_CUDNN_WORKSPACE_KEEP bytes (64 MiB) is one buffer per
worker (per stream while a plan is captured on several streams,
runtime/streams.py), shared by every such plan: it grows to the largest
one's need and stays, so the many small workspaces of a network cost one
allocation and never fragment a pool. A larger workspace is allocated for
its call and freed after it, in stream order, as PyTorch does: AlexNet's
first convolution's weight gradient at batch 1024 asks for 1.55 GB, which a
kept buffer would hold through every other moment of the step and between
steps (the peak then sat 1 GB above PyTorch's). Inside a CUDA-graph capture
that allocation comes from the graph's own pool (graphs.py), where it is
held only while that convolution runs, and the step-by-step run that sizes
the graph's arena measures it at the same moment. A step of cuDNN calls can
be captured once its plans are built (a capture never builds or times); the
graph keeps the shared buffer it was captured with alive
(memory.keep_for_capture), even after a later plan makes it grow.

cuDNN is optional: without the package or the library, or when cuDNN
declines a case (`Refused`), the callers use im2col and cuBLAS instead.
`DMATH_CUDNN=0` turns cuDNN off; `DMATH_TF32=0` keeps float32 convolutions
off TF32 tensor cores; `DMATH_DETERMINISTIC=1` never builds a plan cuDNN
marks non-deterministic.
"""
from typing import NamedTuple

import numpy as np

from .. import backend, memory, settings, tuning
from ..planning.conv import output_length

#: timed runs per candidate plan (after one warm-up run); the median decides
TIMED_RUNS = 3
#: a plan within this factor of the fastest one's time counts as fast: of those, the one with the
#: smallest workspace is chosen (a kept workspace is held for good, a larger one through its call; a
#: few percent of one kernel's time is not worth hundreds of MB of every GPU's memory)
NEAR_FASTEST = 1.05
#: a plan whose workspace is at least LEAN_BYTES smaller than that choice's and whose time is within
#: LEAN_SLOWER of the fastest is taken instead: a workspace above DMATH_CUDNN_WORKSPACE_KEEP is
#: allocated for its call, so it adds to the step's peak memory where it runs (AlexNet's second
#: convolution's fastest weight gradient on an H200 needs 571 MB at batch 256 and 2.26 GB at 1024,
#: against 8.5 MB for a plan 1.22x and 1.26x slower: the step's peak was above PyTorch's)
LEAN_BYTES = 256 << 20
LEAN_SLOWER = 1.3


def pick(timed):
    """(the chosen plan, why) of timed [(plan, workspace bytes, ms)] (a pure rule): the smallest workspace
    among the plans within NEAR_FASTEST of the fastest; then, where plans within LEAN_SLOWER of the
    fastest need at least LEAN_BYTES less workspace than that, the fastest of them."""
    fastest = min(ms for _, _, ms in timed)
    near = [t for t in timed if t[2] <= fastest * NEAR_FASTEST]
    choice = min(near, key=lambda t: (t[1], t[2]))
    lean = [t for t in timed if t[2] <= fastest * LEAN_SLOWER and t[1] <= choice[1] - LEAN_BYTES]
    if lean:
        return min(lean, key=lambda t: (t[2], t[1]))[0], \
            f"the fastest plan within {LEAN_SLOWER:g}x of the fastest that spares {LEAN_BYTES >> 20} MiB of workspace"
    return choice[0], f"smallest workspace within {NEAR_FASTEST:g}x of the fastest"


class Refused(Exception):
    """cuDNN cannot run this case here (no library, or no engine supports it)."""


class ConvKey(NamedTuple):
    """Everything a convolution plan depends on."""
    direction: str      # 'fprop', 'dgrad' or 'wgrad'
    n: int
    c: int
    h: int
    w: int
    k: int
    kh: int
    kw: int
    sh: int
    sw: int
    ph: int
    pw: int
    dh: int
    dw: int
    groups: int
    dtype: str
    epilogue: str = ""  # fprop only: '', 'bias', 'relu' or 'bias_relu', fused after the convolution
    channels_last: bool = False     # NHWC activations and (K, kh, kw, C/groups) filters

    @property
    def out_hw(self):
        return (output_length(self.h, self.kh, self.sh, self.ph, self.dh),
                output_length(self.w, self.kw, self.sw, self.pw, self.dw))

    @property
    def flops(self):
        ho, wo = self.out_hw
        return 2 * self.n * self.k * ho * wo * (self.c // self.groups) * self.kh * self.kw


_state = {}
_plans = {}


def _module():
    """The `cudnn` frontend module and this process's handle, or None when cuDNN is unusable here."""
    if "cudnn" not in _state:
        _state["cudnn"] = None
        _state["why"] = "disabled by DMATH_CUDNN=0" if not settings.current.cudnn else None
        if settings.current.cudnn and backend.current().is_gpu:
            try:
                import cudnn
                _state["handle"] = cudnn.create_handle()
                _state["cudnn"] = cudnn
                _state["version"] = cudnn.backend_version()
            except Exception as exc:  # noqa: BLE001 - any failure to load means "no cuDNN": im2col instead
                _state["why"] = f"{type(exc).__name__}: {exc}"
    return _state["cudnn"]


def available():
    """True when convolutions can go through cuDNN on this worker (GPU backend, frontend and library load)."""
    return _module() is not None


def status():
    """A line saying whether cuDNN is used, and why not."""
    if available():
        return f"cuDNN {_state['version']} through nvidia-cudnn-frontend"
    return f"cuDNN not used: {_state.get('why') or 'CPU backend'}"


def _types(cudnn, dtype):
    dt = cudnn.data_type
    return {"float16": (dt.HALF, dt.FLOAT, dt.FLOAT), "float32": (dt.FLOAT, dt.FLOAT, dt.FLOAT),
            "float64": (dt.DOUBLE, dt.DOUBLE, dt.DOUBLE)}[dtype]


def _strides(dims, channels_last):
    """Fully packed strides of the (n, c, h, w) `dims` in NCHW or NHWC order (given explicitly:
    cuDNN must not guess a layout); a filter (k, c, kh, kw) alike (KCRS or KRSC)."""
    n, c, h, w = dims
    return [c * h * w, 1, w * c, c] if channels_last else [c * h * w, h * w, w, 1]


class ConvPlan:
    """A convolution graph of one ConvKey, the plans built of it so far and the chosen one.

    The heuristics order the graph's engine configurations; a plan is built
    only when it is about to be timed or adopted (building a runtime-compiled
    engine takes far longer than running it), so DMATH_TUNE=fast builds the
    few it times and a cached choice builds one (see dmath.tuning).
    """

    def __init__(self, key, budget=None):
        cudnn = _module()
        if cudnn is None:
            raise Refused(status())
        self.key = key
        io, inter, comp = _types(cudnn, key.dtype)
        ho, wo = key.out_hw
        x_dims = [key.n, key.c, key.h, key.w]
        w_dims = [key.k, key.c // key.groups, key.kh, key.kw]
        y_dims = [key.n, key.k, ho, wo]
        conv = dict(padding=[key.ph, key.pw], stride=[key.sh, key.sw], dilation=[key.dh, key.dw])
        last = key.channels_last
        try:
            g = cudnn.pygraph(io_data_type=io, intermediate_data_type=inter, compute_data_type=comp,
                              handle=_state["handle"])
            extra = ()
            if key.direction == "fprop":
                a = g.tensor(name="x", dim=x_dims, stride=_strides(x_dims, last), data_type=io)
                b = g.tensor(name="w", dim=w_dims, stride=_strides(w_dims, last), data_type=io)
                out, out_dims = g.conv_fprop(image=a, weight=b, **conv), y_dims
                if "bias" in key.epilogue:
                    b_dims = [1, key.k, 1, 1]
                    bias = g.tensor(name="b", dim=b_dims, stride=_strides(b_dims, last), data_type=io)
                    out = g.bias(input=out, bias=bias)
                    extra = (bias,)
                if "relu" in key.epilogue:
                    out = g.relu(input=out)
            elif key.direction == "dgrad":
                a = g.tensor(name="dy", dim=y_dims, stride=_strides(y_dims, last), data_type=io)
                b = g.tensor(name="w", dim=w_dims, stride=_strides(w_dims, last), data_type=io)
                out, out_dims = g.conv_dgrad(loss=a, filter=b, **conv), x_dims
            else:
                a = g.tensor(name="x", dim=x_dims, stride=_strides(x_dims, last), data_type=io)
                b = g.tensor(name="dy", dim=y_dims, stride=_strides(y_dims, last), data_type=io)
                out, out_dims = g.conv_wgrad(image=a, loss=b, **conv), w_dims
            out.set_output(True).set_dim(out_dims).set_stride(_strides(out_dims, last)).set_data_type(io)
            g.validate()
            g.build_operation_graph()
            g.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
            # float32 may run on TF32 tensor cores (about 1e-3 relative error) as PyTorch's does by
            # default; DMATH_TF32=0 never builds the plans whose notes say tensor cores or
            # down-converted inputs (which plan wins the timing varies, and its last digits with it)
            note, notes = cudnn.numerical_note, []
            if key.dtype == "float32" and not settings.current.tf32:
                notes += [note.TENSOR_CORE, note.DOWN_CONVERT_INPUTS]
            if settings.current.deterministic:      # plans that sum with atomics: another order each run
                notes.append(note.NONDETERMINISTIC)
            if notes:
                g.deselect_numeric_notes(notes)
            if budget is not None and hasattr(g, "deselect_workspace_greater_than"):
                g.deselect_workspace_greater_than(int(budget))      # never built, never timed
            g.check_support()
            # an older frontend without build_plan_at_index builds every plan now
            self._lazy = hasattr(g, "build_plan_at_index")
            if not self._lazy:
                g.build_plans(cudnn.build_plan_policy.ALL)
            count = g.get_execution_plan_count()
        except Exception as exc:  # noqa: BLE001 - cuDNN's many "not supported" errors all mean: fall back
            raise Refused(f"cuDNN declined {key}: {type(exc).__name__}: {exc}") from exc
        self.graph, self.tensors = g, (a, b) + extra + (out,)
        self.names = []
        for i in range(count):
            try:
                self.names.append(g.get_plan_name_at_index(i))
            except Exception:  # noqa: BLE001 - a name is for explain() and the cache
                self.names.append(f"plan {i}")
        if not self.names:
            raise Refused(f"cuDNN offered no plan for {key}")
        self.candidates = []        # the plans built so far, in the heuristics' order
        self.choice = None
        self.why = ""
        self.source = ""            # how the choice was made: 'cache', 'off', 'fast' or 'full'

    def _execute(self, index, ptrs, workspace):
        cudnn = _module()
        handle = _state["handle"]
        cudnn.set_stream(handle, backend.current().xp.cuda.get_current_stream().ptr)
        pack = dict(zip(self.tensors, ptrs))
        self.graph.execute_plan_at_index(pack, workspace, index, handle)

    def _workspace(self, nbytes):
        return memory.empty((max(nbytes, 1),), np.uint8)

    def _build(self, index):
        """Plan `index` built: its candidate dict, or None where it does not build here."""
        try:
            if self._lazy:
                self.graph.build_plan_at_index(index)
            ws = int(self.graph.get_workspace_size_plan_at_index(index))
        except Exception:  # noqa: BLE001 - a plan that does not build is not a candidate
            return None
        c = {"index": index, "name": self.names[index], "workspace": ws, "ms": None}
        self.candidates.append(c)
        return c

    def _fitting(self, budget):
        """The plans that build and whose workspace fits `budget` bytes, built one at a time, in the
        heuristics' order."""
        for i in range(len(self.names)):
            c = self._build(i)
            if c is not None and c["workspace"] <= budget:
                yield c

    def _time(self, c, ptrs):
        """The median milliseconds of plan c on these buffers (after one warm-up run), or None (and
        c['error']) when it fails to run."""
        xp = backend.current().xp
        stream = xp.cuda.get_current_stream()
        ws = self._workspace(c["workspace"])
        try:
            self._execute(c["index"], ptrs, ws.data.ptr)            # warm-up (and: does it run?)
            times = []
            for _ in range(TIMED_RUNS):
                start, end = xp.cuda.Event(), xp.cuda.Event()
                start.record(stream)
                self._execute(c["index"], ptrs, ws.data.ptr)
                end.record(stream)
                end.synchronize()
                times.append(xp.cuda.get_elapsed_time(start, end))
        except Exception as exc:  # noqa: BLE001 - a plan that fails to run is not chosen
            c["error"] = f"{type(exc).__name__}: {exc}"
            return None
        c["ms"] = float(np.median(times))
        return c["ms"]

    def adopt(self, value, ptrs, budget):
        """The cached choice `value` ({'name', 'ms', ...}) as this plan's choice when it builds, fits
        `budget` and runs once on these buffers; None (tune instead) otherwise."""
        name = value.get("name")
        if name not in self.names:
            return None
        c = self._build(self.names.index(name))
        if c is None or c["workspace"] > budget:
            return None
        ws = self._workspace(c["workspace"])
        try:
            self._execute(c["index"], ptrs, ws.data.ptr)
            backend.current().xp.cuda.get_current_stream().synchronize()
        except Exception:  # noqa: BLE001 - a cached plan that fails to run is tuned again
            return None
        ms = value.get("ms")
        c["ms"] = float(ms) if isinstance(ms, (int, float)) else None
        self.why = f"cached: {value.get('why', 'timed in an earlier run')}"
        return c

    def tune(self, ptrs, budget, how):
        """(choice, value to cache) under DMATH_TUNE mode `how`: 'off' takes the heuristics' first plan
        that builds and fits `budget` bytes, untimed; 'fast' times the first few (dmath.tuning.timed),
        'full' every one; of the timed plans, the one with the smallest workspace among those within
        NEAR_FASTEST of the fastest."""
        if how == "off":
            for c in self._fitting(budget):
                self.why = "the heuristics' first plan that builds (DMATH_TUNE=off: nothing timed)"
                return c, None
            raise Refused(f"no cuDNN plan for {self.key} builds within the {budget:,} bytes the worker can spare")
        timed = tuning.timed(self._fitting(budget), lambda c: self._time(c, ptrs), how)
        if not timed:
            raise Refused(f"no cuDNN plan for {self.key} ran within the {budget:,} bytes the worker can spare: "
                          f"{[c.get('error') for c in self.candidates]}")
        best = min(timed, key=lambda cm: cm[1])[0]
        choice, rule = pick([(c, c["workspace"], ms) for c, ms in timed])
        lean = "" if choice is best else (f"; the fastest ({best['ms']:.3f} ms) needs a workspace of "
                                          f"{best['workspace']:,} bytes")
        self.why = f"{rule} of {len(timed)} timed plan(s) of {len(self.names)} (DMATH_TUNE={how})" + lean
        value = {"name": choice["name"], "workspace": choice["workspace"], "ms": choice["ms"], "why": self.why,
                 "timed": [[c["name"], ms, c["workspace"]] for c, ms in timed]}
        return choice, value

    def choose(self, ptrs, budget):
        """Make the choice: the cached one where DMATH_TUNE and the cache allow, else by tune()."""
        self.choice, self.source = tuning.decide(
            "cudnn_conv", fingerprint(), dict(self.key._asdict(), tf32=settings.current.tf32),
            lambda value: self.adopt(value, ptrs, budget), lambda how: self.tune(ptrs, budget, how))

    def run(self, ptrs):
        """Run the chosen plan on device pointers (inputs, then the output), on the current stream."""
        c = self.choice
        nbytes = c["workspace"]
        if nbytes > settings.current.cudnn_workspace_keep:
            # this call's own (the module docstring says why): freed on return, in stream order, so
            # the next allocation on this stream may take it only after this convolution
            ws = memory.empty((nbytes,), np.uint8)
        else:
            ws = shared_workspace(nbytes, memory.capture_lane())
            memory.keep_for_capture(ws)
        self._execute(c["index"], ptrs, ws.data.ptr)


def fingerprint():
    """This worker's GPU and cuDNN, as the tuning cache keys them."""
    machine = _state.get("machine")
    if machine is None:
        machine = _state["machine"] = tuning.gpu_fingerprint(
            cudnn=_state["version"], cudnn_frontend=str(getattr(_state["cudnn"], "__version__", "")))
    return machine


def shared_workspace(nbytes, lane=0):
    """The worker's cuDNN workspace, grown to at least `nbytes` (a new buffer replaces a smaller one:
    the old one lives on only in the graphs captured with it).

    lane: the stream of a capture on several streams (dmath.memory.capture_lane) whose workspace
    this is: convolutions on different streams may run at once, so each stream has its own
    (made during such a capture, kept for the next ones); 0: the one of every other call.
    """
    key = "workspace" if lane == 0 else ("lane", lane)
    ws = _state.get(key)
    if ws is None or ws.size < nbytes:
        _state[key] = None                          # the old buffer may go back to the pool first
        ws = _state[key] = memory.empty((max(nbytes, 1),), np.uint8)
    return ws


def prepare_lanes(lanes=1):
    """Before a capture on `lanes` streams: each side stream's workspace, as large as the shared one
    (the largest a convolution of the recording runs asked for), made now (a capture on one stream,
    a chain's, makes none).

    Made inside a capture instead, a side stream's workspace took a block of the capture's memory
    that the graph also handed to buffers of other streams: the first capture on several streams
    trained GoogLeNet to other losses while a second one, finding the workspaces made, did not
    (benchmarks/streams_noise.py on an H100). Convolutions the recording runs did not run, or that
    ask for more, still grow a lane's buffer during the capture as before. GPU only; idempotent.
    """
    main = _state.get("workspace")
    if main is None:
        return
    for lane in range(1, max(1, int(lanes))):
        shared_workspace(int(main.size), lane)


def _workspace_keys():
    """The keys of _state that hold a workspace: the one of every call's, and each capture stream's."""
    return [k for k in _state if k == "workspace" or (isinstance(k, tuple) and k[0] == "lane")]


def workspace_bytes():
    """The bytes of the worker's workspaces now, every stream's (0: none)."""
    return sum(int(_state[k].size) for k in _workspace_keys() if _state[k] is not None)


def release_workspace():
    """Drop the worker's workspaces (dmath.memory.clear): the next convolution makes one of the
    size its plan needs. A graph captured with an old one keeps it alive (memory.keep_for_capture)."""
    for k in _workspace_keys():
        _state[k] = None


def _budget():
    """Workspace bytes this worker can spare: a quarter of what the pool may still take."""
    xp = backend.current().xp
    free, _ = xp.cuda.runtime.memGetInfo()
    stats = memory.local_stats()
    room = free + stats["cached"]
    limit = stats.get("limit")
    if limit is not None:
        room = min(room, max(0, limit - stats["in_use"]))
    return room // 4


def conv(key, ptrs):
    """Run the convolution `key` on device pointers (two inputs, the bias of a bias epilogue, then
    the output).

    The first call of a key chooses its plan, from the tuning cache or by
    timing (dmath.tuning; raises Refused when cuDNN cannot do it: the caller
    falls back); later calls only execute.
    Must not be first called while the stream is being captured.
    """
    plan = _plans.get(key)
    if plan is None:
        if key in _plans:
            raise Refused(f"cuDNN declined {key} before")
        try:
            budget = _budget()
            plan = ConvPlan(key, budget)
            plan.choose(ptrs, budget)
        except Refused:
            _plans[key] = None
            raise
        _plans[key] = plan
    plan.run(ptrs)


def known(key):
    """True when `key` has a chosen plan (so a run needs no building or timing: safe in a capture)."""
    return _plans.get(key) is not None


def explain():
    """Every convolution shape seen by this worker: what cuDNN chose and why (or why not), as dicts."""
    out = []
    for key, plan in _plans.items():
        row = {"key": key._asdict()}
        if plan is None:
            row["engine"] = "im2col + cuBLAS (cuDNN declined)"
        else:
            c = plan.choice
            ms = c["ms"]
            row.update(engine=c["name"], ms=ms, workspace=c["workspace"], why=plan.why, source=plan.source,
                       tflops=key.flops / (ms * 1e-3) / 1e12 if ms else None,
                       candidates=[{k: v for k, v in cand.items() if k != "index"} for cand in plan.candidates])
        out.append(row)
    return out


def describe(rows):
    """explain()'s rows as text, one line per shape."""
    lines = []
    for r in rows:
        k = r["key"]
        shape = (f"{k['direction']:5s} n{k['n']} c{k['c']} {k['h']}x{k['w']} -> k{k['k']} {k['kh']}x{k['kw']}"
                 f" s{k['sh']} p{k['ph']} d{k['dh']} g{k['groups']} {k['dtype']}"
                 + (" NHWC" if k.get("channels_last") else "") + (f" +{k['epilogue']}" if k.get("epilogue") else ""))
        if "ms" not in r:
            lines.append(f"{shape}: {r['engine']}")
        else:
            tf = f", {r['tflops']:.1f} TFLOP/s" if r.get("tflops") else ""
            ms = "untimed" if r["ms"] is None else f"{r['ms']:.3f} ms"
            lines.append(f"{shape}: {r['engine']} {ms}{tf}, workspace {r['workspace']:,} B ({r['why']})")
    return "\n".join(lines)

