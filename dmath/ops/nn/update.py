"""Fused parameter updates (SGD with momentum, Adam) and the all-finite test of mixed precision.

An optimizer written with elementwise operations reads and writes every
parameter-sized array several times per step (AlexNet's 61M weights: about
ten passes over 244 MB for SGD with momentum and loss scaling) and launches
a dozen kernels per parameter. Here one kernel per parameter reads the
gradient, the parameter and its state once and writes them once.

The rules are PyTorch's: g = grad / grad_scale (+ weight_decay * p);
SGD: v = momentum * v + g, d = g + momentum * v (nesterov) or v (or g without
momentum), p -= lr * d; Adam: m = b1 m + (1 - b1) g, v = b2 v + (1 - b2) g^2,
p -= step_size * m / (sqrt(v) * denom_scale + eps). A `gate` of 0 (a
non-finite gradient somewhere in a mixed-precision step) leaves everything
unchanged, decided on the device, so a recorded step needs no master-side
branch. Values are computed in float32 for float16/float32 parameters and in
float64 for float64 ones; the gradient may have another dtype (float16
gradients of float32 master weights are read as they are).

The master halves (`sgd_update`, `adam_update`, `all_finite`, exported by
dmath.nn) check everything first: shapes, float dtypes, the state in the
parameter's layout (the gradient is remapped to it, a Partial one summed on
the way), (1, 1) scalars replicated on the parameter's workers. Operands
therefore arrive aligned: gradient and state in the parameter's
distribution, the step scalars on its workers, so a worker only combines its
own pieces. A step scalar is either a Python float or a (1, 1) matrix that
lives on the workers: a recorded training step keeps reading the current
values of the matrices at every replay, with no message from the master.
"""
import math
import numbers
from typing import NamedTuple

import numpy as np

from ... import backend
from ...comm import collectives
from ...errors import DMathError, DTypeError, LayoutError, ShapeError
from ...layout import Replicated, RowBlock, distribution
from ...runtime import define, protocol, runtime
from ...runtime.registry import collectives_in_graphs
from ...gpu import launcher as cuda
from . import args, rows
from ..elementwise import minimum
from ..base import dispatch, dist_of, is_matrix, new_meta


class UpdateArgs(NamedTuple):
    """Static arguments of `nn_update`."""
    rule: str            # 'sgd' or 'adam'
    hyper: tuple         # sgd: (momentum, nesterov, weight_decay); adam: (beta1, beta2, eps, weight_decay)
    step_scalars: tuple  # per step scalar, in the kernel's order: (name, present, on the device)


UPDATE = define("nn_update", UpdateArgs)


class UpdateManyArgs(NamedTuple):
    """Static arguments of `nn_update_many`: nn_update's, and how many parameters the command updates."""
    rule: str
    hyper: tuple
    step_scalars: tuple
    count: int


UPDATE_MANY = define("nn_update_many", UpdateManyArgs)
# the matrices' number and layouts are the signature: no static arguments
ALL_FINITE = define("nn_all_finite")
#: the most matrices one nn_all_finite command reads: with its output, a command names at most
#: protocol.MAX_OPERANDS handles (a byte of the frame's header counts them)
FINITE_CHUNK = protocol.MAX_OPERANDS - 1


# ---- master halves ----------------------------------------------------------------------
_FLOATS = ("float16", "float32", "float64")


def _matrix(m, what):
    """`m`, which must be a Matrix of a float dtype."""
    if not is_matrix(m):
        raise DMathError(f"{what} must be a dmath.Matrix, got {type(m).__name__}")
    if m.dtype not in _FLOATS:
        raise DTypeError(f"{what} must have a float dtype {_FLOATS}, got {m.dtype}")
    return m


def _same_place(m, ref):
    p = runtime().nworkers
    return distribution(m.layout, m.shape, p).same_placement(distribution(ref.layout, ref.shape, p))


def _state(m, param, what):
    """A state matrix: the parameter's shape, dtype and placement (it is written in place)."""
    _matrix(m, what)
    if m.shape != param.shape or m.dtype != param.dtype:
        raise ShapeError(f"{what} must have the parameter's shape {param.shape} and dtype {param.dtype}, "
                         f"got {m.shape} {m.dtype}")
    if m.layout.partial or not _same_place(m, param):
        raise LayoutError(f"{what} must be laid out as the parameter ({param.layout}), got {m.layout}")
    return m


def _grad(g, param):
    _matrix(g, "the gradient")
    if g.shape != param.shape:
        raise ShapeError(f"the gradient has shape {g.shape}, the parameter {param.shape}")
    if not g.placed_as(param):
        g = g.remap(param.layout)             # a Partial gradient is all-reduced into place
    return g


