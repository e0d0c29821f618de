"""The op-case harness of tests/dist: cases checked against a NumPy oracle with every failure reported
at once (`Failures`, `check_cases`), and every backend kernel a case runs checked against its op's
generic kernel on the same command (`kernels_checked`).

conftest.py imports this module on every rank before dmath.init, so that the backend kernels are
wrapped and the harness's commands registered there too (workers never import test modules). A
wrapped kernel runs as it is until the master turns checking on; then each command of it runs
the generic kernel first (on copies of what it overwrites in place), then the backend's own, and
the rank notes where their results differ. On a GPU this checks the real kernels (cuDNN, the CUDA
C kernels, the one-launch elementwise path); on the CPU, where no production op has a backend
kernel of its own, the test ops below exercise the same path.
"""
import contextlib

import numpy as np

import dmath
from dmath.backend import current as _backend
from dmath.comm.control import gather_objects
from dmath.ops.base import dispatch, new_meta
from dmath.runtime import Shard, kernel, registry

from _cases import tol

#: how far a backend kernel's result may be from the generic kernel's, relative to the result's
#: largest magnitude (at least 1): libraries sum in other orders (cuDNN's algorithms, fused kernels)
KERNEL_TOLERANCE = {"float16": 1e-2, "float32": 1e-5, "float64": 1e-12}

_checking = False      # this rank: compare each wrapped kernel with the generic one (set by the master)
_differences = []      # this rank: what the comparisons found since checking was turned on
_GENERIC_CACHE = ("harness", "generic")   # the generic kernel's own cache inside the entry's


def _copy(xp, a):
    return xp.array(a, copy=True)


def _difference(got, want):
    """None when the backend kernel's array `got` matches the generic kernel's `want`, else why not."""
    if got.shape != want.shape or got.dtype != want.dtype:
        return f"shape/dtype {got.shape} {got.dtype} against {want.shape} {want.dtype}"
    g, w = _backend().asnumpy(got), _backend().asnumpy(want)
    if g.dtype.kind != "f":
        return None if np.array_equal(g, w) else "values differ"
    if not np.array_equal(np.isnan(g), np.isnan(w)):
        return "NaNs in other places"
    finite = np.isfinite(w)
    if not np.array_equal(g[~finite], w[~finite]):
        return "infinities differ"
    if not finite.any():
        return None
    g64, w64 = g[finite].astype(np.float64), w[finite].astype(np.float64)
    scale = max(1.0, float(np.abs(w64).max()))
    err = float(np.abs(g64 - w64).max()) / scale
    return None if err <= KERNEL_TOLERANCE[g.dtype.name] else f"largest difference {err:.3g} of the scale {scale:g}"


def _checked(op_name, own, generic_fn):
    """`own` (a backend's kernel of `op_name`), running the generic kernel beside it while checking."""
    def run(call):
        if not _checking:
            return own(call)
        entry, xp = call.entry, _backend().xp
        # operands the kernels overwrite in place: both must start from the same values
        saved = {k: [_copy(xp, p) for p in call.inputs[k].pieces] for k in set(entry.in_place)}
        kept = entry.cache
        entry.cache = kept.setdefault(_GENERIC_CACHE, {})     # a cache of its own: keys may clash
        try:
            shards = generic_fn(call)
        finally:
            entry.cache = kept
        want = [[_copy(xp, p) for p in s.pieces] for s in shards]
        want_result, call.result = call.result, None
        for k, pieces in saved.items():
            for piece, value in zip(call.inputs[k].pieces, pieces):
                piece[...] = value
        shards = own(call)
        for i, (s, pieces) in enumerate(zip(shards, want)):
            for j, (g, w) in enumerate(zip(s.pieces, pieces)):
                why = _difference(g, w)
                if why is not None:
                    _differences.append(f"{op_name} on worker {call.rank}, output {i} piece {j}: {why}")
        if len(shards) != len(want):
            _differences.append(f"{op_name} on worker {call.rank}: {len(shards)} outputs against {len(want)}")
        if isinstance(want_result, float) and not np.isclose(call.result, want_result, rtol=1e-5, equal_nan=True):
            _differences.append(f"{op_name} on worker {call.rank}: result {call.result!r} against {want_result!r}")
        return shards
    return run


