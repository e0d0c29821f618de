"""Optimizer: per-parameter update rules issued as dmath commands on the workers.

A step is a fixed sequence of commands on persistent matrices (parameters,
their state, and tiny (1, 1) matrices for the learning rate and step
counters), so it can be recorded once as a dmath plan and replayed. Values
that change between steps live on the workers: the learning rate is a (1, 1)
matrix the master rewrites only when the schedule changes it (outside the
recorded step), and Adam's bias corrections are (1, 1) matrices updated by
the step itself.

Gradients may arrive in any layout: Partial weight gradients of data
parallelism are all-reduced here by remapping them to the parameter's layout
(and dtype) before the update. Weight decay adds `weight_decay * w` to the
gradient, as PyTorch.

Mixed precision passes a `gate`: a (1, 1) matrix, 1 when every gradient is
finite and 0 otherwise. Gated, the gradient's non-finite values are replaced
by zeros, the learning rate is multiplied by the gate and the state's decay
factors become 1 where the gate is 0: a skipped step changes nothing, with no
master-side decision inside the recorded step.
"""
import contextlib
import math
import numbers
import weakref

import numpy as np

import dmath

from ..errors import ConfigError, GraphError
from ..graph.execute import plain_layout
from ..graph.node import Variable
from . import schedules as _schedules


def setting(name, check):
    """A hyper-parameter that may change between fits, or from a callback's on_batch_end during one
    (the recorded step is rebuilt for the next step: its key holds it): every assignment, the
    constructor's included, stores check(optimizer, value), so a later one is checked as the
    constructor's argument; the value lives in `_<name>` (state_names may follow it)."""
    attr = "_" + name
    return property(lambda self: getattr(self, attr), lambda self, value: setattr(self, attr, check(self, value)))


class StepScalars:
    """The per-step hyper-parameters a rule reads: `lr` and `factor(value)`, gated or not."""

    def __init__(self, lr, gate):
        self.lr, self.gate = lr, gate
        self._factors = {}

    def factor(self, value):
        """A decay factor (a Python float), or a (1, 1) matrix that is 1 on skipped steps when gated."""
        if self.gate is None:
            return value
        m = self._factors.get(value)
        if m is None:
            m = self._factors[value] = self.gate * (value - 1.0) + 1.0
        return m


