"""Optimizers against NumPy transcriptions of PyTorch's update rules; schedules; gated (skipped)
steps; dynamic loss scaling. Gradients arrive Partial, as data parallelism makes them."""
import numpy as np
import pytest

import dmath
import dnn
from dnn import optim
from dnn.graph.node import Variable
from dnn.optim import schedules
from dnn import layers as L
from _cases import runs_may_differ

SHAPE = (5, 3)


def _grads(steps, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.normal(size=SHAPE) for _ in range(steps)]


def ref_sgd(p, grads, lrs, momentum=0.0, nesterov=False, wd=0.0):
    buf = np.zeros_like(p)
    for g, lr in zip(grads, lrs):
        g = g + wd * p
        if momentum:
            buf = momentum * buf + g
            g = g + momentum * buf if nesterov else buf
        p = p - lr * g
    return p


def ref_adam(p, grads, lrs, betas=(0.9, 0.999), eps=1e-8, wd=0.0):
    m, v = np.zeros_like(p), np.zeros_like(p)
    b1, b2 = betas
    for t, (g, lr) in enumerate(zip(grads, lrs), 1):
        g = g + wd * p
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g * g
        p = p - lr / (1 - b1 ** t) * m / (np.sqrt(v) / np.sqrt(1 - b2 ** t) + eps)
    return p


def ref_rmsprop(p, grads, lrs, alpha=0.99, eps=1e-8, momentum=0.0, centered=False, wd=0.0):
    s, a, b = np.zeros_like(p), np.zeros_like(p), np.zeros_like(p)
    for g, lr in zip(grads, lrs):
        g = g + wd * p
        s = alpha * s + (1 - alpha) * g * g
        if centered:
            a = alpha * a + (1 - alpha) * g
            avg = np.sqrt(s - a * a) + eps
        else:
            avg = np.sqrt(s) + eps
        if momentum:
            b = momentum * b + g / avg
            p = p - lr * b
        else:
            p = p - lr * g / avg
    return p


def ref_adagrad(p, grads, lrs, eps=1e-10, init=0.0, wd=0.0):
    s = np.full_like(p, init)
    for g, lr in zip(grads, lrs):
        g = g + wd * p
        s = s + g * g
        p = p - lr * g / (np.sqrt(s) + eps)
    return p


CASES = [
    ("sgd", lambda: optim.SGD(lr=0.1), lambda p, g, l: ref_sgd(p, g, l)),
    ("sgd_wd", lambda: optim.SGD(lr=0.1, weight_decay=0.05), lambda p, g, l: ref_sgd(p, g, l, wd=0.05)),
    ("sgd_momentum_wd", lambda: optim.SGD(lr=0.05, momentum=0.9, weight_decay=0.01),
     lambda p, g, l: ref_sgd(p, g, l, 0.9, False, 0.01)),
    ("sgd_nesterov", lambda: optim.SGD(lr=0.05, momentum=0.8, nesterov=True),
     lambda p, g, l: ref_sgd(p, g, l, 0.8, True)),
    ("adam", lambda: optim.Adam(lr=0.01, weight_decay=0.1), lambda p, g, l: ref_adam(p, g, l, wd=0.1)),
    ("adam_betas", lambda: optim.Adam(lr=0.02, betas=(0.5, 0.9), eps=1e-6),
     lambda p, g, l: ref_adam(p, g, l, (0.5, 0.9), 1e-6)),
    ("rmsprop", lambda: optim.RMSProp(lr=0.01), lambda p, g, l: ref_rmsprop(p, g, l)),
    ("rmsprop_centered_momentum", lambda: optim.RMSProp(lr=0.01, alpha=0.9, momentum=0.5, centered=True,
                                                        weight_decay=0.05),
     lambda p, g, l: ref_rmsprop(p, g, l, 0.9, 1e-8, 0.5, True, 0.05)),
    ("adagrad", lambda: optim.AdaGrad(lr=0.1, initial_accumulator_value=0.1),
     lambda p, g, l: ref_adagrad(p, g, l, init=0.1)),
]


def _param(p0):
    return Variable(dmath.from_numpy(p0, layout=dmath.Replicated(), dtype="float64"), name="p")


