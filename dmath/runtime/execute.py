"""Running commands on every rank: the handle table of shards, frees, recorded programs, statistics."""
import time

from .. import memory
from ..comm import counters
from ..memory import replicas
from . import protocol
from .entry import Call
from .graphs import Replayer
from .streams import traffic_mark

#: DMATH_PROFILE=1: every kernel is timed on its worker (the device synchronised before and after, so
#: kernels run one at a time and CUDA graphs are off); dmath.stats() reports it under 'profile'.
#: Set from dmath.settings at init
PROFILE = False


def configure(values):
    """Take the profiling switch from the checked settings (`dmath.settings.current`)."""
    global PROFILE
    PROFILE = values.profile


class Execution:
    """The Runtime's part that runs on every rank: execute a command on the local shards."""

    def _execute(self, entry, in_handles, out_handles, scalars, payload=None):
        table = self.table
        inputs = list(map(table.__getitem__, in_handles))     # (no comprehension frame: Python < 3.12)
        call = Call(self, entry, inputs, scalars, payload, in_handles)
        homed = False
        for s in inputs:
            if s.pending is not None or s.home is not None:     # (one test for the usual shard)
                if s.pending is not None:
                    s.settle()          # written by a background all-reduce: wait for it on the device
                if s.home is not None:
                    homed = True
        self.commands += 1
        shards = self._profiled(entry, call) if PROFILE else entry.kernel(call)
        if homed:
            for s in inputs:
                if s.home is not None:
                    # held in host memory on a GPU: a write makes its device copy the newer one,
                    # and a 'host' shard gives its device copy up until the next command needs it
                    s.home.after_command(any(o is s for o in shards))
        version = self.next_version
        for h, s in zip(out_handles, shards):
            # every write makes a new version: replica-cache keys of the old one go stale
            s.version = version
            version += 1
            table[h] = s
        self.next_version = version
        return call.result

    def _profiled(self, entry, call):
        """Run the kernel alone on the device and add its seconds to self.profile[op]."""
        be = self.backend
        be.synchronize_all()
        t0 = time.perf_counter()
        shards = entry.kernel(call)
        be.synchronize_all()
        slot = self.profile.setdefault(entry.op, [0, 0.0])
        slot[0] += 1
        slot[1] += time.perf_counter() - t0
        return shards

    def _free(self, handles):
        table, cache = self.table, replicas.cache
        dropped = None
        for h in handles:
            if h < 0:
                if -h >= protocol.SIGNATURE_DROP:       # a signature the master dropped (protocol.py)
                    entry = self.entries.pop(-h - protocol.SIGNATURE_DROP, None)
                    if entry is not None and entry.cache:
                        dropped = dropped or []
                        dropped.append(entry)
                else:                                   # -k drops plan k
                    self.programs.pop(-h, None)
                continue
            s = table.pop(h, None)
            if s is not None and s.pending is not None:
                s.settle()              # its buffers go back to the pool: the side stream must be done
            cache.drop(h)
        if dropped:
            # what the dropped signatures' kernels cached (staging buffers, plans) goes now: the device
            # first finishes its queued work, which may still read those buffers (once per message)
            self.backend.synchronize_all()
            for entry in dropped:
                entry.cache.clear()

    def _define(self, plan_id, program):
        self.programs[plan_id] = Replayer(self, program)
        self._free(program.tail)            # the recording's temporaries still held at its end

    def _run_program(self, program, talked=None):
        """Execute a recorded program as its commands ran: same entries, frees, fresh versions.

        talked: None, or a list to which each step's answer to "did it communicate on this rank"
        is appended (streams.traffic_mark: the stream plan keeps those on the capture stream).
        """
        results = []
        for step in program.steps:
            self._free(step.frees)
            entry = self.entries[step.sig_id]
            n_in = len(entry.inputs)
            if talked is not None:
                mark = traffic_mark()
            results.append(self._execute(entry, step.handles[:n_in], step.handles[n_in:], step.scalars))
            if talked is not None:
                talked.append(traffic_mark() != mark)
        self._free(program.tail)
        return results

    def local_stats(self):
        d = dict(counters.counters)
        d.update(commands=self.commands, pool=memory.local_stats(),
                 signatures=len(self.entries), handles=len(self.table), plans=len(self.programs),
                 plan_graphs=sum(1 for r in self.programs.values() if r.captured),
                 # the most streams a plan's capture would use (DMATH_GRAPH_STREAMS; 1: one)
                 plan_streams=max((r.streams.streams for r in self.programs.values() if r.streams is not None),
                                  default=1),
                 # operation -> plans it keeps step by step (not capturable into a CUDA graph)
                 plan_blockers={op: sum(op in r.blockers for r in self.programs.values())
                                for op in {op for r in self.programs.values() for op in r.blockers}})
        d.update(replicas.cache.stats())
        if PROFILE:
            d["profile"] = {op: tuple(v) for op, v in self.profile.items()}
        return d
