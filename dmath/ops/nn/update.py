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
from . import rows
from ..elementwise import minimum
from ..base import dispatch, dist_of, is_matrix, new_meta


class UpdateArgs(NamedTuple):
    """Static arguments of `nn_update`."""
    rule: str            # 'sgd' or 'adam'
    hyper: tuple         # sgd: (momentum, nesterov, weight_decay); adam: (beta1, beta2, eps, weight_decay)
    step_scalars: tuple  # per step scalar, in the kernel's order: (name, present, on the device)


UPDATE = define("nn_update", UpdateArgs)
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
    static = UPDATE.static(rule=rule, hyper=hyper, step_scalars=tuple(has))
    dispatch("nn_update", inputs, outputs, static=static, scalars=dyn)
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
def _operands(call):
    """(param, grad, state shards, {name: (1, 1) piece or None}, python scalars by name)."""
    rule, hyper, has = call.entry.static.rule, call.entry.static.hyper, call.entry.static.step_scalars
    ins = list(call.inputs)
    nstate = {"sgd": 1 if hyper[0] else 0, "adam": 2}[rule]
    param, grad, state = ins[0], ins[1], ins[2:2 + nstate]
    rest = iter(ins[2 + nstate:])
    dyn = iter(call.scalars)
    scal = {}
    for name, present, on_device in has:
        if not present:
            scal[name] = None
        elif on_device:
            scal[name] = rows.local(next(rest))
        else:
            scal[name] = float(next(dyn))
    return rule, hyper, param, grad, state, scal


def _value(x):
    """A step scalar on the host (the CPU kernel reads it; a (1, 1) array or a float)."""
    return None if x is None else (float(x.reshape(-1)[0]) if hasattr(x, "reshape") else float(x))


@UPDATE.kernel(capturable=True)
def _update(call):
    """inputs param, grad, state..., then the (1, 1) step scalars that live on the workers;
    outputs param and state, in place. Computed with the array module (the CPU path)."""
    rule, hyper, param, grad, state, scal = _operands(call)
    gate = _value(scal["gate"])
    if gate is not None and gate == 0.0:
        return [param] + state               # a skipped step changes nothing
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
    return [param] + state


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


@UPDATE.kernel(backend="gpu", capturable=True)
def _update_cuda(call):
    """nn_update as one CuPy elementwise kernel per piece (no host read of the gate: capturable)."""
    rule, hyper, param, grad, state, scal = _operands(call)
    if not param.pieces:
        return [param] + state
    dummy = call.entry.cache.get("dummy")
    if dummy is None:
        dummy = call.entry.cache["dummy"] = backend.current().xp.zeros((1, 1), np.float32)
    gate, _, has_gate = _device_scalar(scal["gate"], dummy)
    sd, sh, s_dev = _device_scalar(scal["grad_scale"], dummy)
    common = (gate, has_gate, sd, sh, s_dev, np.int32(scal["grad_scale"] is not None), float(hyper[-1]))
    for k, p in enumerate(param.pieces):
        g = grad.pieces[k]
        if rule == "sgd":
            momentum, nesterov = hyper[0], hyper[1]
            ld, lh, l_dev = _device_scalar(scal["lr"], dummy)
            args = (g,) + common + (ld, lh, l_dev, float(momentum), np.int32(nesterov), p)
            if momentum:
                args += (state[0].pieces[k],)
        else:
            b1, b2, eps = hyper[0], hyper[1], hyper[2]
            dd, dh, d_dev = _device_scalar(scal["denom_scale"], dummy)
            td, th, t_dev = _device_scalar(scal["step_size"], dummy)
            args = (g,) + common + (dd, dh, d_dev, td, th, t_dev, float(b1), float(b2), float(eps),
                                    p, state[0].pieces[k], state[1].pieces[k])
        _elementwise(rule, hyper[0] if rule == "sgd" else True)(*args)
    return [param] + state


# ---- all finite -------------------------------------------------------------------------------------
def _whole_on_each(dists):
    """True when every member holds all of every input (Replicated, or a group of one worker)."""
    return all(d.replicated or len(d.group) == 1 for d in dists)


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
    """The nn_all_finite kernel that calls mark(piece, bad) on every non-empty local piece: inputs are
    matrices of any float dtype on one group; the output is (1, 1) float32 Replicated, 1 or 0."""
    def run(call):
        outs = rows.new_output(call, 0)
        if not outs:
            return [rows.shard(call, 0, [])]
        bad = backend.current().xp.zeros(1, np.float32)
        for s in call.inputs:
            for piece in s.pieces:
                if piece.size:
                    mark(piece, bad)
        _combine(call, bad, outs[0])
        return [rows.shard(call, 0, outs)]
    return run


def _mark_host(piece, bad):
    if not bool(backend.current().xp.isfinite(piece).all()):
        bad[0] = 1.0


_FINITE_SOURCE = r"""
template <typename T>
__global__ void dm_nonfinite(const T* x, long long n, float* bad) {
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        if (!isfinite(dm_val(x[i]))) { bad[0] = 1.0f; return; }   // every writer writes the same value
    }
}
"""
_FINITE_INSTANCES = [f"dm_nonfinite<{t}>" for t in cuda.C_TYPES.values()]


def _mark_device(piece, bad):
    """One reading pass on the device, no host synchronisation (capturable)."""
    import cupy
    x = cupy.ascontiguousarray(piece)
    fn = cuda.function(_FINITE_SOURCE, f"dm_nonfinite<{cuda.C_TYPES[str(x.dtype)]}>", _FINITE_INSTANCES)
    threads = 256
    fn((min((x.size + threads - 1) // threads, 2048),), (threads,), (x, np.int64(x.size), bad))


ALL_FINITE.kernel(capturable=_finite_capturable)(_finite_kernel(_mark_host))
ALL_FINITE.kernel(backend="gpu", capturable=_finite_capturable)(_finite_kernel(_mark_device))