@pytest.mark.parametrize("name,make,ref", CASES, ids=[c[0] for c in CASES])
def test_optimizer_matches_pytorch_rule(name, make, ref):
    p0 = np.random.default_rng(1).normal(size=SHAPE)
    grads = _grads(6)
    p = _param(p0)
    opt = make()
    for g in grads:
        opt.step([p], [dmath.from_numpy(g, layout=dmath.Partial(), dtype="float64")])
    assert p.value.layout == dmath.Replicated().resolved(dmath.num_workers())
    np.testing.assert_allclose(p.value.to_numpy(), ref(p0, grads, [opt.lr] * len(grads)), rtol=1e-10, atol=1e-12)


def test_schedule_with_warmup_sets_each_steps_learning_rate():
    sched = schedules.Warmup(3, then=schedules.StepDecay(2, gamma=0.5))
    opt = optim.SGD(lr=0.4, momentum=0.5, schedule=sched)
    lrs = [sched(t, 0.4) for t in range(8)]
    # the decay clock starts after the warm-up: steps 3, 4 at 0.4, then 5, 6 at 0.2, then 0.1
    np.testing.assert_allclose(lrs, [0.4 / 3, 0.8 / 3, 0.4, 0.4, 0.4, 0.2, 0.2, 0.1])
    p0 = np.ones(SHAPE)
    p, grads = _param(p0), _grads(8, seed=3)
    for g in grads:
        opt.step([p], [dmath.from_numpy(g, layout=dmath.Replicated(), dtype="float64")])
    np.testing.assert_allclose(p.value.to_numpy(), ref_sgd(p0, grads, lrs, 0.5), rtol=1e-12)


def test_schedule_values():
    cos = schedules.CosineAnnealing(10, min_lr=0.1)
    assert cos(0, 1.0) == pytest.approx(1.0) and cos(10, 1.0) == pytest.approx(0.1)
    assert cos(5, 1.0) == pytest.approx(0.55) and cos(50, 1.0) == pytest.approx(0.1)
    assert schedules.ExponentialDecay(0.5)(3, 8.0) == pytest.approx(1.0)
    w = schedules.Warmup(4, start_factor=0.5)
    assert [w(t, 1.0) for t in range(5)] == pytest.approx([0.625, 0.75, 0.875, 1.0, 1.0])
    assert schedules.get(w.get_config())(1, 1.0) == pytest.approx(0.75)
    with pytest.raises(dnn.ConfigError):
        schedules.StepDecay(0)


@pytest.mark.parametrize("name,make,ref", CASES[1:5] + CASES[7:], ids=[c[0] for c in CASES[1:5] + CASES[7:]])
def test_a_gated_step_changes_nothing(name, make, ref):
    """A step with gate 0 (an overflow in mixed precision) is skipped exactly, NaN gradients included."""
    p0 = np.random.default_rng(2).normal(size=SHAPE)
    grads = _grads(4, seed=5)
    p, opt = _param(p0), make()
    one = dmath.ones((1, 1), dtype="float64", layout=dmath.Replicated())
    zero = dmath.zeros((1, 1), dtype="float64", layout=dmath.Replicated())
    bad = np.full(SHAPE, np.nan)
    bad[0, 0] = np.inf
    # skipped first (Adam's bias corrections must not advance), then two good, one skipped, two good
    sequence = [(bad, zero), (grads[0], one), (grads[1], one), (bad, zero), (grads[2], one), (grads[3], one)]
    for g, gate in sequence:
        opt.prepare([p])
        opt.apply([p], [dmath.from_numpy(g, dtype="float64", layout=dmath.Partial())], gate=gate)
    np.testing.assert_allclose(p.value.to_numpy(), ref(p0, grads, [opt.lr] * 4), rtol=1e-10, atol=1e-12)


def test_dynamic_loss_scale_backs_off_and_grows():
    scaler = optim.DynamicLossScale(init_scale=1024.0, growth_interval=3)
    scaler.setup()
    finite = dmath.from_numpy(np.ones((2, 2)), layout=dmath.Replicated(), dtype="float32")
    inf = dmath.from_numpy(np.array([[1.0, np.inf], [0, 0]]), layout=dmath.Replicated(), dtype="float32")
    nan = dmath.from_numpy(np.array([[np.nan, 1.0], [0, 0]]), layout=dmath.Replicated(), dtype="float32")
    seen = []
    for g in (inf, nan, finite, finite, finite, finite, inf, finite):
        ok = scaler.check([g, None, finite])
        seen.append((ok.get((0, 0)), scaler.value()))
        scaler.update(ok)
    assert [s[0] for s in seen] == [0, 0, 1, 1, 1, 1, 0, 1]
    assert [s[1] for s in seen] == [1024, 512, 256, 256, 256, 512, 512, 256]


