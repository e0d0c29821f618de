"""dmath.layout.indexset against plain Python sets."""
import numpy as np
import pytest

from dmath.layout import indexset as ix


def _as_set(s):
    return {i for a, b in s for i in range(a, b)}


def _random_set(rng, n, k):
    """A sorted disjoint interval tuple inside [0, n) with up to k intervals."""
    cuts = sorted(set(rng.integers(0, n + 1, size=2 * k).tolist()))
    pairs = [(cuts[i], cuts[i + 1]) for i in range(0, len(cuts) - 1, 2)]
    return tuple((a, b) for a, b in pairs if b > a)


def test_interval_size_shift():
    assert ix.interval(2, 5) == ((2, 5),)
    assert ix.interval(5, 5) == () and ix.interval(6, 2) == ()
    assert ix.size(((0, 3), (5, 9))) == 7 and ix.size(()) == 0
    assert ix.shift(((0, 3), (5, 9)), 10) == ((10, 13), (15, 19))
    assert ix.shift(((10, 13),), -10) == ((0, 3),)


def test_intersect_matches_sets():
    rng = np.random.default_rng(0)
    for _ in range(300):
        s, t = _random_set(rng, 40, 5), _random_set(rng, 40, 5)
        r = ix.intersect(s, t)
        assert _as_set(r) == _as_set(s) & _as_set(t)
        # sorted, disjoint, non-empty intervals
        assert all(a < b for a, b in r)
        assert all(r[k][1] <= r[k + 1][0] for k in range(len(r) - 1))
    assert ix.intersect((), ((0, 5),)) == ()


def test_to_array_and_selection():
    s = ((1, 3), (6, 9))
    np.testing.assert_array_equal(ix.to_array(s), [1, 2, 6, 7, 8])
    assert ix.to_array(()).dtype == np.int64 and ix.to_array(()).size == 0
    assert ix.selection(((2, 7),)) == slice(2, 7)
    assert ix.selection(()) == slice(0, 0)
    np.testing.assert_array_equal(ix.selection(s), [1, 2, 6, 7, 8])
    a = np.arange(10)
    np.testing.assert_array_equal(a[ix.selection(s)], [1, 2, 6, 7, 8])


def test_positions_matches_brute_force():
    rng = np.random.default_rng(1)
    for _ in range(300):
        s = _random_set(rng, 50, 6)
        if not s:
            continue
        full = ix.to_array(s)
        sub = ix.intersect(s, _random_set(rng, 50, 4))
        pos = ix.positions(sub, s)
        want = np.searchsorted(full, ix.to_array(sub))
        got = np.arange(len(full))[pos]
        np.testing.assert_array_equal(got, want)
        if isinstance(pos, slice):
            # a slice only when the positions are contiguous
            assert want.size == 0 or np.all(np.diff(want) == 1)
        else:
            assert not np.all(np.diff(want) == 1)


@pytest.mark.parametrize("n,parts", [(10, 3), (7, 7), (2, 4), (0, 3), (13, 1), (5, 2)])
def test_split_even_and_blocks(n, parts):
    sizes = ix.split_even(n, parts)
    assert len(sizes) == parts and sum(sizes) == n
    assert max(sizes) - min(sizes) <= 1
    assert list(sizes) == sorted(sizes, reverse=True)       # the longer blocks first
    blocks = ix.blocks_from_sizes(sizes)
    assert [ix.size(b) for b in blocks] == list(sizes)
    covered = [i for b in blocks for i in ix.to_array(b)]
    assert covered == list(range(n))


@pytest.mark.parametrize("n,block,parts", [(10, 3, 2), (7, 1, 3), (5, 8, 2), (0, 2, 2), (17, 4, 3)])
def test_cyclic_matches_brute_force(n, block, parts):
    seen = []
    for part in range(parts):
        s = ix.cyclic(n, block, parts, part)
        want = [i for i in range(n) if (i // block) % parts == part]
        assert ix.to_array(s).tolist() == want
        seen += want
    assert sorted(seen) == list(range(n))
