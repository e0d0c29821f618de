"""float16 Partial sums accumulate in float32 (issue 35, item 5), at every worker count.

A ColBlock @ RowBlock product and a sum along the rows of a ColBlock matrix come out Partial: each
worker's addend is its share of the sum. In float16 an addend alone may overflow (or lose digits)
where the whole sum does not; before the fix such a result was 0 at one worker and NaN at 2-4. The
oracle: the float64 value rounded once to float16, the same at every worker count.
"""
import numpy as np
import pytest

import dmath

P = dmath.num_workers()
#: row 0 cancels across the columns only as a whole (each half overflows float16 alone)
A = np.array([[3e4, 3e4, 3e4, -3e4, -3e4, -3e4, 2.0, 5.0],
              [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0]])
B = np.array([[4.0], [4.0], [4.0], [4.0], [4.0], [4.0], [1.0], [1.0]])


def _h(x):
    return np.asarray(x, dtype=np.float64).astype(np.float16)


def test_a_colblock_rowblock_product_is_rounded_once():
    a = dmath.from_numpy(A, layout=dmath.ColBlock(), dtype="float16")
    b = dmath.from_numpy(B, layout=dmath.RowBlock(), dtype="float16")
    want = _h(A.astype(np.float16).astype(np.float64) @ B)
    got = a @ b
    assert got.dtype == "float16"
    np.testing.assert_array_equal(got.to_numpy(), want)             # before: NaN at P >= 2
    for lay in (dmath.Replicated(), dmath.RowBlock(), dmath.Partial()):
        np.testing.assert_array_equal(dmath.gemm(a, b, layout=lay).to_numpy(), want)
    c = dmath.from_numpy(np.ones((2, 1)), layout=dmath.Partial(), dtype="float16")
    dmath.gemm(a, b, c, beta=1.0)                                    # into a Partial C, with beta
    np.testing.assert_array_equal(c.to_numpy(), _h(want.astype(np.float64) + 1))
    # the same product recorded and replayed
    out = dmath.zeros((2, 1), dtype="float16", layout=dmath.Replicated())
    with dmath.record() as plan:
        out.assign(a @ b)
    plan.replay()
    np.testing.assert_array_equal(out.to_numpy(), want)


@pytest.mark.parametrize("op", ["sum", "mean"])
def test_a_sum_along_split_rows_is_rounded_once(op):
    a = dmath.from_numpy(A * 2, layout=dmath.ColBlock(), dtype="float16")
    x = (A * 2).astype(np.float16).astype(np.float64)
    got = getattr(a, op)(axis=1)
    np.testing.assert_array_equal(got.to_numpy(), _h(getattr(x, op)(axis=1, keepdims=True)))  # before: NaN
    np.testing.assert_array_equal((got * 1.0).to_numpy(), _h(getattr(x, op)(axis=1, keepdims=True)))


def test_float32_partial_results_are_unchanged():
    a = dmath.from_numpy(A, layout=dmath.ColBlock(), dtype="float32")
    b = dmath.from_numpy(B, layout=dmath.RowBlock(), dtype="float32")
    np.testing.assert_allclose((a @ b).to_numpy(), A @ B, rtol=1e-6)
    assert (a @ b).layout.partial == (P > 1)
    np.testing.assert_allclose(a.sum(axis=1).to_numpy(), A.sum(axis=1, keepdims=True), rtol=1e-6)
