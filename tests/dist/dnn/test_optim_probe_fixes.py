"""Regressions of a report-only hostile-use probe of dnn's optimizers, schedules, loss scaling and
callbacks, at every worker count.

Oracles: the same training run eagerly (record=False) or with a Callback subclass, NumPy in
float64, torch.optim.Adam (skipped without torch), and the state a refused call found.
"""
import numpy as np
import pytest

import dmath
import dnn
from dnn import layers as L
from dnn.errors import ConfigError

P = dmath.num_workers()


def _data(n=16):
    rng = np.random.default_rng(0)
    return rng.standard_normal((n, 8)), rng.integers(0, 3, n)


def _mlp(optimizer, record=True, dtype="float64", **kw):
    dmath.random.seed(1)
    return dnn.Sequential([L.Input((8,)), L.Dense(6), L.Activation("relu"), L.Dense(3), L.Output("softmax")],
                          dtype=dtype, optimizer=optimizer, record=record, **kw)


def _max_diff(ws, vs):
    return max(float(np.abs(a - b).max()) for a, b in zip(ws, vs))


# ---- D1: a LambdaCallback's on_batch_end re-keys the recorded step -------------------------------------
_CHANGES = {
    "momentum=0.3": lambda m: setattr(m.optimizer, "momentum", 0.3),
    "weight_decay=0.5": lambda m: setattr(m.optimizer, "weight_decay", 0.5),
    "freeze": lambda m: setattr(m.layers[1], "trainable", False),
    "momentum=0.0": lambda m: setattr(m.optimizer, "momentum", 0.0),
}


def _train_with_change(record, kind, change):
    x, y = _data()
    m = _mlp(dnn.optim.SGD(lr=0.1, momentum=0.9), record=record)

    def f(batch, logs=None):
        if batch == 1:
            change(m)

    class Sub(dnn.callbacks.Callback):
        def on_batch_end(self, batch, logs=None):
            f(batch)

    cb = dnn.callbacks.LambdaCallback(on_batch_end=f) if kind == "lambda" else Sub()
    m.fit(x, y, batch_size=4, epochs=1, shuffle=False, verbose=0, callbacks=[cb])
    return m.get_weights()


@pytest.mark.parametrize("name", list(_CHANGES))
def test_a_lambda_callbacks_change_applies_from_the_next_step(name):
    """LambdaCallback(on_batch_end=f) changing momentum, weight decay or a layer's trainable flag was
    ignored for the rest of the epoch (momentum 0 replayed freed buffers: PlanError), recorded or
    not: it trains as a Callback subclass doing the same, run eagerly."""
    change = _CHANGES[name]
    ref = _train_with_change(False, "subclass", change)
    untouched = _train_with_change(False, "subclass", lambda m: None)
    assert _max_diff(ref, untouched) > 1e-6          # the change matters
    for record, kind in ((True, "subclass"), (True, "lambda"), (False, "lambda")):
        assert _max_diff(ref, _train_with_change(record, kind, change)) == 0.0


def test_hooks_batch_end_sees_instance_hooks():
    """The rule fit re-keys by: a hook of the subclass or of the instance, unless changes_settings is False."""
    assert not dnn.callbacks.Callback().hooks_batch_end()
    assert not dnn.callbacks.LambdaCallback(on_epoch_end=lambda e, logs: None).hooks_batch_end()
    assert dnn.callbacks.LambdaCallback(on_batch_end=lambda b: None).hooks_batch_end()
    assert not dnn.callbacks.TerminateOnNaN().hooks_batch_end()


# ---- D8: asynchronous SGD's staleness-corrected momentum with nesterov -----------------------------------
def _async_fit(nesterov):
    x, y = _data(24)
    m = _mlp(dnn.optim.SGD(lr=0.1, momentum=0.5, nesterov=nesterov))
    m.fit(x, y, batch_size=4, epochs=1, verbose=0, asynchronous=True)
    return m


