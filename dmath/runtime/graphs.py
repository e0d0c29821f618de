"""Replaying a recorded plan on one rank: step by step, or as one CUDA graph launch.

Every rank keeps a `Replayer` per plan. The first replay runs the program
step by step (`Runtime._run_program`). On the GPU backend, when every step's
kernel declares itself capturable (registry.py) and every matrix the program
reads from outside is plain device memory, the second replay captures the
program into a CUDA graph and launches it; later replays launch the graph and
redo only the runtime's bookkeeping (one launch instead of a kernel call
per step).

What a graph needs, and how it is kept:
- fixed addresses: the capture allocates from a CuPy memory pool of its own
  (`using_allocator`), which nothing else allocates from and which the
  Replayer keeps, so every buffer the graph touches (outputs, temporaries,
  scratch of the kernels) stays where it was; the shards the program leaves
  in the handle table (its outputs) are kept too and put back after every
  launch, so the block's Matrix objects keep seeing the graph's outputs;
- the same inputs: the graph reads the shards of the program's external
  inputs at their captured addresses. Writes in place (assign, `+=`, set)
  keep a shard and its buffers; an operation that replaces a shard gives a
  new Shard object, on every rank, so `valid()` (object identity, the same
  answer on every rank) notices it and the plan is captured again;
- the runtime's bookkeeping: each launch gives every written matrix a new
  version (as `_execute` would), counts the commands, and adds the data
  traffic the capture counted (the kernels ran in Python only at capture).

Every decision here (step by step, capture, launch) depends only on the
program, the kernels' declarations, the memory kinds of the inputs and the
sequence of commands, which are the same on every rank, so all ranks decide
alike. Kernels that communicate do so through NCCL on the compute stream
(all-reduces, the exchanges of a remap, the operand remaps of a GEMM), which
a graph captures with them (`DMATH_GRAPH_COLLECTIVES=0`: never); work left on
the side stream is waited for before a capture and joined at its end.
`DMATH_CUDA_GRAPHS=0` turns graphs off.

A plan with steps that cannot be captured (a batch decoded from disk on the
host, a value the master reads) is cut into segments (`segments`): each run
of at least MIN_SEGMENT capturable steps between them is captured into a
graph of its own, and the others run step by step in between, in program
order on the same stream. Training from an image folder needs this: the
batch's host stage cannot be captured, and replaying ResNet-50's ~1,750
kernels a step from Python left the GPU idle for most of the step (a CUPTI
timeline on an H100: 61 ms busy in a 219 ms step). A segment whose input a
step-by-step step makes anew at every replay (a new shard: the capture would
be invalid at the next replay) runs step by step, and so does one captured
invalid more than MAX_RECAPTURES times.

With `DMATH_GRAPH_STREAMS` above 1 the
capture issues independent steps on several streams forked from the capture
stream, so the graph has parallel branches (streams.py: the plan, and why its
frees are safe).
"""
from typing import NamedTuple

from .. import memory, settings
from ..comm import counters
from .protocol import Program
from .registry import capturable, prepare_capture
from .streams import Capture, plan_program, streams_allowed


def enabled():
    """Whether plans may be captured into CUDA graphs: DMATH_CUDA_GRAPHS, and not DMATH_PROFILE (a
    profiled run times every kernel in Python, which a graph launch would skip)."""
    return settings.current.cuda_graphs and not settings.current.profile


def external_inputs(rt, program):
    """Handles the program uses without making them first (read, or written in place)."""
    made, external = set(), []
    for step in program.steps:
        n_in = len(rt.entries[step.sig_id].inputs)
        for h in step.handles[:n_in]:
            if h not in made and h not in external:
                external.append(h)
        made.update(h for h in step.handles[n_in:] if h not in step.handles[:n_in])
    return external


#: the fewest capturable steps between uncapturable ones worth a graph of their own (a launch saves
#: a Python kernel call per step; a short segment would cost a pool and a capture for little)
MIN_SEGMENT = 8
#: a segment whose capture was found invalid (its inputs' shards replaced between replays) more
#: than this many times is run step by step from then on
MAX_RECAPTURES = 2


