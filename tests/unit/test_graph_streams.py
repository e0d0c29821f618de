"""The stream plan of a captured program (dmath/runtime/streams.py), checked against a brute-force oracle.

The oracle orders two steps when a path of stream order (consecutive steps on
one stream) and event waits leads from one to the other; every pair of steps
that touch a common handle, one of them writing it (and no free in between),
must be so ordered, and every communicating step must follow every earlier step.
"""
import random

import pytest

from dmath import settings
from dmath.runtime.streams import MemoryOrder, StepUse, plan


def conflicts(uses):
    """(j, i) for every earlier step j that step i must follow (read/write, write/read, write/write)."""
    out = set()
    for i, u in enumerate(uses):
        for j in range(i):
            v = uses[j]
            freed = set()
            for k in range(j + 1, i + 1):
                freed.update(uses[k].frees)
            shared = (set(v.writes) & (set(u.reads) | set(u.writes))) | (set(v.reads) & set(u.writes))
            if shared - freed:
                out.add((j, i))
    return out


def happens_before(p):
    """The transitive closure of stream order and waits: hb[i] = the steps that happen before step i."""
    hb = []
    last = {}
    for i, s in enumerate(p.stream):
        before = set()
        preds = list(p.waits[i]) + ([last[s]] if s in last else [])
        for j in preds:
            before.add(j)
            before |= hb[j]
        hb.append(before)
        last[s] = i
    return hb


def check(uses, p, max_streams):
    assert len(p.stream) == len(uses) == len(p.waits)
    assert 1 <= p.streams <= max_streams and all(0 <= s < p.streams for s in p.stream)
    hb = happens_before(p)
    for j, i in conflicts(uses):
        assert j in hb[i], f"step {i} does not follow step {j}"
    for i, u in enumerate(uses):
        for j in p.waits[i]:
            assert j < i and p.stream[j] != p.stream[i]
        if u.communicates:
            assert p.stream[i] == 0 and hb[i] == set(range(i)), f"collective {i} not after every earlier step"
    return hb


def inception(branches=4, lengths=(1, 2, 3, 2), modules=2):
    """Modules of `branches` chains from one input, joined by a concatenation (an Inception module)."""
    uses, h = [StepUse((), (1,))], 10
    x = 1
    for _ in range(modules):
        ends = []
        for b in range(branches):
            prev = x
            for _ in range(lengths[b % len(lengths)]):
                uses.append(StepUse((prev,), (h,)))
                prev, h = h, h + 1
            ends.append(prev)
        uses.append(StepUse(tuple(ends), (h,)))
        x, h = h, h + 1
    return uses


def test_independent_chains_get_their_own_streams():
    uses = inception(modules=1)
    p = plan(uses, 4)
    check(uses, p, 4)
    assert p.streams == 4
    # each branch on one stream, four branches on four streams, the concatenation on stream 0
    assert p.stream == (0, 0, 1, 1, 2, 2, 2, 3, 3, 0)
    # the three other branches wait for the input once each; the concatenation for three branches
    assert p.waits[2] == (0,) and p.waits[4] == (0,) and p.waits[7] == (0,)
    assert sorted(p.waits[-1]) == [3, 6, 8]
    # the branches are unordered among themselves: they may run side by side
    hb = happens_before(p)
    assert 1 not in hb[3] and 3 not in hb[6] and 6 not in hb[8]


def test_fewer_streams_than_branches_and_one_stream():
    uses = inception(modules=3)
    for n in (1, 2, 3, 8):
        p = plan(uses, n)
        check(uses, p, n)
        assert p.streams == min(n, 4)
    assert plan(uses, 1).waits == ((),) * len(uses)


def test_chains_of_modules_reuse_streams_without_extra_waits():
    uses = inception(modules=3)
    p = plan(uses, 4)
    check(uses, p, 4)
    # a later module's branches start on streams whose earlier work the concatenation already
    # waited for: only the wait on the module input per side branch, three on each concatenation
    assert sum(map(len, p.waits)) == 3 * (3 + 3)


def test_a_chain_stays_on_one_stream():
    uses = [StepUse((), (1,))] + [StepUse((k,), (k + 1,)) for k in range(1, 30)]
    p = plan(uses, 4)
    check(uses, p, 4)
    assert p.streams == 1 and p.waits == ((),) * len(uses)


