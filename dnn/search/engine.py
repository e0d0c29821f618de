"""The search's scheduler: worker groups, one configuration per free group, steps interleaved.

The workers (all of them, or those of an enclosing `dmath.on_group`) are
cut into consecutive groups of workers_per_trial. The master keeps a queue
of configurations and, in rounds, (1) hands the next configuration to each
free group, lowest group first, (2) advances every running trial by one
step (`Trial.advance`: one plan replay on that group). The group holding
the master (rank 0, also worker 0) goes last in a round: the master runs
its share of that group's step itself, and by then the other groups have
their step queued, so they compute while it does. A group whose trial ends
is handed the next configuration in the following round. The only waits
are a trial's final reads (the evaluation and the metrics), which wait for
that group alone. See docs/ARCHITECTURE.md, "Hyperparameter search".
"""
import math
import numbers
from collections import deque

import dmath

from ..data import Dataset
from ..data.dataset import as_dataset
from ..errors import ConfigError
from .trial import Trial


def positive_int(v, what):
    if isinstance(v, bool) or not isinstance(v, numbers.Integral) or v < 1:
        raise ConfigError(f"dnn.search: {what} must be a positive integer, got {v!r}")
    return int(v)


def worker_groups(workers, workers_per_trial):
    """`workers` (a tuple of ranks) cut into consecutive groups of workers_per_trial."""
    n = positive_int(workers_per_trial, "workers_per_trial")
    if n > len(workers):
        raise ConfigError(f"dnn.search: workers_per_trial={n} exceeds the {len(workers)} worker(s) available")
    if len(workers) % n:
        raise ConfigError(f"dnn.search: workers_per_trial={n} must divide the number of workers "
                          f"({len(workers)}), so that every group has the same size; try one of "
                          f"{[d for d in range(1, len(workers) + 1) if len(workers) % d == 0]}")
    return [tuple(workers[i:i + n]) for i in range(0, len(workers), n)]


def check_seed(seed):
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral) or not 0 <= seed < 2 ** 53:
        raise ConfigError(f"dnn.search: seed must be an integer in [0, 2**53), got {seed!r}")
    return int(seed)


def check_options(build, epochs, batch_size, seed, verbose):
    if not callable(build):
        raise ConfigError(f"dnn.search: build must be a function params -> compiled dnn model, got {build!r}")
    positive_int(epochs, "epochs")
    positive_int(batch_size, "batch_size")
    check_seed(seed)
    if verbose not in (0, 1):
        raise ConfigError(f"dnn.search: verbose must be 0 (quiet) or 1 (a line per finished trial), got {verbose!r}")


def place_data(x, y, validation_data, workers):
    """(train, validation) Datasets resident on every worker of `workers`: placed once, shared by all trials."""
    if validation_data is None:
        raise ConfigError("dnn.search: validation_data is required: the trials are ranked by their val_loss")
    if isinstance(validation_data, Dataset):
        val = validation_data
    else:
        try:
            xv, yv = validation_data
        except (TypeError, ValueError) as exc:
            raise ConfigError("dnn.search: validation_data must be a pair (x, y) or a dnn.data.Dataset") from exc
        val = as_dataset(xv, yv, "validation_data")
    train = as_dataset(x, y)
    for ds, what in ((train, "x"), (val, "validation_data")):
        if ds.y is None:
            raise ConfigError(f"dnn.search: {what} needs targets")
        held = set(ds.x.layout.members(dmath.num_workers()))
        if not ds.x.layout.replicated or not set(workers) <= held:
            raise ConfigError(f"dnn.search: the {what} Dataset must be resident on every worker of the search "
                              f"{workers} (made outside dmath.on_group, or inside the search's own group); "
                              f"it is {ds.x.layout}")
    return train, val


def run(build, configs, data, groups, epochs, batch_size, seed, verbose):
    """Train every configuration on the groups (see the module docstring); the results sorted by val_loss."""
    pending = deque(enumerate(configs))
    running = {}                  # group number -> its Trial
    results = []
    # the master's group advances last in each round (it computes its share while the others run theirs)
    order = sorted(range(len(groups)), key=lambda k: 0 in groups[k])
    try:
        while pending or running:
            for k in range(len(groups)):
                if k not in running and pending:
                    i, params = pending.popleft()
                    running[k] = Trial(i, params, groups[k], build, data, epochs, batch_size, seed)
            for k in order:
                trial = running.get(k)
                if trial is not None and trial.advance():
                    del running[k]
                    results.append(trial.result)
                    if verbose:
                        print(progress_line(trial.result, len(configs)), flush=True)
    finally:
        for trial in running.values():
            trial.close()
    return sorted(results, key=lambda r: (math.isnan(r["val_loss"]), r["val_loss"], r["trial"]))


def progress_line(result, total):
    """'trial 3/8 on worker 1 (2.1 s): lr=0.1, units=64 - loss 0.2345 - accuracy 0.9312 - val_loss ...'."""
    ranks = result["workers"]
    where = f"worker {ranks[0]}" if len(ranks) == 1 else f"workers {ranks[0]}-{ranks[-1]}"
    params = ", ".join(f"{k}={_short(v)}" for k, v in result["params"].items())
    metrics = " - ".join(f"{k} {result[k]:.4f}" for k in ("loss", "accuracy", "val_loss", "val_accuracy")
                         if result[k] is not None)
    return f"trial {result['trial'] + 1}/{total} on {where} ({result['seconds']:.1f} s): {params} - {metrics}"


def _short(v):
    return f"{v:.4g}" if isinstance(v, float) else repr(v) if isinstance(v, str) else str(v)
