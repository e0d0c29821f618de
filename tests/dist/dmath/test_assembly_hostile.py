"""Hostile use of the assembly functions: random calls with mostly invalid arguments must return
NumPy's values or raise a typed dmath error, and leave the runtime usable (test_hostile_dist's
fuzz suite, for writes, concatenate, block, pad, roll, triu, tril, diag, trace and take_rows)."""
import numpy as np
import pytest

import dmath
from dmath import DMathError

P = dmath.num_workers()
BAD = [None, "x", 1j, float("nan"), float("inf"), 2.5, (), (3, 4, 5), [[1, 2]], object(), True, 10 ** 30,
       np.ones(3), dmath.Replicated()]


class Fuzz:
    def __init__(self, seed):
        self.rng = np.random.default_rng(seed)
        self.errors = self.checked = 0

    def pick(self, options):
        return options[self.rng.integers(len(options))]

    def some(self, good):
        """A valid argument from `good` most of the time, else a hostile one."""
        return self.pick(BAD) if self.rng.random() < 0.3 else self.pick(good)

    def matrix(self):
        shape = (int(self.rng.integers(1, 7)), int(self.rng.integers(1, 7)))
        x = self.rng.normal(size=shape)
        lay = self.pick([dmath.RowBlock(), dmath.ColBlock(), dmath.Replicated(), dmath.Block2D(),
                         dmath.BlockCyclic((2, 1)), dmath.Partial()])
        return dmath.from_numpy(x, dmath.RowBlock()).remap(lay), x

    def call(self, a, x, b, y):
        """(name, the dmath call, its NumPy oracle or None)."""
        k = self.some([0, 1, -1, 3, -7])
        ax = self.some([0, 1, -1, None, (0, 1)])
        shift = self.some([1, -2, 5, (1, 2)])
        width = self.some([1, (0, 2), ((1, 0), (2, 1)), 0])
        mode = self.some(["constant", "edge", "wrap", "reflect", "symmetric", "mean"])
        rows = self.some([[0], [-1, 0], list(range(x.shape[0]))[::-1], [x.shape[0]], []])
        key = self.some([(0, slice(None)), (slice(0, 1), slice(0, 1)), (slice(None, None, 2), 0), (9, 9), (-1, -1)])
        value = self.some([2.5, b[:1, :1], np.ones((1, 1)), np.ones((2, 2)), b])
        parts = self.pick([([a, b], [x, y]), ([a], [x]), ([], [])])
        ops = {
            "concatenate": (lambda: dmath.concatenate(parts[0], axis=ax), lambda: np.concatenate(parts[1], axis=ax)),
            "block": (lambda: dmath.block(self.some([[[a, b]], [a, b], [[a], [b]]])), None),
            "pad": (lambda: dmath.pad(a, width, mode=mode), lambda: np.pad(x, width, mode=mode)),
            "roll": (lambda: dmath.roll(a, shift, axis=ax), lambda: np.roll(x, shift, axis=ax)),
            "triu": (lambda: dmath.triu(a, k), lambda: np.triu(x, k)),
            "tril": (lambda: dmath.tril(a, k), lambda: np.tril(x, k)),
            "diag": (lambda: dmath.diag(a, k), None),
            "trace": (lambda: dmath.trace(a, k), lambda: np.trace(x, k)),
            "take_rows": (lambda: dmath.take_rows(a, rows), lambda: x[np.asarray(rows, dtype=np.int64)]),
            "setitem": (lambda: a.__setitem__(key, value), None),
        }
        name = self.pick(sorted(ops))
        return (name,) + ops[name]

    def run(self, n):
        for _ in range(n):
            a, x = self.matrix()
            b, y = self.matrix() if self.rng.random() < 0.6 else (a, x)
            name, fn, oracle = self.call(a, x, b, y)
            try:
                got = fn()
            except DMathError:
                self.errors += 1
            else:
                if oracle is not None:
                    try:
                        want = oracle()
                    except OverflowError:        # NumPy's C long (k = 10 ** 30): dmath takes Python ints
                        continue
                    value = got.to_numpy() if isinstance(got, dmath.Matrix) else got
                    np.testing.assert_allclose(value, want, rtol=1e-9, atol=1e-12, err_msg=name)
                    self.checked += 1
            if name != "setitem":
                np.testing.assert_allclose(a.to_numpy(), x, rtol=1e-12, atol=1e-12, err_msg=name)
        m = dmath.from_numpy(np.arange(6.0).reshape(2, 3))       # the runtime is still usable
        np.testing.assert_array_equal((m + 1).to_numpy(), np.arange(6.0).reshape(2, 3) + 1)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_assembly_fuzz(seed):
    fuzz = Fuzz(seed + 100 * P)
    fuzz.run(120)
    assert fuzz.errors > 10 and fuzz.checked > 20, vars(fuzz)