class Segment(NamedTuple):
    """Steps [start, stop) of a program; capture: whether they are captured into a graph."""
    start: int
    stop: int
    capture: bool


def segments(flags, min_steps=MIN_SEGMENT):
    """The segments of a program whose steps are capturable where `flags` is true (pure): maximal runs
    of capturable steps of at least `min_steps` are captured, everything else (runs in between,
    shorter runs) runs step by step; adjacent step-by-step runs are merged."""
    out = []
    i, n = 0, len(flags)
    while i < n:
        j = i
        while j < n and bool(flags[j]) == bool(flags[i]):
            j += 1
        capture = bool(flags[i]) and j - i >= min_steps
        if out and not out[-1].capture and not capture:
            out[-1] = Segment(out[-1].start, j, False)
        else:
            out.append(Segment(i, j, capture))
        i = j
    return out


def made_anew(rt, program, segs):
    """Indices of the captured segments in `segs` that read a handle an earlier step-by-step segment
    of `program` makes as a new shard (an output that is not also an input of its step): such a
    segment's capture would be invalid at every replay."""
    fresh, bad = set(), set()
    for k, seg in enumerate(segs):
        steps = program.steps[seg.start:seg.stop]
        if seg.capture and not fresh & set(external_inputs(rt, Program(tuple(steps), ()))):
            fresh -= {h for s in steps for h in s.handles[len(rt.entries[s.sig_id].inputs):]}
            continue
        if seg.capture:
            bad.add(k)                  # step by step after all: what it makes is made anew too
        for s in steps:
            n_in = len(rt.entries[s.sig_id].inputs)
            fresh.update(h for h in s.handles[n_in:] if h not in s.handles[:n_in])
    return bad


class _Part:
    """What a Replayer keeps of a captured segment: its graph (None until captured)."""

    def __init__(self, reserve_share):
        self.graph = None
        self.invalidated = 0              # captures found invalid at a replay (inputs replaced)
        self.largest = reserve_share      # whether it gets the program's measured arena


