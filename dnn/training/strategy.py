"""parallel='auto' decided by measurement: the candidate strategies timed at the first training steps.

The byte-counting cost model (dnn.parallel) ranks strategies by traffic
alone; on 4 GPUs it chose model-parallel Dense layers for AlexNet at batch
256 that ran 6% slower than all data parallel, since it sees neither the
GEMM shapes nor how a sum overlaps the backward pass. So, as for the
convolution algorithms, the candidates are timed:

- 'data': every undecided layer data parallel;
- the cost model's choice per layer (when it differs from 'data').

At the first training steps of a batch size on several workers, each
candidate in turn trains `WARM` steps (its step recorded; the first replay
step by step; the second captured into a CUDA graph and launched: see
dmath/runtime/graphs.py) and then `TIMED` steps, each timed alone between
two `dmath.synchronize()`; its figure is the median of those steps, so that
a step that pays for something once (a library tuning a new shape at its
first use, the memory pool growing, a capture made again) does not decide
the choice. (With two steps of warm-up and the mean of three, the capture
was timed: on 4 H200s AlexNet's candidates read 2.5 to 3 times their steady
step, one 16 times, and float16 at batch 256 kept data parallel at 54k
images/s, where model-parallel Dense layers had run at 79k-83k on 4 H100s.)
The fastest is kept. The steps are ordinary training steps on the epoch's
batches: the strategies compute the same values, so nothing is spent but
one recording per candidate and a synchronisation per timed step. The
choice goes to dmath's tuning cache (kind 'dnn_parallel', keyed by the
model's layers, batch, workers, dtype, machine and this timing rule), so a
second run of the same model starts with it:
DMATH_TUNE=off takes the cost model's choice untimed, 'fast' a cached one
when there is one, 'full' always times. A cached value is checked before it
is adopted (the cache's digest does not cover it): one that is not what a
trial stores is a miss, with a TuneCacheWarning, and the candidates are
timed again. `Model.explain_parallel()` says
what was timed and what was chosen.

The batch size of a trial is the epoch's full batch (every sample when
batch_size exceeds them). A trial goes on across epochs and fits of its
size; a fit of another size first gives up a trial still under way (its
layers undecided again, its report 'not decided'), so the new size decides.
"""
import hashlib
import json
import platform
import statistics
import sys
import time
import warnings

import dmath
from dmath import tuning

#: steps of each candidate before its timing starts (recording, a replay step by step, the capture)
WARM = 3
#: steps of each candidate timed, one at a time (its figure: their median)
TIMED = 5
#: the tuning cache's kind
KIND = "dnn_parallel"
#: how the candidates were timed, part of the cache key: choices an older rule made (the mean of
#: three steps, the capture among them) are not trusted
RULE = f"median of {TIMED} after {WARM}"
#: the largest timing a cached value may hold (a larger number is no float: float() of it overflows)
_LARGEST = sys.float_info.max


def undecided(model):
    """The layers whose strategy parallel='auto' leaves to be decided."""
    return [layer for layer in model.layers if layer.strategy is None]


def candidates(layers, batch, nworkers):
    """{name: strategies of `layers`}: all 'data', and the cost model's choice where it differs (pure)."""
    data = tuple("data" for _ in layers)
    cost = tuple(layer.proposal(batch, nworkers) for layer in layers)
    if cost == data:
        return {"data": data}
    split = [layer.name for layer, s in zip(layers, cost) if s != "data"]
    return {"data": data, "cost model (" + ", ".join(f"{n}: model" for n in split) + ")": cost}


def typical(seconds):
    """The milliseconds of a typical step among `seconds` (one per timed step): their median, which
    a step or two that paid a one-time cost do not move (pure)."""
    return statistics.median(seconds) * 1e3


def fastest(ms):
    """The name of the smallest time in {name: ms per step}; ties go to the first (pure)."""
    return min(ms, key=lambda name: ms[name])


def invalid_cached(value, names):
    """Why a value read from the tuning cache is not one a Trial of the candidates `names` stores
    ({'choice': one of them, 'ms': {each of them: milliseconds per step, finite and >= 0}}), or None
    when it is (pure). The cache's digest names an entry by its kind, machine and key and leaves the
    value out (see dmath.tuning): a value edited by hand, or written by something else, reaches this
    check with its digest intact, and must cost a new timing, not the fit."""
    if not isinstance(value, dict):
        return f"a {type(value).__name__}, not a dict"
    choice, ms = value.get("choice"), value.get("ms")
    if not isinstance(choice, str) or choice not in names:
        return f"the choice {choice!r}, not one of the candidates {list(names)}"
    if not isinstance(ms, dict) or set(ms) != set(names):
        return f"the timings (ms) {ms!r:.120}, not one per candidate"
    for name, t in ms.items():
        # (bool is an int to Python: True is no timing; an int of 400 digits overflows float())
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not 0 <= t <= _LARGEST:
            return f"the timing (ms) {t!r:.40} of {name!r}, not a finite number of milliseconds"
    return None


def machine():
    """The machine a timing holds for: the GPU's identity, or the CPU's."""
    if dmath.device() == "gpu":
        return tuning.gpu_fingerprint()
    return {"device": "cpu", "cpu": platform.processor() or platform.machine(), "python": platform.python_version()}


def model_key(model, batch, names):
    """The cache key: a digest of the layers' configurations, the batch, the workers, the dtype."""
    layers = json.dumps([layer.get_config() for layer in model.layers], sort_keys=True, default=str)
    return {"layers": hashlib.sha256(layers.encode()).hexdigest()[:32], "batch": int(batch),
            "workers": len(model.workers), "dtype": model.dtype, "candidates": sorted(names),
            "timing": RULE}


