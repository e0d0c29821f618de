"""Sequential: a stack of layers trained with fit, used with evaluate and predict.

    model = dnn.Sequential([L.Input((1, 28, 28)), L.Flatten(), L.Dense(528), L.Activation('sigmoid'),
                            L.Dense(10), L.Output('softmax')],
                           loss='cross_entropy', optimizer=dnn.optim.SGD(lr=0.05), dtype='float32')
    history = model.fit(x, y, batch_size=100, epochs=5, validation_data=(xv, yv))

The model builds one `Program` per batch size and mode (dnn.programs): the
training step is recorded as a dmath plan the first time and replayed after
that, with each batch written into the same input matrices. The batch is in
row blocks over the workers (data parallelism); see dnn.parallel for the
per-layer strategies.

Precision: dtype='float16' runs activations and gradients in float16 with
float32 master weights (cast into the graph once per step) and dynamic loss
scaling (dnn.optim.DynamicLossScale): the loss and its gradient are computed
in float32, steps with inf/NaN gradients are skipped on the workers and the
scale adjusts.
"""
import math
import numbers
import time
import weakref

import numpy as np

import dmath

from . import asgd, callbacks as cbs, losses, optim, serialization
from .data import Dataset
from .data.dataset import as_dataset
from .errors import ConfigError, NotSupportedError, ShapeError
from .graph.node import canonical_dtype
from .layers import Dropout, Input, Layer, from_config
from .programs import Metrics, Program
from .progress import ProgressBar

#: the batch size evaluate and predict use when none is given
EVAL_BATCH = 1000
#: model seeds stay below this: Dropout layers without a seed of their own draw with seed * 1000 + i + 1
SEED_END = 2 ** 53 // 1000 - 1000


