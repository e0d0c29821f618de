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


class _Entry:
    def __init__(self, n_in):
        self.inputs = [None] * n_in


class _Rt:
    """What made_anew reads of a runtime: each step's entry (sig_id = its number of inputs)."""
    entries = {n: _Entry(n) for n in range(4)}


def test_a_segment_reading_a_new_shard_of_a_step_by_step_step_is_not_captured():
    from dmath.runtime.graphs import made_anew
    from dmath.runtime.protocol import Program, Step
    # an uncapturable step writing its input 1 in place (a batch decoded into its matrix), a run that
    # reads it; an uncapturable step making 5 anew from 4, a run that reads 5, then one that reads only
    # what the run before it made (6 -> 7) and one that reads what the step-by-step run made (8)
    steps = (Step(1, (1, 1), (), ()), Step(1, (1, 4), (), ()),          # 0: in place; 1: run A
             Step(1, (4, 5), (), ()),                                   # 2: a new shard of 5
             Step(1, (5, 6), (), ()),                                   # 3: run B reads 5
             Step(1, (6, 7), (), ()),                                   # 4: run C reads 6 (B's)
             Step(0, (8,), (), ()), Step(1, (8, 9), (), ()))            # 5: makes 8; 6: run D reads it
    segs = [Segment(0, 1, False), Segment(1, 2, True), Segment(2, 3, False), Segment(3, 4, True),
            Segment(4, 5, True), Segment(5, 6, False), Segment(6, 7, True)]
    # B reads 5, made anew: step by step; then what B makes (6) is made anew too, so C is as well;
    # D reads 8, made anew by step 5; A reads 1, written in place: captured
    assert made_anew(_Rt(), Program(steps, ()), segs) == {3, 4, 6}
