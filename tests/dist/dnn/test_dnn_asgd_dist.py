"""Asynchronous SGD (`fit(..., asynchronous=True, max_staleness=k)`) at every worker count.

k = 0 is synchronous SGD (the synchronous fit's weights, any number of
groups); with k > 0 the engine computes every gradient on the weights the
schedule says (a NumPy simulation of the same schedule is the oracle), the
staleness measured on the workers stays within k and reaches it, a group's
traffic is its gradients to the store and the store's weights back, and
ASGD on real digits gets close to synchronous SGD's accuracy. Bad options
raise dnn.ConfigError on the master and leave the runtime usable.
"""
import collections

import numpy as np
import pytest

import dmath
import dnn
from dnn import layers as L
from dnn.training import asgd
from dnn.training.asgd import Schedule

P = dmath.num_workers()
#: (groups, max_staleness) cases at this worker count: one worker per group, fewer groups, bounds
#: below, at and above G - 1
CASES = sorted({(P, 0), (P, P - 1), (P, P + 1), (1, 2)} | ({(P // 2, 1)} if P % 2 == 0 and P > 2 else set()))


def mlp(dtype="float64", dropout=0.0, optimizer=None, hidden=16, seed=3):
    dmath.random.seed(seed)
    layers = [L.Input((1, 6, 6)), L.Flatten(), L.Dense(hidden), L.Activation("tanh")]
    layers += [L.Dropout(dropout)] if dropout else []
    layers += [L.Dense(4), L.Output("softmax")]
    return dnn.Sequential(layers, dtype=dtype,
                          optimizer=optimizer or dnn.optim.SGD(lr=0.1, momentum=0.9, weight_decay=1e-3))


@pytest.fixture(scope="module")
def blobs():
    rng = np.random.default_rng(5)
    y = rng.integers(0, 4, size=90)
    x = rng.normal(size=(90, 1, 6, 6)) * 0.5 + y[:, None, None, None] * np.linspace(-1, 1, 36).reshape(1, 6, 6)
    return x, y


@pytest.mark.parametrize("groups", sorted({1, P}))
@pytest.mark.parametrize("opt", ["sgd", "adam", "adagrad"])
def test_k0_equals_synchronous_fit(blobs, groups, opt):
    x, y = blobs

    def make():
        # AdaGrad overrides prepare (its accumulator starts at initial_accumulator_value): the engine
        # passes it the staleness-aware lr_scale too
        o = {"sgd": lambda: dnn.optim.SGD(lr=0.1, momentum=0.9, weight_decay=1e-3),
             "adam": lambda: dnn.optim.Adam(lr=0.01, weight_decay=1e-3),
             "adagrad": lambda: dnn.optim.AdaGrad(lr=0.05, initial_accumulator_value=0.1, weight_decay=1e-3)}[opt]()
        return mlp(dropout=0.2, optimizer=o)
    sync, asy = make(), make()
    hs = sync.fit(x, y, batch_size=16, epochs=2, verbose=0)
    ha = asy.fit(x, y, batch_size=16, epochs=2, verbose=0, asynchronous=True, max_staleness=0, groups=groups)
    for a, b in zip(sync.get_weights(), asy.get_weights()):
        np.testing.assert_allclose(b, a, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(ha["loss"], hs["loss"], rtol=1e-10)
    assert ha["max_staleness"] == [0.0, 0.0]
    assert asy.optimizer.iterations == sync.optimizer.iterations == 12
    # the optimizer state came back to the model: one more synchronous epoch stays equal
    sync.fit(x, y, batch_size=16, epochs=1, verbose=0)
    asy.fit(x, y, batch_size=16, epochs=1, verbose=0)
    for a, b in zip(sync.get_weights(), asy.get_weights()):
        np.testing.assert_allclose(b, a, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("groups", sorted({1, P}))
def test_frozen_layers_are_read_not_trained_asynchronously(blobs, groups):
    """A frozen layer made fit(asynchronous=True) raise a bare KeyError (a hostile-use probe: the
    groups' graphs looked its weights up among the trained ones). Each group reads a copy of them:
    they stay as they were, and the other layers train as the synchronous fit trains them (k = 0);
    with staleness too, and a frozen layer's new weights between fits are read."""
    x, y = blobs

    def make():
        m = mlp(optimizer=dnn.optim.SGD(lr=0.1, momentum=0.9, weight_decay=1e-3))
        m.layers[2].trainable = False         # the first Dense
        return m
    sync, asy = make(), make()
    frozen = asy.layers[2].get_weights()
    sync.fit(x, y, batch_size=16, epochs=2, verbose=0)
    ha = asy.fit(x, y, batch_size=16, epochs=2, verbose=0, asynchronous=True, max_staleness=0, groups=groups)
    for a, b in zip(frozen, asy.layers[2].get_weights()):
        np.testing.assert_array_equal(b, a)
    for a, b in zip(sync.get_weights(), asy.get_weights()):
        np.testing.assert_allclose(b, a, rtol=1e-10, atol=1e-12)
    assert ha["max_staleness"] == [0.0, 0.0]
    new = [w * 0.5 for w in frozen]
    sync.layers[2].set_weights(new)
    asy.layers[2].set_weights(new)
    sync.fit(x, y, batch_size=16, epochs=1, verbose=0)
    asy.fit(x, y, batch_size=16, epochs=1, verbose=0, asynchronous=True, max_staleness=0, groups=groups)
    for a, b in zip(sync.get_weights(), asy.get_weights()):
        np.testing.assert_allclose(b, a, rtol=1e-10, atol=1e-12)
    before = asy.get_weights()
    asy.fit(x, y, batch_size=16, epochs=1, verbose=0, asynchronous=True, groups=groups)     # k = G - 1
    after = asy.get_weights()
    for a, b in zip(new, after[:2]):
        np.testing.assert_array_equal(b, a)
    assert all(np.abs(a - b).max() > 0 for a, b in zip(before[2:], after[2:]))


def simulate(w, b, x, y, batch, groups, k, epochs, lr, seed=0):
    """NumPy ASGD of a softmax regression under dnn.training.asgd.Schedule: each gradient on its group's replica."""
    n = len(x)
    x = x.reshape(n, -1)
    sched = Schedule(groups, k)
    # the staleness rule's share of each update's rate (of plain SGD: none but the 'lr' rule's)
    rule = asgd.StalenessRule(asgd.STALENESS_RULE, asgd.mean_staleness(groups, k, -(-n // batch)), 0.0)
    replicas = [None] * groups
    for epoch in range(epochs):
        order = dmath.random.permutation(n, key=(seed, epoch)).to_numpy().ravel().astype(int)
        sched.invalidate()
        pending = collections.deque()
        for event in sched.epoch(-(-n // batch)):
            kind, g = event[:2]
            if kind == "refresh":
                replicas[g] = (w.copy(), b.copy())
            elif kind == "compute":
                rows = order[event[2] * batch:(event[2] + 1) * batch]
                rw, rb = replicas[g]
                z = x[rows] @ rw + rb
                p = np.exp(z - z.max(axis=1, keepdims=True))
                p /= p.sum(axis=1, keepdims=True)
                p[np.arange(len(rows)), y[rows]] -= 1.0
                pending.append((x[rows].T @ p / len(rows), p.sum(axis=0) / len(rows)))
            else:
                gw, gb = pending.popleft()
                step = lr * rule.lr_scale(event[2])
                w, b = w - step * gw, b - step * gb
    return w, b, sched


@pytest.mark.parametrize("groups,k", CASES)
def test_gradients_are_computed_on_the_weights_the_schedule_says(blobs, groups, k):
    x, y = blobs
    dmath.random.seed(7)
    model = dnn.Sequential([L.Input((1, 6, 6)), L.Flatten(), L.Dense(4), L.Output("softmax")], dtype="float64",
                           optimizer=dnn.optim.SGD(lr=0.5))
    w0, b0 = model.get_weights()
    hist = model.fit(x, y, batch_size=8, epochs=2, verbose=0, asynchronous=True, max_staleness=k, groups=groups)
    w, b, sched = simulate(w0, b0, x, y, 8, groups, k, 2, 0.5)
    got_w, got_b = model.get_weights()
    np.testing.assert_allclose(got_w, w, rtol=1e-7, atol=1e-9)
    np.testing.assert_allclose(got_b, b, rtol=1e-7, atol=1e-9)
    # the staleness measured on the store (versions travelling with weights and gradients) is the
    # schedule's, within the bound, and reaches what the bound allows
    per_epoch = len(sched.staleness) // 2
    for e in range(2):
        mine = sched.staleness[e * per_epoch:(e + 1) * per_epoch]
        assert hist["max_staleness"][e] == max(mine) <= k
        assert hist["mean_staleness"][e] == pytest.approx(np.mean(mine))
    assert max(hist["max_staleness"]) >= min(k, groups - 1)
    if k > 0:
        assert max(hist["max_staleness"]) > 0


@pytest.mark.skipif(P < 2, reason="traffic between workers needs several")
def test_a_group_talks_only_to_the_store(blobs):
    """One worker per group: worker w >= 1 sends its gradients to worker 0 and receives the store's
    weights, nothing else of size (a synchronous step would all-reduce among all workers)."""
    data = dnn.data.Dataset(*blobs)             # placed once, before counting
    model = mlp()                               # SGD with momentum: one state matrix per weight
    model.fit(data, batch_size=8, epochs=1, verbose=0, asynchronous=True, max_staleness=P - 1)  # plans recorded
    dmath.reset_stats()
    model.fit(data, batch_size=8, epochs=1, verbose=0, asynchronous=True, max_staleness=P - 1)
    stats = dmath.stats()
    weights = sum(w.nbytes for w in model.get_weights())
    nbatches = -(-len(data) // 8)
    for w in range(1, P):
        steps = len(range(w, nbatches, P))       # batches w, w + P, ...: one apply and one refresh each
        sent, recv = stats[w]["data_bytes_sent"], stats[w]["data_bytes_recv"]
        # besides: the version counters and the epoch's metric reads (a few (1, 1) values), and the
        # weights and momenta the model gets back from the store at the epoch's end
        assert steps * weights <= sent <= steps * weights + 1024, (w, sent, steps * weights)
        assert steps * weights <= recv - 2 * weights <= steps * weights + 1024, (w, recv, steps * weights)


@pytest.fixture(scope="module")
def digits(mnist_5k):
    x, y = mnist_5k
    return dnn.data.Dataset(x[:1500], y[:1500]), dnn.data.Dataset(x[4000:], y[4000:])


def test_asgd_gets_close_to_sgd_on_real_digits(digits):
    train, test = digits
    acc = {}
    for asynchronous in (False, True):
        dmath.random.seed(1)
        model = dnn.Sequential([L.Input((1, 28, 28)), L.Flatten(), L.Dense(64), L.Activation("relu"), L.Dense(10),
                                L.Output("softmax")], optimizer=dnn.optim.SGD(lr=0.05))
        hist = model.fit(train, batch_size=50, epochs=3, verbose=0, validation_data=test,
                         asynchronous=asynchronous)
        acc[asynchronous] = model.evaluate(test)["accuracy"]
        assert acc[asynchronous] == pytest.approx(hist["val_accuracy"][-1])   # the store's weights came back
        assert hist["loss"][-1] < hist["loss"][0]
    # 1,500 digits, 3 epochs of a 784-64-10 MLP; staleness acts like added momentum (Mitliagkas et al.
    # 2016), which plain SGD at this learning rate tolerates up to 4 groups
    assert acc[False] >= 0.78, acc
    assert acc[True] >= acc[False] - 0.03, acc


@pytest.fixture(scope="module")
def more_digits(mnist_5k):
    x, y = mnist_5k
    return dnn.data.Dataset(x[:4000], y[:4000]), dnn.data.Dataset(x[-1000:], y[-1000:])


def test_asgd_with_momentum_converges_at_every_staleness(more_digits):
    """Issue 35, item 9: SGD with momentum 0.9 at lr 0.1 learned nothing asynchronously (0.21-0.30
    at the default max_staleness, 3 workers) where synchronous SGD reached 0.93. The staleness
    rule (dnn.training.asgd.StalenessRule, 'both') keeps it within 2 points at every max_staleness to P + 1."""
    train, test = more_digits

    def accuracy(**kwargs):
        dmath.random.seed(0)
        model = dnn.Sequential([L.Input((1, 28, 28)), L.Flatten(), L.Dense(64), L.Activation("relu"),
                                L.Dense(10), L.Output("softmax")], optimizer=dnn.optim.SGD(lr=0.1, momentum=0.9))
        model.fit(train, batch_size=50, epochs=6, verbose=0, **kwargs)
        assert model.optimizer.momentum == 0.9          # the corrected momentum lived in the store's steps
        return model.evaluate(test)["accuracy"]
    sync = accuracy()
    assert sync >= 0.88, sync
    got = {k: accuracy(asynchronous=True, max_staleness=k) for k in range(P + 2)}
    assert got[0] == pytest.approx(sync)
    assert all(a >= sync - 0.02 for a in got.values()), (sync, got)


def test_bad_options_raise_on_the_master(blobs):
    x, y = blobs
    model = mlp()
    bad = [dict(asynchronous=True, max_staleness=-1), dict(asynchronous=True, max_staleness=1.5),
           dict(asynchronous=True, groups=0), dict(asynchronous=True, groups=P + 1),
           dict(max_staleness=2), dict(groups=1), dict(asynchronous="yes")]
    if P > 2:
        bad.append(dict(asynchronous=True, groups=2 if P % 2 else P - 1))        # does not divide P
    for kwargs in bad:
        with pytest.raises(dnn.ConfigError):
            model.fit(x, y, batch_size=16, epochs=1, verbose=0, **kwargs)
    with pytest.raises(dnn.ConfigError, match="unit='step'"):
        model.fit(x, y, epochs=1, verbose=0, asynchronous=True,
                  callbacks=[dnn.callbacks.ModelCheckpoint("/nonexistent/{step}", unit="step")])
    incompatible = [
        dnn.Sequential([L.Input(36), L.Dense(8), L.BatchNorm(), L.Dense(4), L.Output("softmax")]),
        dnn.Sequential([L.Input(36), L.Dense(8, parallel="model"), L.Dense(4), L.Output("softmax")]),
        dnn.Sequential([L.Input(36), L.Dense(8), L.Dense(4), L.Output("softmax")], dtype="float16"),
    ]
    for m in incompatible:
        with pytest.raises(dnn.ConfigError, match="asynchronous"):
            m.fit(x.reshape(len(x), -1), y, epochs=1, verbose=0, asynchronous=True)
    # nothing was sent: the model trains as before
    before = model.get_weights()
    model.fit(x, y, batch_size=16, epochs=1, verbose=0, asynchronous=True)
    assert any(np.abs(a - b).max() > 0 for a, b in zip(before, model.get_weights()))
