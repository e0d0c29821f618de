"""dmath.random: counter-based random matrices whose values depend only on the seed and the index.

Each call draws from a new stream (the master counts calls since the last
`seed`), so a program draws the same matrices at any layout or worker count.
"""
from .matrix import _check_memory, _create
from .ops.base import new_meta

_state = {"seed": 0, "stream": 0}


def seed(s):
    """Restart the random streams from seed `s` (a non-negative integer)."""
    if not isinstance(s, int) or s < 0 or s >= 2 ** 53:
        raise ValueError(f"seed must be an integer in [0, 2**53), got {s!r}")
    _state["seed"], _state["stream"] = s, 0


def _draw(kind, shape, dtype, layout, memory):
    memory = _check_memory(memory)
    out = new_meta(layout, shape, dtype)
    _state["stream"] += 1
    return _create(out, "random", memory, static=(kind,), scalars=(_state["seed"], _state["stream"]))


def rand(shape, dtype="float32", layout=None, memory=None):
    """Uniform [0, 1) values."""
    return _draw("uniform", shape, dtype, layout, memory)


def randn(shape, dtype="float32", layout=None, memory=None):
    """Standard normal values."""
    return _draw("normal", shape, dtype, layout, memory)