@pytest.mark.parametrize("make", [lambda: optim.SGD(lr=0.5, momentum=0.9, weight_decay=0.1),
                                  lambda: optim.Adam(lr=0.01, weight_decay=0.1),
                                  lambda: optim.RMSProp(lr=0.01)], ids=["sgd", "adam", "rmsprop"])
def test_a_scaled_gradient_steps_as_the_unscaled_one(make):
    """apply(grad_scale=s) with s * g is the step of g: fused rules divide inside their kernel, the others
    before their elementwise rule; float16 gradients of float64 weights are read as they are."""
    p0 = np.random.default_rng(3).normal(size=SHAPE)
    g = np.random.default_rng(4).normal(size=SHAPE).astype(np.float16).astype(np.float64)
    scale = dmath.full((1, 1), 512.0, dtype="float32", layout=dmath.Replicated())
    results = []
    for grad, kw in ((dmath.from_numpy(g), {}),
                     (dmath.from_numpy(g * 512.0, dtype="float16", layout=dmath.Partial()), {"grad_scale": scale}),
                     (dmath.from_numpy(g * 512.0, dtype="float16"), {"grad_scale": scale})):
        p, opt = _param(p0), make()
        for _ in range(2):
            opt.prepare([p])
            opt.apply([p], [grad], **kw)
            opt.finish()
        results.append(p.value.to_numpy())
    np.testing.assert_allclose(results[1], results[0], rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(results[2], results[0], rtol=1e-12, atol=1e-12)


def test_optimizer_config_round_trip_and_errors():
    opt = optim.Adam(lr=0.003, betas=(0.8, 0.99), weight_decay=0.01,
                     schedule=schedules.Warmup(10, then=schedules.CosineAnnealing(100)))
    again = optim.get(opt.get_config())
    assert isinstance(again, optim.Adam) and again.get_config() == opt.get_config()
    assert isinstance(optim.get("rmsprop"), optim.RMSProp)
    for bad in (lambda: optim.SGD(lr=0), lambda: optim.SGD(lr=0.1, momentum=1.5),
                lambda: optim.SGD(lr=0.1, nesterov=True), lambda: optim.Adam(betas=(0.9,)),
                lambda: optim.get("lbfgs"), lambda: optim.SGD(lr=0.1, foreach="yes")):
        with pytest.raises(dnn.ConfigError):
            bad()


def test_optimizer_state_round_trip():
    p0 = np.random.default_rng(4).normal(size=SHAPE)
    grads = _grads(5, seed=6)
    a, b = _param(p0), _param(p0)
    opt_a, opt_b = optim.Adam(lr=0.01), optim.Adam(lr=0.01)
    for g in grads[:3]:
        opt_a.step([a], [dmath.from_numpy(g, dtype="float64", layout=dmath.Replicated())])
    b.value.assign(a.value.to_numpy())
    opt_b.set_state([b], opt_a.get_state([a]))
    for g in grads[3:]:
        for p, o in ((a, opt_a), (b, opt_b)):
            o.step([p], [dmath.from_numpy(g, dtype="float64", layout=dmath.Replicated())])
    np.testing.assert_array_equal(a.value.to_numpy(), b.value.to_numpy())


def test_optimizer_state_is_checked_before_any_is_restored():
    """set_state refused nothing but a bad step count: a transposed moment was reshaped, a beta power
    of NaN (or several values, the first used) was taken. Every array is checked first, so a refused
    state leaves the optimizer as it was (no state made for the parameter, its clock unchanged)."""
    p0 = np.random.default_rng(4).normal(size=SHAPE)
    a = _param(p0)
    opt_a = optim.Adam(lr=0.01)
    for g in _grads(2, seed=6):
        opt_a.step([a], [dmath.from_numpy(g, dtype="float64", layout=dmath.Replicated())])
    good = opt_a.get_state([a])
    assert good["param0/exp_avg"].shape == SHAPE and good["iterations"] == 2
    cases = {"param0/exp_avg": (np.zeros(SHAPE[::-1]), np.zeros(15), np.full(SHAPE, np.nan)),
             "param0/exp_avg_sq": (-np.ones(SHAPE), np.full(SHAPE, np.inf)),
             "scalars/float64/beta1_power": (np.array([[np.nan]]), np.array([[0.81, 5.0]]), np.array([[1.5]]),
                                             np.array([[-0.1]])),
             "scalars/float64/lr": (np.array([[0.5]]),),
             "iterations": (np.array(2.7), np.array(np.inf), np.array([2, 3]), np.array(-1))}
    for key, values in cases.items():
        for value in values:
            b = _param(p0)
            opt_b = optim.Adam(lr=0.01)
            with pytest.raises(dnn.ConfigError, match=key.split("/")[-1]):
                opt_b.set_state([b], dict(good, **{key: value}))
            assert not opt_b.has_state(b) and opt_b.iterations == 0 and not opt_b.get_state([b]).keys() - {"iterations"}
    b = _param(p0)
    opt_b = optim.Adam(lr=0.01)
    opt_b.set_state([b], dict(good, iterations=np.array(2.0)))       # a whole float: a count all the same
    assert opt_b.iterations == 2
    for k, v in good.items():
        np.testing.assert_array_equal(opt_b.get_state([b])[k], v)


def test_an_optimizer_shared_by_successive_models_starts_each_fresh():
    """The state is held per parameter Variable, weakly: a later model's parameters never take over a
    collected model's momentum (a reused id once did), and a collected model's state goes with it."""
    import gc
    from dnn import layers as L
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(20, 4)), rng.integers(0, 3, 20)

    def model(opt):
        dmath.random.seed(0)
        return dnn.Sequential([L.Input(4), L.Dense(3, use_bias=False), L.Output("softmax")], optimizer=opt,
                              dtype="float64")
    shared = optim.SGD(lr=0.1, momentum=0.9)
    for _ in range(8):
        m, ref = model(shared), model(optim.SGD(lr=0.1, momentum=0.9))
        m.fit(x, y, batch_size=20, epochs=1, verbose=0)
        ref.fit(x, y, batch_size=20, epochs=1, verbose=0)
        np.testing.assert_array_equal(m.get_weights()[0], ref.get_weights()[0])
        del m, ref
        gc.collect()
        assert len(shared._state) == 0


