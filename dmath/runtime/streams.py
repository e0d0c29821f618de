"""Independent steps of a captured program on their own CUDA streams: the plan, and the capture that follows it.

A recorded program replays as one CUDA graph per worker (graphs.py). Captured
from one stream, the graph is a chain: an Inception module's four branches of
small kernels run one after another although none reads what another writes.
Captured from several streams forked from the capture stream, the graph has
parallel branches and the GPU runs them side by side. `DMATH_GRAPH_STREAMS=N`
(default 4; 1: one stream, a chain) allows up to N streams. The default is 4
since the streams share one free list (below): with a free list per stream a
graph on 4 streams held up to 1.7x the memory; with one it holds one stream's
(GoogLeNet, Inception v3 and ResNet-50 at batch 1024 on one H200: the same
peak allocated, reserved within 2%), and runs GoogLeNet 1.02x and 1.016x (1
and 2 H200s), Inception v3 1.01x, ResNet-50 1.00x (session 36).

The plan (`plan`, pure: handles in, streams and waits out; tested without a
GPU) follows the data:
- a step depends on the last writer of every handle it reads or writes
  (read-after-write, write-after-write) and on the readers since that write of
  every handle it writes (write-after-read: an in-place update must not
  overwrite what a step on another stream has yet to read);
- a step continues the stream of a dependency that is that stream's last step
  (a chain stays on one stream); else it takes a stream whose work it already
  follows, lowest number first; else the stream whose last step is the oldest;
- it waits (a CUDA event) for each dependency on another stream that it does
  not already follow through an earlier wait or its own stream (vector clocks
  of the steps decide that), newest first;
- a step that communicates runs on the capture stream after every other
  stream's last step, so this rank issues its collectives (NCCL on the
  compute stream) on one stream, in program order, as without streams. Which
  steps communicate is measured on the plan's first replay, which runs step
  by step before any capture (`traffic_mark` around each step): a command's
  communication depends on its signature, except where a replica-cache hit
  skips a remap that a capture makes (CACHED_TALK: planned as talking). The
  measure is per rank, and that suffices: what NCCL needs is that each rank
  issues its own collectives on one stream in one order. A step that talks on
  a side stream anyway stops the capture with an error instead of risking a
  hang;
- at the end every stream joins the capture stream.
The streams change only the order of kernels on one GPU, never a result. Checked
on H100s in float64 (where a run repeats its bits): GoogLeNet and an
Inception-like model at one GPU, the gradient-bucket model at two (every
gradient summed alone, and in 25 MB buckets) give one stream's weights
exactly on 4 streams (benchmarks/probes/streams_bisect.py), and the GPU tests
of the setting pass at 1 and 2 GPUs. Two causes of earlier differences were
found and fixed: a side stream's cuDNN workspace made inside the first
capture (now made before it), and the inputs of a step that leaves
side-stream work (a background all-reduce sends from its Partial input's
buffer) going back to a free list before that work had read them.

Memory. CuPy's pool keeps a free list per stream: a block freed by one stream
would be taken again only by that stream, so a capture on four streams held
up to four streams' worth of free blocks (Inception v3 at batch 1024 on one
H100: 69 GB in the graph's pool against ~41 GB on one stream, out of memory).
So the capture's allocator takes every block from the capture stream's free
list (graphs.py; DMATH_GRAPH_STREAMS_MEMORY=shared, the default), whichever
stream asks, and a block freed by one stream may serve the next allocation of
another. That is safe once the taking stream
waits for every other stream's last use of the memory it gets: `MemoryOrder`
keeps, per address range of the capture's pool, the last step of each stream
that used it (the step that allocated it, and every step that read or wrote
a shard living in it); an allocation overlapping ranges of earlier blocks
(freed since: the pool gives out free memory only, split or merged) returns
those steps, and the taking stream waits for their events before the kernel
that writes the new block. Views are covered because uses are noted per
allocated block, whatever handle reached it. Temporaries a kernel allocates
and frees inside one step count as used by that step on its stream. The
waits make branches that reuse each other's memory partly ordered: the
price of a graph about one stream's size. With `own` each stream allocates
from its own list (CuPy's way): the same waits keep a block a stream takes
back after the other streams' uses of it, but no stream takes another's
memory, so branches never wait for each other's blocks, for more memory. Caches a kernel fills from its
signature are filled by the recording run, before any capture. The
libraries' shared scratch buffers are one per stream ("lane") during such a
capture: cuBLAS's capture workspaces (dmath.gpu.blas) and cuDNN's workspace
(dmath.gpu.cudnn), so that two concurrent library calls never share one.
Side-stream work a step leaves running (a background all-reduce) counts as a
use of the step's outputs and of its inputs (it may send from an input's
buffer): every later step that uses them waits for it, and so does the
stream that next takes their memory.

Step-by-step runs (the first replay, every replay off the GPU or out of a
graph) are unchanged.
"""
import bisect
from typing import NamedTuple