def test_the_setting():
    assert settings.read({}).graph_streams == 4
    assert settings.read({"DMATH_GRAPH_STREAMS": "1"}).graph_streams == 1
    for bad in ("0", "9", "two", "-1"):
        with pytest.raises(settings.SettingError, match="DMATH_GRAPH_STREAMS"):
            settings.read({"DMATH_GRAPH_STREAMS": bad})


def test_write_after_read_is_ordered():
    # a reads w on one branch while b reads it on another; then w is updated in place
    uses = [StepUse((), (1,)),
            StepUse((1, 50), (2,)), StepUse((2,), (3,)),      # branch 1 reads w (50)
            StepUse((1,), (4,)), StepUse((4, 50), (5,)),      # branch 2 reads w later
            StepUse((50, 3), (50,)),                          # w updated in place from branch 1's result
            StepUse((5,), (6,))]
    p = plan(uses, 4)
    hb = check(uses, p, 4)
    assert 4 in hb[5] and 1 in hb[5]


def test_collectives_stay_on_the_capture_stream_after_everything():
    uses = inception(modules=1)
    uses.insert(5, StepUse((11,), (500,), communicates=True))    # an all-reduce in the middle of a branch
    uses.append(StepUse((), (501,), communicates=True))
    uses.append(StepUse((), (502,)))
    p = plan(uses, 4)
    check(uses, p, 4)
    comm = [i for i, u in enumerate(uses) if u.communicates]
    assert [p.stream[i] for i in comm] == [0, 0]


def test_frees_end_a_handles_dependencies():
    # handle 7 is freed and made again by an unrelated step: no order with its old readers needed
    uses = [StepUse((), (7,)), StepUse((7,), (8,)), StepUse((), (7,), frees=(7,)), StepUse((7,), (9,))]
    p = plan(uses, 2)
    hb = check(uses, p, 2)
    assert p.stream[2] != p.stream[1] and 1 not in hb[2]


def test_random_programs_are_ordered_and_deterministic():
    rng = random.Random(5)
    for trial in range(150):
        handles = list(range(12))
        uses = []
        for _ in range(rng.randrange(1, 40)):
            reads = tuple(rng.sample(handles, rng.randrange(0, 3)))
            writes = tuple(rng.sample(handles, rng.randrange(0, 3)))
            frees = tuple(rng.sample(handles, 1)) if rng.random() < 0.1 else ()
            uses.append(StepUse(reads, writes, frees, rng.random() < 0.05))
        n = rng.randrange(1, 6)
        p = plan(uses, n)
        check(uses, p, n)
        assert plan(list(uses), n) == p


def test_plan_argument_errors():
    with pytest.raises(ValueError, match="max_streams"):
        plan([], 0)
    assert plan([], 3).streams == 1


def test_memory_order_waits_for_other_streams_before_reuse():
    from dmath.runtime.streams import NOW
    order = MemoryOrder()
    assert order.allocated(100, 10, 1, 3) == ([], [])      # [100, 110) made on stream 1 by step 3
    order.accessed(100, 0, 5)           # read on stream 0 (step 5) and stream 2 (steps 6, 8)
    order.accessed(100, 2, 6)
    order.accessed(100, 2, 8)
    # freed; part of it taken by stream 1 at step 9: it waits for the last use on each other stream
    assert order.allocated(104, 4, 1, 9) == ([(0, 5), (2, 8)], [])
    # what is left of the old block keeps its uses; stream 1 waited for them already
    assert order.allocated(100, 4, 1, 10) == ([], [])
    # stream 2 takes the three ranges merged: it waits for stream 1's last use (step 10) and stream
    # 0's; its own stream's uses need no wait
    assert order.allocated(100, 10, 2, 11) == ([(0, 5), (1, 10)], [])
    # a block used on its own stream only needs nothing; one from outside the capture is not tracked
    assert order.allocated(200, 8, 2, 12) == ([], [])
    order.accessed(200, 2, 13)
    order.accessed(300, 3, 14)
    assert order.allocated(200, 8, 2, 15) == ([], [])
    assert order.allocated(300, 8, 1, 16) == ([], [])
    # a wait the plan issued covers later needs (stream 0's use), not the others (stream 1's)
    order.accessed(300, 0, 17)
    order.followed(3, 0, 18)
    assert order.allocated(300, 8, 3, 19) == ([(1, 16)], [])
    # side-stream work still using a block: whoever takes it waits for that work's events too
    order.add_events(300, ["e1", "e2"])
    order.add_events(300, ["e1"])
    assert order.allocated(296, 20, 3, 20) == ([], ["e1", "e2"])
    # a block allocated between steps: taken by another stream, it waits for that stream's position then
    assert order.allocated(400, 8, 0, NOW) == ([], [])
    assert order.allocated(400, 8, 1, 21) == ([(0, NOW)], [])
    assert order.starts == sorted(order.spans) and all(
        order.spans[a].end <= b for a, b in zip(order.starts, order.starts[1:]))