class Replayer:
    """A stored plan on one rank; `replay()` runs it and returns the master's result of every step."""

    def __init__(self, rt, program):
        self.rt = rt
        self.program = program
        self.runs = 0
        self.graph = None
        # the operations that keep this plan out of a CUDA graph (reported by dmath.stats())
        self.blockers = sorted({rt.entries[s.sig_id].op for s in program.steps
                                if not capturable(rt.entries[s.sig_id])})
        on = enabled() and rt.backend.is_gpu and bool(program.steps)
        self.capturable = on and not self.blockers
        # with blockers: the segments, a _Part for each captured one (None: no segment is captured)
        self.parts = self._segment(rt, program) if on and self.blockers else None
        self.reserve = 0        # the bytes a step-by-step run added at its peak: the capture's arena
        # the streams of a capture (DMATH_GRAPH_STREAMS; None: one), planned at the first replay from
        # what its steps communicated. Planned on every backend, so that a CPU run checks the plans
        # too; only a GPU capture follows one
        self.streams = None

    def _segment(self, rt, program):
        """[(the segment's sub-program, its _Part or None: step by step)] of a program with blockers,
        or None when no segment is worth capturing."""
        segs = segments([capturable(rt.entries[s.sig_id]) for s in program.steps])
        bad = made_anew(rt, program, segs)
        segs = [Segment(g.start, g.stop, g.capture and k not in bad) for k, g in enumerate(segs)]
        captured = [g for g in segs if g.capture]
        if not captured:
            return None
        largest = max(captured, key=lambda g: g.stop - g.start)
        subs = [Program(tuple(program.steps[g.start:g.stop]), ()) for g in segs]
        return [(sub, _Part(g is largest) if g.capture else None) for g, sub in zip(segs, subs)]

    @property
    def captured(self):
        """Whether a CUDA graph of this plan (the whole program, or a segment) is held."""
        return self.graph is not None or any(p is not None and p.graph is not None for _, p in self.parts or ())

    def replay(self):
        rt = self.rt
        self.runs += 1
        if self.parts is not None and self.runs >= 2:
            return self._replay_parts()
        if self.graph is not None and not self.graph.valid(rt):
            self.graph = None                   # an input shard was replaced: capture again
        if self.graph is None and self.capturable and self.runs >= 2 and self._inputs_on_device():
            # the capture's bookkeeping and its first launch are this replay
            self.graph = CapturedProgram(rt, self.program, self.reserve, self.streams)
            return [None] * len(self.program.steps)
        if self.graph is not None:
            return self.graph.launch(rt)
        talked = [] if self.runs == 1 and streams_allowed() > 1 else None
        if (self.capturable or self.parts is not None) and not self.reserve:
            # measured once: a plan kept step by step (inputs in host memory) pays for it no more
            results, self.reserve = memory.pool.current().measure_peak(lambda: rt._run_program(self.program, talked))
        else:
            results = rt._run_program(self.program, talked)
        if talked is not None:
            self.streams = plan_program(rt, self.program, talked)
        return results

    def _replay_parts(self):
        """A replay of a segmented program: captured segments launched (captured first where needed),
        the others step by step, in program order; then the program's tail freed."""
        rt, results = self.rt, []
        for sub, part in self.parts:
            if part is not None and part.graph is not None and not part.graph.valid(rt):
                part.graph = None
                part.invalidated += 1
            if part is None or part.invalidated > MAX_RECAPTURES or (
                    part.graph is None and not self._inputs_on_device(sub)):
                results += rt._run_program(sub)
            elif part.graph is None:
                # (the capture's bookkeeping and its first launch are this segment's execution)
                part.graph = CapturedProgram(rt, sub, self.reserve if part.largest else 0)
                results += [None] * len(sub.steps)
            else:
                results += part.graph.launch(rt)
        rt._free(self.program.tail)
        return results

    def release_graph(self):
        """Drop the captured graph(s) and give their pools' free blocks back; returns the bytes released.

        The buffers the graph wrote its outputs into stay with those matrices;
        the temporaries' fixed addresses go, so the next replay captures again.
        """
        released = 0
        for _, part in self.parts or ():
            if part is not None and part.graph is not None:
                released += _release(part.graph)
                part.graph = None
        if self.graph is not None:
            released += _release(self.graph)
            self.graph = None
        return released

    def _inputs_on_device(self, program=None):
        # a shard held in host memory gets a new device copy for every command
        program = self.program if program is None else program
        return all(self.rt.table[h].home is None for h in external_inputs(self.rt, program))


def _release(graph):
    """Give a CapturedProgram's pool's free blocks back; the bytes released."""
    pool = graph.pool
    before = pool.total_bytes()
    pool.free_all_blocks()
    return before - pool.total_bytes()


