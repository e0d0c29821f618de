"""The master-worker runtime: `Runtime` wires its parts, one job to a module.

Rank 0 runs the user's program and is also worker 0: it validates a call,
sends the command (dispatch.py), then runs its own share (execute.py). Ranks
1..P-1 run the worker loop (worker.py) until the master shuts them down
(shutdown.py). Handle numbers: handles.py; what a failure means: failures.py;
starting and ending the process's runtime: lifecycle.py.
A recorded plan (plans.py) is a program of commands stored on every rank
under a plan ID; a replay is one REPLAY frame, run step by step or as a CUDA
graph (graphs.py).
"""
import collections
import os
import threading
import time

from ..comm.control import ControlChannel
from . import protocol
from .dispatch import Dispatch
from .entry import Call  # noqa: F401  (the kernels' view; tools import it from here)
from .execute import Execution
from .failures import Failures
from .handles import Handles
from .ledger import Ledger
from .replica_ledger import ReplicaLedger, budget as replica_budget
from .shutdown import Shutdown
from .worker import Worker


class Runtime(Dispatch, Handles, Failures, Execution, Worker, Shutdown):
    """One per process; `runtime()` returns it after `init`."""

    def __init__(self, world, be, careful="auto"):
        self.world = world
        self.nworkers = world.size   # P (an attribute: read on every operation)
        self.is_mpi = world.is_mpi
        self.backend = be
        self.ctl = ControlChannel(world)
        self.table = {}            # handle -> Shard
        self.entries = {}          # signature id -> Entry
        self.signatures = {}       # master: signature -> its Entry (entries[entry.sig_id])
        self.next_sig_id = 1       # master: the next signature ID (never reused: dropped ones included)
        self.signature_bytes = 0   # master: the registration messages' bytes of the signatures kept
        self.next_handle = 1       # master: the next handle number to hand out (see _free_run)
        self.handle_end = protocol.HANDLE_MAX + 1   # master: ... while it stays below this
        self._free_runs = None     # master: the free runs of numbers left from the last scan
        self.pending_frees = []
        self.released_elsewhere = collections.deque()   # master: handles collected in other threads
        self.commands = 0
        self.next_version = 1      # shard versions, unique in this process (see _execute)
        self.broken = None         # set to the WorkerError that broke the runtime
        self.closed = False
        self.ledger = Ledger(world.size, careful)   # master: bytes of live matrices per worker, vs the limit
        self.replicas = ReplicaLedger(lambda: replica_budget(self.ledger.limit))   # master: cached copies
        self.programs = {}         # plan id -> graphs.Replayer of its protocol.Program (every rank)
        self.next_plan = 1
        self.recorder = None       # master: the plans.Recorder of an open record block
        self.watchers = {}         # master: handle -> plans to tell when it is released
        self.profile = {}          # op -> [kernels run, seconds] when PROFILE is on
        self.owner = threading.get_ident()   # master: the only thread that may issue commands
        self.pinger = None         # master: heartbeat.Pinger when a timeout is set (MPI only)
        self.beacon = None         # master: heartbeat.Beacon (its beats tell the workers it is alive)
        self.pid = os.getpid()     # the process that called init(): only it talks to the workers
        self.forked = False        # set in a child forked from it (lifecycle._forked)
        self.child_status = None   # [exit status] of such a child
        self.activity = ("starting", time.monotonic())   # worker: what its main thread does, since when
        self.last_command = None   # master: oom.LastCommand of the last message sent, if a command
        self.poisoned = set()      # master: handles of matrices whose command was undone (oom.py)
        self.deciding = False      # master: inside oom.verdict, whose waits must not raise failures
        self.refusals = {}         # master: rank -> traceback of refusals in the careful command running
        self.refusal_deadline = None   # master: when the careful command must be left by all (oom.noted)
        self.batching = world.is_mpi   # master: local commands may be queued (alone, nothing is sent)
        self.queue = []            # master: the messages of the queued commands, oldest first
        self.queued_bytes = 0      # master: their total length
        self.queued_since = 0.0    # master: perf_counter() when the first of them was queued