# ---- the capture on streams, with CUDA's streams and events replaced by a recording fake ----------
class _Log:
    def __init__(self):
        self.items, self.current = [], []


class _Event:
    def __init__(self, disable_timing=False):
        self.at = None          # (stream, position in its stream) once recorded


class _Stream:
    log = None
    count = 0

    def __init__(self, non_blocking=False):
        self.id, _Stream.count = _Stream.count, _Stream.count + 1
        self.done = 0           # work items issued on it

    def record(self, event):
        event.at = (self.id, self.done)

    def wait_event(self, event):
        self.log.items.append(("wait", self.id, event.at))

    def __enter__(self):
        self.log.current.append(self)

    def __exit__(self, *exc):
        self.log.current.pop()


class _Mem:
    def __init__(self, ptr):
        self.ptr = ptr


class _Piece:
    def __init__(self, ptr):
        self.data = type("Data", (), {"mem": _Mem(ptr)})()


class _Shard:
    def __init__(self, ptr):
        self.pieces = [_Piece(ptr)]


class _Entry:
    def __init__(self, n_in):
        self.inputs = [None] * n_in
        self.op = "fake"


class _Runtime:
    """Runs steps by logging (step, current stream); outputs get blocks 'allocated' first, from one
    free list (the last block freed is taken first, as a pool would), and the blocks each step
    touched are noted (log.touched, for `check_reuse`)."""

    def __init__(self, program, log):
        import types
        self.log, self.table, self.entries, self.capture = log, {}, {}, None
        self.backend = types.SimpleNamespace(xp=types.SimpleNamespace(
            cuda=types.SimpleNamespace(Stream=_Stream, Event=_Event)))
        self.next_ptr = 1000
        self.free_ptrs = []
        log.touched = {}
        for step in program.steps:
            self.entries.setdefault(step.sig_id, _Entry(step.sig_id))

    def _execute(self, entry, ins, outs, scalars):
        stream = self.log.current[-1]
        replaced, made = [], []
        for h in outs:
            if h not in ins:
                if self.free_ptrs:
                    ptr = self.free_ptrs.pop()
                else:
                    self.next_ptr += 1
                    ptr = self.next_ptr
                self.capture.allocated(ptr, 1)      # (its waits are issued before the kernel)
                old = self.table.get(h)
                if old is not None:
                    replaced.append(old.pieces[0].data.mem.ptr)
                self.table[h] = _Shard(ptr)
                made.append(ptr)
        stream.done += 1
        touched = [self.table[h].pieces[0].data.mem.ptr for h in list(ins) + list(outs)]
        self.log.touched[len(self.log.items)] = (touched, made)
        self.log.items.append(("run", stream.id, tuple(ins), tuple(outs)))
        self.free_ptrs += replaced          # (dropped after the step, as the capture's `found`)

    def _free(self, handles):
        for h in handles:
            shard = self.table.pop(h, None)
            if shard is not None:
                self.free_ptrs.append(shard.pieces[0].data.mem.ptr)
            self.log.items.append(("free", h))


