"""Asynchronous SGD with bounded staleness: `Sequential.fit(..., asynchronous=True, max_staleness=k)`.

The P workers are split into G groups of P/G workers (`groups=`, default P:
one worker per group). Each group holds a replica of the weights
(Replicated over the group) and trains data parallel inside the group; the
training samples are already resident on every worker (dnn.data.Dataset),
so a group takes its batches where it is, through a Feed of its own, and
no sample bytes move. A parameter store on worker 0 (the master's worker)
holds the weights that count and the optimizer state. The master issues,
in the order of `Schedule`:

    compute g   group g: its next batch, forward, backward -> gradients (Partial over g)
    apply g     the gradient goes to the store (a remap: reduce-scatter over g, then to worker 0),
                which applies the optimizer's fused update, one version further
    refresh g   the store's weights go to group g's replica (a broadcast from worker 0)

Each is a recorded dmath plan (one control frame). A command involves only
its group's workers (and, for apply and refresh, worker 0): the ranks of
other groups skip it, so groups compute at the same time and nothing waits
for all of them. The master waits only where its own worker takes part: in
an apply, for that group's gradient; in its own group's compute.

Staleness. A gradient computed on store version v and applied when the
store is at version V has staleness V - v (the updates it did not see).
`Schedule` keeps at most D = min(G, k + 1) gradients in flight and
refreshes a replica before it computes whenever its gradient would
otherwise arrive more than k versions late; so k = 0 is sequential SGD (a
refresh before every step: the synchronous fit's weights at any G), and k =
G - 1 (the default) lets every group compute at once while refreshing at
each step. A larger k also skips refreshes. The versions are counted on
the workers too: a (1, 1) version travels with the weights in every
refresh and with every gradient to the store, which keeps the largest and
the summed staleness it saw (the epoch's logs report them).

Batches: the epoch's order is the synchronous one (a permutation of the
model's seed and the epoch); batch t goes to group t mod G. Given the seed,
everything is deterministic (the order of updates is the schedule's).

What is asynchronous here, and what is not: there is no barrier across
groups at any step; a group waits only for the store (worker 0) to take
its gradient and send weights back. Commands still reach the workers in
one ordered stream from the master, which is both the scheduler and the
store's worker: the master computes its own group's steps in between, and
the store is a single worker (a parameter server), whose link carries
every gradient and every refresh.

Frozen layers (trainable=False) are read, not trained: each group reads its
own copy of their weights, written from the model's at every epoch's start;
the store holds none of them, so they are neither updated nor exchanged.

Not supported asynchronously (ConfigError): float16 (its loss scale is one
shared state), BatchNorm and other layers with non-trained buffers,
model-parallel layers, step checkpoints and resuming inside an epoch.
"""
import collections
import contextlib
import math
import numbers
import time

import dmath

from .callbacks import ModelCheckpoint, call as call_hooks, read_epoch_end
from ..errors import ConfigError
from ..graph.execute import backward, forward
from ..graph.node import Variable
from ..layers.base import Context
from ..losses import correct_count
from .programs import Metrics, Program, read_elements
from .progress import ProgressBar

#: the workers that hold the parameter store
STORE = (0,)


# ---- staleness-aware steps -----------------------------------------------------------------------
#: how updates are corrected for staleness (see `StalenessRule`): 'both' (the default),
#: 'momentum', 'lr' or 'none'
STALENESS_RULE = "both"