def test_optimizer_assignment_takes_names_and_refuses_others():
    m = dnn.Sequential([L.Input(4), L.Dense(3), L.Output("softmax")], dtype="float64")
    m.optimizer = "adam"
    assert isinstance(m.optimizer, dnn.optim.Adam)
    with pytest.raises(dnn.ConfigError, match="optimizer"):
        m.optimizer = 3


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("make", [
    lambda f: optim.SGD(lr=0.05, momentum=0.9, nesterov=True, weight_decay=1e-3, foreach=f),
    lambda f: optim.Adam(lr=0.01, weight_decay=1e-3, foreach=f)], ids=["sgd", "adam"])
def test_foreach_steps_give_the_one_command_per_parameter_weights(make, dtype):
    """foreach (the default: the parameters of a dtype in few commands, dmath.nn.sgd_update_many) gives
    the weights of one command per parameter, bit for bit, over a few steps of a small CNN (float16:
    float32 master weights, float16 gradients, loss scaling and its gate). On GPUs the two runs' convolutions
    may differ in their last bits (runs_may_differ), so there at a tolerance; the update kernels alone are
    compared bit for bit in tests/dist/dmath/test_nn_update_many.py."""
    rng = np.random.default_rng(3)
    x, y = rng.normal(size=(16, 1, 8, 8)), rng.integers(0, 4, 16)
    weights = []
    for foreach in (True, False):
        dmath.random.seed(5)
        opt = make(foreach)
        assert opt.get_config()["foreach"] is foreach and optim.get(opt.get_config()).foreach is foreach
        # (no bias before the BatchNorm: its gradient is zero but for rounding, which Adam's division by
        # sqrt(v) turns into whole steps, so on a GPU the two runs' biases parted by 0.4%)
        m = dnn.Sequential([L.Input((1, 8, 8)), L.Conv2D(4, 3, padding="same", use_bias=False), L.BatchNorm(),
                            L.Activation("relu"), L.Flatten(), L.Dense(4), L.Output("softmax")],
                           optimizer=opt, dtype=dtype)
        m.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0)
        weights.append(m.get_weights())
    for a, b in zip(*weights):
        if runs_may_differ():           # (a GPU's convolution plans may sum in another order each run)
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6 * max(float(np.abs(a).max()), 1.0))
        else:
            np.testing.assert_array_equal(a, b)


