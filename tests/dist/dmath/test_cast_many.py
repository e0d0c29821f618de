"""dmath.astype_many: every matrix of a list converted exactly as its own astype converts it (bit for bit),
across layouts, groups of workers and every pair of float dtypes, lists longer than one command carries,
and its argument checks; at any worker count (on GPUs: the table kernel, and the copy of a strided or
same-dtype piece)."""
import numpy as np
import pytest

import dmath
from dmath.ops import cast

P = dmath.num_workers()
FLOATS = ("float16", "float32", "float64")
SHAPES = [(7, 5), (1, 9), (12, 3), (4, 4), (0, 3)]


def _layouts():
    out = [dmath.Replicated(), dmath.RowBlock(), dmath.ColBlock(), dmath.BlockCyclic((2, 2))]
    if P > 1:
        out.append(dmath.RowBlock(group=tuple(range(1, P))))       # a group without the first worker
    return out


def _matrices(seed, count, dtype):
    """count matrices of `dtype` in the layouts taken in turn; values that round differently in each
    narrower dtype (and overflow float16 now and then)."""
    rng = np.random.default_rng(seed)
    lays = _layouts()
    mats = []
    for k in range(count):
        a = rng.normal(size=SHAPES[k % len(SHAPES)]) * 10.0 ** rng.integers(-6, 6)
        if a.size and k % 7 == 3:
            a.flat[0] = 7.0e4                 # past float16's largest finite value
        mats.append(dmath.from_numpy(a.astype(dtype), layout=lays[k % len(lays)]))
    return mats


def _bits(a):
    return np.ascontiguousarray(a).view(np.uint8)


def _rounded(a, dtype):
    """a in dtype as NumPy rounds it (an overflow to inf is the expected value)."""
    with np.errstate(over="ignore"):
        return a.astype(dtype)


@pytest.mark.parametrize("src", FLOATS)
@pytest.mark.parametrize("dst", FLOATS)
def test_each_matrix_is_its_astype(src, dst):
    mats = _matrices(1, 11, src)
    got = dmath.astype_many(mats, dst)
    assert len(got) == len(mats)
    for m, g in zip(mats, got):
        want = m.astype(dst)
        assert g.dtype == dst and g.shape == m.shape and g.layout == m.layout
        assert np.array_equal(_bits(g.to_numpy()), _bits(want.to_numpy()))
        # and as NumPy rounds the same values
        assert np.array_equal(_bits(g.to_numpy()), _bits(_rounded(m.to_numpy(), dst)))


def test_more_matrices_than_one_command_carries():
    mats = _matrices(2, cast.CHUNK + 9, "float32")
    got = dmath.astype_many(mats, "float16")
    for m, g in zip(mats, got):
        assert np.array_equal(_bits(g.to_numpy()), _bits(_rounded(m.to_numpy(), np.float16)))


def test_results_are_new_matrices():
    (m,) = _matrices(3, 1, "float32")
    (g,) = dmath.astype_many([m], "float32")          # the same dtype: an independent copy
    g.assign(g + 1.0)
    assert np.array_equal(g.to_numpy(), m.to_numpy() + np.float32(1.0))
    assert dmath.astype_many([], "float16") == []


def test_inside_a_recorded_plan_each_replay_reads_the_current_values():
    (m,) = _matrices(4, 1, "float32")
    target = dmath.zeros(m.shape, dtype="float16", layout=m.layout)
    with dmath.record() as plan:
        target.assign(dmath.astype_many([m], "float16")[0])
    m.assign(m * 2.0)
    plan.replay()
    assert np.array_equal(_bits(target.to_numpy()), _bits(_rounded(m.to_numpy(), np.float16)))


def test_arguments_are_checked():
    (m,) = _matrices(5, 1, "float32")
    with pytest.raises(dmath.DMathError, match=r"matrices\[1\] must be a dmath.Matrix"):
        dmath.astype_many([m, np.zeros((2, 2))], "float16")
    for bad, what in ((None, "NoneType"), (m, "one dmath.Matrix")):
        with pytest.raises(dmath.DMathError, match=f"astype_many: pass a list of matrices, got {what}"):
            dmath.astype_many(bad, "float16")
    with pytest.raises(dmath.DTypeError, match="astype_many: dtype int32 is not supported"):
        dmath.astype_many([m], "int32")
    with pytest.raises(dmath.DTypeError, match="astype_many: unknown dtype"):
        dmath.astype_many([m], "quarter")
    assert dmath.astype_many([m], np.float16)[0].dtype == "float16"
    partial = dmath.from_numpy(np.ones((2, 3)), layout=dmath.Partial())
    with pytest.raises(dmath.LayoutError, match="Partial"):
        dmath.astype_many([partial], "float16")


def test_large_arrays_beside_small_ones():
    """On a GPU each array of a table launch gets blocks in proportion to its size: large and small
    arrays side by side convert element for element, the large ones' last elements included, and a
    non-finite value at the very end of a large gradient is found by all_finite."""
    rng = np.random.default_rng(4)
    shapes = [(2, 2), (1031, 1021), (1, 1), (257, 2053)]
    mats = [dmath.from_numpy(rng.normal(size=s).astype("float32"), layout=lay)
            for s, lay in zip(shapes, [dmath.Replicated(), dmath.RowBlock()] * 2)]
    for got, m in zip(dmath.astype_many(mats, "float16"), mats):
        np.testing.assert_array_equal(_bits(got.to_numpy()), _bits(m.to_numpy().astype("float16")))
    assert dmath.nn.all_finite(mats).to_numpy()[0, 0] == 1.0
    last = rng.normal(size=shapes[1]).astype("float32")
    last[-1, -1] = np.inf
    mats[1] = dmath.from_numpy(last, layout=mats[1].layout)
    assert dmath.nn.all_finite(mats).to_numpy()[0, 0] == 0.0
