"""Fused optimizer steps and the all-finite test: `dmath.nn.sgd_update`, `adam_update`, `all_finite`.

One command updates a parameter and its state in place, in a single pass
over its pieces on every worker (kernels in dmath/ops/nn_update.py). The
step's scalars (learning rate, Adam's step size, the loss scale, the gate)
are either Python floats or (1, 1) matrices that live on the workers: a
recorded training step keeps reading the current values of the matrices at
every replay, with no message from the master.

Everything is checked here, on the master: shapes, float dtypes, the state
in the parameter's layout (the gradient is remapped to it, a Partial one
summed on the way), (1, 1) scalars replicated on the parameter's workers.
"""
import math
import numbers

import numpy as np

from .errors import DMathError, DTypeError, LayoutError, ShapeError
from .layout import Replicated, RowBlock, distribution
from .matrix import Matrix
from .ops.base import dispatch, dist_of, new_meta
from .runtime import runtime

_FLOATS = ("float16", "float32", "float64")


def _matrix(m, what):
    if not isinstance(m, Matrix):
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
    if g.layout.partial or not _same_place(g, param):
        g = g.remap(param.layout)             # a Partial gradient is all-reduced into place
    return g


def _scalar(x, name, group, positive=False):
    """('device', Matrix replicated on `group`) or ('host', float) or None."""
    if x is None:
        return None
    if isinstance(x, Matrix):
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


def _run(rule, hyper, param, grad, state, scalars):
    """Dispatch nn_update: scalars is [(name, None | ('device', M) | ('host', v))] in the kernel's order."""
    _matrix(param, "the parameter")
    if param.layout.partial:
        raise LayoutError("the parameter must not be Partial (it is updated in place)")
    grad = _grad(grad, param)
    group = tuple(dist_of(param).group)
    inputs, dyn, has = [param, grad] + list(state), [], []
    for name, value, kw in scalars:
        s = _scalar(value, name, group, **kw)
        has.append((name, s is not None, s is not None and s[0] == "device"))
        if s is None:
            continue
        (inputs if s[0] == "device" else dyn).append(s[1])
    outputs = [0] + [2 + k for k in range(len(state))]
    dispatch("nn_update", inputs, outputs, static=(rule, hyper, tuple(has)), scalars=dyn)
    return param


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
    momentum = _unit(momentum, "momentum")
    if nesterov and not momentum:
        raise DMathError("nesterov momentum needs momentum > 0")
    state = []
    if momentum:
        if momentum_buffer is None:
            raise DMathError("momentum > 0 needs a momentum_buffer (zeros of the parameter's shape and layout)")
        state.append(_state(momentum_buffer, param, "momentum_buffer"))
    hyper = (momentum, bool(nesterov), _non_negative(weight_decay, "weight_decay"))
    return _run("sgd", hyper, param, grad, state, [
        ("lr", lr, {}), ("gate", gate, {}),
        ("grad_scale", grad_scale, {"positive": True})])


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
    eps = float(eps) if isinstance(eps, numbers.Real) and not isinstance(eps, bool) else eps
    if not isinstance(eps, float) or not (eps > 0 and math.isfinite(eps)):
        raise DMathError(f"eps must be a positive number, got {eps!r}")
    hyper = (_unit(beta1, "beta1"), _unit(beta2, "beta2"), eps, _non_negative(weight_decay, "weight_decay"))
    return _run("adam", hyper, param, grad, state, [
        ("step_size", step_size, {}), ("denom_scale", denom_scale, {}),
        ("gate", gate, {}), ("grad_scale", grad_scale, {"positive": True})])


def all_finite(matrices):
    """A (1, 1) float32 Matrix, Replicated on the matrices' workers: 1.0 when every element of every
    matrix is finite, else 0.0. Decided on the workers (no value comes back to the master), so it
    can gate a recorded mixed-precision step: `sgd_update(..., gate=all_finite(grads))`.

    The matrices may have any float dtype and layout, but must live on the same workers; a Partial
    matrix is summed first (a non-finite addend makes a non-finite sum).
    """
    mats = [_matrix(m, "all_finite: each matrix") for m in matrices]
    if not mats:
        raise DMathError("all_finite needs at least one matrix")
    mats = [m.remap(RowBlock(dist_of(m).group)) if m.layout.partial else m for m in mats]
    group = tuple(dist_of(mats[0]).group)
    for m in mats[1:]:
        if tuple(dist_of(m).group) != group:
            raise LayoutError(f"all_finite: the matrices live on different workers ({group} and "
                              f"{tuple(dist_of(m).group)}); remap them to one group first")
    out = new_meta(Replicated(group), (1, 1), "float32")
    return dispatch("nn_all_finite", mats, [out])[0][0]
