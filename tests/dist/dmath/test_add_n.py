"""dmath.add_n: the elementwise sum of a list in one pass per four operands (three more a pass), against
NumPy adding left to right in the pass's precision (float32 for float16, rounded once a pass); across
layouts (the result in the first operand's), broadcast vectors, Partial operands, and its checks."""
import numpy as np
import pytest

import dmath

P = dmath.num_workers()
LAYOUTS = [dmath.RowBlock(), dmath.ColBlock(), dmath.Replicated(), dmath.BlockCyclic((2, 3))]


def _expected(arrays, dtype):
    """NumPy's left-to-right sum, a pass over the first four, then over the total and three more each."""
    wide = np.float32 if dtype == "float16" else dtype

    def one_pass(ops):
        acc = ops[0].astype(wide)
        for o in ops[1:]:
            acc = acc + o.astype(wide)
        return acc.astype(dtype)
    total, rest = one_pass(arrays[:4]), arrays[4:]
    while rest:
        total, rest = one_pass([total] + rest[:3]), rest[3:]
    return total


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
@pytest.mark.parametrize("count", [2, 3, 4, 5, 7, 9])
def test_sum_matches_numpy_pass_by_pass(dtype, count):
    rng = np.random.default_rng(count)
    arrays = [rng.normal(size=(9, 7)).astype(dtype) for _ in range(count)]
    mats = [dmath.from_numpy(a, layout=LAYOUTS[k % len(LAYOUTS)]) for k, a in enumerate(arrays)]
    got = dmath.add_n(mats)
    assert got.dtype == dtype and got.layout == mats[0].layout
    if count == 2:
        want = arrays[0] + arrays[1]
    else:
        want = _expected(arrays, dtype)
    np.testing.assert_array_equal(got.to_numpy(), want)


def test_vectors_broadcast_as_plus_broadcasts():
    rng = np.random.default_rng(1)
    a, b = rng.normal(size=(6, 5)), rng.normal(size=(6, 5))
    row, col = rng.normal(size=(1, 5)), rng.normal(size=(6, 1))
    got = dmath.add_n([dmath.from_numpy(x) for x in (a, row, b, col)]).to_numpy()
    np.testing.assert_allclose(got, a + row + b + col, rtol=1e-14, atol=1e-14)


def test_one_matrix_gives_a_copy_and_partials_are_summed():
    a = dmath.from_numpy(np.arange(6.0).reshape(2, 3))
    c = dmath.add_n([a])
    c.assign(c + 1.0)
    np.testing.assert_array_equal(a.to_numpy(), np.arange(6.0).reshape(2, 3))
    parts = [dmath.from_numpy(np.full((2, 3), float(k)), layout=dmath.Partial()) for k in range(1, 4)]
    # a Partial matrix is the sum of its workers' addends (from_numpy places the array as that sum)
    total = dmath.add_n(parts)
    np.testing.assert_array_equal(total.to_numpy(), np.full((2, 3), 6.0))


def test_arguments_are_checked():
    a = dmath.from_numpy(np.ones((2, 3)))
    with pytest.raises(dmath.DMathError, match="at least one matrix"):
        dmath.add_n([])
    with pytest.raises(dmath.DMathError, match=r"matrices\[1\] must be a dmath.Matrix"):
        dmath.add_n([a, 2.0, a])
    for bad, what in ((None, "NoneType"), (a, "one dmath.Matrix"), (3.0, "float")):
        with pytest.raises(dmath.DMathError, match=f"add_n: pass a list of matrices, got {what}"):
            dmath.add_n(bad)
    with pytest.raises(dmath.ShapeError):
        dmath.add_n([a, a, dmath.from_numpy(np.ones((3, 2)))])