def test_asynchronous_nesterov_with_a_momentum_corrected_to_zero():
    """The staleness rule's momentum went through SGD's checked setting: corrected to 0 (3 and 4
    workers) it raised 'nesterov momentum needs momentum > 0'. It is an internal override now, and a
    corrected momentum of 0 steps as plain SGD, so nesterov or not then trains alike."""
    from dnn.training import asgd
    m = _async_fit(True)
    assert m.optimizer.momentum == 0.5 and m.optimizer.nesterov          # the user's settings, untouched
    assert m.optimizer.get_config()["momentum"] == 0.5
    assert all(np.isfinite(w).all() for w in m.get_weights())
    rule = asgd.StalenessRule(asgd.STALENESS_RULE, asgd.mean_staleness(P, P - 1, 6), 0.5)
    plain = _async_fit(False).get_weights()
    if rule.momentum(0.5) == 0.0:
        assert _max_diff(m.get_weights(), plain) == 0.0
    else:       # a momentum left: Nesterov's step differs from the heavy ball's
        assert _max_diff(m.get_weights(), plain) > 0.0


def test_momentum_override_leaves_the_setting_alone():
    """Optimizer.momentum_override substitutes the update's momentum without the setting's checks."""
    opt = dnn.optim.SGD(lr=0.1, momentum=0.5, nesterov=True)
    with opt.momentum_override(0.0):
        assert opt.step_momentum() == 0.0 and opt._rule() == (0.0, False)
        assert opt.momentum == 0.5
    assert opt.step_momentum() == 0.5 and opt._rule() == (0.5, True)


# ---- D2, D3, D4: the loss scale's settings, replacement and range -------------------------------------
def _f16(loss_scale=None, record=True):
    return _mlp(dnn.optim.SGD(lr=0.1), record=record, dtype="float16", loss_scale=loss_scale)


@pytest.mark.parametrize("record", [True, False])
def test_loss_scale_settings_changed_between_fits_apply(record):
    """growth_interval and growth_factor changed between fits were baked in the recorded step (and a
    growth_interval lowered below the count of good steps already made was never met again): after
    4 finite steps with growth_interval=1 and growth_factor=4 the scale is 4 * 4**4."""
    x, y = _data()
    ls = dnn.optim.DynamicLossScale(init_scale=4.0, growth_interval=1000)
    m = _f16(ls, record)
    m.fit(x.astype(np.float32), y, batch_size=4, epochs=1, verbose=0)
    assert ls.value() == 4.0
    ls.growth_interval, ls.growth_factor = 1, 4.0
    m.fit(x.astype(np.float32), y, batch_size=4, epochs=1, verbose=0)
    assert ls.value() == 4.0 * 4.0 ** 4


def test_a_replaced_loss_scale_works_from_the_next_fit():
    """A DynamicLossScale assigned between fits was never set up: the next fit raised a raw TypeError
    after the weights moved. It is set up on assignment and trains as one given to the constructor."""
    x, y = _data()
    x = x.astype(np.float32)
    m = _f16()
    m.fit(x, y, batch_size=4, epochs=1, shuffle=False, verbose=0)
    m.loss_scale = dnn.optim.DynamicLossScale(init_scale=8.0, growth_interval=2)
    m.fit(x, y, batch_size=4, epochs=1, shuffle=False, verbose=0)
    ref = _f16()
    ref.fit(x, y, batch_size=4, epochs=1, shuffle=False, verbose=0)
    ref.loss_scale = None           # a float16 model's None: a scaler with the defaults, replaced next
    ref.loss_scale = dnn.optim.DynamicLossScale(init_scale=8.0, growth_interval=2)
    ref.fit(x, y, batch_size=4, epochs=1, shuffle=False, verbose=0)
    assert m.loss_scale.value() == 8.0 * 2 ** 2 == ref.loss_scale.value()
    assert _max_diff(m.get_weights(), ref.get_weights()) == 0.0
    assert m.optimizer.iterations == 8


@pytest.mark.parametrize("value", [3.0, "dynamic", True])
def test_a_loss_scale_that_is_not_a_scaler_is_refused_on_assignment(value):
    """m.loss_scale = 3.0 was accepted and the next fit raised AttributeError; it is refused at once
    (ConfigError), and the model keeps its scaler."""
    m = _f16()
    before = m.loss_scale
    with pytest.raises(ConfigError, match="DynamicLossScale"):
        m.loss_scale = value
    assert m.loss_scale is before
    f64 = _mlp(dnn.optim.SGD(lr=0.1))
    with pytest.raises(ConfigError, match="applies to dtype='float16' only"):
        f64.loss_scale = dnn.optim.DynamicLossScale()
    assert f64.loss_scale is None