def check_reuse(log):
    """Every step that takes a block must follow, through stream order and waits, every earlier use
    of that memory on any other stream (side-stream work included): vector clocks over the log."""
    clock, hist, uses, checked = {}, {}, {}, 0
    for k, item in enumerate(log.items):
        if item[0] == "wait":
            _, sid, (other, pos) = item
            c = clock.setdefault(sid, {})
            for s, v in hist.get(other, [{}])[pos].items():
                c[s] = max(c.get(s, 0), v)
        elif item[0] in ("run", "side"):
            sid = item[1]
            c = clock.setdefault(sid, {})
            touched, made = log.touched[k]
            for ptr in made:
                for s, pos in uses.get(ptr, ()):
                    assert s == sid or c.get(s, 0) >= pos, \
                        f"item {k} on stream {sid} takes block {ptr} before use {pos} on stream {s} is done"
                    checked += 1
            h = hist.setdefault(sid, [{}])
            c[sid] = len(h)
            h.append(dict(c))
            for ptr in touched:
                uses.setdefault(ptr, []).append((sid, c[sid]))
    return checked


def test_the_capture_follows_the_plan_orders_frees_and_joins_every_stream():
    import types

    from dmath.runtime.protocol import Program, Step
    from dmath.runtime.streams import Capture, plan
    log = _Log()
    _Stream.log = log
    # input 1 -> three branches (2; 3 -> 4; 5) -> concatenation 6, which frees the branch outputs
    # (sig_id = number of inputs, for the fake entries)
    steps = (Step(0, (1,), (), ()), Step(1, (1, 2), (), ()), Step(1, (1, 3), (), ()), Step(1, (3, 4), (), ()),
             Step(1, (1, 5), (), ()), Step(3, (2, 4, 5, 6), (), ()), Step(1, (6, 7), (), (2, 3, 4, 5)),
             Step(1, (1, 8), (), ()), Step(1, (1, 9), (), ()))
    program = Program(steps, (6,))
    uses = [StepUse(s.handles[:s.sig_id], s.handles[s.sig_id:], s.frees) for s in steps]
    splan = plan(uses, 4)
    assert splan.stream == (0, 0, 1, 1, 2, 0, 0, 3, 1)
    rt = _Runtime(program, log)
    main = _Stream()
    owner = types.SimpleNamespace(capture_lane=0)
    with main:
        cap = rt.capture = Capture(rt, program, splan, main, owner)
        cap.run()
    lanes = [lane.id for lane in cap.lanes]
    runs = [item for item in log.items if item[0] == "run"]
    assert [lanes.index(r[1]) for r in runs] == list(splan.stream)
    # the side streams start after the capture stream's fork point, and join it at the end
    waits = [item for item in log.items if item[0] == "wait"]
    assert waits[0][1] == lanes[1] and waits[1][1] == lanes[2] and waits[0][2] == (lanes[0], 0)
    assert {w[2][0] for w in waits[-3:]} == set(lanes[1:]) and all(w[1] == lanes[0] for w in waits[-3:])
    # the branch outputs were freed. Step 7 (stream 3) takes the block of 4 (made on stream 1, read by
    # the concatenation, stream 0's third step) and waits for both first; step 8 (stream 1) takes the
    # block of 3, which only stream 1 used: no wait
    run7 = log.items.index(("run", lanes[3], (1,), (8,)))
    assert {("wait", lanes[3], (lanes[0], 3)), ("wait", lanes[3], (lanes[1], 2))} <= set(log.items[:run7])
    run8 = log.items.index(("run", lanes[1], (1,), (9,)))
    assert log.items[run7 + 1:run8] == []
    assert check_reuse(log) > 0
    assert owner.capture_lane == 0


def test_cudnn_keeps_one_workspace_per_stream(monkeypatch):
    """Convolutions on different streams of a capture may run at once: each stream has its workspace."""
    import types

    import numpy as np

    from dmath.gpu import cudnn
    monkeypatch.setattr(cudnn, "_state", {})
    monkeypatch.setattr(cudnn, "memory", types.SimpleNamespace(empty=np.empty))
    main = cudnn.shared_workspace(100)
    side = cudnn.shared_workspace(50, lane=2)
    assert side is not main and side.size == 50
    assert cudnn.shared_workspace(80) is main and cudnn.shared_workspace(40, lane=2) is side
    grown = cudnn.shared_workspace(200, lane=2)
    assert grown.size == 200 and cudnn.shared_workspace(10) is main
    assert cudnn.workspace_bytes() == 300
    cudnn.release_workspace()
    assert cudnn.workspace_bytes() == 0


