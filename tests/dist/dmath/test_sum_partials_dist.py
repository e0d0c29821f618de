"""dmath.sum_partials: several Partial matrices summed by one all-reduce, at every worker count.

The oracle is the per-matrix sum (`remap` to Replicated) and the float64 value of the addends. Real
per-worker addends come from ColBlock @ RowBlock products (each worker's addend is its share of the
inner dimension) and from the test kernel that puts column w of a matrix on worker w.
"""
import numpy as np
import pytest

import dmath
from dmath.ops.base import dispatch, new_meta
from dmath.ops.buckets import ALIGN, offsets

P = dmath.num_workers()
RNG = np.random.default_rng(7)
SHAPES = [(3, 5), (1, 7), (4, 1), (6, 6), (1, 1)]


def _partial_product(shape, k=8, dtype="float64", seed=0):
    """A Partial (m, n) matrix: a ColBlock (m, k) times a RowBlock (k, n), and its float64 value."""
    rng = np.random.default_rng(seed)
    a, b = rng.standard_normal((shape[0], k)), rng.standard_normal((k, shape[1]))
    A = dmath.from_numpy(a, layout=dmath.ColBlock(), dtype=dtype)
    B = dmath.from_numpy(b, layout=dmath.RowBlock(), dtype=dtype)
    got = dmath.gemm(A, B, layout=dmath.Partial())
    assert got.layout.partial
    return got, a.astype(dtype).astype(np.float64) @ b.astype(dtype).astype(np.float64)


def test_offsets_align_every_part():
    starts, total = offsets([3, 0, 65, 1], 4)
    assert starts == [0, 64, 64, 192] and total == 256
    for itemsize in (2, 4, 8):
        starts, total = offsets([5, 17, 1000], itemsize)
        assert all(s * itemsize % ALIGN == 0 for s in starts)
        assert total >= starts[-1] + 1000


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("background", [False, True])
def test_sums_equal_the_per_matrix_remaps(dtype, background):
    pairs = [_partial_product(s, dtype=dtype, seed=i) for i, s in enumerate(SHAPES)]
    ms = [m for m, _ in pairs]
    sums = dmath.sum_partials(ms, background=background)
    tol = 1e-12 if dtype == "float64" else 2e-5
    for (m, want), got in zip(pairs, sums):
        assert got.layout == dmath.Replicated(tuple(range(P))) and got.dtype == dtype
        assert got.shape == m.shape
        ref = m.remap(dmath.Replicated()).to_numpy()
        np.testing.assert_allclose(got.to_numpy(), ref, rtol=tol, atol=tol)
        np.testing.assert_allclose(got.to_numpy(), want, rtol=10 * tol, atol=10 * tol)
    # the results are ordinary matrices: later commands read them (waiting for a background sum)
    total = sum(float(s.sum()) for s in sums)
    np.testing.assert_allclose(total, sum(w.sum() for _, w in pairs), rtol=1e-4)


def test_float16_addends_are_summed_in_float32():
    # column w of X is worker w's addend: 6e4 + 6e4 overflows float16, their float32 sum does not
    cols = np.full((3, P), 6e4)
    cols[1] = np.arange(P) + 0.25
    X = dmath.from_numpy(cols, layout=dmath.ColBlock(), dtype="float16")
    part = dispatch("test_partial_addends", [X], [new_meta(dmath.Partial(), (3, 1), "float16")])[0][0]
    other, want_other = _partial_product((2, 2), dtype="float16")
    got = dmath.sum_partials([part, other], dtype="float32")
    want = cols.astype(np.float16).astype(np.float64).sum(axis=1, keepdims=True)
    np.testing.assert_array_equal(got[0].to_numpy(), want.astype(np.float32))
    assert got[0].dtype == "float32" and np.isfinite(got[0].to_numpy()).all()
    np.testing.assert_allclose(got[1].to_numpy(), want_other, rtol=1e-3, atol=1e-2)