from .. import settings
from ..comm import counters
from ..comm.world import NCCL_USES
from .registry import is_local


def streams_allowed():
    """The most streams a captured program may use (DMATH_GRAPH_STREAMS; 1: the capture stream only)."""
    return settings.current.graph_streams


class StepUse(NamedTuple):
    """What a planned step touches: the handles it reads and writes (in-place ones in both), the
    handles freed before it, and whether it may communicate (then it is serialised on stream 0)."""
    reads: tuple
    writes: tuple
    frees: tuple = ()
    communicates: bool = False


class StreamPlan(NamedTuple):
    """Per step, its stream (0: the capture stream) and the steps on other streams it waits for."""
    streams: int            # how many streams the plan uses (1: none besides the capture stream)
    stream: tuple           # per step: its stream
    waits: tuple            # per step: indices of earlier steps on other streams whose end it waits for

    def describe(self):
        """A short account: steps per stream and the number of waits."""
        counts = [self.stream.count(s) for s in range(self.streams)]
        return f"{len(self.stream)} steps on {self.streams} stream(s) {counts}, {sum(map(len, self.waits))} waits"


def plan(uses, max_streams):
    """The StreamPlan of steps `uses` (a sequence of StepUse) on at most `max_streams` streams (pure).

    Deterministic: the same uses give the same plan. See the module docstring for the rules.
    """
    if not isinstance(max_streams, int) or max_streams < 1:
        raise ValueError(f"max_streams must be a whole number >= 1, got {max_streams!r}")
    n = max_streams
    writer, readers = {}, {}        # handle -> its last writer; handle -> steps that read it since
    clocks = []                     # per step: per stream, the newest step there that happens before it
    stream_of = []
    tail = [-1] * n                 # per stream: its last step (-1: none yet)
    tail_clock = [[-1] * n for _ in range(n)]
    waits_all = []
    for i, use in enumerate(uses):
        for h in use.frees:
            writer.pop(h, None)
            readers.pop(h, None)
        deps = set()
        for h in use.reads:
            if h in writer:
                deps.add(writer[h])
        for h in use.writes:
            if h in writer:
                deps.add(writer[h])
            deps.update(readers.get(h, ()))
        deps.discard(i)
        known = [-1] * n            # what the step follows through its dependencies alone
        for j in deps:
            known = [max(a, b) for a, b in zip(known, clocks[j])]
        if use.communicates:
            s = 0
            deps.update(t for t in tail if t >= 0)
        else:
            s = _choose(deps, tail, known, n)
        clock = list(tail_clock[s])
        waits = []
        for j in sorted(deps, reverse=True):
            t = stream_of[j]
            if t == s or clock[t] >= j:
                continue            # already ordered: own stream, or through an earlier wait
            waits.append(j)
            clock = [max(a, b) for a, b in zip(clock, clocks[j])]
        clock[s] = i
        clocks.append(clock)
        stream_of.append(s)
        tail[s] = i
        tail_clock[s] = clock
        waits_all.append(tuple(waits))
        for h in use.reads:
            readers.setdefault(h, set()).add(i)
        for h in use.writes:
            writer[h] = i
            readers[h] = set()
    used = max(stream_of, default=0) + 1
    return StreamPlan(used, tuple(stream_of), tuple(waits_all))


def _choose(deps, tail, known, n):
    # continue a chain: a dependency that is its stream's last step
    for s in range(n):
        if tail[s] >= 0 and tail[s] in deps:
            return s
    # a stream whose work the step follows already (or an unused one): no new ordering
    for s in range(n):
        if tail[s] <= known[s]:
            return s
    # every stream is busy with unrelated work: the one that has been so the longest
    return min(range(n), key=lambda s: (tail[s], s))