def _scalar(x, name, group, positive=False):
    """('device', Matrix replicated on `group`) or ('host', float) or None."""
    if x is None:
        return None
    if is_matrix(x):
        _matrix(x, name)
        if x.shape != (1, 1):
            raise ShapeError(f"{name} must be a (1, 1) Matrix or a float, got shape {x.shape}")
        lay = x.layout
        if not (lay.replicated and set(group) <= set(lay.members(runtime().nworkers))):
            x = x.remap(Replicated(group))
        return ("device", x)
    if isinstance(x, (bool, np.bool_)) or not isinstance(x, numbers.Real) or not math.isfinite(x) \
            or (positive and not x > 0):
        raise DMathError(f"{name} must be a {'positive ' if positive else ''}finite number or a (1, 1) Matrix, "
                         f"got {x!r}")
    return ("host", float(x))


def _unit(v, what):
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, numbers.Real) or not 0 <= v < 1:
        raise DMathError(f"{what} must be in [0, 1), got {v!r}")
    return float(v)


def _non_negative(v, what):
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, numbers.Real) or not (v >= 0 and math.isfinite(v)):
        raise DMathError(f"{what} must be a finite number >= 0, got {v!r}")
    return float(v)


def _param(param):
    _matrix(param, "the parameter")
    if param.layout.partial:
        raise LayoutError("the parameter must not be Partial (it is updated in place)")
    return param


def _step_scalars(scalars, group):
    """(device scalar matrices, host values, the static (name, present, on the device) flags) of the step
    scalars [(name, value, checks)] for the workers `group`."""
    device, host, has = [], [], []
    for name, value, kw in scalars:
        s = _scalar(value, name, group, **kw)
        has.append((name, s is not None, s is not None and s[0] == "device"))
        if s is not None:
            (device if s[0] == "device" else host).append(s[1])
    return device, host, tuple(has)


def _run(rule, hyper, param, grad, state, scalars):
    """Dispatch nn_update: scalars is [(name, value, checks)] in the kernel's order."""
    _once([param] + list(state))
    grad = _grad(grad, _param(param))
    device, host, has = _step_scalars(scalars, tuple(dist_of(param).group))
    outputs = [0] + [2 + k for k in range(len(state))]
    static = UPDATE.static(rule=rule, hyper=hyper, step_scalars=has)
    dispatch("nn_update", [param, grad] + list(state) + device, outputs, static=static, scalars=host)
    return param


def _once(written):
    """DMathError unless every matrix an update writes in place (parameters, states) is a different one:
    the same matrix as exp_avg and exp_avg_sq, or as a parameter and its momentum buffer, was written
    twice by one step (the one state lost, without a word)."""
    if len({id(m) for m in written}) != len(written):
        raise DMathError("a parameter or state matrix appears twice: each is updated in place once a step")


