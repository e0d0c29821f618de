"""Operation units: one definition per operation, its typed static arguments and its kernels by backend.

An `Op` is what a command names. It holds
- `args`: the class of its static arguments, a `typing.NamedTuple` whose
  annotations are checked when the master builds them (`Op.static(...)`), so
  a kernel reads `call.entry.static.axis`, never a position in a tuple;
- its worker kernels keyed by backend: None (written once with `xp`, serves
  every backend) or a backend's name ('cpu', 'gpu'), which takes precedence
  there. A backend's kernel may hand what it cannot do to the generic one
  (`generic(name)`), as the cuDNN convolution does;
- per kernel, whether a recorded plan may capture it into a CUDA graph, and
  whether its commands are local (no communication at all: the master may
  queue them and send several in one control message, dispatch.py);
- `capture_hooks`: what must be ready before any capture (cuBLAS's workspace).
The master half of an operation (validation, result layout, dispatch) lives
beside its kernels in `dmath/ops/<family>.py`; the registry dispatches by
(op, backend) when a signature is registered, so no kernel tests which backend
it runs on.
"""

from .. import settings


def collectives_in_graphs():
    """Whether a kernel that runs NCCL collectives on the compute stream may be captured into a CUDA
    graph (NCCL supports capture: a data-parallel training step, its gradient all-reduce included,
    then replays as one graph launch per worker). DMATH_GRAPH_COLLECTIVES=0: never."""
    return settings.current.graph_collectives

#: name -> Op
OPS = {}

#: functions run before a plan is captured into a CUDA graph (in registration order, each once)
CAPTURE_HOOKS = {}


class Op:
    """One operation: its name, the class of its static arguments, its kernels by backend."""

    __slots__ = ("name", "args", "kernels", "local_rules")

    def __init__(self, name, args=None):
        self.name = name
        self.args = args          # a NamedTuple class, or None: no static arguments (or the `kernel`
        #                           shorthand's positional tuples, unchecked)
        self.kernels = {}         # backend name or None -> (kernel, capture rule)
        self.local_rules = {}     # backend name or None -> local rule (see `kernel`)

    def __repr__(self):
        return f"Op({self.name!r}, backends={sorted(self.kernels, key=str)})"

    def kernel(self, backend=None, capturable=False, local=False):
        """Register `fn(call)` as this operation's worker kernel on `backend` (None: every backend).

        capturable: True (or a function of the command's Entry returning True)
        when the kernel, on the GPU backend, only enqueues device work on the
        current stream: CuPy kernels and copies, library calls that accept a
        capture (cuDNN, NCCL; cuBLAS through `dmath.gpu.blas`), no host
        synchronisation, no host-device transfer, no MPI, no replica-cache use,
        and every allocation through the array module. Such kernels may be
        replayed from a CUDA graph (graphs.py).

        local: True (or a function of the command's Entry returning True) when
        a command of it never communicates on any rank: no collective, no
        point-to-point message, no result sent to the master, no wait on
        another rank, whatever the data (a replica-cache lookup whose miss
        would communicate is not local). The master may then queue the
        command and send it later with others in one control message
        (dispatch.py, "Queued commands"). The answer must be a function of the
        signature only.
        """
        def register(fn):
            if backend in self.kernels:
                raise ValueError(f"kernel {self.name!r} registered twice for backend {backend!r}")
            self.kernels[backend] = (fn, capturable)
            self.local_rules[backend] = local
            return fn
        return register

    def static(self, **values):
        """The static arguments as this op's `args` (checked against its annotations)."""
        args = self.args(**values)
        for field, value in zip(args._fields, args):
            want = self.args.__annotations__.get(field)
            if want is not None and not isinstance(value, want):
                raise TypeError(f"operation {self.name!r}: static argument {field}={value!r} is not {want}")
        return args

    def lookup(self, backend):
        """(kernel, capture rule) on the backend named `backend`."""
        found = self.kernels.get(backend) or self.kernels.get(None)
        if found is None:
            raise KeyError(f"operation {self.name!r} has no kernel for backend {backend!r}")
        return found


    def local_rule(self, backend):
        """The local rule of the kernel `lookup(backend)` returns."""
        return self.local_rules[backend if backend in self.kernels else None]


def define(name, args=None):
    """Define operation `name` (once) with static arguments of class `args`; returns the Op."""
    if name in OPS:
        raise ValueError(f"operation {name!r} defined twice")
    op = OPS[name] = Op(name, args)
    return op


def kernel(name, capturable=False, backend=None, local=False):
    """Shorthand for an operation with positional static arguments: its Op's `kernel` decorator.

    The first kernel defines the Op; a backend's kernel registered later
    under the same name joins it.
    """
    op = OPS.get(name) or define(name)
    return op.kernel(backend, capturable, local)


def lookup(name, backend):
    """(kernel, capture rule) of operation `name` on the backend named `backend` ('cpu' or 'gpu')."""
    op = OPS.get(name)
    if op is None:
        raise KeyError(f"no kernel registered for operation {name!r}")
    return op.lookup(backend)


def local_rule(name, backend):
    """The local rule (see `Op.kernel`) of operation `name`'s kernel on the backend named `backend`."""
    return OPS[name].local_rule(backend)


def is_local(entry):
    """Whether `entry`'s commands never communicate (the master may queue them; the same answer on
    every rank, though only the master asks)."""
    rule = entry.local_rule
    return bool(rule(entry)) if callable(rule) else bool(rule)


def generic(name):
    """The backend-independent kernel of `name` (what a backend's own kernel falls back to)."""
    return OPS[name].kernels[None][0]


def capture_hook(fn):
    """Have `fn(lanes)` run before every CUDA-graph capture (a library's one-time setup; `lanes`: the
    streams the capture will issue on, each of which may need its own scratch); returns fn."""
    CAPTURE_HOOKS[fn] = None
    return fn


def prepare_capture(lanes=1):
    """Run every capture hook (graphs.py, before a capture on `lanes` streams begins)."""
    for fn in CAPTURE_HOOKS:
        fn(lanes)


def capturable(entry):
    """Whether `entry`'s kernel may be captured into a CUDA graph (the same answer on every rank)."""
    rule = entry.capture_rule
    return bool(rule(entry)) if callable(rule) else bool(rule)
