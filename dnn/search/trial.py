"""One trial of a search: a configuration trained on its worker group, one step per `advance`.

A trial is a generator driven by the scheduler (dnn.search.engine). Every
`advance` runs inside `dmath.on_group(group)`, so everything the trial makes
(the model's weights, optimizer state, batch matrices, the feeds' counters,
the metric accumulators) lives on its group, and each call issues at most
one training step: a plan replay, one small control message. Nothing is
read back until the trial's last step, so issuing a step never waits for
the group: the groups' steps run concurrently.

The run is `Sequential.fit`'s, step for step: `dmath.random.seed(seed)`
then `build(params)`, then per epoch the samples ordered by the model's
shuffle key, cut into batches of batch_size, one recorded step each; at the
end the last epoch's training loss and accuracy and one evaluation of the
validation set, read from the group. (tests/dist/test_dnn_search_dist.py
checks that a trial equals fit on a group of the same size.)
"""
import time

import dmath

from ..errors import ConfigError
from ..model import EVAL_BATCH, Model


class Trial:
    """Configuration `params` (trial number `index`) trained on `group`; see the module docstring."""

    def __init__(self, index, params, group, build, data, epochs, batch_size, seed):
        self.index, self.params, self.group = index, params, group
        self.result = None
        self._steps = self._run(build, data, epochs, batch_size, seed)
        self._start = None

    def advance(self):
        """Issue the trial's next step on its group; True once it has finished (then see `result`)."""
        if self._start is None:
            self._start = time.perf_counter()
        with dmath.on_group(self.group):
            try:
                next(self._steps)
            except StopIteration:
                return True
        return False

    def close(self):
        """Drop an unfinished trial (its matrices are freed with the model)."""
        self._steps.close()

    def _run(self, build, data, epochs, batch_size, seed):
        train, val = data
        dmath.random.seed(seed)
        model = build(dict(self.params))
        if not isinstance(model, Model):
            raise ConfigError(f"dnn.search: build(params) must return a dnn.Sequential or dnn.Model, got "
                              f"{type(model).__name__} for params {self.params}")
        # a model another trial trains (built once, returned for every params) lives on that trial's
        # workers: its steps here ended the runtime with a worker's IndexError, and on one worker the
        # trials went on from each other's weights, silently
        if getattr(model, "_search_trial", None) is not None or tuple(model.workers) != tuple(self.group):
            raise ConfigError(f"dnn.search: build(params) must make a new model for each call (inside it, "
                              f"the trial's workers are the default group); for params {self.params} it "
                              f"returned one " + ("another trial trains" if getattr(model, "_search_trial", None)
                                                  is not None else f"on workers {tuple(model.workers)}, not the "
                                                  f"trial's {tuple(self.group)}"))
        model._search_trial = self.index
        # the shared datasets checked against this model (shapes, targets), as fit checks its arrays
        train = model._dataset(train, None)
        val = model._dataset(val, None, "validation_data")
        feed = model._feed(train)
        metrics = model.train_metrics
        for epoch in range(epochs):
            feed.start_epoch(model.shuffle_key(epoch), epoch)
            metrics.reset()
            key = model._program_key("train")
            for size in model._batches(feed.n, batch_size):
                model._program("train", size, feed, key).run()
                metrics.samples += size
                yield
        model.epochs_trained = epochs
        # the reads below wait for this group's queue: give the other groups their next step first
        yield
        v = model._evaluate(val, EVAL_BATCH)     # issues the evaluation, then waits for it
        loss, accuracy = metrics.read()          # the group is done by now: no second wait
        has_accuracy = bool(model.loss.accuracy)
        self.result = {"params": dict(self.params), "loss": loss, "accuracy": accuracy if has_accuracy else None,
                       "val_loss": v["loss"], "val_accuracy": v.get("accuracy"),
                       "seconds": time.perf_counter() - self._start, "trial": self.index,
                       "workers": self.group}
