"""The programs a model runs on one batch size of one dataset: a training step, an evaluation pass.

A program builds its graph once (placeholders for the batch, the layers'
nodes, the loss head) over a `dnn.data.Feed` (the dataset's order and
counters on the workers), keeps the batch matrices, and runs one step per
call. The step starts by taking its own batch on the workers:

    take the samples order[position ...] into the batch matrices (dmath.nn.take_rows)
    transform them (augmentation in training, normalisation)  (dmath.nn.transform_images)
    forward, backward, update, metrics
    position += batch                                          (in place, on the workers)

first call:  run the step eagerly inside `dmath.record()`  -> a Plan
later calls: plan.replay()                                  (one control message, no sample bytes)

A step is a fixed sequence of commands on fixed matrices: parameters and
optimizer state are updated in place, the learning rate is a (1, 1) matrix
written outside the step when it changes, the dropout step counters advance
in place inside it, and the loss and the number of correct predictions are
added into (1, 1) accumulators that the master reads only when it reports.
"""
import numpy as np

import dmath
from dmath.ops.movement import get_elements
from dmath.runtime.protocol import MAX_OPERANDS as MAX_READ

from ..graph.execute import Releases, backward, forward, topological_order
from ..graph.node import Placeholder
from ..layers.base import Context
from ..losses import correct_count
from ..functional import build_nodes
from ..ops import Affine, add_n, cast, fold_relu_masks, to_channels_first, to_channels_last
from .. import parallel
from .buckets import Buckets


def read_elements(matrices):
    """The (0, 0) element of each of `matrices` (floats), one command per 255 of them."""
    return [v for k in range(0, len(matrices), MAX_READ) for v in get_elements(matrices[k:k + MAX_READ], (0, 0))]


class Metrics:
    """(1, 1) float64 accumulators of the summed loss and correct count, on the workers.

    Each quantity has a Replicated and a Partial accumulator; a value is added
    into the one of its own layout, so a per-sample sum that comes out Partial
    over the batch's workers (the correct count, an MSE loss) is accumulated
    without any communication, and the two are added only when read.
    """

    def __init__(self, group=None):
        # group: the workers whose steps add into these sums (None: all); asynchronous training keeps
        # one Metrics per worker group, so that adding a step's values never involves other groups
        layouts = (("rep", dmath.Replicated(group)), ("partial", dmath.Partial(group)))
        self._acc = {name: {kind: dmath.zeros((1, 1), dtype="float64", layout=lay) for kind, lay in layouts}
                     for name in ("loss", "correct")}
        # copied over the accumulators to reset them: a local copy on every worker, no bytes from the master
        self._zero = {kind: dmath.zeros((1, 1), dtype="float64", layout=lay) for kind, lay in layouts}
        # the model's workers: every worker, or the group of the dmath.on_group block it was built in
        self._all = tuple(self._zero["partial"].layout.group)
        self.samples = 0

    def _add(self, name, value):
        lay = value.layout
        kind = "partial" if lay.partial and tuple(lay.group) == self._all else "rep"
        target = self._acc[name][kind]
        target += value

    def add(self, loss, correct, batch):
        """Recordable: loss (the batch mean) times the batch size, and the correct count."""
        self._add("loss", loss * float(batch))
        if correct is not None:
            self._add("correct", correct)

    def read_with(self, extra):
        """((mean loss, accuracy), [the (0, 0) value of each of `extra`]): the sums and the extra
        (1, 1) matrices in one round trip to the workers (an epoch ends with this read)."""
        sums, values = self._sums(extra)
        n = max(self.samples, 1)
        return (sums["loss"] / n, sums["correct"] / n), values

    def _sums(self, extra=()):
        """({name: the accumulated sum}, [the (0, 0) value of each of `extra`]): the four
        accumulators and the extra matrices read by one command (an epoch ends with this read while
        the GPUs wait: one round trip to the workers, not one per matrix; a second command past the
        255 matrices one reads)."""
        names = list(self._acc)
        accs = [m for name in names for m in self._acc[name].values()]
        values = read_elements(accs + list(extra))
        k = len(accs) // len(names)
        sums = {name: sum(values[i * k:(i + 1) * k]) for i, name in enumerate(names)}
        return sums, values[len(accs):]

    def read(self):
        """(mean loss, accuracy) over the samples since the last reset (master-side reads)."""
        return self.read_with([])[0]

    def get_state(self):
        """{name: numpy array}: the accumulated sums and the sample count (a mid-epoch checkpoint)."""
        out = {name: np.array(v, dtype=np.float64) for name, v in self._sums()[0].items()}
        out["samples"] = np.array(self.samples, dtype=np.int64)
        return out

    def set_state(self, arrays):
        """Continue from `get_state`'s arrays: each sum goes into the Replicated accumulator."""
        self.reset()
        for name, accs in self._acc.items():
            accs["rep"].set((0, 0), float(np.asarray(arrays[name]).reshape(-1)[0]))
        self.samples = int(np.asarray(arrays["samples"]).reshape(-1)[0])

    def reset(self):
        for accs in self._acc.values():
            for kind, m in accs.items():
                m.assign(self._zero[kind])
        self.samples = 0