class Trial:
    """The decision of the undecided layers' strategies at one batch size (see the module docstring).

    Created by fit before the first step of the batch size; `before_step` and
    `after_step` wrap each training step until `done`. The report (what was
    timed, what chosen, and why) is `model.parallel_report[batch]`.
    """

    def __init__(self, model, batch):
        self.model, self.batch = model, batch
        self.layers = undecided(model)
        P = len(model.workers)
        self.options = candidates(self.layers, batch, P)
        self.names = list(self.options)
        self.ms = {}
        self.index = 0
        self.warm_left, self.t0, self.steps = WARM, None, []
        #: {candidate: [milliseconds of each timed step]} (explain shows their spread)
        self.step_ms = {}
        self.done = False
        report = {"batch": batch, "workers": P, "layers": [layer.name for layer in self.layers],
                  "candidates": {n: list(s) for n, s in self.options.items()}}
        model.parallel_report[batch] = self.report = report
        how = tuning.mode()
        if len(self.names) == 1:         # (one worker: the cost model's choice is data parallel)
            self._finish(self.names[0], "only candidate")
            return
        if how == "off":
            self._finish(self.names[-1], "cost model (DMATH_TUNE=off)")
            return
        self.key = model_key(model, batch, self.names)
        self.machine = machine()
        if how == "fast":
            cache = tuning.shared()
            cached = cache.get(KIND, self.machine, self.key) if cache is not None else None
            if cached is not None:
                why = invalid_cached(cached, self.names)
                if why is None:
                    self.ms = {n: float(v) for n, v in cached["ms"].items()}
                    self._finish(cached["choice"], "tuning cache")
                    return
                # a miss: these candidates are timed, and the entry rewritten with their timings
                warnings.warn(f"tuning cache {cache.path}: the {KIND} entry of these layers at batch {batch} "
                              f"holds {why}: ignored, the candidates are timed again", tuning.TuneCacheWarning,
                              stacklevel=2)
        self._adopt(self.names[0])

    # ---- the steps ---------------------------------------------------------------------------
    def before_step(self, size):
        """Start the clock before a full step once the candidate's warm-up is done (from the end of
        the step before when that one was timed too: one synchronisation a step); a step of another
        size (a ragged last batch) is not timed."""
        if self.done:
            return
        if size != self.batch:
            self.t0 = None
        elif self.warm_left == 0 and self.t0 is None:
            dmath.synchronize()
            self.t0 = time.perf_counter()

    def after_step(self, size, last=False):
        """Count the step, stop its clock (the epoch's end, its evaluation and callbacks are never
        inside one); after TIMED timed steps move on to the next candidate, or decide."""
        if self.done or size != self.batch:
            return
        if self.warm_left > 0:
            self.warm_left -= 1
            return
        if self.t0 is None:
            return
        dmath.synchronize()
        now = time.perf_counter()
        self.steps.append(now - self.t0)
        self.t0 = None if last else now
        if len(self.steps) < TIMED:
            return
        name = self.names[self.index]
        self.ms[name] = typical(self.steps)
        self.step_ms[name] = [round(t * 1e3, 3) for t in self.steps]
        self.report.update(ms_per_step=dict(self.ms), step_ms=dict(self.step_ms))     # (explain, meanwhile)
        self.index += 1
        if self.index < len(self.names):
            self._adopt(self.names[self.index])
            return
        self._finish(fastest(self.ms), "measured")
        cache = tuning.shared()
        if cache is not None:
            cache.put(KIND, self.machine, self.key, {"choice": self.report["chosen"], "ms": self.ms})

    def end_epoch(self):
        """The epoch ended (fit may stop here): the clock, if running, is dropped."""
        self.t0 = None

    def abandon(self):
        """Give up an undone trial (fit moved to another batch size before this one's steps were all
        timed): its layers are undecided again, for the trial of the new batch size, and the report
        says so instead of 'timing under way'."""
        for layer in self.layers:
            layer.strategy = None       # (the weights stay where they are: adopting moves them from there)
        self.done = True
        self.report.update(chosen=None, how=f"not decided: no fit finished timing {len(self.names)} candidates "
                                            f"at this batch size before another size was trained")

    # ---- choosing ---------------------------------------------------------------------------
    def _adopt(self, name):
        for layer, strategy in zip(self.layers, self.options[name]):
            layer.adopt(strategy)
        self.warm_left, self.t0, self.steps = WARM, None, []
        self.report["running"] = name

    def _finish(self, name, how):
        self._adopt(name)
        self.done = True
        self.report.update(chosen=name, how=how, ms_per_step=dict(self.ms), step_ms=dict(self.step_ms))


def explain(reports):
    """The text of `Model.explain_parallel()`: one paragraph per batch size decided."""
    if not reports:
        return "no layer with parallel='auto' has been decided (fit decides at the first training step)"
    lines = []
    for batch, r in sorted(reports.items()):
        how = r.get("how") or f"timing under way; meanwhile the layers run '{r.get('running')}'"
        lines.append(f"batch {batch} on {r['workers']} worker(s), layers {', '.join(r['layers']) or '-'}: "
                     f"{r.get('chosen') or 'undecided'} ({how})")
        for name, strategies in r["candidates"].items():
            t, steps = r.get("ms_per_step", {}).get(name), r.get("step_ms", {}).get(name)
            timing = f"{t:.2f} ms per step" if t is not None else "not timed"
            if steps:
                timing += f" (median of {len(steps)} steps, {min(steps):.2f} to {max(steps):.2f})"
            lines.append(f"  {name}: {timing}; " + ", ".join(f"{n}={s}" for n, s in zip(r["layers"], strategies)))
    return "\n".join(lines)