class CapturedProgram:
    """One program captured into a CUDA graph on this rank, with everything its addresses rely on.

    reserve: the bytes the program's buffers take at their peak (measured on a step-by-step run):
    the graph's pool starts as one free block of that size, which the capture's allocations split
    and its frees merge again, an arena; without it, each size the step asks for first becomes a
    block of its own and later sizes split those (AlexNet's step at 2 GPUs: a 936 MB pool without
    the arena, 750 MB with it). The arena serves every stream of the capture (streams.py).
    streams: the program's StreamPlan (streams.py), or None: every step on the capture stream.
    """

    def __init__(self, rt, program, reserve=0, streams=None):
        xp = rt.backend.xp
        table = rt.table
        self.inputs = {h: table[h] for h in external_inputs(rt, program)}
        n_in = [len(rt.entries[s.sig_id].inputs) for s in program.steps]
        self.writes = [h for s, k in zip(program.steps, n_in) for h in s.handles[k:]]
        self.nsteps = len(program.steps)
        before = dict(counters.counters)
        # side-stream work still writing a shard (a background all-reduce of the last step-by-step
        # run) is waited for here, on the compute stream the graph will launch on: inside the
        # capture that wait would name an event from outside it, and the first launch could read
        # the shard before the side stream is done (seen on a cold GPU as a different loss)
        for s in table.values():
            if s.pending is not None:
                s.settle()
        self.pool = xp.cuda.MemoryPool()
        self.stream = xp.cuda.Stream(non_blocking=True)
        # (a plan made for more streams than the setting allows now is captured on one: the libraries'
        # per-stream workspaces are made for the setting)
        on_lanes = streams is not None and 1 < streams.streams <= streams_allowed()
        # e.g. cuBLAS may not allocate its workspace mid-capture; one scratch buffer per stream used
        prepare_capture(streams.streams if on_lanes else 1)
        owner = memory.pool.current()
        owner.capture_refs = []                 # buffers the kernels share between steps (a workspace)
        pool, peak = self.pool, [0]
        lanes = Capture(rt, program, streams, self.stream, owner) if on_lanes else None

        main = self.stream
        shared = settings.current.graph_streams_memory == "shared"

        def malloc(size):
            # shared: a side stream's block from the capture stream's free list (CuPy keeps one per
            # current stream): a block one stream frees may serve another, which then waits for its
            # last uses (streams.MemoryOrder), so the graph's pool is about one stream's size. own: the
            # current stream's list (its reuse waits for the other streams' uses all the same)
            if shared and lanes is not None and owner.capture_lane:
                with main:
                    mem = pool.malloc(size)
            else:
                mem = pool.malloc(size)
            if lanes is not None and mem.ptr:
                lanes.allocated(mem.ptr, mem.mem.size)
            peak[0] = max(peak[0], pool.used_bytes())
            return mem
        if reserve:
            # the step-by-step runs' temporaries are cached in the shared pool, which the graph's own
            # pool cannot take: give them back to the device first, so the arena fits where they were
            # (else a model as large as the GPU allows ran out of memory at its capture)
            owner.release_cached()
        with xp.cuda.using_allocator(malloc), self.stream:
            if reserve:
                # the arena: one block, allocated on the capture stream (CuPy reuses a block on the
                # stream that freed it) and freed at once
                pool.malloc(reserve)
            self.stream.begin_capture()
            try:
                if lanes is not None:
                    lanes.run()
                else:
                    rt._run_program(program)
                for s in table.values():        # side-stream work the program left running joins the graph
                    if s.pending is not None:
                        s.settle()
            except BaseException:
                try:
                    self.stream.end_capture()
                except Exception:  # noqa: S110 - the capture is invalid anyway; report the first error
                    pass
                raise
            finally:
                self.keep, owner.capture_refs = owner.capture_refs, None
            self.graph = self.stream.end_capture()
        # the side streams (their ids key free lists of the graph's pool) live as long as the graph
        self.lanes = lanes.lanes if lanes is not None else None
        self.traffic = {k: counters.counters[k] - before[k] for k in before}
        owner.hold_graph_pool(self, self.pool, peak[0])
        # the step-by-step runs before the capture left their temporaries cached in the shared pool;
        # the graph has its own buffers now, so that memory goes back to the device
        owner.release_cached()
        # what the program leaves in the table: its outputs and the inputs it wrote in place
        self.final = {h: table[h] for h in dict.fromkeys(self.writes) if h in table}
        # the capture ran nothing and counted once: the first launch is this replay's execution
        self._launch(rt)

    def valid(self, rt):
        """True while every input is still the shard (hence the buffers) the graph was captured with."""
        table = rt.table
        return all(table.get(h) is s for h, s in self.inputs.items())

    def launch(self, rt):
        """Run the graph and redo the runtime's bookkeeping of the program; results are all None."""
        self._launch(rt)
        rt.commands += self.nsteps
        for k, v in self.traffic.items():
            counters.counters[k] += v
        final = self.final
        rt.table.update(final)
        for h in self.writes:
            version, rt.next_version = rt.next_version, rt.next_version + 1
            s = final.get(h)
            if s is not None:
                s.version = version
        return [None] * self.nsteps

    def _launch(self, rt):
        self.graph.launch(stream=rt.backend.xp.cuda.get_current_stream())