def test_cudnn_side_workspaces_are_made_before_the_capture(monkeypatch):
    """A side stream's workspace allocated inside the first capture shared memory with the graph's other
    buffers (GoogLeNet's losses differed on that capture only): the capture hook makes one per stream
    of the capture beforehand, as large as the shared workspace; a capture then finds them and
    allocates none. A capture on one stream (a chain's plan) makes none."""
    import types

    import numpy as np

    from dmath.gpu import cudnn
    from dmath.runtime import registry
    monkeypatch.setattr(cudnn, "_state", {})
    made = []
    monkeypatch.setattr(cudnn, "memory", types.SimpleNamespace(empty=lambda *a: made.append(a) or np.empty(*a)))
    assert cudnn.prepare_lanes in registry.CAPTURE_HOOKS          # registered by dmath.ops.nn.conv
    cudnn.prepare_lanes(3)
    assert made == []                      # no convolution recorded yet: nothing to size them by
    cudnn.shared_workspace(100)
    cudnn.prepare_lanes(3)
    lanes = [cudnn._state[("lane", k)] for k in (1, 2)]
    assert [w.size for w in lanes] == [100, 100] and ("lane", 3) not in cudnn._state
    made.clear()
    cudnn.prepare_lanes(3)                 # idempotent
    assert made == [] and [cudnn.shared_workspace(60, lane=k) for k in (1, 2)] == lanes
    monkeypatch.setattr(cudnn, "_state", {"workspace": np.empty(10)})
    cudnn.prepare_lanes(1)
    assert list(cudnn._state) == ["workspace"]


def test_an_output_given_a_new_shard_orders_the_old_blocks_reuse():
    import types

    from dmath.runtime.protocol import Program, Step
    from dmath.runtime.streams import Capture, plan
    log = _Log()
    _Stream.log = log
    # 2 <- 1 on stream 0; 3 <- 1 on stream 1 (allocated there), read by step 3 on stream 0 (4 <- 2, 3);
    # then step 4 writes handle 3 anew from 4 (a new shard: the old block goes back to stream 1)
    steps = (Step(0, (1,), (), ()), Step(1, (1, 2), (), ()), Step(1, (1, 3), (), ()), Step(2, (2, 3, 4), (), ()),
             Step(1, (4, 3), (), ()), Step(1, (1, 5), (), ()))
    program = Program(steps, ())
    splan = plan([StepUse(s.handles[:s.sig_id], s.handles[s.sig_id:]) for s in steps], 2)
    assert splan.stream[2] == 1 and splan.stream[3] == 0 and splan.stream[4] == 0
    rt = _Runtime(program, log)
    main = _Stream()
    with main:
        cap = rt.capture = Capture(rt, program, splan, main, types.SimpleNamespace(capture_lane=0))
        cap.run()
    lanes = [lane.id for lane in cap.lanes]
    run4 = log.items.index(("run", lanes[0], (4,), (3,)))
    # after step 4 and before stream 1 runs anything more, stream 1 waits for step 3 (main's third)
    later = log.items[run4 + 1:]
    first_side_run = next(k for k, item in enumerate(later) if item[0] == "run" and item[1] == lanes[1])
    assert ("wait", lanes[1], (lanes[0], 3)) in later[:first_side_run]


def test_what_communicates_is_measured_except_where_a_capture_may_talk_more():
    import types

    from dmath.runtime.protocol import Program, Step
    from dmath.runtime.streams import uses_of

    def entry(op, local):
        return types.SimpleNamespace(op=op, inputs=[None], local_rule=local)
    rt = types.SimpleNamespace(entries={0: entry("ewise", True), 1: entry("nn_batchnorm", False),
                                        2: entry("gemm", False), 3: entry("gemm", True)})
    program = Program(tuple(Step(k, (10 + k, 20 + k), (), ()) for k in range(4)), ())
    # unmeasured: whatever is not local may communicate
    assert [u.communicates for u in uses_of(rt, program)] == [False, True, True, False]
    # measured on this rank: what talked; a GEMM that is not local may talk in a capture (no replica cache)
    assert [u.communicates for u in uses_of(rt, program, [False, False, False, False])] == [False, False, True, False]
    assert [u.communicates for u in uses_of(rt, program, [False, True, False, False])] == [False, True, True, False]
    assert uses_of(rt, program)[1] == StepUse((11,), (21,), (), True)