def rows_for(h, reads, channels_last):
    """The node h with its image rows in the order a layer reads (`reads`, a Layer.image_rows) in
    a model that runs its convolutions channels-last or not: a conversion node where it changes
    (once into channels-last before the first convolution, once back before Flatten or Dense)."""
    if len(h.sample_shape) != 3 or reads == "any":
        return h
    want = channels_last and reads == "channels_last"
    if want == h.channels_last:
        return h
    return to_channels_last(h) if want else to_channels_first(h)


class Program:
    """The graph of one batch size and mode over one feed, its batch matrices and its recorded plan.

    group: the workers the batch is split over (None: all of them); context: the layers.Context the
    graph reads its weights through (None: the model's own weights). Asynchronous training
    (dnn.training.asgd) builds its per-group steps with both.
    """

    def __init__(self, model, feed, batch, training, with_targets, one_hot=False, group=None, context=None):
        self.model, self.feed, self.batch, self.training = model, feed, batch, training
        lay = parallel.batch_layout(group)
        self.x = dmath.zeros((batch, model.features), dtype=model.dtype, layout=lay)
        sample = model.input_shape if len(model.graph.inputs) == 1 else (model.features,)
        self.inputs = Placeholder((batch, model.features), model.dtype, name="x", sample_shape=sample)
        self.inputs.feed(self.x)
        ctx = context if context is not None else Context(training, model.dtype, model.param_dtype)
        # one node per layer call (a Sequential's: per layer), the heads of the outputs
        self.layer_nodes, heads = build_nodes(model, self.inputs, ctx,
                                              lambda h, reads: rows_for(h, reads, model.channels_last))
        self.output_nodes = [hd.out for hd in heads]
        self.output = self.output_nodes[0]
        self.loss = self.pred = self.y = None
        self.one_hot = one_hot
        if with_targets:
            self.y = self.targets = None
            parts = []
            for hd, weight in zip(heads, model.loss_weights):
                z = hd.z if model.dtype != "float16" else cast(hd.z, "float32")     # the loss in float32
                if self.y is None:
                    self.y = dmath.zeros((batch, model.outputs), dtype=z.dtype, layout=lay)
                    self.targets = Placeholder((batch, model.outputs), z.dtype, name="y")
                    self.targets.feed(self.y)
                loss, pred, ref = model.loss.head(z, self.targets, hd.act)
                if self.pred is None:           # accuracy: the first output's
                    self.pred, self.accuracy_reference = pred, ref
                # a single output's weight scales its loss (and so the step) as each of several does:
                # skipping it there trained loss_weights=[0] or [3] as [1], silently
                parts.append(loss if weight == 1.0 else Affine(weight).apply(loss))
            self.loss = parts[0] if len(parts) == 1 else add_n(*parts)
        # training and evaluate need the loss head (the output activation is fused into it), predict the output
        self.order = topological_order([self.loss, self.pred] if with_targets else self.output_nodes)
        # a max pool after a relu-fused convolution applies the relu's gradient mask (one pass fewer)
        fold_relu_masks(self.order, keep=[self.loss, self.pred] + self.output_nodes)
        self.params = model.params
        # the weights' casts (mixed precision) made together at the start of a step: one command and,
        # on a GPU, one kernel per table of weights, where a cast each was a launch per weight
        in_order = {node.id for node in self.order}
        self.casts = [node for node in ctx.casts() if node.id in in_order]
        self.cast_ids = frozenset(node.id for node in self.casts)
        self.cast_dtype = ctx.dtype
        # gradients are taken where the graph reads each weight: at its cast in mixed precision, so that
        # a float16 gradient is converted once, by the move to the weight's layout (to_layout_of)
        self.grad_at = [ctx.read_node(p) for p in self.params]
        # a training step drops each activation after its last reader (the metrics read loss and pred)
        self.releases = Releases(self.order, self.grad_at, keep=[self.loss, self.pred]) if training else None
        self.plan = None
        #: the gradient buckets of the recorded step (lists of parameter indices, dnn.training.buckets)
        self.buckets = []
        # the BatchNorm layers whose running statistics a training step updates (PyTorch counts them)
        self.tracking = [layer for layer in model.layers if hasattr(layer, "batches_tracked")
                         and layer.trainable] if training else []

    # ---- one step -----------------------------------------------------------------
    def run(self):
        """Take the feed's next batch on the workers and run the step (a replay after the first)."""
        opt = self.model.optimizer if self.training else None
        if opt is not None:
            opt.prepare(self.params)
        if self.plan is not None:
            self.plan.replay()
        elif self.model.record:
            with dmath.record() as plan:
                self._step()
            self.plan = plan
        else:
            self._step()
        if opt is not None:
            opt.finish()
        for layer in self.tracking:
            layer.batches_tracked += 1

    def _step(self):
        model, feed = self.model, self.feed
        self.inputs.feed(feed.batch_x(self.x, self.training, model.seed))
        if self.y is not None:
            feed.batch_y(self.y, self.one_hot)
        if self.casts:
            values = dmath.astype_many([node.inputs[0].value for node in self.casts], self.cast_dtype)
            for node, value in zip(self.casts, values):
                node.value = value
        forward([], self.order, self.releases, self.cast_ids)
        if self.training:
            self._update()
        if self.loss is not None:
            metrics = model.train_metrics if self.training else model.eval_metrics
            kind = model.loss.accuracy
            correct = correct_count(self.pred.value, self.y, kind, self.accuracy_reference) if kind else None
            metrics.add(self.loss.value, correct, self.batch)
        feed.advance(self.batch)
        if self.training:
            self._release_activations()

    def _release_activations(self):
        """Drop what the step still holds (the loss, the predictions) once the metrics have read it:
        the backward pass dropped every other activation after its last reader (`Releases`), so
        each is a temporary of the recorded step whose memory a replay, and its CUDA graph, reuses,
        and nothing holds them between steps (as PyTorch frees what autograd saved)."""
        for node in self.order:
            if node.fn is not None:
                node.value = None

    def _sum_running_terms(self):
        """The forward's running-statistics terms (batch norms with each worker's own statistics, all in
        the model's weight dtype) summed over the workers by one all-reduce in the background, written
        straight into the running statistics (on a GPU the all-reduce and the copies run on the
        communication stream beside the backward pass; the next step's forward waits for them). An
        assign of each sum after the backward pass cost a launch per statistic at the step's end
        (GoogLeNet: 114 a step, 0.2 ms on 4 H200s)."""
        calls = {}          # running statistic -> [(its Partial terms, keep)] per call, in call order
        for node in self.order:
            if node.fn is not None:
                for terms, target, keep in node.fn.running_terms():
                    calls.setdefault(target, []).append((terms, keep))
        once = [(t[0][0], target) for target, t in calls.items() if len(t) == 1]
        if once:
            dmath.sum_partials([t for t, _ in once], background=True, out=[target for _, target in once])
        shared = {target: t for target, t in calls.items() if len(t) > 1}
        if shared:
            self._sum_shared_terms(shared)

    @staticmethod
    def _sum_shared_terms(shared):
        """The running statistics of batch norms with each worker's own statistics that are called
        more than once (a shared layer), each updated by its calls in call order. Every call's terms
        were made from the statistic r0 as the step found it (all forwards run before any sum), and
        sum to u_k = (1 - m) r0 + m s_k; PyTorch's r_k = (1 - m) r_(k-1) + m s_k is then
        (1 - m) (r_(k-1) - r0) + u_k, worked out here from the sums of all the terms (one all-reduce)
        before the statistic is written (a sum_partials writing one matrix twice is refused)."""
        targets = list(shared)
        sums = dmath.sum_partials([terms for target in targets for terms, _ in shared[target]])
        k = 0
        for target in targets:
            r = sums[k]
            for _, keep in shared[target][1:]:
                k += 1
                r = (r - target) * keep + sums[k]
            k += 1
            target.assign(r)

    def _update(self):
        model, params = self.model, self.params
        scaler = model.loss_scale
        seed = scaler.scale if scaler is not None else model.one
        # the weight gradients move to their weights' layouts as the backward pass completes them:
        # the data-parallel sums in buckets (dnn.training.buckets), each one all-reduce that runs
        # beside the layers below (on a GPU's communication stream, inside the step's graph), as
        # DDP's buckets do, with the buckets known in advance
        buckets = Buckets([p.value for p in params], cap=int(model.bucket_mb * (1 << 20)),
                          half=model.gradient_sum_dtype == "float16")
        self._sum_running_terms()
        grads = buckets.gradients(backward(self.loss, self.grad_at, seed=seed, order=self.order,
                                           releases=self.releases, ready=buckets.ready))
        self.buckets = buckets.summed
        if scaler is None:
            model.optimizer.apply(params, grads)
            return
        ok = scaler.check(grads)            # on the sums over the workers
        model.optimizer.apply(params, grads, gate=ok, grad_scale=scaler.scale)
        scaler.update(ok)