class StalenessRule:
    """What asynchronous training changes in the optimizer's steps because gradients arrive late.

    A gradient computed `s` updates ago acts like momentum: Mitliagkas et al., "Asynchrony begets
    momentum" (2016), find that asynchrony with mean staleness s adds implicit momentum
    mu_s = s / (s + 1), and that the explicit momentum must be lowered for the total to stay where
    synchronous training had it. 'momentum' keeps the heavy ball's step multiplier: it trains
    with explicit momentum mu' where (1 - mu') (1 - mu_s) = 1 - mu, i.e.
    mu' = max(0, 1 - (1 - mu) (s + 1)), s the schedule's mean staleness (found by running the
    pure `Schedule` over the epoch's batches). 'lr' is Zhang et al., "Staleness-aware async-SGD"
    (2016): each update's learning rate divided by its staleness (by 1 when fresh). 'both' (the
    default) lowers the momentum as 'momentum' does and divides every update's rate by the square
    root of the mean staleness s (by 1 when s <= 1): Zhang's rate, made even (dividing by s itself
    on top of the momentum correction under-trained: 2.7 points lost at 4 workers), since a max_staleness past G - 1
    skips refreshes and mixes staleness 0 to k in one epoch, and dividing each update by its own
    made the steps irregular (3 points lost in one measured case); and only with explicit
    momentum: plain SGD (lr 0.05, 1,500 digits, 3 epochs, 3 workers) stayed within 3 points of
    synchronous SGD uncorrected and lost 5 with its rate halved. 'none' changes nothing.
    Optimizers without momentum (Adam, AdaGrad, plain SGD) are left alone by 'both'.

    Measured on the real digits (benchmarks/asgd_staleness.py: 4,000 digits, 6 epochs of a
    784-64-10 MLP, SGD lr 0.1 momentum 0.9, one group per worker, three seeds, every
    max_staleness from 0 to P + 1; results in benchmarks/results/asgd_staleness_p*_cpu.json):
    'none' lost up to 84 points to synchronous SGD; 'momentum' alone up to 25.8 points (4 workers);
    'both' stayed within 2 points at 2, 3 and 4 workers. When the implicit momentum alone reaches the
    requested one (s >= mu / (1 - mu): 9 for 0.9) no explicit momentum is left, and only the
    rate's share damps.
    """

    def __init__(self, name, mean_staleness, momentum=0.0):
        if name not in ("momentum", "lr", "both", "none"):
            raise ConfigError(f"dnn.training.asgd.STALENESS_RULE must be 'momentum', 'lr', 'both' or 'none', got {name!r}")
        self.name, self.mean_staleness = name, float(mean_staleness)
        self.with_momentum = bool(momentum)      # the optimizer's own momentum is > 0

    def momentum(self, mu):
        """The explicit momentum to train with in place of `mu`."""
        if self.name not in ("momentum", "both") or not mu:
            return mu
        return max(0.0, 1.0 - (1.0 - mu) * (self.mean_staleness + 1.0))

    def lr_scale(self, staleness):
        """The factor of the learning rate of an update whose gradient is `staleness` updates late."""
        if self.name == "lr":
            return 1.0 / max(1, staleness)
        if self.name == "both" and self.with_momentum:
            return 1.0 / math.sqrt(max(1.0, self.mean_staleness))
        return 1.0


def mean_staleness(ngroups, max_staleness, nbatches):
    """The mean staleness of an epoch of `nbatches` under `Schedule` (pure: no dmath)."""
    schedule = Schedule(ngroups, max_staleness)
    for _ in schedule.epoch(nbatches):
        pass
    return sum(schedule.staleness) / max(1, len(schedule.staleness))


# ---- options ---------------------------------------------------------------------------------
def check_options(model, asynchronous, max_staleness, groups, callbacks):
    """None for synchronous training, else (list of worker groups, max staleness k); raises
    ConfigError on the master, before anything is placed, for every misfit."""
    if not isinstance(asynchronous, bool):
        raise ConfigError(f"asynchronous must be True or False, got {asynchronous!r}")
    if not asynchronous:
        if max_staleness is not None or groups is not None:
            raise ConfigError("max_staleness and groups apply to asynchronous training: pass asynchronous=True")
        return None
    nworkers = dmath.num_workers()
    if groups is None:
        groups = nworkers
    if isinstance(groups, bool) or not isinstance(groups, numbers.Integral) or not 1 <= groups <= nworkers \
            or nworkers % groups:
        raise ConfigError(f"groups must be a positive integer dividing the number of workers ({nworkers}), "
                          f"got {groups!r}")
    groups = int(groups)
    if max_staleness is None:
        max_staleness = groups - 1
    if isinstance(max_staleness, bool) or not isinstance(max_staleness, numbers.Integral) or max_staleness < 0:
        raise ConfigError(f"max_staleness must be an integer >= 0 (the updates a gradient may miss), "
                          f"got {max_staleness!r}")
    if model.dtype == "float16":
        raise ConfigError("asynchronous training needs dtype 'float32' or 'float64': float16's dynamic loss "
                          "scale is one state for all steps, which groups would update out of order")
    for layer in model.layers:
        if any(not w.trainable for w in layer.weights):
            raise ConfigError(f"asynchronous training cannot keep {layer.name}'s running statistics "
                              f"({type(layer).__name__}): they are not trained by gradients, and each group "
                              f"would hold its own; train it synchronously")
        if layer.strategy == "model":
            raise ConfigError(f"asynchronous training keeps every weight in one piece per group; {layer.name} "
                              f"is model parallel (parallel='model')")
    for cb in callbacks or ():
        if isinstance(cb, ModelCheckpoint) and cb.unit == "step":
            raise ConfigError("ModelCheckpoint(unit='step') needs synchronous training: inside an asynchronous "
                              "epoch the weights live in the parameter store; use unit='epoch'")
    return worker_groups(nworkers, groups), int(max_staleness)


