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


class _CapEntry:
    def __init__(self, n_in, capture, op):
        self.inputs, self.capture_rule, self.op = [None] * n_in, capture, op


class _Shard:
    home = None


class _FakeRt:
    """A GPU runtime as Replayer sees it: entries, a handle table, step-by-step runs logged."""

    def __init__(self):
        import types
        self.backend = types.SimpleNamespace(is_gpu=True)
        # sig 0: makes a handle (capturable); 1: one input, capturable; 2: one input, not capturable
        self.entries = {0: _CapEntry(0, True, "make"), 1: _CapEntry(1, True, "ewise"),
                        2: _CapEntry(1, False, "host_batch")}
        self.table, self.ran, self.freed = {}, [], []

    def _run_program(self, program, talked=None):
        for s in program.steps:
            self.ran.append(s.handles)
            n_in = len(self.entries[s.sig_id].inputs)
            for h in s.handles[n_in:]:
                if h not in s.handles[:n_in] or h not in self.table:
                    self.table[h] = _Shard()
        return [s.handles for s in program.steps]

    def _free(self, handles):
        self.freed.append(tuple(handles))


class _FakeGraph:
    made = []

    def __init__(self, rt, program, reserve=0, streams=None):
        self.program, self.reserve, self.launches, self.ok = program, reserve, 0, True
        _FakeGraph.made.append(self)

    def valid(self, rt):
        return self.ok

    def launch(self, rt):
        self.launches += 1
        return [None] * len(self.program.steps)


def test_a_replayer_runs_blockers_step_by_step_and_launches_the_segments_around_them(monkeypatch):
    """The replays of a plan with a blocker: the first step by step; from the second on the blocker step
    by step, the run after it captured once, then launched; a capture found invalid is made again, and
    after MAX_RECAPTURES such times the run goes step by step for good."""
    from dmath.runtime import graphs
    from dmath.runtime.protocol import Program, Step
    monkeypatch.setattr(graphs, "CapturedProgram", _FakeGraph)
    monkeypatch.setattr(graphs, "enabled", lambda: True)
    monkeypatch.setattr(graphs, "streams_allowed", lambda: 1)
    monkeypatch.setattr(graphs.memory.pool, "current", lambda: type("P", (), {
        "measure_peak": staticmethod(lambda fn: (fn(), 4096))})())
    _FakeGraph.made = []
    rt = _FakeRt()
    rt.table[1] = _Shard()
    n = graphs.MIN_SEGMENT
    # the batch decoded into 1 in place (a blocker), then a chain of n capturable steps 1 -> 2 -> ...
    steps = (Step(2, (1, 1), (), ()),) + tuple(Step(1, (k, k + 1), (), ()) for k in range(1, n + 1))
    rep = graphs.Replayer(rt, Program(steps, (n + 1,)))
    assert rep.blockers == ["host_batch"] and not rep.capturable and rep.parts is not None
    assert len(rt.ran) == 0
    rep.replay()                                            # 1: step by step, the peak measured
    assert len(rt.ran) == n + 1 and rep.reserve == 4096 and not rep.captured
    out = rep.replay()                                      # 2: the blocker, then the capture
    assert rt.ran[-1] == (1, 1) and len(rt.ran) == n + 2 and len(_FakeGraph.made) == 1
    assert out[0] == (1, 1) and out[1:] == [None] * n and rep.captured
    assert _FakeGraph.made[0].reserve == 4096 and len(_FakeGraph.made[0].program.steps) == n
    rep.replay()                                            # 3: the blocker, then a launch
    assert len(rt.ran) == n + 3 and _FakeGraph.made[0].launches == 1
    assert rt.freed[-1] == (n + 1,)                         # the program's tail, every replay
    for k in range(graphs.MAX_RECAPTURES):                  # invalid captures are made again...
        _FakeGraph.made[-1].ok = False
        rep.replay()
        assert len(_FakeGraph.made) == 2 + k
    _FakeGraph.made[-1].ok = False                          # ... until there were too many
    before = len(rt.ran)
    rep.replay()
    assert len(_FakeGraph.made) == 1 + graphs.MAX_RECAPTURES and len(rt.ran) == before + n + 1
