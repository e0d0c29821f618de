"""Recorded plans: run a block of operations once, then replay it with one control message.

    with dmath.record() as plan:
        h = dmath.relu(x @ w)
        loss = ((h - y) ** 2).mean()
    plan.replay()        # the same commands on the same matrices; returns [loss]

The block runs as usual (it is the plan's first execution). The master
records every command it sends inside the block as (signature ID, handles,
scalars, frees); at the end of the block the program goes to every rank once
(a DEFINE message) and is stored under a plan ID. A replay is one REPLAY
frame (12 bytes, 64 on the wire) and every rank runs the program through the
same entries, so whatever a kernel cached from the signature (remap plans,
index arrays) is reused.

Handles of a plan are of three kinds (see `Recorder`):
  inputs       matrices that existed before the block and were used in it;
               a replay reads (or overwrites in place) their current values,
               and raises PlanError on the master when one has been freed;
  temporaries  made and freed inside the block; the frees are part of the
               program, so a replay makes and frees them at the same points
               (allocation goes through dmath.memory: a reuse, not a new one);
  outputs      made in the block and alive at its end; a replay writes them
               again under the same handle numbers, so the Matrix objects
               from the block hold the new values (each write a new version).
"""
from ..errors import PlanError
from . import protocol
from .lifecycle import runtime

_window = None
_drop_copies = None


def set_memory_hooks(window, drop_copies):
    """`window(True)` opens every worker's memory window (the most bytes its blocks allocated from now on
    hold at once); `window(False)` closes them and returns, a list indexed by rank, each one's (that
    peak, whether it is exact (else it is the peak above what was in use at the start, which blocks
    made before and freed meanwhile lower), bytes in use now, bytes of its replica copies).
    `drop_copies()` has every worker drop its replica copies.

    dmath.ops.storage registers them (they run commands, which this layer cannot name). A record block
    measures what its commands' allocations held at once on every worker: temporaries, outputs,
    kernels' scratch, communication buffers and replica copies it made: what a replay may need again.
    """
    global _window, _drop_copies
    _window, _drop_copies = window, drop_copies


class Recorder:
    """The master's bookkeeping while a block is recorded (pure: no communication)."""

    def __init__(self):
        self.steps = []
        self.returns = []        # per step: whether the command returned a value to the master
        self.inputs = {}         # handle -> Meta, in order of first use
        self.created = set()     # handles made in the block
        self.live = set()        # made in the block and not freed yet
        self.freed_inputs = set()
        self.carried = []        # frees of block-made handles sent with a command that failed
        self.freed_before = ()   # per worker: bytes of matrices made before the block and freed in it

    def command(self, sig_id, inputs, out_handles, new_handles, scalars, frees, returned):
        """Note one command sent inside the block.

        inputs: its (handle, Meta) pairs; out_handles: every output (in-place
        ones repeat an input); new_handles: the outputs it made; frees: the
        handles freed with it (only those made in the block belong to the
        plan: earlier garbage is freed once, now).
        """
        own = tuple(self.carried) + tuple(h for h in frees if h in self.live)
        self.carried = []
        self.live.difference_update(own)
        self.freed_inputs.update(h for h in frees if h in self.inputs)
        for h, m in inputs:
            if h not in self.created and h not in self.inputs:
                self.inputs[h] = m
        self.created.update(new_handles)
        self.live.update(new_handles)
        handles = tuple(h for h, _ in inputs) + tuple(out_handles)
        self.steps.append(protocol.Step(sig_id, handles, tuple(scalars), own))
        self.returns.append(bool(returned))

    def releasing(self, handle, live):
        """Matrix `handle` is released during the block (`live`: the ledger's shares, before): one made
        before the block is noted in `freed_before`."""
        s = live.get(handle) if handle not in self.created else None
        if s:
            self.freed_before = tuple(a + b for a, b in zip(self.freed_before, s)) \
                if self.freed_before else tuple(s)

    def failed(self, frees):
        """A command sent in the block with `frees` failed (refused for memory and undone): it is not
        part of the plan, but the workers freed those handles; the next recorded step frees them in a
        replay (else a temporary freed with it became an output a replay made again, never freed)."""
        own = [h for h in frees if h in self.live]
        self.live.difference_update(own)
        self.carried += own

    def finish(self, pending):
        """The Program, given the master's pending frees at the end of the block.

        Temporaries released but not yet freed become the program's tail; what
        is still live is the plan's outputs (`self.live` afterwards).
        """
        tail = tuple(self.carried) + tuple(h for h in pending if h in self.live)
        self.carried = []
        self.live.difference_update(tail)
        self.freed_inputs.update(h for h in pending if h in self.inputs)
        return protocol.Program(tuple(self.steps), tail)