class _Returns(schedules.Schedule):
    """A schedule giving `value` at every step (what a user's buggy schedule may return)."""

    def __init__(self, value):
        self.value = value

    def __call__(self, step, base_lr):
        return self.value


@pytest.mark.parametrize("value", [-0.5, float("nan"), float("inf"), 1e400, "0.1", None, True],
                         ids=["negative", "nan", "inf", "overflow", "str", "none", "bool"])
def test_a_bad_learning_rate_from_a_schedule_or_an_assignment_is_refused(value):
    """The learning rate is checked where each step reads it: a negative one would train uphill, NaN or
    inf would only surface as a NaN guard error, a string or None as a raw TypeError."""
    p = _param(np.ones(SHAPE))
    g = dmath.from_numpy(np.ones(SHAPE), layout=dmath.Replicated(), dtype="float64")
    opt = optim.SGD(lr=0.1, schedule=_Returns(value))
    with pytest.raises(dnn.ConfigError, match="_Returns.*learning rate"):
        opt.step([p], [g])
    opt = optim.SGD(lr=0.1)
    opt.lr = value
    with pytest.raises(dnn.ConfigError, match="SGD.*lr"):
        opt.step([p], [g])
    np.testing.assert_array_equal(p.value.to_numpy(), np.ones(SHAPE))     # nothing stepped


def test_a_zero_learning_rate_is_legitimate():
    """Warm-up schedules start at 0: a step at lr 0 changes nothing and is no error."""
    p = _param(np.ones(SHAPE))
    opt = optim.SGD(lr=0.1, schedule=_Returns(0))
    opt.step([p], [dmath.from_numpy(np.ones(SHAPE), layout=dmath.Replicated(), dtype="float64")])
    np.testing.assert_array_equal(p.value.to_numpy(), np.ones(SHAPE))


@pytest.mark.parametrize("min_lr", [float("nan"), float("inf"), -1.0, "0"])
def test_cosine_annealing_refuses_a_min_lr_that_is_not_finite(min_lr):
    with pytest.raises(dnn.ConfigError, match="min_lr"):
        schedules.CosineAnnealing(10, min_lr=min_lr)


@pytest.mark.parametrize("make,change,ref", [
    (lambda: optim.SGD(lr=0.1), dict(momentum=0.9), lambda p, g, lrs: ref_sgd(p, g, lrs, momentum=0.9)),
    (lambda: optim.RMSProp(lr=0.01), dict(momentum=0.5),
     lambda p, g, lrs: ref_rmsprop(p, g, lrs, momentum=0.5)),
    (lambda: optim.RMSProp(lr=0.01), dict(centered=True), lambda p, g, lrs: ref_rmsprop(p, g, lrs, centered=True)),
], ids=["sgd-momentum", "rmsprop-momentum", "rmsprop-centered"])
def test_a_hyper_parameter_changed_between_steps_creates_its_state(make, change, ref):
    """Turning momentum (or RMSProp's centering) on after some steps makes the state it needs, zeros as a
    fresh optimizer's, at the next step; the old state carries on (here the steps before the change
    had none that matters: SGD has no state, RMSProp's square_avg is kept, so compare from scratch)."""
    p0 = np.random.default_rng(2).normal(size=SHAPE)
    grads = _grads(4, seed=6)
    p, opt = _param(p0), make()
    opt.step([p], [dmath.from_numpy(grads[0], layout=dmath.Replicated(), dtype="float64")])
    for k, v in change.items():
        setattr(opt, k, v)
    assert opt.get_config()[k] == v
    for g in grads[1:]:
        opt.step([p], [dmath.from_numpy(g, layout=dmath.Replicated(), dtype="float64")])
    # the reference: one step with the old setting, then the new one from zero state (square_avg kept)
    fresh = make()
    q = _param(p0)
    fresh.step([q], [dmath.from_numpy(grads[0], layout=dmath.Replicated(), dtype="float64")])
    for k, v in change.items():
        setattr(fresh, k, v)
    if isinstance(opt, optim.SGD):
        np.testing.assert_allclose(p.value.to_numpy(), ref(q.value.to_numpy(), grads[1:], [0.1] * 3), rtol=1e-12)
    else:
        assert set(opt._state[p]) == set(opt.state_names)
        assert float(np.abs(opt._state[p]["square_avg"].to_numpy()).max()) > 0
        assert np.isfinite(p.value.to_numpy()).all()