def test_recorded_and_replayed():
    m1, w1 = _partial_product((5, 3), seed=1)
    m2, w2 = _partial_product((2, 9), seed=2)
    out1 = dmath.zeros((5, 3), dtype="float64", layout=dmath.Replicated())
    out2 = dmath.zeros((2, 9), dtype="float64", layout=dmath.Replicated())
    with dmath.record() as plan:
        s1, s2 = dmath.sum_partials([m1, m2], background=True)
        out1.assign(s1 * 2.0)
        out2.assign(s2)
    for _ in range(2):
        out1.assign(dmath.zeros((5, 3), dtype="float64", layout=dmath.Replicated()))
        plan.replay()
        np.testing.assert_allclose(out1.to_numpy(), 2 * w1, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(out2.to_numpy(), w2, rtol=1e-12, atol=1e-12)
    plan.close()


@pytest.mark.skipif(P < 3, reason="a group smaller than the world needs 3 workers")
def test_a_group_of_some_workers():
    group = (P - 1, 0)
    a = RNG.standard_normal((4, 3))
    ms = [dmath.from_numpy(a, layout=dmath.Partial(group)), dmath.from_numpy(a.T, layout=dmath.Partial(group))]
    got = dmath.sum_partials(ms)
    assert got[0].layout == dmath.Replicated(group)
    np.testing.assert_array_equal(got[0].to_numpy(), a)
    np.testing.assert_array_equal(got[1].to_numpy(), a.T)


def test_bad_arguments_are_refused_on_the_master():
    m, _ = _partial_product((2, 2))
    rep = dmath.ones((2, 2), layout=dmath.Replicated())
    with pytest.raises(dmath.DMathError, match="non-empty list"):
        dmath.sum_partials([])
    with pytest.raises(dmath.DMathError, match="non-empty list"):
        dmath.sum_partials([m, np.ones((2, 2))])
    with pytest.raises(dmath.LayoutError, match="sums Partial matrices"):
        dmath.sum_partials([m, rep])
    m32, _ = _partial_product((2, 2), dtype="float32")
    with pytest.raises(dmath.DTypeError, match="pass dtype="):
        dmath.sum_partials([m, m32])
    with pytest.raises(dmath.DTypeError, match="wider than the sums"):
        dmath.sum_partials([m, m32], dtype="float32")
    if P > 1:
        other = dmath.from_numpy(np.ones((2, 2)), layout=dmath.Partial((0,)))
        with pytest.raises(dmath.LayoutError, match="one all-reduce sums over one group"):
            dmath.sum_partials([m, other])
    # the runtime is usable after the refusals
    np.testing.assert_allclose(dmath.sum_partials([m])[0].to_numpy(), m.to_numpy())


@pytest.mark.parametrize("background", [False, True])
def test_more_matrices_than_one_command_carries(background):
    # a bucket of many small addends (a network's batch-norm scales and shifts): past PER_COMMAND
    # matrices the sums take several commands, each its own all-reduce, in the order given
    from dmath.ops.buckets import PER_COMMAND
    n = 2 * PER_COMMAND + 3
    pairs = [_partial_product((1, 1 + i % 3), k=4, seed=i) for i in range(n)]
    sums = dmath.sum_partials([m for m, _ in pairs], background=background)
    assert len(sums) == n
    for (_, want), got in zip(pairs, sums):
        np.testing.assert_allclose(got.to_numpy(), want, rtol=1e-12, atol=1e-12)


def test_the_same_workers_in_another_order_and_a_bad_background():
    a, want_a = _partial_product((2, 3), seed=1)
    with pytest.raises(dmath.DMathError, match="background must be True or False"):
        dmath.sum_partials([a], background="no")
    if P < 2:
        return
    # the same group listed in another order: the same sum (one all-reduce over those workers)
    members = tuple(reversed(range(P)))
    rng = np.random.default_rng(4)
    u, v = rng.standard_normal((3, 4)), rng.standard_normal((4, 5))
    rev = dmath.gemm(dmath.from_numpy(u, layout=dmath.ColBlock(members)),
                     dmath.from_numpy(v, layout=dmath.RowBlock(members)), layout=dmath.Partial(members))
    assert rev.layout.members(P) == members
    got = dmath.sum_partials([a, rev])
    np.testing.assert_allclose(got[0].to_numpy(), want_a, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(got[1].to_numpy(), u @ v, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("background", [False, True])
def test_sums_written_into_given_matrices(dtype, background):
    # out=: the sums land in the given Replicated matrices, in place (their handles and layouts kept),
    # bit for bit the sums sum_partials returns
    pairs = [_partial_product(s, dtype=dtype, seed=i) for i, s in enumerate(SHAPES)]
    ms = [m for m, _ in pairs]
    want = [s.to_numpy() for s in dmath.sum_partials(ms)]
    targets = [dmath.full(m.shape, -7.0, dtype=dtype, layout=dmath.Replicated()) for m in ms]
    handles = [t._handle for t in targets]
    got = dmath.sum_partials(ms, background=background, out=targets)
    assert [g._handle for g in got] == handles
    for t, w in zip(targets, want):
        assert t.layout == dmath.Replicated(tuple(range(P))) and t.dtype == dtype
        np.testing.assert_array_equal(t.to_numpy(), w)
    # a later command reads them (waiting for a background sum and its copies)
    np.testing.assert_allclose(sum(float(t.sum()) for t in targets), sum(w.sum() for w in want), rtol=1e-6)


def test_sums_into_given_matrices_recorded_and_replayed():
    # a training step's running statistics: the sums written in place inside a recorded plan, read by
    # the next replay's commands
    m1, w1 = _partial_product((5, 3), seed=1)
    m2, w2 = _partial_product((2, 9), seed=2)
    r1 = dmath.zeros((5, 3), dtype="float64", layout=dmath.Replicated())
    r2 = dmath.zeros((2, 9), dtype="float64", layout=dmath.Replicated())
    seen = dmath.zeros((1, 1), dtype="float64", layout=dmath.Replicated())
    with dmath.record() as plan:
        seen.assign(r1.sum(axis=0).sum(axis=1))       # reads the sums of the run before
        dmath.sum_partials([m1, m2], background=True, out=[r1, r2])
    assert seen.to_numpy()[0, 0] == 0.0               # (recording ran the commands once)
    for _ in range(3):
        r2.assign(dmath.zeros((2, 9), dtype="float64", layout=dmath.Replicated()))
        plan.replay()
        np.testing.assert_allclose(r1.to_numpy(), w1, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(r2.to_numpy(), w2, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(seen.to_numpy()[0, 0], w1.sum(), rtol=1e-10, atol=1e-10)
    plan.close()


def test_more_matrices_into_than_one_command_carries():
    from dmath.ops.buckets import PER_COMMAND_INTO
    n = 2 * PER_COMMAND_INTO + 5
    pairs = [_partial_product((1, 1 + i % 3), k=4, seed=i) for i in range(n)]
    targets = [dmath.zeros(m.shape, dtype="float64", layout=dmath.Replicated()) for m, _ in pairs]
    dmath.sum_partials([m for m, _ in pairs], background=True, out=targets)
    for (_, want), t in zip(pairs, targets):
        np.testing.assert_allclose(t.to_numpy(), want, rtol=1e-12, atol=1e-12)


def test_bad_targets_are_refused_and_change_nothing():
    m, want = _partial_product((2, 3))
    good = dmath.zeros((2, 3), dtype="float64", layout=dmath.Replicated())
    cases = [
        ([good, good], "list of 1"),
        (good, "list of 1"),
        ([np.zeros((2, 3))], "list of 1"),
        ([dmath.zeros((3, 2), dtype="float64", layout=dmath.Replicated())], "shape"),
        ([dmath.zeros((2, 3), dtype="float32", layout=dmath.Replicated())], "float32"),
        ([dmath.zeros((2, 3), dtype="float64", layout=dmath.RowBlock())], "Replicated over"),
    ]
    for out, match in cases:
        with pytest.raises(dmath.DMathError, match=match):
            dmath.sum_partials([m], out=out)
    if P > 1:
        with pytest.raises(dmath.LayoutError, match="Replicated over"):
            dmath.sum_partials([m], out=[dmath.zeros((2, 3), dtype="float64", layout=dmath.Replicated((0,)))])
        m2, _ = _partial_product((2, 3), seed=3)
        with pytest.raises(dmath.DMathError, match="twice"):
            dmath.sum_partials([m, m2], out=[good, good])
    # a transpose or a slice is a copy: the sums written there would leave the matrix unchanged
    square = dmath.zeros((3, 2), dtype="float64", layout=dmath.Replicated())
    with pytest.raises(dmath.NotSupportedError, match="copy"):
        dmath.sum_partials([m], out=[square.T])
    wide = dmath.zeros((4, 3), dtype="float64", layout=dmath.Replicated())
    with pytest.raises(dmath.NotSupportedError, match="copy"):
        dmath.sum_partials([m], out=[wide[0:2, :]])
    np.testing.assert_array_equal(wide.to_numpy(), np.zeros((4, 3)))
    np.testing.assert_array_equal(good.to_numpy(), np.zeros((2, 3)))
    dmath.sum_partials([m], out=[good])
    np.testing.assert_allclose(good.to_numpy(), want, rtol=1e-12, atol=1e-12)


def test_large_sums_beside_small_ones_into_given_matrices():
    """On a GPU the bucket's packing and the copies into out= targets are table launches whose arrays
    get blocks in proportion to their sizes: a large sum beside small ones is bit for bit the returned
    sum, up to its last element."""
    shapes = [(2, 3), (611, 1707), (1, 1)]
    ms = [_partial_product(s, dtype="float32", seed=20 + i)[0] for i, s in enumerate(shapes)]
    want = [s.to_numpy() for s in dmath.sum_partials(ms)]
    targets = [dmath.zeros(m.shape, dtype="float32", layout=dmath.Replicated()) for m in ms]
    dmath.sum_partials(ms, out=targets)
    for t, w in zip(targets, want):
        np.testing.assert_array_equal(t.to_numpy(), w)
    assert np.count_nonzero(want[1]) > want[1].size // 2
