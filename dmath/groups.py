"""Worker groups as a scope: `with dmath.on_group(ranks):` puts new matrices on those workers.

    with dmath.on_group((2, 3)):
        A = dmath.random.rand((1000, 100))      # RowBlock over workers 2 and 3
        w = dmath.zeros((100, 10), layout=dmath.Replicated())   # on 2 and 3 only
        C = A @ w                               # computed by 2 and 3; 0 and 1 skip it

Every layout made inside the block without an explicit group
(`RowBlock()`, `Replicated()`, the defaults of the creation functions and
of library code such as dnn's layers) takes the block's group, so code
written for "all workers" runs unchanged on a subset. Commands still reach
every rank in one ordered stream; a rank outside a command's layouts skips
it without communicating, so work issued to disjoint groups runs
concurrently as long as the master does not wait on one of them (a read
such as `get` or `to_numpy` waits only for the group that holds the value).
This is JAX's `with mesh:` and PyTorch's default-device context applied to
dmath's worker groups.
"""
import contextlib
import numbers

from .errors import LayoutError
from .layout import scope
from .runtime import runtime


def _check_ranks(ranks, nworkers):
    try:
        group = tuple(ranks)
    except TypeError:
        raise LayoutError(f"on_group needs a sequence of worker ranks, got {ranks!r}") from None
    if not group:
        raise LayoutError("on_group needs at least one worker rank")
    for r in group:
        if isinstance(r, bool) or not isinstance(r, numbers.Integral) or not 0 <= r < nworkers:
            raise LayoutError(f"on_group: ranks must be integers in [0, {nworkers}), got {ranks!r}")
    if len(set(group)) != len(group):
        raise LayoutError(f"on_group: ranks must be distinct, got {ranks!r}")
    return tuple(int(r) for r in group)


@contextlib.contextmanager
def on_group(ranks):
    """Inside the block, layouts made without a group live on `ranks` (see the module docstring).

    Blocks nest (the innermost wins) and the previous default comes back on
    exit, also after an exception. The group is kept in each layout value,
    so matrices made inside keep their workers after the block ends.
    """
    group = _check_ranks(ranks, runtime().nworkers)
    previous = scope.set_default_group(group)
    try:
        yield group
    finally:
        scope.set_default_group(previous)


def current_group():
    """The ranks that a layout made here without a group lives on: `on_group`'s, else every worker."""
    group = scope.default_group()
    return group if group is not None else tuple(range(runtime().nworkers))
