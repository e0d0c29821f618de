"""The segments of a plan with uncapturable steps (dmath.runtime.graphs.segments): pure, no GPU."""
from dmath.runtime.graphs import Segment, segments


def test_a_blocker_first_leaves_the_rest_one_captured_segment():
    # training from an image folder: the batch's host stage, then the step
    assert segments([False] + [True] * 10, 8) == [Segment(0, 1, False), Segment(1, 11, True)]


def test_short_runs_run_step_by_step_and_merge_with_their_neighbours():
    flags = [True] * 3 + [False] + [True] * 9 + [False, False] + [True] * 2
    assert segments(flags, 8) == [Segment(0, 4, False), Segment(4, 13, True), Segment(13, 17, False)]


def test_every_step_is_in_exactly_one_segment_in_order():
    flags = [bool((k * 7) % 5) for k in range(40)]
    segs = segments(flags, 2)
    assert segs[0].start == 0 and segs[-1].stop == len(flags)
    assert all(a.stop == b.start for a, b in zip(segs, segs[1:]))
    for g in segs:
        assert not g.capture or (all(flags[g.start:g.stop]) and g.stop - g.start >= 2)


def test_nothing_captured_below_the_minimum_and_nothing_for_no_steps():
    assert segments([True] * 5, 8) == [Segment(0, 5, False)]
    assert segments([], 8) == []