#: operations whose commands may skip their communication in a step-by-step run (a replica-cache hit
#: for a remapped GEMM operand) but not in a capture, which bypasses the cache: unless local, they
#: are planned as communicating whatever the measured run saw
CACHED_TALK = frozenset({"gemm"})


def traffic_mark():
    """A value that changes whenever this process communicates (messages counted, or an NCCL
    communicator taken): compared around a step, it tells whether the step talked on this rank."""
    c = counters.counters
    return c["data_msgs_sent"], c["data_msgs_recv"], NCCL_USES[0]


def uses_of(rt, program, talked=None):
    """The StepUse of each step of a recorded program.

    talked: per step, whether a step-by-step run of it communicated on this rank (`traffic_mark`);
    None: every step that is not `registry.is_local` counts as communicating. A step that is
    local never communicates; one of CACHED_TALK that is not local always may.
    """
    uses = []
    for i, step in enumerate(program.steps):
        entry = rt.entries[step.sig_id]
        k = len(entry.inputs)
        local = is_local(entry)
        if talked is None:
            talks = not local
        else:
            talks = talked[i] or (not local and entry.op in CACHED_TALK)
        uses.append(StepUse(tuple(step.handles[:k]), tuple(step.handles[k:]), tuple(step.frees), talks))
    return uses


#: [limit]: steps from index `limit` of a program on are planned on the capture stream after every
#: other stream's last step, as if they communicated (None: no limit). A bisection aid: the first
#: limit at which a program's result departs from one stream's names the step whose placement on a
#: side stream breaks it (benchmarks/probes/streams_bisect.py sets it on every rank)
SIDE_LIMIT = [None]


def plan_program(rt, program, talked=None):
    """The StreamPlan of a recorded program under DMATH_GRAPH_STREAMS (`uses_of` says what
    `talked` is), or None when the setting allows one stream."""
    n = streams_allowed()
    if n <= 1 or not program.steps:
        return None
    uses = uses_of(rt, program, talked)
    limit = SIDE_LIMIT[0]
    if limit is not None:
        uses = [u if i < limit else u._replace(communicates=True) for i, u in enumerate(uses)]
    return plan(uses, n)


def blocks(shard):
    """The allocation addresses of the device blocks a shard's pieces live in (views share their
    base's); nothing for host arrays or empty pieces."""
    out = []
    if getattr(shard, "home", None) is not None:
        return out                  # held in host memory (never in a capture): no device block of its own
    for a in shard.pieces:
        data = getattr(a, "data", None)
        mem = getattr(data, "mem", None)
        ptr = getattr(mem, "ptr", 0)
        if ptr:
            out.append(ptr)
    return out


class Span(NamedTuple):
    """A byte range of the capture's pool up to `end`, the last step of each stream that used it
    ({lane: step}; NOW: that stream's position when the range is next taken), and side-stream
    events still using it."""
    end: int
    uses: dict
    events: tuple = ()


#: a use on a stream outside any step (an allocation between steps): ordered by an event recorded on
#: that stream when the range is taken again
NOW = float("inf")


