"""dmath.nn.sgd_update_many and adam_update_many: every parameter of a list stepped exactly as
sgd_update / adam_update steps it alone (bit for bit), across layouts, groups of workers, dtypes
(float16 gradients of float32 weights), step scalars on the host or the workers, a closed gate, and
lists longer than one command carries; at any worker count (on GPUs: the table kernels)."""
import os

import numpy as np
import pytest

import dmath
from dmath.ops.nn import update
from dmath.ops.nn.update import many_chunks

P = dmath.num_workers()
SHAPES = [(7, 5), (1, 9), (12, 3), (4, 4)]


def _layouts():
    out = [dmath.Replicated(), dmath.RowBlock(), dmath.ColBlock(), dmath.BlockCyclic((2, 2))]
    if P > 1:
        out.append(dmath.RowBlock(group=tuple(range(1, P))))       # a group without the first worker
    return out


def _case(seed, count, dtype, grad_dtype, nstate, lays=None):
    """count (param, grad, states) as numpy arrays and matrices, in layouts and groups taken in turn."""
    rng = np.random.default_rng(seed)
    lays = lays or _layouts()
    arrays, mats = [], []
    for k in range(count):
        shape = SHAPES[k % len(SHAPES)]
        lay = lays[k % len(lays)]
        a = [rng.normal(size=shape) for _ in range(2 + nstate)]
        if nstate == 2:
            a[3] = np.abs(a[3])                       # exp_avg_sq >= 0
        arrays.append(a)
        mats.append([dmath.from_numpy(a[0].astype(dtype), layout=lay),
                     dmath.from_numpy((a[1] * 8.0).astype(grad_dtype), layout=lay)] +
                    [dmath.from_numpy(x.astype(dtype), layout=lay) for x in a[2:]])
    return arrays, mats


def _copies(mats):
    return [[dmath.from_numpy(m.to_numpy(), layout=m.layout) for m in item] for item in mats]


def _scalars(dtype, on_device):
    """lr (or step size), denom scale, loss scale, gate: floats or (1, 1) matrices on every worker."""
    def s(v, dt):
        return dmath.full((1, 1), v, dtype=dt, layout=dmath.Replicated()) if on_device else v
    gate = dmath.ones((1, 1), dtype="float32", layout=dmath.Replicated()) if on_device else None
    return s(0.05, dtype), s(0.7, dtype), s(8.0, "float32"), gate


# (parameter, gradient) dtypes: the GPU's table kernels take the first three, float16 weights the
# elementwise kernel of each piece
CASES = [("float64", "float64"), ("float32", "float32"), ("float32", "float16"), ("float16", "float16")]


@pytest.mark.parametrize("on_device", [False, True])
@pytest.mark.parametrize("dtype,grad_dtype", CASES)
@pytest.mark.parametrize("momentum,nesterov", [(0.0, False), (0.9, False), (0.9, True)])
def test_sgd_update_many_steps_each_parameter_as_sgd_update(momentum, nesterov, dtype, grad_dtype, on_device):
    nstate = 1 if momentum else 0
    _, mats = _case(1, 9, dtype, grad_dtype, nstate)
    alone = _copies(mats)
    lr, _, scale, gate = _scalars(dtype, on_device)
    kw = dict(momentum=momentum, nesterov=nesterov, weight_decay=0.01, grad_scale=scale, gate=gate)
    out = dmath.nn.sgd_update_many([m[0] for m in mats], [m[1] for m in mats], lr,
                                   [m[2] for m in mats] if momentum else None, **kw)
    assert [o is m[0] for o, m in zip(out, mats)] == [True] * len(mats)
    for item in alone:
        dmath.nn.sgd_update(item[0], item[1], lr, item[2] if momentum else None, **kw)
    for k, (a, b) in enumerate(zip(mats, alone)):
        for j in [0] + list(range(2, 2 + nstate)):
            np.testing.assert_array_equal(a[j].to_numpy(), b[j].to_numpy(), err_msg=f"parameter {k}, operand {j}")
        assert not np.array_equal(a[0].to_numpy(), a[1].to_numpy())


