"""dmath.random: counter-based random matrices whose values depend only on the seed and the index.

Each call draws from a new stream (the master counts calls since the last
`seed`), so a program draws the same matrices at any layout or worker count.
"""
import numbers

from .errors import DMathError, ShapeError
from .layout import Replicated
from .matrix import Matrix
from .ops import creation
from .ops.base import dispatch, new_meta

_state = {"seed": 0, "stream": 0}


def seed(s):
    """Restart the random streams from seed `s` (a non-negative integer)."""
    if isinstance(s, bool) or not isinstance(s, numbers.Integral) or not 0 <= s < 2 ** 53:
        raise DMathError(f"seed must be an integer in [0, 2**53), got {s!r}")
    _state["seed"], _state["stream"] = int(s), 0


def get_seed():
    """The seed of the last `seed(s)` call (0 before any)."""
    return _state["seed"]


def get_state():
    """(seed, stream): where the random streams stand; `set_state` continues from there (checkpoints)."""
    return _state["seed"], _state["stream"]


def set_state(state):
    """Continue the random streams from a `get_state()` pair: the next draw is the one that followed it."""
    try:
        s, stream = state
    except (TypeError, ValueError) as exc:
        raise DMathError(f"a random state is a pair (seed, stream), got {state!r}") from exc
    # both checked before either is set: a refused state leaves the streams where they were
    if isinstance(stream, bool) or not isinstance(stream, numbers.Integral) or not 0 <= stream < 2 ** 53:
        raise DMathError(f"the stream of a random state must be an integer in [0, 2**53), got {stream!r}")
    seed(s)
    _state["stream"] = int(stream)


def rand(shape, dtype="float32", layout=None, memory=None):
    """Uniform [0, 1) values. Recorded in a dmath.record() block, the draw keeps its stream: every
    replay draws the same values again (a replay runs the same sequence)."""
    return creation.random("uniform", shape, dtype, layout, memory, _state)


def randn(shape, dtype="float32", layout=None, memory=None):
    """Standard normal values. Recorded in a dmath.record() block, the draw keeps its stream: every
    replay draws the same values again (a replay runs the same sequence)."""
    return creation.random("normal", shape, dtype, layout, memory, _state)


def permutation(n, key=None, out=None, layout=None):
    """A random permutation of range(n) as a (1, n) float64 matrix (Replicated by default).

    key: a tuple of non-negative integers that alone decides the order (the
    same for any layout, worker count and backend); None: the next stream
    of this module's seed (recorded in a dmath.record() block, every
    replay repeats that stream's order); (): the identity. out: an existing (1, n) float64
    matrix to overwrite in place instead (a recorded plan reading it stays
    valid). Every worker computes the permutation itself: nothing but the
    key travels.
    """
    # everything is checked before the stream advances (as rand and randn do): a call that raises
    # leaves the later draws as they would have been without it
    if key is not None:
        try:
            key = tuple(key)
        except TypeError as exc:
            raise DMathError(f"permutation: key must be a tuple of non-negative integers, got {key!r}") from exc
        for k in key:
            if isinstance(k, bool) or not isinstance(k, numbers.Integral) or not 0 <= k < 2 ** 53:
                raise DMathError(f"permutation: key entries must be integers in [0, 2**53), got {key!r}")
    if isinstance(n, bool) or not isinstance(n, numbers.Integral) or n < 0:
        raise ShapeError(f"permutation: n must be a non-negative integer, got {n!r}")
    if out is not None:
        if not isinstance(out, Matrix) or out.shape != (1, n) or out.dtype != "float64":
            raise ShapeError(f"permutation: out must be a (1, {n}) float64 dmath.Matrix, got {out!r}")
        out._check_writable("permutation")      # a slice or transpose is a copy: the order would be lost
    elif layout is not None:
        new_meta(layout, (1, int(n)), "float64")      # a layout that does not fit raises here
    if key is None:
        _state["stream"] += 1
        key = (_state["seed"], _state["stream"])
    if out is None:
        out = creation.zeros((1, int(n)), dtype="float64", layout=layout if layout is not None else Replicated())
    dispatch("nn_permutation", [out], [0], scalars=key)
    return out