class _Pending:
    """collectives.Pending on the GPU: wait() makes the current stream wait for the side stream's
    event, once (the event is consumed, as the real one does)."""

    def __init__(self, event):
        self.event = event

    def wait(self):
        if self.event is not None:
            event, self.event = self.event, None
            _Stream.log.current[-1].wait_event(event)


class _SidedRuntime(_Runtime):
    """A fake runtime whose steps in `background` leave their outputs written by side-stream work (a
    bucketed all-reduce: one Pending shared by every output), settled as Execution._execute does."""

    def __init__(self, program, log, background):
        super().__init__(program, log)
        self.background, self.side = background, _Stream()

    def _execute(self, entry, ins, outs, scalars):
        for h in ins:
            shard = self.table[h]
            pending, shard.pending = getattr(shard, "pending", None), None
            for p in pending or ():
                p.wait()
        super()._execute(entry, ins, outs, scalars)
        if tuple(outs) in self.background:
            # the all-reduce reads the inputs' blocks and writes the outputs' on the side stream
            self.side.done += 1
            touched = [self.table[h].pieces[0].data.mem.ptr for h in list(ins) + list(outs)]
            self.log.touched[len(self.log.items)] = (touched, [])
            self.log.items.append(("side", self.side.id))
            event = _Event()
            self.side.record(event)
            shared = _Pending(event)
            for h in outs:
                self.table[h].pending = [shared]


def _capture_sided(steps, tail, talks, background):
    """Capture fake `steps` (sig_id = number of inputs) on up to 4 streams, step `talks` communicating and
    the steps whose outputs are in `background` leaving them to the side stream; (log, plan, lane ids,
    the side stream's event)."""
    import types

    from dmath.runtime.protocol import Program
    from dmath.runtime.streams import Capture, plan
    log = _Log()
    _Stream.log = log
    program = Program(steps, tail)
    uses = [StepUse(s.handles[:s.sig_id], s.handles[s.sig_id:], s.frees, communicates=k == talks)
            for k, s in enumerate(steps)]
    splan = plan(uses, 4)
    rt = _SidedRuntime(program, log, background)
    main = _Stream()
    with main:
        cap = rt.capture = Capture(rt, program, splan, main, types.SimpleNamespace(capture_lane=0))
        cap.run()
    return log, splan, [lane.id for lane in cap.lanes], (rt.side.id, 1)


def test_every_stream_that_reads_a_background_sum_waits_for_the_side_stream():
    from dmath.runtime.protocol import Step
    # 1 -> an all-reduce on the capture stream that leaves 2 and 3 to the side stream (one Pending), then
    # 2 and 3 read on two streams (4 <- 2, 5 <- 3, the optimizer's updates of two weights), joined in 6
    steps = (Step(0, (1,), (), ()), Step(1, (1, 2, 3), (), ()), Step(1, (2, 4), (), ()), Step(1, (3, 5), (), ()),
             Step(2, (4, 5, 6), (), ()), Step(1, (6, 7), (), (2, 3)))
    log, splan, lanes, side_event = _capture_sided(steps, (4, 5, 6, 7), 1, {(2, 3)})
    assert splan.stream[1] == 0 and splan.stream[2] != splan.stream[3]
    for k in (2, 3):
        # the stream of each reader waits for the side stream before it runs the reader
        lane = lanes[splan.stream[k]]
        run = log.items.index(("run", lane, steps[k].handles[:1], steps[k].handles[1:]))
        assert ("wait", lane, side_event) in log.items[:run], f"step {k} on stream {lane} reads before the sum"
    # the sums' blocks go back to the capture stream's free list after it waited for the side stream too
    at_free = log.items.index(("free", 2))
    assert ("wait", lanes[0], side_event) in log.items[:at_free]


