"""Hyperparameter search over worker groups: grid and random search, trials run concurrently.

    def build(p):
        return dnn.Sequential([L.Input(784), L.Dense(p['units']), L.Activation('relu'),
                               L.Dense(10), L.Output('softmax')],
                              optimizer=dnn.optim.SGD(lr=p['lr']))
    results = dnn.search.grid(build, {'lr': [0.1, 0.03], 'units': [32, 128]}, x, y,
                              epochs=3, batch_size=100, validation_data=(xv, yv))
    best = results[0]['params']

MagmaDNN's "random and/or exhaustive grid search ... a parameter server
sends a parameter set to each node", on dmath's master-worker runtime: the
workers are cut into groups of workers_per_trial; each group trains one
configuration at a time (data parallel inside the group), the groups run
concurrently, and the master hands the next configuration to the first
free group. Each trial seeds dmath.random with `seed` before calling
build(params), so it equals `dmath.random.seed(seed); build(params).fit(...)`
on a group of the same size. The samples are placed on the workers once and
shared by every trial. Modules: `space` (grids and random draws, pure),
`trial` (one configuration, step by step), `engine` (groups and scheduling).
"""
import dmath

from . import engine
from .space import grid_configs, random_configs

__all__ = ["grid", "random", "grid_configs", "random_configs"]


def grid(build, space, x, y=None, *, epochs, batch_size, validation_data, workers_per_trial=1, seed=0, verbose=1):
    """Train every combination of the lists in `space` and rank them by validation loss.

    build(params) -> a compiled dnn.Sequential, where params maps each name
    of `space` to one of its values (e.g. {'lr': [0.1, 0.01], 'units': [32,
    64]}: 4 trials, the first name varying slowest). x, y: numpy samples and
    targets, or a dnn.data.Dataset (y None); validation_data: (x, y) or a
    Dataset. Every trial trains for `epochs` epochs of batch_size, shuffled
    as fit shuffles. workers_per_trial: the size of each group (it must
    divide the number of workers). seed: given to dmath.random.seed before
    each build. verbose: 1 prints a line per finished trial, 0 nothing.

    Returns one dict per trial, sorted by 'val_loss' ascending (NaN last):
    'params', 'loss', 'accuracy' (the last epoch's training values; accuracy
    None for losses without one), 'val_loss', 'val_accuracy', 'seconds' (the
    trial's wall time, build to final read), 'trial' (its number in the
    grid's order) and 'workers' (the ranks that trained it).
    """
    configs = grid_configs(space)
    return _search(build, configs, x, y, epochs, batch_size, validation_data, workers_per_trial, seed, verbose)


def random(build, space, x, y=None, *, trials, epochs, batch_size, validation_data, workers_per_trial=1, seed=0,
           verbose=1):
    """Train `trials` configurations drawn from `space` and rank them by validation loss.

    space maps each name to a list (one value chosen, equally likely), a
    range (low, high) (uniform; integers in [low, high] when both bounds
    are ints, else floats in [low, high)) or ('log', low, high) (log-uniform,
    low > 0; integers again when both bounds are ints). The draws depend on
    `seed` only (see dnn.search.space). Everything else as `grid`.
    """
    configs = random_configs(space, engine.positive_int(trials, "trials"), engine.check_seed(seed))
    return _search(build, configs, x, y, epochs, batch_size, validation_data, workers_per_trial, seed, verbose)


def _search(build, configs, x, y, epochs, batch_size, validation_data, workers_per_trial, seed, verbose):
    if not dmath.is_initialized():
        dmath.init()
    engine.check_options(build, epochs, batch_size, seed, verbose)
    workers = dmath.current_group()
    groups = engine.worker_groups(workers, workers_per_trial)
    data = engine.place_data(x, y, validation_data, workers)
    return engine.run(build, configs, data, groups, epochs, batch_size, seed, verbose)