def worker_groups(nworkers, ngroups):
    """`ngroups` tuples of consecutive worker ranks, the first holding worker 0 (the store's)."""
    size = nworkers // ngroups
    return [tuple(range(g * size, (g + 1) * size)) for g in range(ngroups)]


# ---- the schedule: pure bookkeeping of versions ---------------------------------------------------
class Schedule:
    """Which group computes, when a gradient is applied and when a replica is refreshed.

    Pure (no dmath): the trainer turns each event into a plan replay, and
    tests check the staleness bound on it without workers. Versions count
    the updates the store has applied; `replica[g]` is the version group g's
    weights hold (None: must be refreshed before its next step).
    """

    def __init__(self, ngroups, max_staleness):
        self.ngroups, self.max_staleness = int(ngroups), int(max_staleness)
        #: gradients in flight at most: more would arrive more than k versions late even when fresh
        self.depth = min(self.ngroups, self.max_staleness + 1)
        self.version = 0
        self.replica = [None] * self.ngroups
        self.staleness = []          # of every gradient applied, in order
        self.refreshes = 0

    def invalidate(self):
        """Every replica is refreshed before its next step (the store was rewritten)."""
        self.replica = [None] * self.ngroups

    def epoch(self, nbatches):
        """Yield the events of an epoch of `nbatches` batches, batch t by group t mod G:
        ('compute', g, t), ('apply', g, staleness), ('refresh', g, version). Ends with every
        gradient applied."""
        queue = collections.deque()          # (group, version) of the gradients in flight, oldest first
        for t in range(nbatches):
            g = t % self.ngroups
            if len(queue) == self.depth:
                yield self._apply(queue.popleft())
            v = self.replica[g]
            # every gradient in flight is applied before this one: it will be len(queue) versions late
            # on fresh weights, and later by what the replica already missed
            if v is None or self.version + len(queue) - v > self.max_staleness:
                v = self.replica[g] = self.version
                self.refreshes += 1
                yield ("refresh", g, v)
            queue.append((g, v))
            yield ("compute", g, t)
        while queue:
            yield self._apply(queue.popleft())

    def _apply(self, item):
        g, v = item
        staleness = self.version - v
        if staleness > self.max_staleness:       # the refresh rule above makes this impossible
            raise AssertionError(f"staleness {staleness} > {self.max_staleness}")
        self.version += 1
        self.staleness.append(staleness)
        return ("apply", g, staleness)


# ---- the pieces on the workers ----------------------------------------------------------------
def _run(owner, attr, fn, record):
    """Replay the plan in owner.<attr>, or run `fn` recording it there (eagerly when not `record`)."""
    plan = getattr(owner, attr)
    if plan is not None:
        plan.replay()
    elif record:
        with dmath.record() as plan:
            fn()
        setattr(owner, attr, plan)
    else:
        fn()


def _counter(layout, value=0.0):
    return dmath.full((1, 1), value, dtype="float64", layout=layout)


class ParameterStore:
    """The weights that count, their optimizer state and version counters, on the STORE workers."""

    def __init__(self, model):
        lay = dmath.Replicated(STORE)
        self.vars = [Variable(p.value.remap(lay), name=f"store/{p.name}") for p in model.params]
        self.version = _counter(lay)              # updates applied
        self.max_staleness = _counter(lay)        # of this epoch's gradients, measured here
        self.sum_staleness = _counter(lay)

    def pull(self, model):
        """The model's weights and optimizer state into the store (a copy on worker 0)."""
        opt = model.optimizer
        opt.prepare(model.params)
        opt.prepare(self.vars)
        for p, s in zip(model.params, self.vars):
            s.value.assign(p.value)
            opt.copy_state(p, s)
        self.max_staleness.set((0, 0), 0.0)
        self.sum_staleness.set((0, 0), 0.0)

    def push(self, model):
        """The store's weights and optimizer state into the model's own matrices (in place)."""
        opt = model.optimizer
        for p, s in zip(model.params, self.vars):
            p.value.assign(s.value)
            opt.copy_state(s, p)

    def apply(self, optimizer, step):
        """Recordable: apply `step`'s gradients (its group's last compute) and count the version."""
        optimizer.apply(self.vars, step.grads)          # remaps each gradient here, then the fused rule
        stale = self.version - step.replica.grad_version
        self.max_staleness.assign(dmath.maximum(self.max_staleness, stale))
        self.sum_staleness += stale
        self.version += 1.0