class MemoryOrder:
    """Which earlier steps an allocation inside a capture on several streams must wait for (pure
    bookkeeping of address ranges).

    Every block of the capture comes from one free list (the capture stream's), so a block one
    stream freed may be taken by another. `allocated(ptr, size, lane, step)` is told of every new
    block; the ranges of earlier blocks it overlaps were freed since (the pool gives out free memory
    only), and the new block's stream must wait for every other stream's last use of them. It
    returns those waits, [(other lane, step)], less the ones an earlier wait of that lane covers, and
    the side-stream events still using the ranges. `accessed(ptr, lane, step)` notes a step's use of
    the block allocated at `ptr` (blocks from outside the capture are never reused inside it: not
    tracked); `add_events(ptr, events)` notes side-stream work still using it; `followed(lane, other,
    step)` notes a wait the plan issued.
    """

    def __init__(self):
        self.starts = []        # sorted starts of the spans (disjoint)
        self.spans = {}         # start -> Span
        self.waited = {}        # (lane, other lane) -> newest step of the other lane already waited for

    def allocated(self, ptr, size, lane, step):
        starts, spans = self.starts, self.spans
        end = ptr + max(int(size), 1)
        lo = bisect.bisect_right(starts, ptr) - 1
        if lo < 0 or spans[starts[lo]].end <= ptr:
            lo += 1
        hi = bisect.bisect_left(starts, end)
        need, events, kept = {}, [], []
        for s in starts[lo:hi]:
            span = spans.pop(s)
            for other, t in span.uses.items():
                if other != lane and t > need.get(other, -1):
                    need[other] = t
            events += [e for e in span.events if not any(e is x for x in events)]
            if s < ptr:                 # what the new block leaves of a range keeps its uses
                spans[s] = Span(ptr, span.uses, span.events)
                kept.append(s)
            if span.end > end:
                spans[end] = Span(span.end, dict(span.uses), span.events)
                kept.append(end)
        spans[ptr] = Span(end, {lane: step})
        starts[lo:hi] = sorted(kept + [ptr])
        waits = []
        for other, t in sorted(need.items()):
            if t != NOW:
                if self.waited.get((lane, other), -1) >= t:
                    continue
                self.waited[(lane, other)] = t
            waits.append((other, t))
        return waits, events

    def accessed(self, ptr, lane, step):
        span = self.spans.get(ptr)
        if span is not None:
            span.uses[lane] = step      # (steps come in order: the newest is the last)

    def add_events(self, ptr, events):
        span = self.spans.get(ptr)
        if span is not None and events:
            self.spans[ptr] = span._replace(events=span.events + tuple(
                e for e in events if not any(e is x for x in span.events)))

    def followed(self, lane, other, step):
        if self.waited.get((lane, other), -1) < step:
            self.waited[(lane, other)] = step


