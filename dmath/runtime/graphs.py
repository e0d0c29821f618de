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
`DMATH_CUDA_GRAPHS=0` turns graphs off. With `DMATH_GRAPH_STREAMS` above 1 the
capture issues independent steps on several streams forked from the capture
stream, so the graph has parallel branches (streams.py: the plan, and why its
frees are safe).
"""
from .. import memory, settings
from ..comm import counters
from .registry import capturable, prepare_capture
from .streams import Capture, plan_program, streams_allowed, warn_experimental


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
        self.capturable = enabled() and rt.backend.is_gpu and bool(program.steps) and not self.blockers
        self.reserve = 0        # the bytes a step-by-step run added at its peak: the capture's arena
        # the streams of a capture (DMATH_GRAPH_STREAMS; None: one), planned at the first replay from
        # what its steps communicated. Planned on every backend, so that a CPU run checks the plans
        # too; only a GPU capture follows one
        self.streams = None

    def replay(self):
        rt = self.rt
        self.runs += 1
        if self.graph is not None and not self.graph.valid(rt):
            self.graph = None                   # an input shard was replaced: capture again
        if self.graph is None and self.capturable and self.runs >= 2 and self._inputs_on_device():
            # the capture's bookkeeping and its first launch are this replay
            self.graph = CapturedProgram(rt, self.program, self.reserve, self.streams)
            return [None] * len(self.program.steps)
        if self.graph is not None:
            return self.graph.launch(rt)
        talked = [] if self.runs == 1 and streams_allowed() > 1 else None
        if self.capturable and not self.reserve:
            # measured once: a plan kept step by step (inputs in host memory) pays for it no more
            results, self.reserve = memory.pool.current().measure_peak(lambda: rt._run_program(self.program, talked))
        else:
            results = rt._run_program(self.program, talked)
        if talked is not None:
            self.streams = plan_program(rt, self.program, talked)
        return results

    def release_graph(self):
        """Drop the captured graph and give its pool's free blocks back; returns the bytes released.

        The buffers the graph wrote its outputs into stay with those matrices;
        the temporaries' fixed addresses go, so the next replay captures again.
        """
        if self.graph is None:
            return 0
        pool, self.graph = self.graph.pool, None
        before = pool.total_bytes()
        pool.free_all_blocks()
        return before - pool.total_bytes()

    def _inputs_on_device(self):
        # a shard held in host memory gets a new device copy for every command
        return all(self.rt.table[h].home is None for h in external_inputs(self.rt, self.program))


class CapturedProgram:
    """One program captured into a CUDA graph on this rank, with everything its addresses rely on.

    reserve: the bytes the program's buffers take at their peak (measured on a step-by-step run):
    the graph's pool starts as one free block of that size, which the capture's allocations split
    and its frees merge again, an arena; without it, each size the step asks for first becomes a
    block of its own and later sizes split those (AlexNet's step at 2 GPUs: a 936 MB pool without
    the arena, 750 MB with it). The arena serves the capture stream; side streams (below) take
    blocks of their own.
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
        prepare_capture()                       # e.g. cuBLAS may not allocate its workspace mid-capture
        owner = memory.pool.current()
        owner.capture_refs = []                 # buffers the kernels share between steps (a workspace)
        pool, peak = self.pool, [0]
        # (a plan made for more streams than the setting allows now is captured on one: the libraries'
        # per-stream workspaces are made for the setting)
        lanes = Capture(rt, program, streams, self.stream, owner) \
            if streams is not None and 1 < streams.streams <= streams_allowed() else None
        if lanes is not None:
            warn_experimental()

        def malloc(size):
            mem = pool.malloc(size)
            peak[0] = max(peak[0], pool.used_bytes())
            if lanes is not None:
                lanes.allocated(mem.ptr)        # the stream whose free list the block goes back to
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