class ReplicaContext(Context):
    """A Context whose graphs read a group's replica Variables instead of the model's weights."""

    def __init__(self, dtype, variables):
        super().__init__(True, dtype, dtype)
        self.variables = variables              # id(model Variable) -> replica Variable

    def param(self, weight):
        return self.variables[id(weight.var)]

    def read_node(self, var):
        return self.variables[id(var)]


class Replica:
    """One group's copy of the weights, its feed over the training set, metrics and steps."""

    def __init__(self, model, dataset, index, group, ngroups):
        self.model, self.index, self.group, self.ngroups = model, index, group, ngroups
        lay = dmath.Replicated(group)
        self.vars = [Variable(p.value.remap(lay), name=f"group{index}/{p.name}") for p in model.params]
        # the frozen layers' weights: read by the group's steps, never trained (no gradient is taken)
        frozen = [w.var for layer in model.layers if not layer.trainable for w in layer.weights]
        self.frozen = [(p, Variable(p.value.remap(lay), name=f"group{index}/{p.name}")) for p in frozen]
        self.context = ReplicaContext(model.dtype, {id(p): v for p, v in
                                                    list(zip(model.params, self.vars)) + self.frozen})
        self.feed = dataset.feed(group)
        self.metrics = Metrics(group)
        self.one = dmath.ones((1, 1), dtype=model.dtype, layout=lay)      # the loss gradient's seed
        self.version = _counter(lay)          # the store version these weights hold
        self.grad_version = _counter(lay)     # the version the last gradient was computed on
        self.steps = {}                       # batch size -> GradientStep
        self.refresh_plan = None

    def step(self, batch):
        s = self.steps.get(batch)
        if s is None:
            s = self.steps[batch] = GradientStep(self, batch)
        return s

    def pull_frozen(self):
        """The model's frozen weights into this replica's copies (in place: recorded steps read them)."""
        for p, mine in self.frozen:
            mine.value.assign(p.value)

    def refresh(self, store):
        """Recordable: the store's weights and version into this replica (a broadcast from worker 0)."""
        for mine, theirs in zip(self.vars, store.vars):
            mine.value.assign(theirs.value)
        self.version.assign(store.version)


class GradientStep(Program):
    """A group's training step without the update: its next batch, forward, backward; the
    gradients stay in `grads` (Partial over the group) until the store applies them."""

    def __init__(self, replica, batch):
        model, feed = replica.model, replica.feed
        store = feed.store
        one_hot = model.loss.one_hot(store.y_kind, store.y.shape[1], store.label_range, model.outputs)
        super().__init__(model, feed, batch, training=True, with_targets=True, one_hot=one_hot,
                         group=replica.group, context=replica.context)
        self.replica = replica
        self.params = replica.vars
        self.grads = None
        self.apply_plan = None         # the store's update with these gradients (AsyncTrainer._apply)

    def run(self):
        _run(self, "plan", self._step, self.model.record)

    def _step(self):
        r, model, feed = self.replica, self.model, self.feed
        self.inputs.feed(feed.batch_x(self.x, True, model.seed))
        feed.batch_y(self.y, self.one_hot)
        forward([], self.order)
        self.grads = backward(self.loss, self.params, seed=r.one, order=self.order)
        kind = model.loss.accuracy
        correct = correct_count(self.pred.value, self.y, kind, self.accuracy_reference) if kind else None
        r.metrics.add(self.loss.value, correct, self.batch)
        r.grad_version.assign(r.version)
        # this group's next batch is G batches further on in the epoch's order
        feed.advance(self.batch * r.ngroups)


class GroupsMetrics:
    """The training metrics summed over the groups (what Model.train_metrics reads during an
    asynchronous epoch: the progress bar and TerminateOnNaN)."""

    def __init__(self, replicas):
        self.replicas = replicas
        self.samples = 0

    def read(self):
        n = max(self.samples, 1)
        states = [r.metrics.get_state() for r in self.replicas]
        return tuple(sum(float(s[name]) for s in states) / n for name in ("loss", "correct"))

    def read_with(self, extra):
        """(read(), the extra (1, 1) matrices' values), as Metrics.read_with (a read each here: the
        groups' sums are on different workers)."""
        return self.read(), read_elements(list(extra))

    def reset(self):
        for r in self.replicas:
            r.metrics.reset()
        self.samples = 0