@pytest.mark.parametrize("kw", [{"init_scale": 1e39}, {"init_scale": 1e-50}, {"init_scale": 1e-40},
                                {"init_scale": 0.0}, {"growth_factor": 1.0}, {"backoff_factor": 1.0},
                                {"growth_interval": 0}, {"growth_interval": 2 ** 24 + 1}, {"growth_interval": 2.0}])
def test_loss_scale_settings_outside_float32_are_refused(kw):
    """init_scale=1e39 (inf in float32) and 1e-50 (0) were accepted: every setting is checked at
    construction and at assignment alike, naming it; a refused assignment changes nothing."""
    (name, value), = kw.items()
    with pytest.raises(ConfigError, match=name):
        dnn.optim.DynamicLossScale(**kw)
    ls = dnn.optim.DynamicLossScale()
    before = ls.get_config()
    with pytest.raises(ConfigError, match=name):
        setattr(ls, name, value)
    assert ls.get_config() == before
    assert dnn.optim.DynamicLossScale(init_scale=float(np.finfo(np.float32).max)).init_scale > 3e38


# ---- D5: hyper-parameters assigned after construction are checked as the constructor's -------------------
_REFUSED = [
    (lambda: dnn.optim.RMSProp(), "eps", -1, "eps"),
    (lambda: dnn.optim.RMSProp(), "alpha", 2.0, "alpha"),
    (lambda: dnn.optim.AdaGrad(), "eps", -1, "eps"),
    (lambda: dnn.optim.AdaGrad(), "initial_accumulator_value", -0.5, "initial_accumulator_value"),
    (lambda: dnn.optim.SGD(), "foreach", "no", "foreach"),
    (lambda: dnn.optim.SGD(), "weight_decay", -1.0, "weight_decay"),
    (lambda: dnn.optim.SGD(), "schedule", 0.5, "schedule"),
    (lambda: dnn.optim.Adam(), "betas", (0.9, 1.0), "beta2"),
    (lambda: dnn.optim.Adam(), "eps", 0.0, "eps"),
    (lambda: dnn.optim.schedules.StepDecay(10), "gamma", 5, "gamma"),
    (lambda: dnn.optim.schedules.StepDecay(10), "step_size", 0, "step_size"),
    (lambda: dnn.optim.schedules.ExponentialDecay(0.9), "gamma", 0.0, "gamma"),
    (lambda: dnn.optim.schedules.CosineAnnealing(5), "min_lr", float("nan"), "min_lr"),
    (lambda: dnn.optim.schedules.Warmup(3), "start_factor", 2.0, "start_factor"),
    (lambda: dnn.optim.schedules.Warmup(3), "then", 5, "then"),
]


@pytest.mark.parametrize("make, name, value, says", _REFUSED, ids=[f"{r[1]}={r[2]!r}" for r in _REFUSED])
def test_assigned_hyper_parameters_are_checked_as_the_constructors(make, name, value, says):
    """RMSProp(eps=-1, alpha=2), AdaGrad(eps=-1), SGD.foreach='no', StepDecay.gamma=5 were refused
    by the constructors but taken by an assignment and trained with: each assignment is refused
    (ConfigError naming the attribute and its range) and leaves the object as it was."""
    obj = make()
    before = obj.get_config()
    with pytest.raises(ConfigError, match=says):
        setattr(obj, name, value)
    assert obj.get_config() == before


def test_an_assigned_hyper_parameter_within_range_trains():
    """An accepted assignment trains as the constructor's argument does (the oracle)."""
    x, y = _data()
    runs = []
    for assign in (False, True):
        opt = dnn.optim.RMSProp(lr=0.01) if assign else dnn.optim.RMSProp(lr=0.01, alpha=0.5, eps=1e-3)
        if assign:
            opt.alpha, opt.eps = 0.5, 1e-3
        m = _mlp(opt)
        m.fit(x, y, batch_size=4, epochs=1, shuffle=False, verbose=0)
        runs.append(m.get_weights())
    assert _max_diff(*runs) == 0.0