class Plan:
    """A recorded sequence of dmath operations; made by `dmath.record()`.

    `replay()` runs it again on the same matrices with one control message.
    `close()` (also run when the Plan is collected) forgets it on the workers.
    """

    def __init__(self, rt):
        self._rt = rt
        self._state = "new"          # new -> recording -> ready | discarded; ready -> closed
        self._recorder = None
        self.id = None
        self._returns = ()
        self._inputs = {}            # handle -> Meta
        self._outputs = frozenset()
        self._dead_inputs = set()
        self._dead_outputs = set()
        self._need = ()              # per worker: the bytes a replay allocates at once beside the matrices
        self.steps = 0

    # ---- recording --------------------------------------------------------------
    def __enter__(self):
        rt = self._rt
        rt.check_usable()
        if self._state != "new":
            raise PlanError("a plan records once; make a new one with dmath.record()")
        if rt.recorder is not None:
            raise PlanError("dmath.record() blocks cannot be nested: the inner block would be recorded "
                            "into the outer plan and replayed twice")
        if _window is not None:
            _window(True)           # (before the recorder: this command is not part of the plan)
        self._recorder = rt.recorder = Recorder()
        self._state = "recording"
        return self

    def __exit__(self, kind, value, tb):
        rt, rec = self._rt, self._recorder
        self._recorder = None
        if rt.recorder is rec:
            rt.recorder = None
        if kind is not None:
            # the commands already sent ran as usual; nothing was sent about the plan
            self._state = "discarded"
            self._close_window()
            return False
        program = rec.finish(rt.pending_frees)
        self.id = rt.define_plan(program)
        self._state = "ready"
        self.steps = len(program.steps)
        self._returns = tuple(rec.returns)
        # what a replay needs at once per worker: what the block's commands held at once on each worker
        # (measured: temporaries, outputs, kernels' scratch and communication buffers)
        need = self._measured_need(rec)
        self._need = need if need and any(need) else ()
        self._inputs = dict(rec.inputs)
        self._outputs = frozenset(rec.live)
        # every matrix a replay writes: the master's replica ledger forgets their copies at each replay
        self._writes = tuple({h for s in program.steps for h in s.handles[len(rt.entries[s.sig_id].inputs):]})
        self._dead_inputs = set(rec.freed_inputs)
        for h in self._inputs:
            if h not in self._dead_inputs:
                rt.watch(h, self)
        for h in self._outputs:
            rt.watch(h, self)
        return False

    def _measured_need(self, rec):
        """Per worker, the bytes a replay needs beside the live matrices, from the window (None without):
        what the block's new blocks held at once (where the pool cannot tell a block made before the
        block and freed inside it, which lowered what was in use and hid that much of the block's own,
        those matrices are added back), plus what the pool holds in use besides matrices and replica
        copies (kernels' caches, a cuDNN workspace: there at a replay too, and not in the master's
        account of matrices; replica copies are dropped before a replay they might not leave room for)."""
        got = self._close_window()
        if not got:
            return None
        freed = rec.freed_before or (0,) * len(got)
        held = self._rt.ledger.per_worker()
        return tuple(grown + (0 if exact else f) + max(0, in_use - copies - h)
                     for (grown, exact, in_use, copies), f, h in zip(got, freed, held))

    def _close_window(self):
        """The workers' memory windows closed; their peaks (None without the hook or a runtime)."""
        if _window is None or self._rt.closed or self._rt.broken is not None:
            return None
        try:
            return _window(False)
        except Exception:  # noqa: BLE001 - a measurement: the plan works without it (counted needs)
            return None

    def handle_released(self, handle):
        """The runtime's notice that a matrix this plan uses was collected."""
        (self._dead_inputs if handle in self._inputs else self._dead_outputs).add(handle)

    # ---- replay -----------------------------------------------------------------
    def replay(self):
        """Run the recorded operations again, on the same matrices; one control message.

        Outputs of the block are overwritten in place of their handles (the
        Matrix objects from the block see the new values). Returns, as a
        list in order, the values the block's commands returned to the master
        (scalar reductions such as `M.sum()` or `M.norm()`, `M.get()`,
        `M.to_numpy()`); Python computations on them in the block are not
        part of the plan. Raises PlanError, before anything is sent, when an
        input matrix of the plan has been freed, and OutOfMemoryError when
        what its commands held at once when it was recorded (temporaries,
        outputs made again, the kernels' scratch) no longer fits beside the
        live matrices on some worker.
        """
        if self._state != "ready":
            raise PlanError({
                "new": "this plan has not been recorded yet: use it as `with dmath.record() as plan:`",
                "recording": "a plan cannot be replayed inside its own record block",
                "discarded": "this plan was discarded: its record block raised an exception",
                "closed": "this plan was closed",
            }[self._state])
        if self._dead_inputs:
            h = min(self._dead_inputs)
            m = self._inputs[h]
            raise PlanError(f"cannot replay: {len(self._dead_inputs)} input matrix(es) of the plan were freed, "
                            f"e.g. the {m.shape} {m.dtype} matrix in {m.layout} (handle {h}); a plan replays on "
                            f"the matrices it recorded, so keep every input referenced (write new values "
                            f"into it with Matrix.assign())")
        rt = self._rt
        need = self._need
        if need and _drop_copies is not None and not rt.ledger.fits(need, extra=rt.replicas.budget()):
            # the workers' replica copies are outside the master's account of matrices (and a replay
            # makes some it never hears of): where the cache, full, might not leave the replay room,
            # every worker drops its copies first (one small command; only that close to the ceiling)
            _drop_copies()
        # (its memory is admitted before anything is sent: a worker out of memory inside a replay would
        # end the job)
        results = rt.replay_plan(self.id, need, self)
        for h in self._writes:
            rt.replicas.written(h)
        if self._dead_outputs:
            # outputs the user dropped are written again by the replay: free them with the next command
            rt.pending_frees.extend(sorted(self._dead_outputs))
        return [r for r, kept in zip(results, self._returns) if kept]

    def close(self):
        """Forget the plan on every rank (with the next command); replay() raises afterwards."""
        if self._state == "ready":
            rt = self._rt
            for h in list(self._inputs) + list(self._outputs):
                rt.unwatch(h, self)
            if not rt.closed:
                rt.drop_plan(self.id)
        if self._state != "recording":
            self._state = "closed"

    def __del__(self):
        try:
            self.close()
        except Exception:  # interpreter shutdown: nothing left to free
            pass

    def __repr__(self):
        return f"dmath.Plan(id={self.id}, steps={self.steps}, state={self._state})"


def record():
    """Record the operations of a `with` block into a Plan that `plan.replay()` runs again.

    The block runs as usual. Commands that carry data from the master
    (from_numpy, assign of a numpy array) cannot be recorded: write new data
    into an existing matrix with `Matrix.assign()` before a replay. Blocks do
    not nest; an exception inside the block discards the plan.
    """
    return Plan(runtime())