@pytest.mark.parametrize("on_device", [False, True])
@pytest.mark.parametrize("dtype,grad_dtype", CASES)
def test_adam_update_many_steps_each_parameter_as_adam_update(dtype, grad_dtype, on_device):
    _, mats = _case(2, 9, dtype, grad_dtype, 2)
    alone = _copies(mats)
    step, ds, scale, gate = _scalars(dtype, on_device)
    kw = dict(beta1=0.8, beta2=0.95, eps=1e-6, weight_decay=0.02, grad_scale=scale, gate=gate)
    dmath.nn.adam_update_many([m[0] for m in mats], [m[1] for m in mats], [m[2] for m in mats],
                              [m[3] for m in mats], step, ds, **kw)
    for item in alone:
        dmath.nn.adam_update(item[0], item[1], item[2], item[3], step, ds, **kw)
    for k, (a, b) in enumerate(zip(mats, alone)):
        for j in (0, 2, 3):
            np.testing.assert_array_equal(a[j].to_numpy(), b[j].to_numpy(), err_msg=f"parameter {k}, operand {j}")


def test_many_parameters_take_several_commands_and_a_closed_gate_changes_nothing():
    """More parameters than one command carries (with momentum: 50 a command), and a gate of 0 leaves
    parameters and buffers as they were even with non-finite gradients."""
    count = 120
    _, mats = _case(3, count, "float32", "float32", 1)
    assert len(many_chunks(count, 1, 1)) == 3
    params, grads, bufs = [m[0] for m in mats], [m[1] for m in mats], [m[2] for m in mats]
    before = [(p.to_numpy(), v.to_numpy()) for p, v in zip(params, bufs)]
    closed = dmath.zeros((1, 1), dtype="float32", layout=dmath.Replicated())
    grads[5] = dmath.full(grads[5].shape, np.nan, dtype="float32", layout=grads[5].layout)
    dmath.nn.sgd_update_many(params, grads, 0.1, bufs, momentum=0.9, gate=closed)
    for (p0, v0), p, v in zip(before, params, bufs):
        np.testing.assert_array_equal(p.to_numpy(), p0)
        np.testing.assert_array_equal(v.to_numpy(), v0)
    grads[5] = dmath.zeros(grads[5].shape, dtype="float32", layout=grads[5].layout)
    alone = _copies(list(zip(params, grads, bufs)))
    dmath.nn.sgd_update_many(params, grads, 0.1, bufs, momentum=0.9)
    for item in alone:
        dmath.nn.sgd_update(item[0], item[1], 0.1, item[2], momentum=0.9)
    for a, b in zip(params, [m[0] for m in alone]):
        np.testing.assert_array_equal(a.to_numpy(), b.to_numpy())
    assert not np.array_equal(params[0].to_numpy(), before[0][0])


def test_many_chunks_rule():
    # parameter, gradient, each state in, parameter and each state out: within 255 handles with the scalars
    for nstate, ndevice in ((0, 0), (1, 3), (2, 4)):
        chunks = many_chunks(500, nstate, ndevice)
        assert chunks[0][0] == 0 and chunks[-1][1] == 500
        assert all(a[1] == b[0] for a, b in zip(chunks, chunks[1:]))
        assert all((hi - lo) * (3 + 2 * nstate) + ndevice <= 255 for lo, hi in chunks)
    assert many_chunks(0, 1, 1) == []


def test_bad_arguments_raise_on_the_master():
    _, mats = _case(4, 3, "float64", "float64", 1)
    params, grads, bufs = [m[0] for m in mats], [m[1] for m in mats], [m[2] for m in mats]
    cases = [lambda: dmath.nn.sgd_update_many(params, grads[:2], 0.1),
             lambda: dmath.nn.sgd_update_many(params, grads, 0.1, momentum=0.9),
             lambda: dmath.nn.sgd_update_many(params, grads, 0.1, bufs[:2], momentum=0.9),
             lambda: dmath.nn.sgd_update_many(params + [np.zeros(3)], grads + [grads[0]], 0.1),
             lambda: dmath.nn.sgd_update_many(params, grads, "fast"),
             lambda: dmath.nn.adam_update_many(params, grads, bufs, bufs[:1], 0.1),
             lambda: dmath.nn.adam_update_many(params, grads, bufs, bufs, 0.1, eps=0.0),
             lambda: dmath.nn.sgd_update_many(params + params[:1], grads + grads[:1], 0.1)]
    before = [p.to_numpy() for p in params]
    for fn in cases:
        with pytest.raises(dmath.DMathError):
            fn()
    for b, p in zip(before, params):
        np.testing.assert_array_equal(p.to_numpy(), b)