@kernel("test_kernel_checking")
def _kernel_checking(call):
    """Every rank turns the comparison on or off (static[0]); turning it off gathers what was found."""
    global _checking
    _checking = call.entry.static[0]
    found = [] if _checking else list(_differences)
    _differences.clear()
    call.result = gather_objects(call.world, found)
    return []


# ---- test ops with a backend kernel of their own, so that the CPU exercises the comparison ----------
def _times(factor, own=False):
    def run(call):
        x = call.inputs[0]
        pieces = [p + p for p in x.pieces] if own else [p * factor for p in x.pieces]
        return [Shard(pieces, call.entry.out_dists[0], x.dtype)]
    return run


_TWICE, _TWICE_WRONG = registry.define("test_twice"), registry.define("test_twice_wrong")
_TWICE.kernel(local=True)(_times(2))
_TWICE_WRONG.kernel(local=True)(_times(2))
for _backend_name in ("cpu", "gpu"):
    _TWICE.kernel(_backend_name, local=True)(_times(2, own=True))
    # off by one part in a thousand: a backend kernel the comparison must catch
    _TWICE_WRONG.kernel(_backend_name, local=True)(_times(2.002))


def twice(m, wrong=False):
    """2 * m through a test op whose backend kernels compute it their own way (or wrongly)."""
    op = "test_twice_wrong" if wrong else "test_twice"
    return dispatch(op, [m], [new_meta(m.layout, m.shape, m.dtype)])[0][0]


# every backend kernel registered so far (dmath's, imported with it, and the test ops') is wrapped
for _op in list(registry.OPS.values()):
    if None in _op.kernels:
        for _name, (_fn, _capture) in list(_op.kernels.items()):
            if _name is not None:
                _op.kernels[_name] = (_checked(_op.name, _fn, _op.kernels[None][0]), _capture)


@contextlib.contextmanager
def kernels_checked(failures, label="backend kernels"):
    """Inside the block every rank compares each backend kernel with the generic one; what differs
    is added to `failures` under `label`."""
    dispatch("test_kernel_checking", static=(True,))
    try:
        yield
    finally:
        if dmath.runtime.is_initialized() and dmath.runtime.runtime().broken is None:
            found = dispatch("test_kernel_checking", static=(False,))[1]
            for rank_found in found:
                for what in rank_found:
                    failures.add(label, what)


class Failures:
    """Every failing case of a test, reported together at the end (`check`)."""

    def __init__(self):
        self.lines = []

    def add(self, label, what):
        self.lines.append(f"{label}: {what}")

    @contextlib.contextmanager
    def case(self, label):
        """A case: an exception inside the block is noted under `label` and the test goes on."""
        try:
            yield
        except Exception as exc:  # noqa: BLE001 - collect every failing case
            self.add(label, f"{type(exc).__name__}: {exc}")

    def check(self):
        assert not self.lines, "\n".join(self.lines)


def check_cases(cases, dtype="float32", exact=False, check=None):
    """Run (label, thunk, expected NumPy array) cases: each thunk's Matrix must have the expected shape
    and values in `dtype` (within `tol(dtype)`, or bit for bit when exact), and pass `check(result)`
    when given; every backend kernel the cases run must agree with the generic one. All failures
    are reported at once."""
    failures = Failures()
    for label, got, want in cases:
        with kernels_checked(failures, label), failures.case(label):
            r = got()
            assert isinstance(r, dmath.Matrix), type(r)
            assert r.shape == want.shape, (r.shape, want.shape)
            if check is not None:
                check(r)
            if exact:
                np.testing.assert_array_equal(r.to_numpy(), want.astype(dtype))
            else:
                np.testing.assert_allclose(r.to_numpy(), want.astype(dtype), **tol(dtype))
    failures.check()
