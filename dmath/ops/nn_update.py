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

Operands arrive aligned by the master (dmath/updates.py): gradient and state
in the parameter's distribution, the (1, 1) step scalars replicated on its
workers, so a worker only combines its own pieces.
"""
import numpy as np

from .. import backend
from ..runtime import kernel
from ..runtime.registry import COLLECTIVES_IN_GRAPHS
from ..comm import collectives
from . import cuda, nn_rows as rows

#: the rules' names; static = (rule, hyper-parameters..., which optional operands are present)
RULES = ("sgd", "adam")


def _operands(call):
    """(param, grad, state shards, {name: (1, 1) piece or None}, python scalars by name)."""
    rule, hyper, has = call.entry.static[0], call.entry.static[1], call.entry.static[2]
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


@kernel("nn_update", capturable=True)
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


@kernel("nn_update", backend="gpu", capturable=True)
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
def _finite_capturable(entry):
    return COLLECTIVES_IN_GRAPHS or all(d.replicated for d in entry.in_dists)


def _combine(call, bad, out):
    """out (1, 1) = 1.0 when no member found a non-finite value (bad summed over the group when the
    inputs are split between the members; replicated inputs gave every member the same answer)."""
    xp = backend.current().xp
    if not all(d.replicated for d in call.entry.in_dists):
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


kernel("nn_all_finite", capturable=_finite_capturable)(_finite_kernel(_mark_host))
kernel("nn_all_finite", backend="gpu", capturable=_finite_capturable)(_finite_kernel(_mark_device))