@pytest.mark.parametrize("make,attr,bad", [
    (lambda: optim.SGD(lr=0.1), "momentum", 1.5), (lambda: optim.SGD(lr=0.1), "momentum", "x"),
    (lambda: optim.SGD(lr=0.1, momentum=0.9), "nesterov", "yes"),
    (lambda: optim.SGD(lr=0.1, momentum=0.9, nesterov=True), "momentum", 0.0),
    (lambda: optim.RMSProp(), "momentum", -0.1), (lambda: optim.RMSProp(), "centered", "no"),
    (lambda: optim.RMSProp(), "centered", 1)])
def test_a_bad_hyper_parameter_assignment_is_refused(make, attr, bad):
    opt = make()
    before = getattr(opt, attr)
    with pytest.raises(dnn.ConfigError, match=attr):
        setattr(opt, attr, bad)
    assert getattr(opt, attr) == before


@pytest.mark.parametrize("bad", [lambda: optim.RMSProp(centered="no"), lambda: optim.SGD(momentum=0.9, nesterov="yes"),
                                 lambda: optim.SGD(nesterov=1), lambda: optim.RMSProp(centered=None)])
def test_bool_arguments_take_only_bools(bad):
    with pytest.raises(dnn.ConfigError, match="True or False"):
        bad()


def test_config_dicts_with_bad_arguments_raise_config_errors():
    for spec in ({"name": "SGD", "schedule": {"name": "StepDecay"}},
                 {"name": "SGD", "schedule": {"name": "ExponentialDecay", "gamma": 0.5, "extra": 1}},
                 {"name": "SGD", "schedule": {"name": "Warmup", "steps": 2, "then": {"name": "StepDecay"}}},
                 {"name": "Adam", "betas": 5}, {"name": "Adam", "betas": None}):
        with pytest.raises(dnn.ConfigError, match="name"):
            optim.get(spec)
    with pytest.raises(dnn.ConfigError, match="StepDecay"):
        schedules.get({"name": "StepDecay", "gamma": 0.5})


@pytest.mark.parametrize("kind", [optim.RMSProp, optim.AdaGrad])
def test_every_optimizer_takes_foreach(kind):
    """foreach is the base class's: RMSProp and AdaGrad take it (their rules have no list form, so
    both values step one command per parameter) and keep it in their config."""
    for f in (True, False):
        opt = kind(foreach=f)
        assert opt.foreach is f and optim.get(opt.get_config()).foreach is f
    with pytest.raises(dnn.ConfigError, match="foreach"):
        kind(foreach="yes")


@pytest.mark.parametrize("kind", [optim.SGD, optim.Adam, optim.RMSProp, optim.AdaGrad])
def test_a_parameter_listed_twice_is_refused_by_every_optimizer(kind):
    """minimize(x ** 2, [x, x]) stepped x twice with AdaGrad and RMSProp (a hostile-use probe; SGD and
    Adam refused it in their fused kernel): one check for every rule, before anything is updated, and
    the same Variable listed once still steps."""
    from dnn import graph as G
    x = G.var("x", (1, 1), init=5.0, dtype="float64")
    opt = kind(lr=0.1)
    with pytest.raises(dnn.ConfigError, match="'x' appears twice"):
        opt.minimize(G.pow(x, 2), [x, x])
    assert x.value.to_numpy().item() == 5.0 and opt.iterations == 0
    with pytest.raises(dnn.ConfigError, match="appears twice"):          # two Variables of one matrix
        opt.step([x, Variable(x.value, name="y")], [dmath.ones((1, 1), dtype="float64")] * 2)
    assert x.value.to_numpy().item() == 5.0
    opt.minimize(G.pow(x, 2), [x])
    once = x.value.to_numpy().item()
    y = G.var("y", (1, 1), init=5.0, dtype="float64")
    kind(lr=0.1).minimize(G.pow(y, 2), [y])
    assert once == y.value.to_numpy().item() < 5.0


# ---- optimizer settings changed by a callback in the middle of an epoch (a hostile-use probe) -------
def _mid_epoch_model(opt):
    dmath.random.seed(5)
    return dnn.Sequential([L.Input(4), L.Dense(6, activation="relu"), L.Dense(3), L.Output("softmax")],
                          dtype="float64", optimizer=opt)


