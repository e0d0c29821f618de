"""A registered signature (`Entry`) and what a kernel sees of one command (`Call`)."""
from .. import backend
from ..layout import distribution
from .registry import is_local, local_rule, lookup
from .shard import Meta


class Entry:
    """A registered signature, prepared on every rank; `cache` keeps what kernels derive from it.

    sig_id: its integer ID. new_outputs: the Metas of the matrices each
    command of it makes; in_place: the input indices it overwrites, in output
    order (both functions of the signature: the master works them out once,
    not on every command). local: its commands never communicate (registry.py),
    so the master may queue them; share_s: master, the seconds its own share of
    the last such command took (infinite until one has run, and for commands
    that are not local: never queued). The master drops the least recently
    used signatures past dispatch.MAX_SIGNATURES; a dropped Entry has sig_id
    None, and a command of it registers the signature again.
    """
    __slots__ = ("op", "static", "inputs", "outputs", "in_dists", "out_dists", "kernel", "capture_rule", "cache",
                 "sig_id", "new_outputs", "in_place", "doing", "local_rule", "local", "share_s", "used",
                 "nbytes")

    def __init__(self, signature, nworkers, sig_id=None):
        self.op, self.static, self.inputs, self.outputs = signature
        self.kernel, self.capture_rule = lookup(self.op, backend.current().name)
        self.in_dists = tuple(distribution(m.layout, m.shape, nworkers) for m in self.inputs)
        self.out_dists = tuple(distribution(m.layout, m.shape, nworkers) if isinstance(m, Meta) else None
                               for m in self.outputs)
        self.cache = {}
        self.sig_id = sig_id
        self.new_outputs = tuple(m for m in self.outputs if type(m) is Meta)
        self.in_place = tuple(m for m in self.outputs if type(m) is not Meta)
        self.doing = f"running {self.op!r}"      # a worker's activity while it runs a command of it
        self.local_rule = local_rule(self.op, backend.current().name)
        self.local = is_local(self)
        self.share_s = _NEVER
        self.used = 0           # master: the command count at its last use (the least recently used go first)
        self.nbytes = 0         # master: the size of its registration message (the signature, pickled)




_NEVER = float("inf")


class Call:
    """What a kernel sees: its entry, input shards (and their handles), dynamic scalars and the runtime.

    `handles` identify the inputs for the replica cache, whose keys are
    (handle, shard version, layout, dtype).
    """
    __slots__ = ("rt", "entry", "inputs", "handles", "scalars", "payload", "result")

    def __init__(self, rt, entry, inputs, scalars, payload, handles=()):
        self.rt, self.entry, self.inputs, self.scalars, self.payload = rt, entry, inputs, scalars, payload
        self.handles = handles
        self.result = None

    @property
    def rank(self):
        return self.rt.world.rank

    @property
    def world(self):
        return self.rt.world
