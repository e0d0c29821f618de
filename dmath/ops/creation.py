"""Creation: constant fill, identity, and counter-based random numbers (master halves and kernels).

Random values are a hash of (seed, stream, global linear index), so a matrix
drawn with the same seed is the same for any layout and any worker count.
The last scalar of every creation command is the new matrix's memory kind.
"""
from typing import NamedTuple

import numpy as np

from .. import backend, memory
from ..errors import DMathError
from ..layout import indexset as ix
from ..memory import kinds
from ..runtime import define
from .base import as_int, check_scalar, new_meta
from .storage import check_kind, compute_empty, create, new_shard

_U = np.uint64


class RandomArgs(NamedTuple):
    """Static arguments of `random`."""
    kind: str        # 'uniform' ([0, 1)) or 'normal' (standard normal)


FILL = define("fill")
EYE = define("eye")
RANDOM = define("random", RandomArgs)


# ---- master halves ------------------------------------------------------------------------
def zeros(shape, dtype="float32", layout=None, memory=None):
    """A matrix of zeros (layout None means RowBlock())."""
    return full(shape, 0.0, dtype, layout, memory)


def ones(shape, dtype="float32", layout=None, memory=None):
    """A matrix of ones (layout None means RowBlock())."""
    return full(shape, 1.0, dtype, layout, memory)


def full(shape, value, dtype="float32", layout=None, memory=None):
    """A matrix with every element `value` (layout None means RowBlock())."""
    memory = check_kind(memory)
    value = check_scalar(value, "the value")
    return create(new_meta(layout, shape, dtype), "fill", memory, scalars=(value,))


def eye(n, dtype="float32", layout=None, memory=None, *, m=None):
    """The n x n identity matrix, or with m= the n x m matrix with ones on the diagonal (NumPy's
    eye(N, M)); layout None means RowBlock()."""
    if isinstance(dtype, (int, np.integer)) and not isinstance(dtype, (bool, np.bool_)):
        # NumPy's eye(N, M): here the second argument is the dtype, as in every creation function
        raise DMathError(f"eye(n, ...): the second argument is the dtype, got {dtype!r}; for an {n} x {dtype} "
                         f"matrix pass the columns by keyword: dmath.eye({n}, m={dtype})")
    memory = check_kind(memory)
    n = as_int(n, "eye: n")
    m = n if m is None else as_int(m, "eye: m")
    return create(new_meta(layout, (n, m), dtype), "eye", memory)


def random(kind, shape, dtype, layout, memory, state):
    """Master half of dmath.random.rand/randn: `kind` values from the next stream of `state`
    (dmath.random's {'seed', 'stream'}), which advances only once the call is valid."""
    memory = check_kind(memory)
    out = new_meta(layout, shape, dtype)
    state["stream"] += 1
    return create(out, "random", memory, static=RANDOM.static(kind=kind), scalars=(state["seed"], state["stream"]))


# ---- kernels ------------------------------------------------------------------------------


def _out(call):
    """(distribution, dtype, this rank's pieces, memory kind) of the new matrix."""
    dist, dtype = call.entry.out_dists[0], call.entry.outputs[0].dtype
    return dist, dtype, dist.pieces[call.rank], kinds.from_code(call.scalars[-1])


#: the other addends of a Partial matrix whose value one member holds: -0.0, IEEE's additive identity
#: (x + -0.0 is x for every x, -0.0 included; +0.0 turned a -0.0 of the value into +0.0)
PARTIAL_ZERO = -0.0


def holds_value(dist, rank):
    """False on the members of a Partial layout other than the first: their addends are zero.

    (A Partial value is the sum of the addends, so creating one with every
    member holding the value would make it P times too large.)
    """
    return not dist.partial or rank == dist.group[0]


def _filled(pieces, dtype, kind, value):
    arrays = [compute_empty(kind, p.shape, dtype) for p in pieces]
    for a in arrays:
        memory.fill(a, value)
    return arrays


