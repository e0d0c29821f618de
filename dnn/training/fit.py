"""The fit loop: epochs of recorded training steps, validation, callbacks, resuming mid-epoch, and the
model's cache of recorded programs (one per batch size and mode, dnn.training.programs): a step is
recorded as a dmath plan the first time and replayed after that, each batch written into the same
input matrices. `Sequential` inherits it."""
import json
import numbers
import time
import weakref

import numpy as np

import dmath

from ..data import Dataset
from ..errors import ConfigError
from . import asgd, callbacks as cbs, strategy
from .programs import Program
from .progress import ProgressBar

#: the batch size evaluate and predict use when none is given
EVAL_BATCH = 1000


class Training:
    """The fit loop and the recorded programs of a model (a mixin of `Model`)."""

    def _program_key(self, kind):
        """What a recorded step of `kind` has baked in besides the weights and data. Every kind: the
        model's settings (`_settings`: every layer's configuration, the loss weights) and the layers'
        strategies; training adds the optimizer object (its state and step matrices), its
        hyper-parameters (momentum, betas, eps, weight decay: constants of its update commands),
        the loss, the loss scale (the object, and its growth and backoff settings: constants of its
        update commands) and gradient buckets; evaluation adds the loss. The learning rate and its
        schedule are left out: the lr is a (1, 1) matrix written before each step, so changing them
        re-records nothing. The key holds the objects themselves (compared by identity), so
        none is freed while a step recorded with it lives."""
        if kind == "train":
            hyper = {k: v for k, v in self.optimizer.get_config().items() if k not in ("lr", "schedule")}
            scaling = None if self.loss_scale is None else repr(sorted(self.loss_scale.get_config().items()))
            return (self.optimizer, repr(sorted(hyper.items())), self.loss, self.loss_scale, scaling, self._settings(),
                    self.bucket_mb, self.gradient_sum_dtype, self._strategies())
        # every kind reads the weights where their layouts put them: a strategy changed (parallel='auto'
        # timed at fit's first steps) moved them to new matrices
        return ((self.loss,) if kind == "eval" else ()) + (self._settings(), self._strategies())

    def _settings(self):
        """The model's settings a recorded step computes with, derived whole rather than listed: every
        layer's get_config() (an activation, a dropout rate or seed, a batch norm's eps, momentum and
        synchronization, a frozen layer), the loss weights, the image-row order and folds, and the seed
        (of the augmentation's draws). Any of them changed between calls on the same Dataset records
        its steps anew (a replay would compute with the old values, silently)."""
        configs = tuple(json.dumps(layer.get_config(), sort_keys=True, default=repr) for layer in self.layers)
        return configs, tuple(self.loss_weights), self.channels_last, self.fuse, self.seed

    def _strategies(self):
        """Each layer's strategy and count of weight moves (`Layer.moves`): a key that changes whenever
        a layer's weights went to new matrices, even where the strategy came back to what it was."""
        return tuple((layer.strategy, layer.moves) for layer in self.layers)

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
            decided = self._strategies()
            for layer in self.layers:
                layer.decide(batch, len(self.workers))
            if self._strategies() != decided:
                key = self._program_key(kind)       # (the strategies just decided are part of it)
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

    def _strategy_trial(self, batch):
        """The `strategy.Trial` deciding the parallel='auto' layers at this batch size (made at the
        first training step; None once they are decided, or when none is undecided)."""
        trial = self._trials.get(batch)
        if trial is None:
            for size, other in list(self._trials.items()):
                if not other.done:      # an earlier fit ended before its timing did
                    other.abandon()
                    del self._trials[size]
            if not strategy.undecided(self):
                return None
            trial = self._trials[batch] = strategy.Trial(self, batch)
        return None if trial.done else trial

    def explain_parallel(self):
        """What parallel='auto' timed and chose at each batch size (dnn.training.strategy), and the
        gradient buckets of the last recorded training step (dnn.training.buckets)."""
        text = strategy.explain(self.parallel_report)
        prog = self._last_program() if self._last_program is not None else None
        if prog is not None and prog.training:
            sizes = [sum(prog.params[k].value.nbytes for k in b) / 2 ** 20 for b in prog.buckets]
            if sizes:
                text += (f"\ngradient buckets of the training step (batch {prog.batch}): {len(sizes)} all-reduces of "
                         + ", ".join(f"{mb:.2f}" for mb in sizes) + " MB, in the order the backward pass sums them")
            else:
                text += f"\ngradient buckets of the training step (batch {prog.batch}): none (nothing summed over workers)"
        return text

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
        instead, as Keras (training keeps the first floor(N * (1 -
        validation_split)) samples: Dataset.split). epochs: how many epochs to run, continuing the
        epoch count of earlier fit calls; with initial_epoch=k (Keras) the
        epochs k .. epochs - 1 run instead (resuming a saved run).
        callbacks: dnn.callbacks.Callback objects. verbose: 0 silent, 1
        a tqdm progress bar on stderr (when tqdm is installed) and one line
        per epoch on stdout, 2 the lines only. terminate_on_nan: add a
        dnn.callbacks.TerminateOnNaN (unless callbacks hold one), which stops
        training with TrainingError at a NaN or infinite loss or weight, or
        a float16 loss scale that skips every step.

        asynchronous: True trains with asynchronous SGD (dnn.training.asgd): the workers
        split into `groups` groups (default: one per worker; it must divide
        the number of workers), each computing gradients on its own batches
        with its own copy of the weights, which a parameter store on worker
        0 applies as they arrive; a gradient is computed on weights at most
        `max_staleness` updates old (default groups - 1; 0 is synchronous
        SGD). The epoch's logs add 'max_staleness' and 'mean_staleness'.
        """
        if verbose not in (0, 1, 2) or isinstance(verbose, float):
            raise ConfigError(f"verbose must be 0, 1 or 2, got {verbose!r}")
        if not isinstance(shuffle, (bool, np.bool_)):
            raise ConfigError(f"shuffle must be True or False, got {shuffle!r}")
        if not isinstance(terminate_on_nan, (bool, np.bool_)):
            raise ConfigError(f"terminate_on_nan must be True or False, got {terminate_on_nan!r}")
        if getattr(self, "_fitting", False):
            # the inner fit reset the outer one's metric sums and added its own: the outer epoch then
            # reported an accuracy of 1.25
            raise ConfigError("fit was called while this model's fit is running (from one of its callbacks?): "
                              "the two would share the epoch's sums and the model's steps. Call it after the "
                              "outer fit returns (evaluate and predict may be called from a callback)")
        options = asgd.check_options(self, asynchronous, max_staleness, groups, callbacks)
        if options is not None and self.resume is not None and self.resume["batch"]:
            raise ConfigError("a checkpoint saved inside an epoch resumes synchronously (asynchronous=False); "
                              "asynchronous training starts at an epoch's beginning")
        batch_size = positive_int(batch_size, "batch_size")
        epochs = positive_int(epochs, "epochs")
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
        self._fitting = True
        try:
            return self._fit_epochs(train, val, batch_size, shuffle, first, last, verbose, hooks, history, options)
        finally:
            self._fitting = False

    def _fit_epochs(self, train, val, batch_size, shuffle, first, last, verbose, hooks, history, options):
        """fit's training, once everything is checked: epochs first..last-1, synchronous or not."""
        cbs.call(hooks, "on_train_begin")
        if options is not None:
            return self._fit_async(train, val, batch_size, shuffle, first, last, verbose, hooks, history, *options)
        feed = self._feed(train)
        resume = self._take_resume(first, batch_size, feed.n)
        logs = None
        for epoch in range(first, last):
            cbs.call(hooks, "on_epoch_begin", epoch)
            logs = self._train_epoch(feed, batch_size, shuffle, epoch, last, verbose, hooks, val,
                                     resume if epoch == first else None)
            cbs.call(hooks, "on_epoch_end", epoch, logs=logs)
            if self.stop_training:
                break
        cbs.call(hooks, "on_train_end", logs=logs)      # (the last epoch's logs, as Keras)
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
        """fit's epochs with asynchronous SGD (dnn.training.asgd.AsyncTrainer)."""
        self.resume = None
        trainer = asgd.AsyncTrainer(self, train, batch_size, groups, max_staleness)
        evaluate = (lambda: self._evaluate(val, EVAL_BATCH)) if val is not None else None
        # callbacks reading the running metrics (TerminateOnNaN, the bar) read every group's
        synchronous, self.train_metrics = self.train_metrics, trainer.metrics
        logs = None
        try:
            for epoch in range(first, last):
                cbs.call(hooks, "on_epoch_begin", epoch)
                logs = trainer.train_epoch(epoch, last, shuffle, verbose, hooks, evaluate)
                cbs.call(hooks, "on_epoch_end", epoch, logs=logs)
                if self.stop_training:
                    break
        finally:
            self.train_metrics = synchronous
            trainer.close()
        cbs.call(hooks, "on_train_end", logs=logs)
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
        if r["batch"] > len(self._batches(n, batch_size)) or r.get("data_samples") not in (None, n):
            # (the data size is in checkpoints of session 27 on: another data set of as many batches
            # resumed its epoch's order and sums on other samples)
            had = "" if r.get("data_samples") is None else f" of {r['data_samples']} samples"
            raise ConfigError(f"the checkpoint was saved after batch {r['batch']} of an epoch over data{had}; "
                              f"this data has {n} samples: resume with the data it was trained on")
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
        # (the trial's batch size is the epoch's full batch: batch_size, or every sample when fewer)
        trial = self._strategy_trial(max(sizes))
        # after the trial: one made now may adopt strategies (a cached choice, the only candidate), which
        # are part of the key; a key taken before would file this epoch's program under the old
        # strategies and the next epoch would record it again
        key = self._program_key("train")
        # a callback's on_batch_end may change the optimizer (momentum, betas, weight decay, the
        # optimizer itself) or a layer's settings: a step recorded before would replay the old ones
        # silently, or read momentum buffers its optimizer freed, so the key is taken again after such
        # hooks (only where some callback may change them: the key reads every layer's config)
        rekey = any(cb.hooks_batch_end() for cb in hooks)
        for b in range(skip, len(sizes)):
            size = sizes[b]
            if trial is not None:
                trial.before_step(size)
                key = self._program_key("train")
            self._program("train", size, feed, key).run()
            if trial is not None:
                trial.after_step(size, last=b == len(sizes) - 1)
                if trial.done:
                    trial, key = None, self._program_key("train")
            done += size
            metrics.samples = done
            self.position = (epoch, b + 1, batch_size, n)
            bar.update(done, metrics.read)
            cbs.call(hooks, "on_batch_end", b)
            if rekey and trial is None:
                key = self._program_key("train")
        self.position = None
        if trial is not None:
            trial.end_epoch()
        self.epochs_trained = epoch + 1
        # one gather: waits for the epoch's last step, and reads what the callbacks need at its end
        loss, acc = cbs.read_epoch_end(metrics, hooks)
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


def _with_nan_guard(callbacks, terminate_on_nan):
    """The user's callbacks, plus a TerminateOnNaN when asked and none is there."""
    if isinstance(callbacks, cbs.Callback):
        raise ConfigError(f"callbacks must be a list of dnn.callbacks.Callback objects, got one "
                          f"{type(callbacks).__name__}: pass callbacks=[it]")
    callbacks = list(callbacks or [])
    if terminate_on_nan and not any(isinstance(cb, cbs.TerminateOnNaN) for cb in callbacks):
        callbacks.append(cbs.TerminateOnNaN())
    return callbacks


def positive_int(v, what):
    """`v` as an int, or ConfigError naming `what` unless it is a positive integer."""
    if isinstance(v, bool) or not isinstance(v, numbers.Integral) or v < 1:
        raise ConfigError(f"{what} must be a positive integer, got {v!r}")
    return int(v)