def many_chunks(count, nstate, ndevice):
    """[(lo, hi)]: `count` parameters with `nstate` state matrices each split into nn_update_many
    commands, each within protocol.MAX_OPERANDS handles (every parameter's inputs and in-place outputs,
    and the `ndevice` step scalars; a pure rule)."""
    per = max(1, (protocol.MAX_OPERANDS - ndevice) // (2 + nstate + 1 + nstate))
    return [(lo, min(lo + per, count)) for lo in range(0, count, per)]


def _run_many(rule, hyper, params, grads, states, scalars):
    """Dispatch nn_update_many for lists of parameters, gradients and states (a list per parameter),
    one command per group of workers and chunk; every parameter is checked before any update is sent."""
    params, grads = list(params), list(grads)
    if len(params) != len(grads) or len(params) != len(states):
        raise DMathError(f"{len(params)} parameters, {len(grads)} gradients and {len(states)} states: one "
                         "of each per parameter")
    _once([m for p, st in zip(params, states) for m in [p] + list(st)])
    groups = {}
    for p, g, st in zip(params, grads, states):
        groups.setdefault(tuple(dist_of(_param(p)).group), []).append((p, _grad(g, p), st))
    sends = []
    for group, items in groups.items():
        device, host, has = _step_scalars(scalars, group)
        nstate = len(items[0][2])
        for lo, hi in many_chunks(len(items), nstate, len(device)):
            part = items[lo:hi]
            k = len(part)
            inputs = [p for p, _, _ in part] + [g for _, g, _ in part] + \
                [st[j] for j in range(nstate) for _, _, st in part] + device
            outputs = list(range(k)) + list(range(2 * k, (2 + nstate) * k))
            sends.append((inputs, outputs, UPDATE_MANY.static(rule=rule, hyper=hyper, step_scalars=has, count=k),
                          host))
    for inputs, outputs, static, host in sends:
        dispatch("nn_update_many", inputs, outputs, static=static, scalars=host)
    return params


def sgd_update(param, grad, lr, momentum_buffer=None, *, momentum=0.0, nesterov=False, weight_decay=0.0,
               grad_scale=None, gate=None):
    """One SGD step of `param` in place, in one pass (PyTorch's rule); returns `param`.

        g = grad / grad_scale + weight_decay * param
        v = momentum * v + g;  d = g + momentum * v (nesterov) or v;  param -= lr * d

    grad: any layout (remapped to the parameter's; a Partial gradient is
    summed on the way), any float dtype (a float16 gradient of float32
    weights is read as it is). momentum_buffer: the state v (the
    parameter's shape, dtype and layout), required when momentum > 0.
    lr, grad_scale: floats or (1, 1) matrices read on the workers at every
    run (a recorded step follows their current values). gate: None or a
    (1, 1) matrix; where it holds 0 the step changes nothing
    (mixed precision after a non-finite gradient, see all_finite).
    """
    _matrix(param, "the parameter")
    hyper = _sgd_hyper(momentum, nesterov, weight_decay)
    state = []
    if hyper[0]:
        if momentum_buffer is None:
            raise DMathError("momentum > 0 needs a momentum_buffer (zeros of the parameter's shape and layout)")
        state.append(_state(momentum_buffer, param, "momentum_buffer"))
    return _run("sgd", hyper, param, grad, state, _sgd_scalars(lr, gate, grad_scale))


def _sgd_hyper(momentum, nesterov, weight_decay):
    momentum = _unit(momentum, "momentum")
    nesterov = args.flag(nesterov, "nesterov")
    if nesterov and not momentum:
        raise DMathError("nesterov momentum needs momentum > 0")
    return momentum, nesterov, _non_negative(weight_decay, "weight_decay")


def _sgd_scalars(lr, gate, grad_scale):
    return [("lr", lr, {}), ("gate", gate, {}), ("grad_scale", grad_scale, {"positive": True})]


def adam_update(param, grad, exp_avg, exp_avg_sq, step_size, denom_scale=1.0, *, beta1=0.9, beta2=0.999,
                eps=1e-8, weight_decay=0.0, grad_scale=None, gate=None):
    """One Adam step of `param` in place, in one pass; returns `param`.

        g = grad / grad_scale + weight_decay * param
        m = beta1 m + (1 - beta1) g;  v = beta2 v + (1 - beta2) g^2
        param -= step_size * m / (sqrt(v) * denom_scale + eps)

    With t steps taken, PyTorch's Adam is step_size = lr / (1 - beta1^t) and
    denom_scale = 1 / sqrt(1 - beta2^t). exp_avg, exp_avg_sq: the state (the
    parameter's shape, dtype and layout). step_size, denom_scale,
    grad_scale: floats or (1, 1) matrices; grad and gate as in sgd_update.
    """
    _matrix(param, "the parameter")
    state = [_state(exp_avg, param, "exp_avg"), _state(exp_avg_sq, param, "exp_avg_sq")]
    return _run("adam", _adam_hyper(beta1, beta2, eps, weight_decay), param, grad, state,
                _adam_scalars(step_size, denom_scale, gate, grad_scale))


def _adam_hyper(beta1, beta2, eps, weight_decay):
    eps = float(eps) if isinstance(eps, numbers.Real) and not isinstance(eps, bool) else eps
    if not isinstance(eps, float) or not (eps > 0 and math.isfinite(eps)):
        raise DMathError(f"eps must be a positive number, got {eps!r}")
    return _unit(beta1, "beta1"), _unit(beta2, "beta2"), eps, _non_negative(weight_decay, "weight_decay")


def _adam_scalars(step_size, denom_scale, gate, grad_scale):
    return [("step_size", step_size, {}), ("denom_scale", denom_scale, {}), ("gate", gate, {}),
            ("grad_scale", grad_scale, {"positive": True})]


def sgd_update_many(params, grads, lr, momentum_buffers=None, *, momentum=0.0, nesterov=False, weight_decay=0.0,
                    grad_scale=None, gate=None):
    """sgd_update of every parameter of the list `params` (with `grads` and, for momentum > 0, the
    `momentum_buffers`, one per parameter), each one exactly as sgd_update steps it, in few commands:
    one per group of workers and chunk of parameters, whose GPU kernel updates a whole table of arrays
    per launch (a launch per parameter cost more than the update of most). Returns `params`."""
    hyper = _sgd_hyper(momentum, nesterov, weight_decay)
    params = [_param(p) for p in params]
    if hyper[0]:
        buffers = list(momentum_buffers) if momentum_buffers is not None else []
        if len(buffers) != len(params):
            raise DMathError(f"momentum > 0 needs a momentum_buffer per parameter: {len(params)} parameters, "
                             f"{len(buffers)} buffers")
        states = [[_state(v, p, "momentum_buffer")] for p, v in zip(params, buffers)]
    else:
        states = [[] for _ in params]
    return _run_many("sgd", hyper, params, grads, states, _sgd_scalars(lr, gate, grad_scale))


def adam_update_many(params, grads, exp_avgs, exp_avg_sqs, step_size, denom_scale=1.0, *, beta1=0.9, beta2=0.999,
                     eps=1e-8, weight_decay=0.0, grad_scale=None, gate=None):
    """adam_update of every parameter of the list `params` (with `grads`, `exp_avgs` and `exp_avg_sqs`,
    one per parameter), each one exactly as adam_update steps it, in few commands (see
    sgd_update_many). Returns `params`."""
    hyper = _adam_hyper(beta1, beta2, eps, weight_decay)
    params, exp_avgs, exp_avg_sqs = [_param(p) for p in params], list(exp_avgs), list(exp_avg_sqs)
    if not len(exp_avgs) == len(exp_avg_sqs) == len(params):
        raise DMathError(f"adam_update_many needs an exp_avg and an exp_avg_sq per parameter: {len(params)} "
                         f"parameters, {len(exp_avgs)} and {len(exp_avg_sqs)}")
    states = [[_state(m, p, "exp_avg"), _state(v, p, "exp_avg_sq")] for p, m, v in zip(params, exp_avgs, exp_avg_sqs)]
    return _run_many("adam", hyper, params, grads, states, _adam_scalars(step_size, denom_scale, gate, grad_scale))


def all_finite(matrices):
    """A (1, 1) float32 Matrix, Replicated on the matrices' workers: 1.0 when every element of every
    matrix is finite, else 0.0. Decided on the workers (no value comes back to the master), so it
    can gate a recorded mixed-precision step: `sgd_update(..., gate=all_finite(grads))`.

    The matrices may have any float dtype and layout, but must live on the same workers; a Partial
    matrix is summed first (a non-finite addend makes a non-finite sum). Any number of matrices: past
    FINITE_CHUNK they are read by several commands, whose flags are combined on the workers.
    """
    mats = [_matrix(m, "all_finite: each matrix") for m in matrices]
    if not mats:
        raise DMathError("all_finite needs at least one matrix")
    mats = [m.remap(RowBlock(dist_of(m).group)) if dist_of(m).pending_sum else m for m in mats]
    group = tuple(dist_of(mats[0]).group)
    for m in mats[1:]:
        if tuple(dist_of(m).group) != group:
            raise LayoutError(f"all_finite: the matrices live on different workers ({group} and "
                              f"{tuple(dist_of(m).group)}); remap them to one group first")
    out = new_meta(Replicated(group), (1, 1), "float32")
    flags = [dispatch("nn_all_finite", mats[k:k + FINITE_CHUNK], [out])[0][0]
             for k in range(0, len(mats), FINITE_CHUNK)]
    ok = flags[0]
    for flag in flags[1:]:
        # 1.0 only where every chunk's flag is: an elementwise command, no value to the master and
        # no host synchronisation (a recorded step stays one replay)
        ok = minimum(ok, flag)
    return ok


# ---- kernels -------------------------------------------------------------------------------
def _scalars_of(call, rest):
    """{name: (1, 1) piece, a float or None} of the step scalars: the device ones from the inputs
    `rest` (an iterator), the others from the command's scalars."""
    dyn = iter(call.scalars)
    scal = {}
    for name, present, on_device in call.entry.static.step_scalars:
        if not present:
            scal[name] = None
        elif on_device:
            scal[name] = rows.local(next(rest))
        else:
            scal[name] = float(next(dyn))
    return scal


def _nstate(rule, hyper):
    return {"sgd": 1 if hyper[0] else 0, "adam": 2}[rule]


def _operands(call):
    """(param, grad, state shards, {name: (1, 1) piece or None}, python scalars by name)."""
    rule, hyper = call.entry.static.rule, call.entry.static.hyper
    ins = list(call.inputs)
    nstate = _nstate(rule, hyper)
    param, grad, state = ins[0], ins[1], ins[2:2 + nstate]
    return rule, hyper, param, grad, state, _scalars_of(call, iter(ins[2 + nstate:]))


def _operands_many(call):
    """nn_update_many's (rule, hyper, [(param, grad, state shards)] per parameter, step scalars)."""
    rule, hyper, k = call.entry.static.rule, call.entry.static.hyper, call.entry.static.count
    ins = list(call.inputs)
    nstate = _nstate(rule, hyper)
    items = [(ins[i], ins[k + i], [ins[(2 + j) * k + i] for j in range(nstate)]) for i in range(k)]
    return rule, hyper, items, _scalars_of(call, iter(ins[(2 + nstate) * k:]))


def _value(x):
    """A step scalar on the host (the CPU kernel reads it; a (1, 1) array or a float)."""
    return None if x is None else (float(x.reshape(-1)[0]) if hasattr(x, "reshape") else float(x))


def _in_place_many(call):
    """nn_update_many's outputs, in place: its parameters' shards, then its states' (input order)."""
    k, nstate = call.entry.static.count, _nstate(call.entry.static.rule, call.entry.static.hyper)
    return list(call.inputs[:k]) + list(call.inputs[2 * k:(2 + nstate) * k])


@UPDATE.kernel(capturable=True)
def _update(call):
    """inputs param, grad, state..., then the (1, 1) step scalars that live on the workers;
    outputs param and state, in place. Computed with the array module (the CPU path)."""
    rule, hyper, param, grad, state, scal = _operands(call)
    _host_step(rule, hyper, param, grad, state, scal)
    return [param] + state


@UPDATE_MANY.kernel(capturable=True)
def _update_many(call):
    """inputs the parameters, their gradients, each state's matrices, then the (1, 1) step scalars that
    live on the workers; outputs the parameters and states, in place (the CPU path: _update's, per
    parameter)."""
    rule, hyper, items, scal = _operands_many(call)
    for param, grad, state in items:
        _host_step(rule, hyper, param, grad, state, scal)
    return _in_place_many(call)


def _host_step(rule, hyper, param, grad, state, scal):
    """One parameter's step with the array module, in place."""
    gate = _value(scal["gate"])
    if gate is not None and gate == 0.0:
        return                               # a skipped step changes nothing
    xp = backend.current().xp
    gscale = _value(scal["grad_scale"])
    for k, p in enumerate(param.pieces):
        cdt = rows.compute_dtype(p.dtype)
        g = grad.pieces[k].astype(cdt, copy=True)
        pv = p.astype(cdt, copy=False)
        if gscale is not None:
            g /= cdt.type(gscale)
        wd = hyper[-1]
        if wd:
            g += pv * cdt.type(wd)
        if rule == "sgd":
            momentum, nesterov = hyper[0], hyper[1]
            lr = cdt.type(_value(scal["lr"]))
            if momentum:
                v = state[0].pieces[k]
                vv = v.astype(cdt, copy=False) * cdt.type(momentum) + g
                v[...] = vv
                d = g + vv * cdt.type(momentum) if nesterov else vv
            else:
                d = g
            p[...] = pv - d * lr
        else:
            b1, b2, eps = hyper[0], hyper[1], hyper[2]
            m, v = state[0].pieces[k], state[1].pieces[k]
            mm = m.astype(cdt, copy=False) * cdt.type(b1) + g * cdt.type(1.0 - b1)
            vv = v.astype(cdt, copy=False) * cdt.type(b2) + (g * g) * cdt.type(1.0 - b2)
            m[...], v[...] = mm, vv
            denom = xp.sqrt(vv) * cdt.type(_value(scal["denom_scale"])) + cdt.type(eps)
            p[...] = pv - (mm / denom) * cdt.type(_value(scal["step_size"]))


# ---- the GPU kernels: one elementwise kernel per parameter piece ---------------------------------
# A: the compute type (float for half and float, double for double). Step scalars that live on the
# device are read through pointers (flags say which), the others come as kernel arguments.
_PREAMBLE = r"""
template <typename T> struct Acc { typedef float type; };
template <> struct Acc<double> { typedef double type; };
"""
_HEAD = r"""
typedef Acc<P>::type A;
if (!has_gate || gate[0] != 0) {
    A g_ = (A)g;
    if (has_scale) g_ = g_ / (A)(scale_on_device ? (double)scale_d[0] : scale_h);
    A p_ = (A)p;
    if (wd != 0) g_ = g_ + p_ * (A)wd;
"""


def _sgd_body(momentum):
    """The SGD kernel's code; without momentum there is no state operand `v`."""
    step = (r"""
    A v_ = (A)v * (A)momentum + g_;
    v = (P)v_;
    A d = nesterov ? g_ + v_ * (A)momentum : v_;""" if momentum else r"""
    A d = g_;""")
    return _HEAD + r"""
    A lr_ = (A)(lr_on_device ? (double)lr_d[0] : lr_h);""" + step + r"""
    p = (P)(p_ - d * lr_);
}
"""


_ADAM = _HEAD + r"""
    A m_ = (A)m * (A)b1 + g_ * (A)(1.0 - b1);
    A v_ = (A)v * (A)b2 + (g_ * g_) * (A)(1.0 - b2);
    m = (P)m_;
    v = (P)v_;
    A ds = (A)(ds_on_device ? (double)ds_d[0] : ds_h);
    A st = (A)(st_on_device ? (double)st_d[0] : st_h);
    A denom = sqrt(v_) * ds + (A)eps;
    p = (P)(p_ - (m_ / denom) * st);
}
"""
_COMMON_IN = ("G g, raw Q gate, int32 has_gate, raw S scale_d, float64 scale_h, int32 scale_on_device, "
              "int32 has_scale, float64 wd")
_KERNELS = {}


def _elementwise(rule, momentum):
    key = (rule, bool(momentum))
    k = _KERNELS.get(key)
    if k is None:
        import cupy
        if rule == "sgd":
            params_in = _COMMON_IN + ", raw L lr_d, float64 lr_h, int32 lr_on_device, float64 momentum, int32 nesterov"
            out, body = ("P p, P v" if momentum else "P p"), _sgd_body(momentum)
        else:
            params_in = (_COMMON_IN + ", raw D ds_d, float64 ds_h, int32 ds_on_device, raw T st_d, float64 st_h, "
                         "int32 st_on_device, float64 b1, float64 b2, float64 eps")
            out, body = "P p, P m, P v", _ADAM
        k = _KERNELS[key] = cupy.ElementwiseKernel(params_in, out, body, f"dmath_{rule}_update",
                                                   preamble=_PREAMBLE)
    return k


def _device_scalar(x, dummy):
    """(pointer operand, host value, on-device flag) of a step scalar (a (1, 1) array, a float or None)."""
    if x is None:
        return dummy, 0.0, np.int32(0)
    if hasattr(x, "reshape"):
        return x, 0.0, np.int32(1)
    return dummy, float(x), np.int32(0)


def _dummy(call):
    """A (1, 1) float32 device array standing for an absent device scalar (never read)."""
    dummy = call.entry.cache.get("dummy")
    if dummy is None:
        dummy = call.entry.cache["dummy"] = backend.current().xp.zeros((1, 1), np.float32)
    return dummy


def _piece_cuda(rule, hyper, p, g, state, scal, dummy):
    """One piece's step as a CuPy elementwise kernel (state: the piece's state arrays)."""
    gate, _, has_gate = _device_scalar(scal["gate"], dummy)
    sd, sh, s_dev = _device_scalar(scal["grad_scale"], dummy)
    common = (gate, has_gate, sd, sh, s_dev, np.int32(scal["grad_scale"] is not None), float(hyper[-1]))
    if rule == "sgd":
        momentum, nesterov = hyper[0], hyper[1]
        ld, lh, l_dev = _device_scalar(scal["lr"], dummy)
        args = (g,) + common + (ld, lh, l_dev, float(momentum), np.int32(nesterov), p) + tuple(state)
    else:
        b1, b2, eps = hyper[0], hyper[1], hyper[2]
        dd, dh, d_dev = _device_scalar(scal["denom_scale"], dummy)
        td, th, t_dev = _device_scalar(scal["step_size"], dummy)
        args = (g,) + common + (dd, dh, d_dev, td, th, t_dev, float(b1), float(b2), float(eps), p) + tuple(state)
    _elementwise(rule, hyper[0] if rule == "sgd" else True)(*args)


@UPDATE.kernel(backend="gpu", capturable=True)
def _update_cuda(call):
    """nn_update as one CuPy elementwise kernel per piece (no host read of the gate: capturable)."""
    rule, hyper, param, grad, state, scal = _operands(call)
    if param.pieces:
        dummy = _dummy(call)
        for k, p in enumerate(param.pieces):
            _piece_cuda(rule, hyper, p, grad.pieces[k], [st.pieces[k] for st in state], scal, dummy)
    return [param] + state


# ---- the GPU kernels of many parameters: a table of arrays per launch ------------------------------------
# The same arithmetic as the elementwise kernels above, in the same order and types (a parameter comes out
# bit for bit as nn_update makes it), over a DmTable of (param, grad, state..., length, first block) per
# array: a block steps the array dm_table_entry gives it, with that array's blocks. Built for float and
# double parameters with a gradient of their type (or half for float parameters), a float32 gate and loss
# scale, and the other step scalars in the parameter's type: what dnn's optimizers hand over; other pieces
# take the elementwise kernels.
_MANY_SOURCE = cuda.TABLE_STRUCT + r"""
// the gradient a rule reads: g / scale (+ wd p), as the elementwise kernels compute it
template <typename A, typename G>
__device__ __forceinline__ A dm_grad_in(G g, A p_, int has_scale, const float* scale_d, double scale_h,
        int scale_on_device, double wd) {
    A g_ = (A)dm_val(g);
    if (has_scale) g_ = g_ / (A)(scale_on_device ? (double)scale_d[0] : scale_h);
    if (wd != 0) g_ = g_ + p_ * (A)wd;
    return g_;
}

template <typename P, typename G, int MOM>
__global__ void dm_sgd_many(const DmTable tab, int count, const float* gate, int has_gate, const float* scale_d,
        double scale_h, int scale_on_device, int has_scale, double wd, const P* lr_d, double lr_h, int lr_on_device,
        double momentum) {
    typedef typename Acc<P>::type A;
    if (has_gate && gate[0] == 0) return;
    const int W = MOM ? 5 : 4;
    long long lb, nb;
    const int y = dm_table_entry(tab, count, W, &lb, &nb);
    P* p = reinterpret_cast<P*>(tab.w[W * y]);
    const G* g = reinterpret_cast<const G*>(tab.w[W * y + 1]);
    P* v = reinterpret_cast<P*>(tab.w[W * y + 2]);      // (MOM: the momentum buffer)
    const long long n = (long long)tab.w[W * y + W - 2];
    for (long long i = lb * blockDim.x + threadIdx.x; i < n; i += nb * blockDim.x) {
        const A p_ = (A)p[i];
        const A g_ = dm_grad_in<A, G>(g[i], p_, has_scale, scale_d, scale_h, scale_on_device, wd);
        A lr_ = (A)(lr_on_device ? (double)lr_d[0] : lr_h);
        A d = g_;
        if (MOM) {
            A v_ = (A)v[i] * (A)momentum + g_;
            v[i] = (P)v_;
            d = MOM == 2 ? g_ + v_ * (A)momentum : v_;
        }
        p[i] = (P)(p_ - d * lr_);
    }
}

template <typename P, typename G>
__global__ void dm_adam_many(const DmTable tab, int count, const float* gate, int has_gate, const float* scale_d,
        double scale_h, int scale_on_device, int has_scale, double wd, const P* ds_d, double ds_h, int ds_on_device,
        const P* st_d, double st_h, int st_on_device, double b1, double b2, double eps) {
    typedef typename Acc<P>::type A;
    if (has_gate && gate[0] == 0) return;
    long long lb, nb;
    const int y = dm_table_entry(tab, count, 6, &lb, &nb);
    P* p = reinterpret_cast<P*>(tab.w[6 * y]);
    const G* g = reinterpret_cast<const G*>(tab.w[6 * y + 1]);
    P* m = reinterpret_cast<P*>(tab.w[6 * y + 2]);
    P* v = reinterpret_cast<P*>(tab.w[6 * y + 3]);
    const long long n = (long long)tab.w[6 * y + 4];
    for (long long i = lb * blockDim.x + threadIdx.x; i < n; i += nb * blockDim.x) {
        const A p_ = (A)p[i];
        const A g_ = dm_grad_in<A, G>(g[i], p_, has_scale, scale_d, scale_h, scale_on_device, wd);
        A m_ = (A)m[i] * (A)b1 + g_ * (A)(1.0 - b1);
        A v_ = (A)v[i] * (A)b2 + (g_ * g_) * (A)(1.0 - b2);
        m[i] = (P)m_;
        v[i] = (P)v_;
        A ds = (A)(ds_on_device ? (double)ds_d[0] : ds_h);
        A st = (A)(st_on_device ? (double)st_d[0] : st_h);
        A denom = sqrt(v_) * ds + (A)eps;
        p[i] = (P)(p_ - (m_ / denom) * st);
    }
}
"""
#: (parameter, gradient) dtypes the table kernels are built for
_MANY_TYPES = (("float32", "float16"), ("float32", "float32"), ("float64", "float64"))
_MANY_NAMES = [f"dm_sgd_many<{cuda.C_TYPES[p]}, {cuda.C_TYPES[g]}, {mom}>"
               for p, g in _MANY_TYPES for mom in (0, 1, 2)] + \
    [f"dm_adam_many<{cuda.C_TYPES[p]}, {cuda.C_TYPES[g]}>" for p, g in _MANY_TYPES]
#: the kernels' argument kinds after the table: count, gate, the loss scale, weight decay, then the rule's
_MANY_KINDS = {"sgd": "tipipdiid" + "pdid", "adam": "tipipdiid" + "pdipdiddd"}
_MANY_LAUNCHERS = {}


def _many_launcher(name, rule):
    run = _MANY_LAUNCHERS.get(name)
    if run is None:
        run = _MANY_LAUNCHERS[name] = cuda.Launcher(cuda.function(_MANY_SOURCE, name, _MANY_NAMES), _MANY_KINDS[rule])
    return run


def _tabled(rule, pdtype, scal):
    """Whether the table kernels take parameters of `pdtype` with these step scalars."""
    typed = {"gate": "float32", "grad_scale": "float32"}
    for name, x in scal.items():
        if hasattr(x, "dtype") and str(x.dtype) != typed.get(name, pdtype):
            return False
    return True


def _device_args(x, dummy):
    """(pointer, host value, on-device flag) of a step scalar for a Launcher: ints and floats."""
    ptr, host, on = _device_scalar(x, dummy)
    return ptr.data.ptr, float(host), int(on)


@UPDATE_MANY.kernel(backend="gpu", capturable=True)
def _update_many_cuda(call):
    """nn_update_many on a GPU: the pieces of every parameter by (parameter, gradient) dtype, a launch per
    table of them (launcher.TABLE_WORDS words); a piece the tables do not take (other dtypes, strided)
    runs nn_update's elementwise kernel."""
    rule, hyper, items, scal = _operands_many(call)
    dummy = _dummy(call)
    tables = {}
    for param, grad, state in items:
        for k, p in enumerate(param.pieces):
            g, sts = grad.pieces[k], [st.pieces[k] for st in state]
            key = (str(p.dtype), str(g.dtype))
            if key in _MANY_TYPES and _tabled(rule, key[0], scal) and \
                    all(a.flags.c_contiguous for a in [p, g] + sts):
                if p.size:
                    tables.setdefault(key, []).append([p.data.ptr, g.data.ptr] + [a.data.ptr for a in sts] + [p.size])
            else:
                _piece_cuda(rule, hyper, p, g, sts, scal, dummy)
    gate, _, has_gate = _device_args(scal["gate"], dummy)
    sd, sh, s_dev = _device_args(scal["grad_scale"], dummy)
    common = (gate, has_gate, sd, sh, s_dev, int(scal["grad_scale"] is not None), float(hyper[-1]))
    for (pdt, gdt), entries in tables.items():
        types = f"{cuda.C_TYPES[pdt]}, {cuda.C_TYPES[gdt]}"
        if rule == "sgd":
            mom = 0 if not hyper[0] else (2 if hyper[1] else 1)
            run = _many_launcher(f"dm_sgd_many<{types}, {mom}>", rule)
            extra = _device_args(scal["lr"], dummy) + (float(hyper[0]),)
        else:
            run = _many_launcher(f"dm_adam_many<{types}>", rule)
            extra = _device_args(scal["denom_scale"], dummy) + _device_args(scal["step_size"], dummy) + \
                (float(hyper[0]), float(hyper[1]), float(hyper[2]))
        run.table(entries, *common, *extra)
    return _in_place_many(call)


# ---- all finite -------------------------------------------------------------------------------------
def _whole_on_each(dists):
    """True when every member holds all of every input (Replicated, or a group of one worker)."""
    return all(rows.whole_on_each(d) for d in dists)


def _finite_capturable(entry):
    return collectives_in_graphs() or _whole_on_each(entry.in_dists)


def _combine(call, bad, out):
    """out (1, 1) = 1.0 when no member found a non-finite value (bad summed over the group when the
    inputs are split between the members; replicated inputs gave every member the same answer)."""
    xp = backend.current().xp
    if not _whole_on_each(call.entry.in_dists):
        group = call.entry.out_dists[0].group
        collectives.allreduce(call.world.group(group), bad, "sum")
    xp.subtract(1.0, xp.minimum(bad, 1.0), out=out.reshape(-1))


def _finite_kernel(mark):
    """The nn_all_finite kernel that calls mark(pieces, bad) with every non-empty local piece: inputs are
    matrices of any float dtype on one group; the output is (1, 1) float32 Replicated, 1 or 0."""
    def run(call):
        outs = rows.new_output(call, 0)
        if not outs:
            return [rows.shard(call, 0, [])]
        bad = backend.current().xp.zeros(1, np.float32)
        mark([piece for s in call.inputs for piece in s.pieces if piece.size], bad)
        _combine(call, bad, outs[0])
        return [rows.shard(call, 0, outs)]
    return run


def _mark_host(pieces, bad):
    xp = backend.current().xp
    if not all(bool(xp.isfinite(piece).all()) for piece in pieces):
        bad[0] = 1.0


_FINITE_SOURCE = cuda.TABLE_STRUCT + r"""
// table: (address, length, first block) of each array of T (dm_table_entry)
template <typename T>
__global__ void dm_nonfinite_many(const DmTable tab, int count, float* bad) {
    long long lb, nb;
    const int y = dm_table_entry(tab, count, 3, &lb, &nb);
    const T* x = reinterpret_cast<const T*>(tab.w[3 * y]);
    const long long n = (long long)tab.w[3 * y + 1];
    for (long long i = lb * blockDim.x + threadIdx.x; i < n; i += nb * blockDim.x) {
        if (!isfinite(dm_val(x[i]))) { bad[0] = 1.0f; return; }   // every writer writes the same value
    }
}
"""
_FINITE_INSTANCES = [f"dm_nonfinite_many<{t}>" for t in cuda.C_TYPES.values()]
_FINITE_LAUNCHERS = {}


def _mark_device(pieces, bad):
    """One reading pass on the device over all `pieces`, a launch per dtype and table of arrays, no host
    synchronisation (capturable; a ResNet-50 step's 161 gradients took 161 launches before)."""
    import cupy
    by_dtype = {}
    for piece in pieces:
        x = cupy.ascontiguousarray(piece)
        by_dtype.setdefault(str(x.dtype), []).append(x)
    for dtype, arrays in by_dtype.items():
        run = _FINITE_LAUNCHERS.get(dtype)
        if run is None:
            name = f"dm_nonfinite_many<{cuda.C_TYPES[dtype]}>"
            run = _FINITE_LAUNCHERS[dtype] = cuda.Launcher(cuda.function(_FINITE_SOURCE, name, _FINITE_INSTANCES),
                                                           "tip")
        run.table([[x.data.ptr, x.size] for x in arrays], bad.data.ptr)


ALL_FINITE.kernel(capturable=_finite_capturable)(_finite_kernel(_mark_host))
ALL_FINITE.kernel(backend="gpu", capturable=_finite_capturable)(_finite_kernel(_mark_device))