class Sequential:
    """A linear stack of layers with a loss and an optimizer.

    Args:
        layers: the layers, the first an Input.
        loss: 'cross_entropy', 'binary_cross_entropy', 'mse' or a dnn.losses.Loss.
        optimizer: a dnn.optim optimizer, a name or None (SGD(lr=0.01)).
        dtype: 'float16', 'float32' or 'float64' (activations; weights are
            float32 for float16).
        loss_scale: float16 only: None (a DynamicLossScale with its defaults)
            or a DynamicLossScale.
        record: record each training and evaluation step as a dmath plan and
            replay it (False: run every step eagerly, e.g. for debugging).
        seed: the seed of the shuffling (with the epoch count) and of Dropout layers without their own.
        channels_last: run the convolution and pooling layers on channels-last
            image rows (converted once before the first and back before the
            first layer that reads NCHW, e.g. Flatten): cuDNN's fastest
            kernels read that order without converting. None (default): on
            GPUs with cuDNN; the results are the same either way.
    dmath is initialised here if the program has not done so.
    """

    def __init__(self, layers, loss="cross_entropy", optimizer=None, dtype="float32", loss_scale=None,
                 record=True, seed=0, name="sequential", channels_last=None):
        if not dmath.is_initialized():
            dmath.init()
        layers = list(layers)
        if not layers or not all(isinstance(x, Layer) for x in layers):
            raise ConfigError("Sequential needs a non-empty list of dnn.layers layers")
        if not isinstance(layers[0], Input) or any(isinstance(x, Input) for x in layers[1:]):
            raise ConfigError("the first layer of a Sequential must be an Input (and only the first), e.g. "
                              "layers.Input((1, 28, 28)) or layers.Input(784)")
        if isinstance(seed, bool) or not isinstance(seed, numbers.Integral) or not 0 <= seed < SEED_END:
            # (Dropout layers draw with seed * 1000 + their place: dmath's draws take keys below 2**53)
            raise ConfigError(f"seed must be an integer in [0, {SEED_END}), got {seed!r}")
        if not isinstance(record, bool):
            raise ConfigError(f"record must be True or False, got {record!r}")
        if not isinstance(name, str):
            raise ConfigError(f"name must be a string, got {name!r}")
        self.name, self.seed, self.record = name, int(seed), record
        if channels_last not in (None, True, False):
            raise ConfigError(f"channels_last must be None (on GPUs with cuDNN), True or False, got {channels_last!r}")
        if channels_last is None:
            channels_last = dmath.device() == "gpu" and dmath.cudnn.available()
        self.channels_last = channels_last
        self.dtype = canonical_dtype(dtype)
        self.param_dtype = "float32" if self.dtype == "float16" else self.dtype
        self.loss = losses.get(loss)
        self.optimizer = optim.get(optimizer if optimizer is not None else optim.SGD())
        if self.dtype == "float16":
            self.loss_scale = loss_scale if loss_scale is not None else optim.DynamicLossScale()
            if not isinstance(self.loss_scale, optim.DynamicLossScale):
                raise ConfigError(f"loss_scale must be a dnn.optim.DynamicLossScale, got {loss_scale!r}")
            self.loss_scale.setup()
        elif loss_scale is not None:
            raise ConfigError("loss_scale applies to dtype='float16' only")
        else:
            self.loss_scale = None
        self.layers = layers
        self._name_layers()
        shape = layers[0].shape
        for layer in layers:
            shape = layer.build(shape, self.param_dtype)
        self.input_shape, self.output_shape = layers[0].shape, shape
        self.outputs = math.prod(shape)
        self.one = dmath.ones((1, 1), dtype="float32" if self.dtype == "float16" else self.dtype,
                              layout=dmath.Replicated())
        # the ranks the model lives on: every worker, or the group of the dmath.on_group block it was built in
        self.workers = tuple(self.one.layout.group)
        self.train_metrics, self.eval_metrics = Metrics(), Metrics()
        self._feeds = weakref.WeakKeyDictionary()    # Dataset -> {reading: its Feed (with this model's programs)}
        self._last_program = None
        self.epochs_trained = 0
        self.stop_training = False
        self.position = None      # (epoch, batches done, batch_size) while an epoch runs: what a checkpoint saves
        self.resume = None        # {'epoch', 'batch', 'batch_size', 'metrics'}: a loaded mid-epoch checkpoint

    def _name_layers(self):
        counts, taken = {}, {x.name for x in self.layers if x.named}
        for i, layer in enumerate(self.layers):
            if not layer.named:
                kind = type(layer).__name__.lower()
                while True:
                    counts[kind] = counts.get(kind, 0) + 1
                    name = f"{kind}_{counts[kind]}"
                    if name not in taken:
                        break
                layer.name = name
                taken.add(name)
            if isinstance(layer, Dropout) and layer.seed is None:
                layer.seed = self.seed * 1000 + i + 1
        if len(taken) != len(self.layers):
            raise ConfigError(f"layer names must be unique, got {[x.name for x in self.layers]}")

    # ---- parameters ------------------------------------------------------------------
    @property
    def params(self):
        """The trainable Variables, layer by layer (kernel, then bias)."""
        return [p for layer in self.layers for p in layer.params]

    def count_params(self):
        return sum(layer.count_params() for layer in self.layers)

    def get_weights(self):
        """Every weight as a numpy array, layer by layer (kernel, then bias; BatchNorm: gamma, beta,
        running mean, running variance)."""
        return [a for layer in self.layers for a in layer.get_weights()]

    def set_weights(self, weights):
        """Write weights in get_weights' order and shapes (in place: recorded steps stay valid)."""
        weights = list(weights)
        expected = sum(len(layer.weights) for layer in self.layers)
        if len(weights) != expected:
            raise ShapeError(f"set_weights: the model has {expected} weights, got {len(weights)} arrays")
        # every array checked before any is written: a misfit leaves the model as it was
        checked, i = [], 0
        for layer in self.layers:
            n = len(layer.weights)
            checked.append(layer.checked_weights(weights[i:i + n]))
            i += n
        for layer, arrays in zip(self.layers, checked):
            layer.write_checked(arrays)

    def __reduce_ex__(self, protocol):
        raise NotSupportedError(f"a {type(self).__name__} holds dmath matrices, which cannot be pickled: "
                                f"save it with model.save(path) and read it back with dnn.load(path)")

    # ---- data ---------------------------------------------------------------------------
    def _dataset(self, x, y, what="x", targets=True):
        """`x` as a Dataset checked against the model (arrays are checked first, then placed once)."""
        if isinstance(x, dmath.Matrix):
            raise ConfigError(f"{what}: pass numpy arrays or a dnn.data.Dataset; batches are made on the workers")
        self._check_sample_shape(x, what)
        _check_range(x, self.dtype, what)

        def check(features, kind, width, label_range):
            if features != math.prod(self.input_shape):
                raise ShapeError(f"{what}: samples must have shape {self.input_shape} (or be flat rows of "
                                 f"{math.prod(self.input_shape)}), got samples of {features} values")
            if targets:
                if kind is None:
                    raise ConfigError(f"{what}: targets are needed (y, or a Dataset built with y)")
                self.loss.one_hot(kind, width, label_range, self.outputs)      # raises on a misfit
        return as_dataset(x, y, what, check)

    def _check_sample_shape(self, x, what):
        """Samples of an image (or any multi-dimensional) input must have its shape or be flat rows:
        the same number of values in another shape (channels-last images for an NCHW Input) would be
        read in the wrong order and train or predict garbage."""
        want = tuple(self.input_shape)
        if len(want) < 2:
            return
        got = tuple(x.sample_shape) if isinstance(x, Dataset) else tuple(np.shape(x)[1:])
        if got == want or len(got) <= 1 or math.prod(got) != math.prod(want):
            return          # right, flat, or a count that the check below words
        hint = ""
        if len(want) == 3 and got == want[1:] + want[:1]:
            hint = (f": these are channels-last (N, H, W, C) images, the model reads NCHW; pass "
                    f"x.transpose(0, 3, 1, 2)")
        raise ShapeError(f"{what}: samples must have shape {want} (or be flat rows of {math.prod(want)}), got "
                         f"samples of shape {got}{hint}")

    def _feed(self, ds, reading=False):
        """This model's Feed over dataset `ds` (made once per dataset and use; dropped with the dataset).

        Training has a cursor of its own (reading=False), and evaluate and predict another: an
        evaluation of the training set from a callback in the middle of an epoch leaves the epoch's
        order and position as they were."""
        feeds = self._feeds.get(ds)
        if feeds is None:
            feeds = self._feeds[ds] = {}
        feed = feeds.get(reading)
        if feed is None:
            feed = feeds[reading] = ds.feed()
        return feed

    # ---- the optimizer -------------------------------------------------------------------
    @property
    def optimizer(self):
        """The dnn.optim optimizer of the training steps. It may be replaced, or its hyper-parameters
        changed, between fit calls (or epochs): the next epoch's step is then recorded anew
        (`_program_key`)."""
        return self._optimizer

    @optimizer.setter
    def optimizer(self, value):
        self._optimizer = optim.get(value)

    def _program_key(self, kind):
        """What a recorded step of `kind` has baked in besides the weights and data: for training the
        optimizer object (its state and step matrices), its hyper-parameters (momentum, betas, eps,
        weight decay: constants of its update commands) and the loss and loss scale; for evaluation
        the loss. The learning rate and its schedule are left out: the lr is a (1, 1) matrix
        written before each step, so changing them re-records nothing. The key holds the objects
        themselves (compared by identity), so none is freed while a step recorded with it lives."""
        if kind == "train":
            hyper = {k: v for k, v in self.optimizer.get_config().items() if k not in ("lr", "schedule")}
            return (self.optimizer, repr(sorted(hyper.items())), self.loss, self.loss_scale)
        return (self.loss,) if kind == "eval" else ()

    @staticmethod
    def _drop_stale(feed, kind, key):
        """Forget the programs of `kind` on `feed` recorded under another key (another optimizer,
        hyper-parameters or loss): their plans replay the old update, or matrices since freed."""
        for k, prog in list(feed.programs.items()):
            if k[0] == kind and prog.key != key:
                if prog.plan is not None:
                    prog.plan.close()
                del feed.programs[k]

    def _program(self, kind, batch, feed, key=None):
        """The feed's Program of `kind` for batches of `batch` (made at first use). key: this kind's
        `_program_key`, when the caller worked it out once for many steps (it reads the optimizer's
        config: an epoch's loop asks once, not at every step)."""
        if key is None:
            key = self._program_key(kind)
        prog = feed.programs.get((kind, batch))
        if prog is not None and prog.key != key:
            self._drop_stale(feed, kind, key)
            prog = None
        if prog is None:
            for layer in self.layers:
                layer.decide(batch, len(self.workers))
            store = feed.store
            if kind == "train":
                # the build and the layouts just decided left cached blocks: given back, the step's
                # long-lived buffers (batch, optimizer state) get blocks of their own instead of
                # splitting those, which would pin the rest of each block for good
                dmath.memory.clear(graphs=False)
            one_hot = kind != "predict" and self.loss.one_hot(store.y_kind, store.y.shape[1], store.label_range,
                                                             self.outputs)
            prog = feed.programs[(kind, batch)] = Program(self, feed, batch, training=kind == "train",
                                                         with_targets=kind != "predict", one_hot=one_hot)
            prog.key = key
            self._last_program = weakref.ref(prog)
        return prog

    @staticmethod
    def _batches(n, batch_size):
        full, rest = divmod(n, batch_size)
        return [batch_size] * full + ([rest] if rest else [])

    # ---- training ---------------------------------------------------------------------------
    def fit(self, x, y=None, batch_size=32, epochs=1, validation_data=None, shuffle=True, callbacks=None,
            verbose=1, validation_split=0.0, initial_epoch=None, terminate_on_nan=True, asynchronous=False,
            max_staleness=None, groups=None):
        """Train; returns a History whose `history` maps 'loss', 'accuracy', 'val_loss',
        'val_accuracy' and 'samples_per_s' to one value per epoch.

        x: a dnn.data.Dataset (y None), or numpy samples (N, C, H, W) or
        (N, features) with y: integer labels (N,) or target rows (N,
        outputs); arrays become a Dataset, placed on the workers once for
        this call. Every epoch the samples are ordered by a permutation of
        (the model's seed, the epoch number) when shuffle, cut into batches
        of batch_size (the last one may be smaller), and each step takes its
        batch on the workers: the master
        sends no sample bytes. validation_data: (x, y) arrays or a Dataset;
        validation_split: the last fraction of x (before shuffling) held out
        instead, as Keras. epochs: how many epochs to run, continuing the
        epoch count of earlier fit calls; with initial_epoch=k (Keras) the
        epochs k .. epochs - 1 run instead (resuming a saved run).
        callbacks: dnn.callbacks.Callback objects. verbose: 0 silent, 1
        a tqdm progress bar on stderr (when tqdm is installed) and one line
        per epoch on stdout, 2 the lines only. terminate_on_nan: add a
        dnn.callbacks.TerminateOnNaN (unless callbacks hold one), which stops
        training with TrainingError at a NaN or infinite loss or weight, or
        a float16 loss scale that skips every step.

        asynchronous: True trains with asynchronous SGD (dnn.asgd): the workers
        split into `groups` groups (default: one per worker; it must divide
        the number of workers), each computing gradients on its own batches
        with its own copy of the weights, which a parameter store on worker
        0 applies as they arrive; a gradient is computed on weights at most
        `max_staleness` updates old (default groups - 1; 0 is synchronous
        SGD). The epoch's logs add 'max_staleness' and 'mean_staleness'.
        """
        if verbose not in (0, 1, 2) or isinstance(verbose, float):
            raise ConfigError(f"verbose must be 0, 1 or 2, got {verbose!r}")
        options = asgd.check_options(self, asynchronous, max_staleness, groups, callbacks)
        if options is not None and self.resume is not None and self.resume["batch"]:
            raise ConfigError("a checkpoint saved inside an epoch resumes synchronously (asynchronous=False); "
                              "asynchronous training starts at an epoch's beginning")
        batch_size = _positive_int(batch_size, "batch_size")
        epochs = _positive_int(epochs, "epochs")
        if initial_epoch is None:
            first, last = self.epochs_trained, self.epochs_trained + epochs
        else:
            if isinstance(initial_epoch, bool) or not isinstance(initial_epoch, numbers.Integral) \
                    or not 0 <= initial_epoch < epochs:
                raise ConfigError(f"initial_epoch must be an integer in [0, epochs={epochs}), got {initial_epoch!r}")
            first, last = int(initial_epoch), epochs
        train = self._dataset(x, y)
        val = None
        if validation_split:
            if validation_data is not None:
                raise ConfigError("pass validation_data or validation_split, not both")
            train, val = train.split(validation_split)
        elif validation_data is not None:
            if isinstance(validation_data, Dataset):
                val = self._dataset(validation_data, None, "validation_data")
            else:
                try:
                    xv, yv = validation_data
                except (TypeError, ValueError) as exc:
                    raise ConfigError("validation_data must be a pair (x, y) or a dnn.data.Dataset") from exc
                val = self._dataset(xv, yv, "validation_data")
        history = cbs.History()
        hooks = [history] + _with_nan_guard(callbacks, terminate_on_nan)
        params = {"epochs": last, "batch_size": batch_size, "verbose": verbose,
                  "metrics": self._log_names(val is not None, options is not None)}
        for cb in hooks:
            if not isinstance(cb, cbs.Callback):
                raise ConfigError(f"callbacks must be dnn.callbacks.Callback objects, got {cb!r}")
            cb.model, cb.params = self, params
        smallest = min(self._batches(len(train), batch_size))
        for layer in self.layers:
            layer.check_training_batch(smallest)       # e.g. BatchNorm of a last batch of one sample
        self.stop_training = False
        for cb in hooks:
            cb.on_train_begin()
        if options is not None:
            return self._fit_async(train, val, batch_size, shuffle, first, last, verbose, hooks, history, *options)
        feed = self._feed(train)
        resume = self._take_resume(first, batch_size, feed.n)
        for epoch in range(first, last):
            for cb in hooks:
                cb.on_epoch_begin(epoch)
            logs = self._train_epoch(feed, batch_size, shuffle, epoch, last, verbose, hooks, val,
                                     resume if epoch == first else None)
            for cb in hooks:
                cb.on_epoch_end(epoch, logs)
            if self.stop_training:
                break
        for cb in hooks:
            cb.on_train_end()
        return history

    def _log_names(self, validation, asynchronous):
        """The names the epoch's logs of a fit will hold (callbacks check theirs before training)."""
        names = ["loss"] + (["accuracy"] if self.loss.accuracy else [])
        if validation:
            names += [f"val_{k}" for k in names]
        if asynchronous:
            names += ["max_staleness", "mean_staleness"]
        return names + ["samples_per_s"]

    def _fit_async(self, train, val, batch_size, shuffle, first, last, verbose, hooks, history, groups,
                   max_staleness):
        """fit's epochs with asynchronous SGD (dnn.asgd.AsyncTrainer)."""
        self.resume = None
        trainer = asgd.AsyncTrainer(self, train, batch_size, groups, max_staleness)
        evaluate = (lambda: self._evaluate(val, EVAL_BATCH)) if val is not None else None
        # callbacks reading the running metrics (TerminateOnNaN, the bar) read every group's
        synchronous, self.train_metrics = self.train_metrics, trainer.metrics
        try:
            for epoch in range(first, last):
                for cb in hooks:
                    cb.on_epoch_begin(epoch)
                logs = trainer.train_epoch(epoch, last, shuffle, verbose, hooks, evaluate)
                for cb in hooks:
                    cb.on_epoch_end(epoch, logs)
                if self.stop_training:
                    break
        finally:
            self.train_metrics = synchronous
            trainer.close()
        for cb in hooks:
            cb.on_train_end()
        return history

    def shuffle_key(self, epoch):
        """The integers that alone decide the sample order of `epoch`: the model's seed and the epoch
        number (the same order at any worker count, and for a run resumed at that epoch)."""
        return (self.seed, int(epoch))

    def _take_resume(self, first, batch_size, n):
        """(batches to skip, metrics state) when a loaded mid-epoch checkpoint continues at epoch `first`."""
        r = self.resume
        if r is None or r["epoch"] != first:
            self.resume = None
            return None
        if r["batch_size"] != batch_size:
            raise ConfigError(f"the checkpoint was saved after batch {r['batch']} of epoch {r['epoch']} with "
                              f"batch_size={r['batch_size']}: resume it with that batch size, not {batch_size}")
        if r["batch"] > len(self._batches(n, batch_size)):
            raise ConfigError(f"the checkpoint was saved after batch {r['batch']} of an epoch, but this data "
                              f"has fewer batches of {batch_size}: resume with the data it was trained on")
        self.resume = None
        return r["batch"], r["metrics"]

    def _train_epoch(self, feed, batch_size, shuffle, epoch, epochs, verbose, hooks, val, resume=None):
        n = feed.n
        sizes = self._batches(n, batch_size)
        skip = resume[0] if resume is not None else 0
        # the samples of the batches a resumed epoch has done already: not skip * batch_size when
        # the checkpoint came after a ragged last batch (it holds fewer)
        skipped = sum(sizes[:skip])
        feed.start_epoch(self.shuffle_key(epoch) if shuffle else None, epoch, skip=skipped)
        metrics = self.train_metrics
        metrics.reset()
        if resume is not None:
            metrics.set_state(resume[1])
        bar = ProgressBar(epoch, epochs, n, verbose)
        start = time.perf_counter()
        done = skipped
        key = self._program_key("train")     # (a change of the optimizer takes effect at the next epoch)
        for b in range(skip, len(sizes)):
            size = sizes[b]
            self._program("train", size, feed, key).run()
            done += size
            metrics.samples = done
            self.position = (epoch, b + 1, batch_size)
            bar.update(done, metrics.read)
            for cb in hooks:
                cb.on_batch_end(b)
        self.position = None
        self.epochs_trained = epoch + 1
        loss, acc = metrics.read()            # a gather: also waits for the epoch's last step
        elapsed = time.perf_counter() - start
        logs = {"loss": loss}
        if self.loss.accuracy:
            logs["accuracy"] = acc
        if val is not None:
            v = self._evaluate(val, EVAL_BATCH)
            logs.update({f"val_{k}": v for k, v in v.items()})
        logs["samples_per_s"] = (n - skipped) / elapsed if elapsed > 0 else float("inf")
        bar.finish(logs)
        return logs

    # ---- evaluation ------------------------------------------------------------------------------
    def evaluate(self, x, y=None, batch_size=None):
        """{'loss': mean loss, 'accuracy': fraction correct (classification losses)} over x:
        a dnn.data.Dataset, or numpy samples with their targets y."""
        batch_size = EVAL_BATCH if batch_size is None else _positive_int(batch_size, "batch_size")
        return self._evaluate(self._dataset(x, y), batch_size)

    def _evaluate(self, ds, batch_size):
        feed = self._feed(ds, reading=True)
        feed.start_epoch(None, 0)
        metrics = self.eval_metrics
        metrics.reset()
        for size in self._batches(feed.n, batch_size):
            self._program("eval", size, feed).run()
            metrics.samples += size
        loss, acc = metrics.read()
        out = {"loss": loss}
        if self.loss.accuracy:
            out["accuracy"] = acc
        return out

    def predict(self, x, batch_size=None):
        """The network's outputs (after the output activation) for x (numpy samples or a Dataset),
        a numpy array (N, outputs)."""
        batch_size = EVAL_BATCH if batch_size is None else _positive_int(batch_size, "batch_size")
        if x is None:
            raise ConfigError("predict: x must be numpy samples or a dnn.data.Dataset, got None")
        if not isinstance(x, Dataset) and np.ndim(x) and len(x) == 0:
            features = math.prod(np.shape(x)[1:]) if np.ndim(x) > 1 else None
            if features != math.prod(self.input_shape):
                raise ShapeError(f"predict: samples must have shape {self.input_shape}, got an empty array of "
                                 f"shape {np.shape(x)}")
            return np.zeros(self._predicted_shape(0), dtype=self.dtype)
        ds = self._dataset(x, None, targets=False)
        feed = self._feed(ds, reading=True)
        feed.start_epoch(None, 0)
        out = []
        for size in self._batches(feed.n, batch_size):
            prog = self._program("predict", size, feed)
            prog.run()
            out.append(prog.output.value.to_numpy())
        return np.concatenate(out).reshape(self._predicted_shape(feed.n))

    def _predicted_shape(self, n):
        """The shape of predict's result for n samples: (n, outputs), or (n,) + an image output's shape."""
        return (n,) + tuple(self.output_shape) if len(self.output_shape) > 1 else (n, self.outputs)

    # ---- description -------------------------------------------------------------------------------
    def summary(self, print_fn=print):
        """Print (and return) the layers with output shapes, parameters, parallel strategy and layouts."""
        acts = self._activation_layouts()
        rows = [("Layer (type)", "Output shape", "Params", "Parallel", "Weights", "Activations")]
        shape = self.input_shape
        for i, layer in enumerate(self.layers):
            shape = layer.output_shape(shape)
            names = {_layout_name(w.value.layout) for w in layer.weights}
            lays = names.pop() if len(names) == 1 else \
                ", ".join(f"{w.name.split('/')[-1]} {_layout_name(w.value.layout)}" for w in layer.weights)
            strategy = (layer.strategy or "auto") if layer.weights else "-"
            rows.append((f"{layer.name} ({type(layer).__name__})", str(tuple(shape)), str(layer.count_params()),
                         strategy, lays or "-", acts.get(i, "RowBlock")))
        widths = [max(len(r[k]) for r in rows) for k in range(len(rows[0]))]
        line = lambda r: "  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip()  # noqa: E731
        rule = "-" * len(line(rows[0]).ljust(sum(widths) + 2 * (len(widths) - 1)))
        text = [f"Model: {self.name}  (dtype {self.dtype}, weights {self.param_dtype}, {dmath.num_workers()} "
                f"worker(s), batch RowBlock: data parallel)", rule, line(rows[0]), rule]
        text += [line(r) for r in rows[1:]]
        text += [rule, f"Total params: {self.count_params():,}",
                 f"Loss: {self.loss.name}   Optimizer: {type(self.optimizer).__name__} "
                 f"(lr {self.optimizer.current_lr():g})"
                 + ("   Loss scaling: dynamic" if self.loss_scale is not None else "")]
        out = "\n".join(text)
        if print_fn is not None:
            print_fn(out)
        return out

    def _activation_layouts(self):
        """Layer index -> the layout of its output in the latest training program (once one has run)."""
        prog = self._last_program() if self._last_program is not None else None
        if prog is None or not prog.training:
            return {}
        # a node's layout is set by the training step's forward pass (None until one has run)
        return {i: _layout_name(n.layout) for i, n in enumerate(prog.layer_nodes) if n.layout is not None}

    # ---- configuration and files --------------------------------------------------------------------
    def get_config(self):
        return {"class": "Sequential", "name": self.name, "dtype": self.dtype, "loss": self.loss.name,
                "seed": self.seed, "record": self.record,
                "loss_scale": self.loss_scale.get_config() if self.loss_scale is not None else None,
                "layers": [layer.get_config() for layer in self.layers]}

    @classmethod
    def from_config(cls, config, optimizer=None):
        """A new model (fresh weights) from get_config()'s dict."""
        if not isinstance(config, dict) or config.get("class") != "Sequential":
            raise ConfigError(f"not a Sequential config: {config!r}")
        ls = config.get("loss_scale")
        return cls([from_config(c) for c in config["layers"]], loss=config["loss"], optimizer=optimizer,
                   dtype=config["dtype"], loss_scale=optim.DynamicLossScale(**ls) if ls else None,
                   record=config.get("record", True), seed=config.get("seed", 0),
                   name=config.get("name", "sequential"))

    def save(self, path):
        """Write a checkpoint to `path` (see dnn.serialization): the architecture, the weights as global
        arrays, the optimizer's state and clock, the loss scale, the epoch (and the batch, when called
        inside an epoch, e.g. by a callback), the layers' random counters and dmath's random streams.
        dnn.load resumes it at any worker count: fit(..., initial_epoch=k) continues as if never stopped."""
        serialization.save_model(self, path)

    def load_weights(self, path):
        """Load the weights and training state (optimizer, counters, epoch) of a model file into this
        model; they must match."""
        header, arrays = serialization.read_file(path)
        serialization.load_state(self, header, arrays, path)