class Capture:
    """Runs a program's steps on the streams of its StreamPlan while the capture stream is captured.

    Made by graphs.CapturedProgram before the capture begins; `run()`, inside it, forks the side
    streams from the capture stream, runs each step with its stream current (CuPy's kernels and
    allocations, cuBLAS and cuDNN follow the current stream), waits for the plan's events, orders
    the reuse of dropped blocks (`MemoryOrder`), and joins every stream back into the capture
    stream at the end.
    """

    def __init__(self, rt, program, splan, main, owner):
        self.rt, self.program, self.plan = rt, program, splan
        xp = rt.backend.xp
        self.lanes = [main] + [xp.cuda.Stream(non_blocking=True) for _ in range(splan.streams - 1)]
        self.owner = owner          # the memory pool: its capture_lane tells the allocator the stream
        self.order = MemoryOrder()
        self.events = [None] * len(program.steps)
        self._event = xp.cuda.Event
        # side-stream work a step left running (a background all-reduce: Shard.pending) per shard it
        # writes, or reads (the all-reduce may send from an input): id(shard) -> (shard, its events).
        # Every stream that uses the shard waits for them: the runtime's settle waits on the current
        # stream only, once for all the shards that share a Pending (it consumes the event), which
        # orders one stream of several, not every reader's
        self.side = {}
        self.side_waited = {}       # (lane, id(event)) -> event: waits issued (the event kept alive)
        self.step = None            # the step being issued (None: between steps)

    def _mark(self, lane):
        # (no timing: an event the graph's edges are made of, nothing reads its time)
        event = self._event(disable_timing=True)
        lane.record(event)
        return event

    def allocated(self, ptr, size):
        """The capture's allocator gave out the block [ptr, ptr + size) to the current lane (from the
        capture stream's free list, whatever the lane): that lane waits for the last use, on every
        other stream, of what was there before (`MemoryOrder`)."""
        lane = self.owner.capture_lane
        step = NOW if self.step is None else self.step
        waits, events = self.order.allocated(ptr, size, lane, step)
        target = self.lanes[lane]
        for other, t in waits:
            target.wait_event(self._mark(self.lanes[other]) if t == NOW else self.events[t])
        if events:
            self._wait_side(lane, events)

    def run(self):
        """Issue the program on the plan's streams; every side stream is joined back at the end."""
        rt, lanes, owner = self.rt, self.lanes, self.owner
        fork = self._mark(lanes[0])
        for lane in lanes[1:]:
            lane.wait_event(fork)
        events, table = self.events, rt.table
        try:
            for i, step in enumerate(self.program.steps):
                self.free(step.frees)
                s = self.plan.stream[i]
                lane = lanes[s]
                for j in self.plan.waits[i]:
                    lane.wait_event(events[j])
                    self.order.followed(s, self.plan.stream[j], j)
                entry = rt.entries[step.sig_id]
                k = len(entry.inputs)
                # the shards the step finds: what it reads, and what its outputs held before (an output
                # given a new shard drops the old one, held here until its blocks are ordered below)
                found = {h: table.get(h) for h in step.handles}
                for h in step.handles[:k]:
                    side = self.side.get(id(found[h]))
                    if side is not None:
                        self._wait_side(s, side[1])
                owner.capture_lane, self.step = s, i
                mark = traffic_mark()
                if s:
                    with lane:
                        rt._execute(entry, step.handles[:k], step.handles[k:], step.scalars)
                else:                   # the capture stream is current already (not entered twice)
                    rt._execute(entry, step.handles[:k], step.handles[k:], step.scalars)
                events[i] = self._mark(lane)
                owner.capture_lane, self.step = 0, None
                if s and traffic_mark() != mark:
                    # a collective on a side stream could meet the other ranks' in another order: the
                    # capture is refused rather than risk a hang (the plan said this step does not talk)
                    raise RuntimeError(f"step {i} ({entry.op!r}) communicated on side stream {s} of a "
                                       "capture; DMATH_GRAPH_STREAMS=1 avoids it")
                for h in step.handles[:k]:
                    self._accessed(found[h], s, i)
                left = []                               # side-stream work the step left running
                for h in step.handles[k:]:
                    shard = table.get(h)
                    self._accessed(shard, s, i)
                    left += self._note_side(shard)
                    before = found[h]
                    if before is not None and before is not shard:
                        self._release(before)           # replaced: released when `found` goes
                if left:
                    # that work may read the step's inputs as well: a background all-reduce sends
                    # straight from a Partial input's buffer (collectives.allreduce_start's src). So the
                    # reuse of an input's blocks (by the stream that allocated them, maybe not this
                    # one) and every later step that uses the input wait for it too
                    for h in step.handles[:k]:
                        self._add_side(found[h], left)
                del found
            self.free(self.program.tail)
        finally:
            owner.capture_lane, self.step = 0, None
            self.side.clear()
            main = lanes[0]
            for lane in lanes[1:]:
                main.wait_event(self._mark(lane))

    def _accessed(self, shard, lane, step):
        if shard is not None:
            for b in blocks(shard):
                self.order.accessed(b, lane, step)

    def _note_side(self, shard):
        """Remember the side-stream work still writing `shard` (its pending events), if any; returns
        those events."""
        events = [p.event for p in getattr(shard, "pending", None) or () if getattr(p, "event", None) is not None]
        if events:
            self.side[id(shard)] = (shard, events)
        return events

    def _add_side(self, shard, events):
        """Remember that side-stream work (`events`) still uses `shard` (reads it), besides any noted."""
        if shard is not None:
            noted = self.side.get(id(shard), (shard, []))[1]
            self.side[id(shard)] = (shard, noted + [e for e in events if e not in noted])

    def _wait_side(self, lane, events):
        """Make stream `lane` wait for side-stream `events`, each once."""
        for e in events:
            key = (lane, id(e))
            if key not in self.side_waited:
                self.side_waited[key] = e
                self.lanes[lane].wait_event(e)

    def _release(self, shard):
        """`shard` is being dropped: side-stream work still using it (noted by `_note_side` or
        `_add_side`) is noted on its blocks, for whichever stream takes them next to wait for."""
        side = self.side.pop(id(shard), None)
        if side is not None:
            for b in blocks(shard):
                self.order.add_events(b, side[1])

    def free(self, handles):
        """Drop `handles` as the runtime does, first noting the side-stream work still using their
        blocks (`_release`; the module docstring says why)."""
        if not handles:
            return
        table = self.rt.table
        for h in handles:
            shard = table.get(h) if h >= 0 else None
            if shard is not None:
                self._release(shard)
        self.rt._free(handles)      # (with the capture stream current: a pending shard settles there)