# ---- the engine ----------------------------------------------------------------------------------
class AsyncTrainer:
    """Asynchronous training of `model` on `dataset` (a dnn.data.Dataset) in batches of batch_size."""

    def __init__(self, model, dataset, batch_size, groups, max_staleness):
        for layer in model.layers:
            layer.decide(batch_size, 1)        # 'auto' layers: data parallel inside their group
        self.model, self.batch_size, self.groups = model, batch_size, groups
        self.schedule = Schedule(len(groups), max_staleness)
        nbatches = len(model._batches(len(dataset), batch_size))
        self.rule = StalenessRule(STALENESS_RULE, mean_staleness(len(groups), max_staleness, nbatches),
                                  getattr(model.optimizer, "momentum", 0.0))

        self.store = ParameterStore(model)
        self.replicas = [Replica(model, dataset, i, g, len(groups)) for i, g in enumerate(groups)]
        self.metrics = GroupsMetrics(self.replicas)
        self.n = len(dataset)

    def train_epoch(self, epoch, epochs, shuffle, verbose, hooks, evaluate=None):
        """One epoch; returns its logs (those of Model.fit plus 'max_staleness' and 'mean_staleness',
        measured on the store). The model's weights are the store's at the end. evaluate: None, or
        a function returning the validation metrics."""
        model, B, store = self.model, self.batch_size, self.store
        store.pull(model)
        for r in self.replicas:
            r.pull_frozen()
        self.schedule.invalidate()
        key = model.shuffle_key(epoch) if shuffle else None
        for r in self.replicas:
            r.feed.start_epoch(key, epoch, skip=r.index * B)     # group g takes batches g, g + G, ...
        metrics = self.metrics
        metrics.reset()
        sizes = model._batches(self.n, B)
        applied = len(self.schedule.staleness)
        bar = ProgressBar(epoch, epochs, self.n, verbose)
        start = time.perf_counter()
        pending = collections.deque()
        # the model's own weights hold the epoch's start until store.push: a callback's get_weights,
        # set_weights, evaluate or save in between is refused (Model._refuse_mid_async)
        model._in_async_epoch = True
        try:
            for event in self.schedule.epoch(len(sizes)):
                kind, g = event[0], event[1]
                if kind == "apply":
                    self._apply(pending.popleft(), event[2])
                elif kind == "refresh":
                    _run(self.replicas[g], "refresh_plan", lambda r=self.replicas[g]: r.refresh(store),
                         model.record)
                else:
                    t = event[2]
                    step = self.replicas[g].step(sizes[t])
                    step.run()
                    pending.append(step)
                    metrics.samples += sizes[t]
                    bar.update(metrics.samples, metrics.read)
                    call_hooks(hooks, "on_batch_end", t)
            model._in_async_epoch = False
            store.push(model)
        except BaseException:
            model._in_async_epoch = False
            # the model keeps the store's latest weights; a broken runtime refuses, and the error says why
            with contextlib.suppress(dmath.DMathError):
                store.push(model)
            raise
        model.epochs_trained = epoch + 1
        # reads every group (also waits for the epoch's last steps), and what the callbacks need at its end
        loss, acc = read_epoch_end(metrics, hooks)
        elapsed = time.perf_counter() - start
        logs = {"loss": loss}
        if model.loss.accuracy:
            logs["accuracy"] = acc
        if evaluate is not None:
            v = evaluate()
            logs.update({f"val_{k}": v for k, v in v.items()})
        updates = len(self.schedule.staleness) - applied
        logs["max_staleness"] = store.max_staleness.get((0, 0))
        logs["mean_staleness"] = store.sum_staleness.get((0, 0)) / max(updates, 1)
        logs["samples_per_s"] = self.n / elapsed if elapsed > 0 else float("inf")
        bar.finish(logs)
        return logs

    def close(self):
        """Forget the store's optimizer state (the model holds its own copy since the last epoch)."""
        self.model.optimizer.forget(self.store.vars)

    def _apply(self, step, staleness):
        opt, store = self.model.optimizer, self.store
        # the learning rate of this update (outside the plan): the rule's share of it
        opt.prepare(store.vars, self.rule.lr_scale(staleness))
        # the corrected momentum is a constant of the store's update commands (recorded once): an
        # override in force only while they are issued, so callbacks and checkpoints see the user's.
        # It never goes through the checked setting: SGD(momentum=0.5, nesterov=True) corrected to 0
        # was refused there (nesterov needs momentum > 0); at 0 the rule steps as plain SGD
        with opt.momentum_override(self.rule.momentum(opt.step_momentum())):
            _run(step, "apply_plan", lambda: store.apply(opt, step), self.model.record)
        opt.finish()