class Optimizer:
    """Base of the optimizers; subclasses define `state_names` and `update`.

    Args:
        lr: the base learning rate.
        weight_decay: L2 penalty, added to the gradient as `weight_decay * w`.
        schedule: None, or a schedule from dnn.optim.schedules giving the
            learning rate of each step (warm-up, step decay, cosine, ...).
        foreach: rules with a form over lists (SGD, Adam) step the parameters of one dtype
            together (few commands and GPU kernels); False: one command per parameter.
    """

    #: names of the per-parameter state matrices (zeros at the start)
    state_names = ()
    #: True when the rule has a one-pass kernel: `fused_update` is called instead of `update`
    fused = False
    #: the state matrices that are never negative (sums of squares): a saved negative one is refused
    non_negative_state = ()
    #: {scalar name: (lowest, highest)}: the values a saved per-step scalar (new_scalars) may take
    scalar_bounds = {}

    def __init__(self, lr, weight_decay=0.0, schedule=None, foreach=True):
        self.lr = _positive(lr, "lr")
        self.foreach = foreach
        self.weight_decay = weight_decay
        self.schedule = schedule
        self.iterations = 0            # steps taken (the schedule's clock)
        # param Variable -> {name: Matrix}, held weakly: the state of a model's parameters goes with
        # them, and a later model's Variables never meet it (an id would be reused)
        self._state = weakref.WeakKeyDictionary()
        self._scalars = {}             # dtype -> {'lr': Matrix, ...}: per-step (1, 1) matrices
        self._lr_written = {}          # dtype -> the learning rate value in the 'lr' matrix

    # may change between fits (or from a callback), checked as the constructor's arguments: a value
    # the constructor refuses (foreach='no', weight_decay=-1) was taken by an assignment and trained
    # with. (lr is checked where it is read, current_lr: 0 is a rate there, a warm-up's first steps.)
    weight_decay = setting("weight_decay", lambda opt, value: _non_negative(value, "weight_decay"))
    foreach = setting("foreach", lambda opt, value: _bool(value, "foreach"))
    schedule = setting("schedule", lambda opt, value: _schedule(value))

    # ---- configuration --------------------------------------------------------
    def get_config(self):
        """The constructor's arguments (JSON-able), with the optimizer's name."""
        cfg = {"name": type(self).__name__, "lr": self.lr, "weight_decay": self.weight_decay}
        cfg.update(self._hyper())
        cfg["schedule"] = self.schedule.get_config() if self.schedule is not None else None
        return cfg

    def _hyper(self):
        return {}

    def current_lr(self):
        """The learning rate of the next step (the schedule's value, or lr), checked here: `lr` may
        have been assigned since the constructor and a schedule may be a user's, and a negative rate
        would train uphill silently, NaN or inf surface only as a NaN guard's error and a string as a
        raw TypeError. 0 is a rate (a warm-up's first steps)."""
        base = self.lr
        if not _is_rate(base):
            raise ConfigError(f"{type(self).__name__}'s lr must be a finite number >= 0, got {base!r}")
        if self.schedule is None:
            return float(base)
        lr = self.schedule(self.iterations, base)
        if not _is_rate(lr):
            raise ConfigError(f"the schedule {self.schedule!r} of {type(self).__name__} gave the learning rate "
                              f"{lr!r} at step {self.iterations}; expected a finite number >= 0")
        return float(lr)

    # ---- the momentum the update commands use ------------------------------------------
    #: None, or the momentum a training loop substitutes while it issues update commands
    #: (asynchronous SGD's staleness rule, dnn.training.asgd): never stored in the checked setting,
    #: whose rules (SGD's nesterov needs momentum > 0) are the user's, not a correction's
    _momentum_override = None

    def step_momentum(self):
        """The momentum the update commands use: the override while one is in force, else `momentum`
        (0.0 for rules without one)."""
        if self._momentum_override is not None:
            return self._momentum_override
        return getattr(self, "momentum", 0.0)

    @contextlib.contextmanager
    def momentum_override(self, mu):
        """Within the block, update commands use the momentum `mu` (a float in [0, 1)) in place of the
        user's; `momentum`, get_config and checkpoints keep showing the user's."""
        self._momentum_override = float(mu)
        try:
            yield
        finally:
            self._momentum_override = None

    # ---- the step, in two halves -------------------------------------------------
    def prepare(self, params, lr_scale=1.0):
        """Master-side, outside a recorded step: make the state and write the next learning rate
        (times `lr_scale`: asynchronous SGD's staleness-aware rate, dnn.training.asgd)."""
        names = self.state_names
        wanted = set(names)           # (once: this runs every step, for every parameter)
        for p in params:
            self._check_param(p)
            state = self._state.get(p)
            if state is None:
                self._state[p] = {name: dmath.zeros(p.shape, dtype=p.dtype, layout=plain_layout(p.value))
                                  for name in names}
                continue
            # a parameter moved to another layout (parallel='auto' decided after a load): its state follows
            for name, m in state.items():
                if m.layout != p.value.layout:
                    state[name] = m.remap(plain_layout(p.value))
            if state.keys() != wanted:
                # state_names follows the settings (SGD's momentum turned on between fits): the state a
                # setting now needs starts at zeros, as a fresh optimizer's; what it no longer reads goes
                self._state[p] = {name: state[name] if name in state else
                                  dmath.zeros(p.shape, dtype=p.dtype, layout=plain_layout(p.value))
                                  for name in names}
        lr = self.current_lr() * lr_scale
        for dtype in {p.dtype for p in params}:
            s = self._step_scalars(dtype)
            if self._lr_written.get(dtype) != lr:
                s["lr"].set((0, 0), lr)
                self._lr_written[dtype] = lr

    def apply(self, params, grads, gate=None, grad_scale=None):
        """Issue the update commands (recordable): gradients to the parameters' layouts, then the rules.

        grads: one matrix per parameter (None: no gradient, the parameter is left alone).
        gate: None, or a (1, 1) matrix, 0 to skip this step (mixed-precision overflow).
        grad_scale: None, or a (1, 1) matrix the gradients are divided by (the loss scale).
        Rules with a fused kernel (`fused_update`) read each gradient, parameter and state once;
        the others run as elementwise commands. A parameter listed twice is refused (ConfigError),
        by every rule: AdaGrad and RMSProp applied two updates to it.
        """
        if len(params) != len(grads):
            raise GraphError(f"{len(params)} parameters but {len(grads)} gradients")
        seen = set()
        for p in params:
            if id(p.value) in seen:
                raise ConfigError(f"the parameter {p.name!r} appears twice among the parameters of one step: each "
                                  f"is updated in place once a step (list it once)")
            seen.add(id(p.value))
        by_dtype = {}
        for p in params:
            if p.dtype not in by_dtype:
                s = self._step_scalars(p.dtype)
                # a fused rule skips a gated step on the device: its learning rate needs no gating
                lr = s["lr"] if gate is None or self.fused else s["lr"] * gate
                by_dtype[p.dtype] = StepScalars(lr, gate)
                self.begin_step(s, by_dtype[p.dtype])
        fused = {}                      # dtype -> (params, grads, states) of a fused rule, one call each
        for p, g in zip(params, grads):
            if g is None:
                continue
            h = by_dtype[p.dtype]
            if self.fused:
                # the kernel reads a float16 gradient as it is, skips a gated step on the device
                # and applies the weight decay itself
                h.grad_scale, h.gate = grad_scale, gate
                lists = fused.setdefault(p.dtype, ([], [], []))
                lists[0].append(p.value)
                lists[1].append(to_layout_of(g, p.value, keep_dtype=True))
                lists[2].append(self._state[p])
                continue
            g = to_layout_of(g, p.value)
            if grad_scale is not None:
                g = g / grad_scale
            if self.weight_decay:
                g = g + p.value * self.weight_decay
            if gate is not None:
                g = dmath.where(gate, g, 0.0)     # NaN/inf -> 0 on a skipped step
            self.update(p.value, g, self._state[p], h)
        for dtype, (ps, gs, states) in fused.items():
            self.fused_update_many(ps, gs, states, by_dtype[dtype])

    def finish(self):
        """Master-side, after the step: advance the schedule's clock."""
        self.iterations += 1

    def step(self, params, grads, gate=None):
        """One whole update (prepare, apply, finish) of `params` (Variables) with `grads` (matrices)."""
        params = list(params)
        self.prepare(params)
        self.apply(params, list(grads), gate)
        self.finish()

    def minimize(self, expr, variables):
        """One gradient step on `expr` (a (1, 1) node, or summed) with respect to `variables` (MagmaDNN's API)."""
        from ..graph import gradients
        variables = list(variables)
        for v in variables:
            self._check_param(v)
        self.step(variables, gradients(expr, variables))

    # ---- what subclasses write ------------------------------------------------------
    def begin_step(self, scalars, h):
        """Once per step and dtype, before the rules: update step counters in `scalars` (recordable)."""

    def update(self, p, g, state, h):
        """Update the matrix `p` in place from the gradient `g` (already in p's layout)."""
        raise NotImplementedError

    def fused_update(self, p, g, state, h):
        """The whole update of `p` as one dmath.nn command (rules with `fused = True`): g is the raw
        gradient in p's layout (any float dtype), h.grad_scale and h.gate are None or (1, 1) matrices,
        the weight decay is the rule's to apply."""
        raise NotImplementedError


    def fused_update_many(self, params, grads, states, h):
        """fused_update of every parameter of a list (one dtype): rules with a form over lists
        (dmath.nn.sgd_update_many) override it, to step them all in few kernels."""
        for p, g, state in zip(params, grads, states):
            self.fused_update(p, g, state, h)

    def new_scalars(self, dtype):
        """Extra (1, 1) per-step matrices of this optimizer: {name: initial value}."""
        return {}

    # ---- state, for save and load ---------------------------------------------------
    def has_state(self, p):
        """Whether parameter Variable p has state here (it took a step, or a load restored it)."""
        return p in self._state

    def get_state(self, params):
        """{name: numpy array} of everything the optimizer keeps (state matrices, counters)."""
        out = {"iterations": np.array(self.iterations, dtype=np.int64)}
        for i, p in enumerate(params):
            for name, m in self._state.get(p, {}).items():
                out[f"param{i}/{name}"] = m.to_numpy()
        for dtype, s in self._scalars.items():
            for name, m in s.items():
                if name != "lr":
                    out[f"scalars/{dtype}/{name}"] = m.to_numpy()
        return out

    def check_state(self, params, arrays):
        """`get_state`'s arrays checked for `params`, without changing anything: {"iterations": int,
        "params": [{name: array}, ...] (one per parameter, the names it holds), "scalars": {(dtype,
        name): float}}, what `set_state` writes. ConfigError names the first array that is not
        exactly what get_state writes: a step count that is not one whole number in [0, 2**63) (an
        int64 in a file), a state array of another shape than its parameter's (a (2, 9) moment saved
        transposed as (9, 2) was reshaped: every shape was always the parameter's, so no older file
        needs that), of values that are not finite (or negative in `non_negative_state`, a sum of
        squares) or past the parameter dtype's range, a scalar that is not one finite value in
        `scalar_bounds`, or one this optimizer does not keep."""
        it = np.asarray(arrays.get("iterations", 0))
        steps = it.reshape(-1)[0].item() if it.size == 1 and it.dtype.kind in "iuf" else None    # a Python number
        if steps is None or not math.isfinite(steps) or steps != math.floor(steps) or not 0 <= steps < 2 ** 63:
            raise ConfigError(f"the optimizer's step count 'iterations' must be one whole number in [0, 2**63), "
                              f"got {_shown(it)}")
        checked = {"iterations": int(steps), "params": [], "scalars": {}}
        for i, p in enumerate(params):
            mine = {}
            for name in self.state_names:
                key = f"param{i}/{name}"
                if key in arrays:
                    mine[name] = self._checked_state(key, arrays[key], p, name in self.non_negative_state)
            checked["params"].append(mine)
        dtypes = {str(p.dtype) for p in params}
        for key, a in arrays.items():
            if not key.startswith("scalars/"):
                continue
            parts = key.split("/")
            if len(parts) != 3 or parts[1] not in dtypes or parts[2] not in self.new_scalars(parts[1]):
                raise ConfigError(f"the optimizer state {key!r} is none of {type(self).__name__}'s per-step "
                                  f"scalars (scalars/<dtype of a parameter>/<name>: "
                                  f"{sorted(self.new_scalars('float32'))})")
            v = np.asarray(a)
            lo, hi = self.scalar_bounds.get(parts[2], (-np.inf, np.inf))
            if v.size != 1 or v.dtype.kind not in "iuf" or not np.isfinite(v).all() \
                    or not lo <= float(v.reshape(-1)[0]) <= hi:
                raise ConfigError(f"the optimizer state {key!r} must be one finite value in [{lo}, {hi}], "
                                  f"got {_shown(v)}")
            checked["scalars"][parts[1], parts[2]] = float(v.reshape(-1)[0])
        return checked

    @staticmethod
    def _checked_state(key, a, p, non_negative):
        a = np.asarray(a)
        if a.shape != tuple(p.shape):
            raise ConfigError(f"the optimizer state {key!r} has shape {a.shape}, its parameter's is {tuple(p.shape)}")
        if a.dtype.kind not in "iuf":
            raise ConfigError(f"the optimizer state {key!r} must hold numbers, got dtype {a.dtype}")
        if a.size:
            if not np.isfinite(a).all():
                raise ConfigError(f"the optimizer state {key!r} holds NaN or infinity")
            top = float(np.finfo(p.dtype).max)
            if float(np.abs(a).max()) > top:
                raise ConfigError(f"the optimizer state {key!r} holds {float(np.abs(a).max()):g}, past the largest "
                                  f"{p.dtype} ({top:g})")
            if non_negative and float(a.min()) < 0:
                raise ConfigError(f"the optimizer state {key!r} holds {float(a.min()):g}; it is a sum of squares, "
                                  f"never negative")
        return a

    def set_state(self, params, arrays):
        """Restore what `get_state` returned (for the same parameters, in the same order). Everything is
        checked first (check_state): a ConfigError leaves the optimizer as it was."""
        checked = self.check_state(params, arrays)
        self.write_state(params, checked)

    def write_state(self, params, checked):
        """Write `check_state`'s result for `params` (the step count, the state, the scalars)."""
        self.iterations = checked["iterations"]
        self.prepare(params)
        for p, mine in zip(params, checked["params"]):
            state = self._state[p]
            for name, a in mine.items():
                state[name].assign(np.ascontiguousarray(a, dtype=state[name].dtype))
        for (dtype, name), value in checked["scalars"].items():
            self._step_scalars(dtype)[name].set((0, 0), value)

    def copy_state(self, src, dst):
        """Write the state of parameter `src` into that of `dst` (Variables of one shape, both
        prepared), in place and whatever their layouts: recorded steps reading dst's state stay
        valid. Asynchronous training moves the state between the model and its parameter store."""
        for name, m in self._state[dst].items():
            m.assign(self._state[src][name])

    def forget(self, params):
        """Drop the state of `params` now (it also goes when they are collected)."""
        for p in params:
            self._state.pop(p, None)

    # ---- helpers -------------------------------------------------------------------------
    def _step_scalars(self, dtype):
        s = self._scalars.get(dtype)
        if s is None:
            rep = dmath.Replicated()
            s = {"lr": dmath.full((1, 1), self.current_lr(), dtype=dtype, layout=rep)}
            self._lr_written[dtype] = self.current_lr()
            for name, value in self.new_scalars(dtype).items():
                s[name] = dmath.full((1, 1), value, dtype=dtype, layout=rep)
            self._scalars[dtype] = s
        return s

    @staticmethod
    def _check_param(p):
        if not isinstance(p, Variable):
            raise GraphError(f"optimizers update dnn.graph Variables, got {p!r}")