@pytest.mark.skipif(P != 1 or os.environ.get("DMATH_DEVICE", "cpu") != "gpu",
                    reason="the worker's kernels are watched in the master's process: one GPU worker")
def test_gpu_tables_take_the_models_dtypes_and_the_rest_runs_per_piece(monkeypatch):
    """On a GPU, float32 weights with float32 or float16 gradients and step scalars of their dtype go
    through the table kernels (no per-piece launch); a learning rate of another dtype sends each piece
    to the elementwise kernel; both give sgd_update's bits."""
    calls = []
    plain = update._piece_cuda
    monkeypatch.setattr(update, "_piece_cuda", lambda *a: (calls.append(1), plain(*a)))
    for lr_dtype, per_piece in (("float32", 0), ("float64", 6)):
        _, mats = _case(5, 6, "float32", "float16", 1, [dmath.Replicated()])      # one piece each
        alone = _copies(mats)
        lr = dmath.full((1, 1), 0.05, dtype=lr_dtype, layout=dmath.Replicated())
        calls.clear()
        dmath.nn.sgd_update_many([m[0] for m in mats], [m[1] for m in mats], lr, [m[2] for m in mats], momentum=0.9)
        assert len(calls) == per_piece
        for item in alone:
            dmath.nn.sgd_update(item[0], item[1], lr, item[2], momentum=0.9)
        for a, b in zip(mats, alone):
            np.testing.assert_array_equal(a[0].to_numpy(), b[0].to_numpy())


@pytest.mark.parametrize("grad_dtype", ["float32", "float16"])
def test_large_parameters_beside_small_ones_step_as_alone(grad_dtype):
    """On a GPU a table launch gives each array blocks in proportion to its size (a million-element
    weight hundreds of blocks, a bias one): every element of large parameters beside small ones, up to
    a large one's last, is stepped bit for bit as sgd_update and adam_update step each alone."""
    rng = np.random.default_rng(9)
    shapes = [(3, 5), (1031, 1021), (1, 1), (257, 2053), (2, 3)]
    lays = [dmath.Replicated(), dmath.RowBlock()]

    def mats(nstate):
        out = []
        for k, shape in enumerate(shapes):
            a = [rng.normal(size=shape) for _ in range(2 + nstate)]
            a[-1] = np.abs(a[-1])
            lay = lays[k % 2]
            out.append([dmath.from_numpy(a[0].astype("float32"), layout=lay),
                        dmath.from_numpy(a[1].astype(grad_dtype), layout=lay)] +
                       [dmath.from_numpy(x.astype("float32"), layout=lay) for x in a[2:]])
        return out
    sgd = mats(1)
    alone = _copies(sgd)
    dmath.nn.sgd_update_many([m[0] for m in sgd], [m[1] for m in sgd], 0.05, [m[2] for m in sgd], momentum=0.9)
    for item in alone:
        dmath.nn.sgd_update(item[0], item[1], 0.05, item[2], momentum=0.9)
    adam = mats(2)
    adam_alone = _copies(adam)
    dmath.nn.adam_update_many(*([m[j] for m in adam] for j in range(4)), 0.01, 1.0, grad_scale=4.0)
    for item in adam_alone:
        dmath.nn.adam_update(*item, 0.01, 1.0, grad_scale=4.0)
    for got, want, states in ((sgd, alone, (0, 2)), (adam, adam_alone, (0, 2, 3))):
        for k, (a, b) in enumerate(zip(got, want)):
            for j in states:
                x, y = a[j].to_numpy(), b[j].to_numpy()
                np.testing.assert_array_equal(x, y, err_msg=f"parameter {k}, operand {j}")
                assert not np.array_equal(x, a[1].to_numpy())