def _mid_epoch_data():
    rng = np.random.default_rng(2)
    return rng.normal(size=(16, 4)), rng.integers(0, 3, 16)


class _AtBatch(dnn.callbacks.Callback):
    def __init__(self, batch, change):
        self.batch, self.change = batch, change

    def on_batch_end(self, batch, logs=None):
        if batch == self.batch:
            self.change(self.model)


@pytest.mark.parametrize("opt,change", [
    (lambda: optim.SGD(lr=0.1, momentum=0.9), lambda m: setattr(m.optimizer, "momentum", 0.0)),
    (lambda: optim.SGD(lr=0.1), lambda m: setattr(m.optimizer, "momentum", 0.9)),
    (lambda: optim.SGD(lr=0.1), lambda m: setattr(m.optimizer, "weight_decay", 0.5)),
    (lambda: optim.Adam(lr=0.05), lambda m: setattr(m.optimizer, "eps", 0.1)),
])
def test_an_optimizer_setting_changed_mid_epoch_applies_from_the_next_step(opt, change):
    """The epoch's recorded step baked momentum, weight decay, betas and eps in: a change from a callback
    was ignored until the next epoch (lowering momentum replayed a step reading freed buffers: a
    PlanError). It applies from the next step now: the same weights as two fits, changed in between."""
    x, y = _mid_epoch_data()
    model = _mid_epoch_model(opt())
    model.fit(x, y, batch_size=4, epochs=1, shuffle=False, verbose=0, callbacks=[_AtBatch(1, change)])
    ref = _mid_epoch_model(opt())
    ref.fit(x[:8], y[:8], batch_size=4, epochs=1, shuffle=False, verbose=0)
    change(ref)
    ref.fit(x[8:], y[8:], batch_size=4, epochs=1, shuffle=False, verbose=0)
    for a, b in zip(model.get_weights(), ref.get_weights()):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-14)


def test_an_optimizer_replaced_mid_epoch_steps_from_the_next_batch():
    x, y = _mid_epoch_data()
    model = _mid_epoch_model(optim.SGD(lr=0.5))
    seen = {}

    def swap(m):
        seen["weights"] = m.get_weights()
        m.optimizer = optim.SGD(lr=1e-300)            # (the old one would move them by 0.5 x gradient)
    model.fit(x, y, batch_size=4, epochs=1, shuffle=False, verbose=0, callbacks=[_AtBatch(1, swap)])
    for a, b in zip(model.get_weights(), seen["weights"]):
        np.testing.assert_allclose(a, b, rtol=1e-15, atol=1e-200)
    assert model.optimizer.iterations == 2


def test_callbacks_given_as_one_object_and_inputs_that_are_not_arrays_are_refused_in_words():
    x, y = _mid_epoch_data()
    model = _mid_epoch_model(optim.SGD(lr=0.1))
    with pytest.raises(dnn.ConfigError, match="a list of dnn.callbacks.Callback objects, got one EarlyStopping"):
        model.fit(x, y, epochs=1, verbose=0, callbacks=dnn.callbacks.EarlyStopping())
    with pytest.raises(dnn.DNNError, match="must be a numpy array .*got generator: materialise it"):
        model.predict(r for r in x)
    with pytest.raises(dnn.DNNError, match="must be a numpy array .*got NoneType"):
        model.fit(None, y, epochs=1, verbose=0)
    model.fit(x, y, epochs=1, verbose=0)                 # the runtime goes on


def test_the_settings_are_read_again_after_each_step_only_where_a_callback_may_change_them(monkeypatch):
    """The key reads every layer's config: fit takes it once an epoch unless a callback with an
    on_batch_end that may change settings is there (the default TerminateOnNaN and a step
    ModelCheckpoint only read or save)."""
    x, y = _mid_epoch_data()
    model = _mid_epoch_model(optim.SGD(lr=0.1))
    calls = []
    plain = type(model)._program_key
    monkeypatch.setattr(type(model), "_program_key", lambda self, kind: calls.append(kind) or plain(self, kind))
    model.fit(x, y, batch_size=2, epochs=1, shuffle=False, verbose=0)
    quiet = calls.count("train")
    calls.clear()
    model.fit(x, y, batch_size=2, epochs=1, shuffle=False, verbose=0, callbacks=[_AtBatch(-1, None)])
    assert calls.count("train") >= quiet + 8 and quiet < 8       # 8 steps: once after each