# ---- D6: layer.parallel assigned after construction ---------------------------------------------------
def test_an_assigned_parallel_strategy_is_applied_and_saved(tmp_path):
    """dense.parallel = 'model' after a fit was stored but not applied (the layer stayed data parallel
    while get_config and the saved file said 'model'). The weights move now and training goes on
    from where it was (its momentum buffers follow), as the model that never changed (the oracle)."""
    from dnn import parallel as par
    x, y = _data()
    runs = []
    for change in (False, True):
        m = _mlp(dnn.optim.SGD(lr=0.1, momentum=0.9))
        m.fit(x, y, batch_size=4, epochs=1, shuffle=False, verbose=0)
        if change:
            m.layers[1].parallel = "model"
            dense = m.layers[1]
            assert dense.strategy == "model" and dense.get_config()["parallel"] == "model"
            assert type(dense.kernel.value.layout) is type(par.weight_layout("model"))
        m.fit(x, y, batch_size=4, epochs=1, shuffle=False, verbose=0)
        runs.append(m)
    np.testing.assert_allclose(np.concatenate([w.ravel() for w in runs[1].get_weights()]),
                               np.concatenate([w.ravel() for w in runs[0].get_weights()]), rtol=1e-12, atol=1e-13)
    runs[1].save(tmp_path / "m.dnn")
    back = dnn.load(tmp_path / "m.dnn")
    assert back.layers[1].strategy == "model"
    assert _max_diff(back.get_weights(), runs[1].get_weights()) == 0.0
    # and back to data parallelism, or to the cost model's choice
    runs[1].layers[1].parallel = "data"
    assert type(runs[1].layers[1].kernel.value.layout) is type(par.weight_layout("data"))
    runs[1].layers[1].parallel = "auto"
    runs[1].fit(x, y, batch_size=4, epochs=1, shuffle=False, verbose=0)
    assert runs[1].layers[1].strategy in ("data", "model")


@pytest.mark.parametrize("layer, value", [(lambda: L.Dense(3), "bogus"), (lambda: L.Dense(3), None),
                                          (lambda: L.Conv2D(2, 3), "model")])
def test_a_parallel_strategy_the_constructor_refuses_is_refused_on_assignment(layer, value):
    """'bogus' and None were accepted (save succeeded, dnn.load failed), and Conv2D.parallel = 'model'
    though its constructor refuses it: ConfigError, the layer unchanged."""
    lay = layer()
    with pytest.raises(ConfigError, match="parallel must be one of"):
        lay.parallel = value
    assert lay.parallel == "data" and lay.strategy == "data"


# ---- D7: schedules of the user's own -------------------------------------------------------------------
class InvTUnregistered(dnn.optim.schedules.Schedule):
    """base_lr / (1 + k * step): a user's schedule never registered."""

    def __init__(self, k=1.0):
        self.k = k

    def __call__(self, step, base_lr):
        return base_lr / (1.0 + self.k * step)


@dnn.optim.schedules.register
class InvTRegistered(InvTUnregistered):
    """The same schedule, registered."""


def test_an_unregistered_schedule_is_refused_by_save_and_checkpoints(tmp_path):
    """save and ModelCheckpoint wrote files that dnn.load refused ('unknown schedule InvT'): save
    refuses naming the class and the cure, and writes nothing; a ModelCheckpoint refuses before the
    first step; directly and inside Warmup's `then` alike."""
    x, y = _data()
    for schedule in (InvTUnregistered(2.0), dnn.optim.schedules.Warmup(2, then=InvTUnregistered())):
        m = _mlp(dnn.optim.SGD(lr=0.1, schedule=schedule))
        with pytest.raises(ConfigError, match="InvTUnregistered is not registered.*register"):
            m.save(tmp_path / "m.dnn")
        assert not (tmp_path / "m.dnn").exists()
        before = m.get_weights()
        with pytest.raises(ConfigError, match="InvTUnregistered is not registered"):
            m.fit(x, y, batch_size=4, epochs=1, verbose=0,
                  callbacks=[dnn.callbacks.ModelCheckpoint(str(tmp_path / "c_{epoch}.dnn"), monitor="loss")])
        assert _max_diff(before, m.get_weights()) == 0.0 and m.optimizer.iterations == 0
        m.fit(x, y, batch_size=4, epochs=1, verbose=0)          # training without a file is fine
    with pytest.raises(ConfigError, match="name of a dnn schedule"):
        dnn.optim.schedules.register(type("StepDecay", (dnn.optim.schedules.Schedule,), {}))