@FILL.kernel()
def _fill(call):
    """scalars = (value, memory kind)."""
    dist, dtype, pieces, kind = _out(call)
    value = call.scalars[0] if holds_value(dist, call.rank) else PARTIAL_ZERO
    return [new_shard(_filled(pieces, dtype, kind, value), dist, dtype, kind)]


def _grid(xp, piece):
    return xp.asarray(ix.to_array(piece.rows))[:, None], xp.asarray(ix.to_array(piece.cols))[None, :]


@EYE.kernel()
def _eye(call):
    xp = backend.current().xp
    dist, dtype, pieces, kind = _out(call)
    if not holds_value(dist, call.rank):
        return [new_shard(_filled(pieces, dtype, kind, PARTIAL_ZERO), dist, dtype, kind)]
    arrays = []
    for p in pieces:
        r, c = _grid(xp, p)
        a = compute_empty(kind, p.shape, dtype)
        a[...] = r == c
        arrays.append(a)
    return [new_shard(arrays, dist, dtype, kind)]


def _mix(z):
    # splitmix64 finaliser: a bijection on 64-bit words with good avalanche
    z = (z ^ (z >> _U(30))) * _U(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> _U(27))) * _U(0x94D049BB133111EB)
    return z ^ (z >> _U(31))


def _uniform(xp, index, key):
    """Uniform [0, 1) doubles from 64-bit counters and a key."""
    z = _mix(index * _U(0x9E3779B97F4A7C15) + key)
    return (z >> _U(11)).astype(xp.float64) * (1.0 / 9007199254740992.0)


def stream_key(seed, stream, lane):
    """The 64-bit key of (seed, stream, lane); pure Python so master and workers agree."""
    mask = (1 << 64) - 1
    x = (int(seed) * 0x9E3779B97F4A7C15 + int(stream) * 0xD1B54A32D192ED03 + lane * 0x8CB92BA72F3D8DD7) & mask
    for shift, mul in ((30, 0xBF58476D1CE4E5B9), (27, 0x94D049BB133111EB)):
        x = ((x ^ (x >> shift)) * mul) & mask
    return x ^ (x >> 31)


@RANDOM.kernel()
def _random(call):
    xp = backend.current().xp
    dist, dtype, pieces, memory_kind = _out(call)
    if not holds_value(dist, call.rank):
        return [new_shard(_filled(pieces, dtype, memory_kind, 0.0), dist, dtype, memory_kind)]
    kind = call.entry.static.kind
    seed, stream = int(call.scalars[0]), int(call.scalars[1])
    n = dist.shape[1]
    # a uniform double just below 1 rounds up to 1.0 in a narrower dtype (1 - 2**-12 in float16,
    # 1 - 2**-25 in float32): those values are clamped to the dtype's largest value below 1, so
    # rand stays in [0, 1) (log(1 - u) finite, floor(u * n) < n). Nothing else changes: float64
    # draws are the doubles themselves, and every other value converts as before
    below_one = None
    if kind == "uniform" and np.dtype(dtype) != np.float64:
        below_one = np.nextafter(np.dtype(dtype).type(1), np.dtype(dtype).type(0))
    arrays = []
    with np.errstate(over="ignore"):
        for p in pieces:
            r, c = _grid(xp, p)
            index = r.astype(xp.uint64) * _U(n) + c.astype(xp.uint64)
            u = _uniform(xp, index, _U(stream_key(seed, stream, 0)))
            if kind == "normal":
                v = _uniform(xp, index, _U(stream_key(seed, stream, 1)))
                u = xp.sqrt(-2.0 * xp.log1p(-u)) * xp.cos(2.0 * np.pi * v)
            a = compute_empty(memory_kind, p.shape, dtype)
            a[...] = u
            if below_one is not None:
                xp.minimum(a, below_one, out=a)
            arrays.append(a)
    return [new_shard(arrays, dist, dtype, memory_kind)]