def test_an_input_the_side_stream_reads_is_not_reused_before_it_is_done():
    """A background all-reduce sends from its Partial input's buffer (collectives.allreduce_start's
    src): when that input, made on another stream, is freed, the stream that takes its block next
    waits for the side stream (a race found by reading; without the wait this test fails)."""
    from dmath.runtime.protocol import Step
    # 1 -> 10 (stream 0) and 1 -> 2 (a gradient, on a side stream); 2 summed in the background into 3 on
    # the capture stream; 3 -> 4 (the update); 10, 4 -> 5, which frees 2
    steps = (Step(0, (1,), (), ()), Step(1, (1, 10), (), ()), Step(1, (1, 2), (), ()), Step(1, (2, 3), (), ()),
             Step(1, (3, 4), (), ()), Step(2, (10, 4, 5), (), (2,)))
    log, splan, lanes, side_event = _capture_sided(steps, (3, 4, 5, 10), 3, {(3,)})
    assert splan.stream[2] != 0 and splan.stream[3] == 0
    # the last step takes the block of 2 for its output: its stream waits for the side stream first
    lane = lanes[splan.stream[5]]
    run = log.items.index(("run", lane, (10, 4), (5,)))
    assert ("wait", lane, side_event) in log.items[:run], log.items
    assert check_reuse(log) > 0


def test_random_captures_take_freed_blocks_only_after_their_uses():
    """Random branchy programs with frees (their blocks reused by whichever stream allocates next) and
    background sums: every block taken is ordered after its earlier uses on other streams."""
    from dmath.runtime.protocol import Step
    rng = random.Random(11)
    checked = 0
    for trial in range(60):
        steps, live, h = [Step(0, (1,), (), ())], [1], 2
        for _ in range(rng.randrange(4, 30)):
            ins = tuple(rng.sample(live, min(len(live), rng.randrange(1, 3))))
            steps.append(Step(len(ins), ins + (h,), (), ()))
            live.append(h)
            h += 1
        # free each handle (but the input) a random number of steps after its last use
        last = {}
        for k, st in enumerate(steps):
            for x in st.handles:
                last[x] = k
        frees = {}
        for x, k in last.items():
            at = k + 1 + rng.randrange(0, 3)
            if x != 1 and at < len(steps):
                frees.setdefault(at, []).append(x)
        steps = tuple(st._replace(frees=tuple(frees.get(k, ()))) for k, st in enumerate(steps))
        freed = {x for xs in frees.values() for x in xs}
        tail = tuple(x for x in range(1, h) if x not in freed)
        background = {st.handles[st.sig_id:] for st in steps[1:] if rng.random() < 0.2}
        talks = rng.randrange(1, len(steps))
        log, _, _, _ = _capture_sided(steps, tail, talks, background)
        checked += check_reuse(log)
    assert checked > 200


def test_a_gone_graphs_pool_lives_while_its_blocks_are_in_use():
    """A captured graph's pool outlives the graph while arrays still use its blocks (its outputs in the
    handle table, a workspace kept for later captures): CuPy's pooled memory refers to its pool weakly,
    and a pool that goes frees every block, in use or not. Once none is in use the pool goes."""
    import gc
    import types
    import weakref

    from dmath.memory.pool import CudaPool

    class Pool:
        def __init__(self):
            self.used, self.freed = 0, 0

        def used_bytes(self):
            return self.used

        def total_bytes(self):
            return self.used

        def free_all_blocks(self):
            self.freed += 1

    cuda = types.SimpleNamespace(MemoryPool=Pool, PinnedMemoryPool=Pool, set_allocator=lambda f: None,
                                 set_pinned_memory_allocator=lambda f: None)
    pool = CudaPool(types.SimpleNamespace(cuda=cuda, ndarray=None))
    graph_pool = Pool()
    graph_pool.used = 4096                  # an output of the graph, still in the handle table
    gone = weakref.ref(graph_pool)

    class Owner:                            # the CapturedProgram
        pass
    owner = Owner()
    pool.hold_graph_pool(owner, graph_pool, 4096)
    del owner, graph_pool                   # the graph goes: nothing here holds its pool
    gc.collect()
    assert pool.graph_pools == {}           # no longer counted as a live graph's ...
    pool.release_cached()
    assert gone() is not None and gone().freed == 1     # ... but alive, its free blocks released
    gone().used = 0                         # the output was freed
    pool.release_cached()
    assert gone() is None