def to_layout_of(g, p, keep_dtype=False, background=False, dtype=None):
    """The gradient g in the layout and dtype of the parameter matrix p (an all-reduce for a Partial g).

    keep_dtype: a gradient already in p's layout keeps its dtype (a fused rule reads it as it is);
    one that must move is converted on the way, so a sum over workers runs in p's precision.
    background: the all-reduce overlaps the commands issued after it (Matrix.remap).
    dtype: what a move converts to instead of p's dtype (float16 gradients summed in float16)."""
    if tuple(g.shape) != tuple(p.shape):
        raise GraphError(f"a gradient of shape {tuple(g.shape)} for a parameter of shape {tuple(p.shape)}")
    if g.layout == p.layout and (g.dtype == p.dtype or keep_dtype):
        return g
    if keep_dtype and g.placed_as(p):
        return g        # e.g. a Partial over one worker: its only addend is the sum, already in place
    return g.remap(p.layout, dtype=p.dtype if dtype is None else dtype, background=background)


def _schedule(v):
    """None or a dnn.optim.schedules schedule."""
    if v is not None and not isinstance(v, _schedules.Schedule):
        raise ConfigError(f"schedule must be a dnn.optim.schedules schedule, got {v!r}")
    return v


def _shown(a):
    """A saved array for an error message: its values when few, its shape otherwise."""
    return repr(a.tolist()) if a.size <= 4 else f"an array of shape {a.shape}"


def _is_rate(v):
    """Whether v is a learning rate: a real number (not a bool), finite, >= 0."""
    return not isinstance(v, bool) and isinstance(v, numbers.Real) and math.isfinite(v) and v >= 0


def _bool(v, what):
    """A real bool: a truthy string ('no') or a number is refused, not read as True."""
    if not isinstance(v, bool):
        raise ConfigError(f"{what} must be True or False, got {v!r}")
    return v


def _positive(v, what):
    if isinstance(v, bool) or not isinstance(v, numbers.Real) or not v > 0 or not math.isfinite(v):
        raise ConfigError(f"{what} must be a positive number, got {v!r}")
    return float(v)


def _non_negative(v, what):
    if isinstance(v, bool) or not isinstance(v, numbers.Real) or not v >= 0 or not math.isfinite(v):
        raise ConfigError(f"{what} must be a non-negative number, got {v!r}")
    return float(v)


def _unit(v, what, closed=False):
    """A number in [0, 1) (or [0, 1] when closed)."""
    if isinstance(v, bool) or not isinstance(v, numbers.Real) or not (0 <= v < 1 or (closed and v == 1)):
        raise ConfigError(f"{what} must be in [0, 1{']' if closed else ')'}, got {v!r}")
    return float(v)