def test_a_registered_schedule_saves_and_loads(tmp_path):
    """A registered schedule's model saves, loads with the schedule rebuilt (also inside a Warmup),
    and resumes as the run that never stopped (the oracle)."""
    x, y = _data()
    sched = lambda: dnn.optim.schedules.Warmup(2, then=InvTRegistered(0.5))      # noqa: E731
    full = _mlp(dnn.optim.SGD(lr=0.1, schedule=sched()))
    full.fit(x, y, batch_size=4, epochs=2, shuffle=False, verbose=0)
    half = _mlp(dnn.optim.SGD(lr=0.1, schedule=sched()))
    half.fit(x, y, batch_size=4, epochs=1, shuffle=False, verbose=0)
    half.save(tmp_path / "m.dnn")
    back = dnn.load(tmp_path / "m.dnn")
    then = back.optimizer.schedule.then
    assert type(then) is InvTRegistered and then.k == 0.5
    back.fit(x, y, batch_size=4, epochs=1, shuffle=False, verbose=0)      # the second epoch
    assert back.optimizer.iterations == full.optimizer.iterations == 8
    assert _max_diff(back.get_weights(), full.get_weights()) == 0.0


# ---- D10: Adam's bias correction after betas change -----------------------------------------------------
def test_adam_with_betas_changed_between_fits_matches_torch():
    """dnn kept a running product of the betas (0.9^4 * 0.5^4 after a change at step 4) where
    torch.optim.Adam corrects with the current betas to the power of the step count (0.5^8): the
    weights differed by 1.3e-2. Oracle: torch.optim.Adam on the same network, batches and betas."""
    torch = pytest.importorskip("torch")
    x, y = _data()
    m = _mlp(dnn.optim.Adam(lr=0.01))
    w0 = m.get_weights()
    m.fit(x, y, batch_size=4, epochs=1, shuffle=False, verbose=0)
    m.optimizer.betas = (0.5, 0.9)
    m.fit(x, y, batch_size=4, epochs=1, shuffle=False, verbose=0)

    ts = [torch.tensor(w, dtype=torch.float64, requires_grad=True) for w in w0]
    opt = torch.optim.Adam(ts, lr=0.01, betas=(0.9, 0.999), eps=1e-8)
    for epoch in range(2):
        if epoch == 1:
            opt.param_groups[0]["betas"] = (0.5, 0.9)
        for k in range(0, 16, 4):
            xb, yb = torch.tensor(x[k:k + 4]), torch.tensor(y[k:k + 4], dtype=torch.long)
            h = torch.relu(xb @ ts[0] + ts[1])
            loss = torch.nn.functional.cross_entropy(h @ ts[2] + ts[3], yb)
            opt.zero_grad()
            loss.backward()
            opt.step()
    for got, want in zip(m.get_weights(), ts):
        np.testing.assert_allclose(got, want.detach().numpy(), rtol=1e-9, atol=1e-11)


# ---- D9: weights read or written inside an asynchronous epoch --------------------------------------------
@pytest.mark.parametrize("call", ["get_weights", "set_weights", "save", "evaluate"])
def test_weights_inside_an_asynchronous_epoch_are_refused(call, tmp_path):
    """Inside an asynchronous epoch get_weights, evaluate and save read the epoch's start and
    set_weights was lost at its end, silently: each is refused (ConfigError) from on_batch_end; the
    model then holds the store's weights and answers again, and on_epoch_end reads the final ones."""
    x, y = _data(24)
    m = _mlp(dnn.optim.SGD(lr=0.1))
    w0 = m.get_weights()
    calls = {"get_weights": lambda: m.get_weights(), "set_weights": lambda: m.set_weights(w0),
             "save": lambda: m.save(tmp_path / "m.dnn"), "evaluate": lambda: m.evaluate(x, y)}
    cb = dnn.callbacks.LambdaCallback(on_batch_end=lambda b: calls[call]())
    with pytest.raises(ConfigError, match=f"{call} was called inside an asynchronous epoch"):
        m.fit(x, y, batch_size=4, epochs=1, verbose=0, asynchronous=True, callbacks=[cb])
    assert not (tmp_path / "m.dnn").exists()
    # the refusal came at the first step's hook, before the store applied any update: the model
    # answers again (the flag is down) with the store's weights, the start's
    assert _max_diff(m.get_weights(), w0) == 0.0
    seen = []
    end = dnn.callbacks.LambdaCallback(on_epoch_end=lambda e, logs: seen.append(m.get_weights()))
    m.fit(x, y, batch_size=4, epochs=1, verbose=0, asynchronous=True, callbacks=[end])
    assert _max_diff(seen[0], m.get_weights()) == 0.0