def load(path):
    """The model saved in `path` by Model.save, ready to continue training at this run's worker count
    and layouts; dmath's random streams continue from where the saving run stood."""
    return serialization.load_model(path)


def _with_nan_guard(callbacks, terminate_on_nan):
    """The user's callbacks, plus a TerminateOnNaN when asked and none is there."""
    callbacks = list(callbacks or [])
    if terminate_on_nan and not any(isinstance(cb, cbs.TerminateOnNaN) for cb in callbacks):
        callbacks.append(cbs.TerminateOnNaN())
    return callbacks


def _check_range(x, dtype, what):
    """Refuse numpy samples that the model's dtype turns into infinity (float16 above 65504)."""
    if dtype != "float16" or isinstance(x, Dataset):
        return
    a = np.asarray(x)
    if a.dtype.kind in "iuf" and a.size:
        biggest = float(np.nanmax(np.abs(a)))
        if biggest > float(np.finfo(np.float16).max):
            raise ConfigError(f"{what}: a float16 model needs inputs within +-{np.finfo(np.float16).max:g}; "
                              f"the largest magnitude here is {biggest:g}, which becomes infinity. Normalise "
                              f"the inputs (or Dataset(..., scale=...)), or use dtype='float32'")


def _positive_int(v, what):
    if isinstance(v, bool) or not isinstance(v, numbers.Integral) or v < 1:
        raise ConfigError(f"{what} must be a positive integer, got {v!r}")
    return int(v)


def _layout_name(layout):
    return type(layout).__name__
