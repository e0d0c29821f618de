"""The pure cut rule of the gradient buckets (dnn.training.buckets.cut)."""
from dnn.training.buckets import cut

MB = 1 << 20


def _simulate(sizes, cap, last):
    """The buckets `cut` makes of gradients of `sizes` bytes arriving in order (as Buckets.ready)."""
    remaining, tail, out, open_ = sum(sizes), False, [], []
    for s in sizes:
        remaining -= s
        open_.append(s)
        if cut(sum(open_), remaining, cap, last, tail):
            if 0 < remaining <= last:
                tail = True
            out.append(open_)
            open_ = []
    assert not open_
    return out


def test_nothing_to_cut_in_an_empty_bucket():
    assert not cut(0, 0, 25 * MB, MB, False)


def test_a_small_model_is_one_bucket():
    assert _simulate([1000, 2000, 300, 40], 25 * MB, MB) == [[1000, 2000, 300, 40]]


def test_full_buckets_and_a_small_final_one():
    sizes = [10 * MB] * 6 + [MB // 4] * 3
    got = _simulate(sizes, 25 * MB, MB)
    assert [sum(b) for b in got[:-1]] == [30 * MB, 30 * MB]
    assert got[-1] == [MB // 4] * 3          # the final bucket: only what remained under 1 MB
    assert sum(map(sum, got)) == sum(sizes)


def test_the_tail_is_cut_once():
    sizes = [3 * MB, MB // 2, MB // 8, MB // 8]
    got = _simulate(sizes, 25 * MB, MB)
    assert got == [[3 * MB], [MB // 2, MB // 8, MB // 8]]
