"""Operations that move or reinterpret data: remap (with window and dtype change), transpose,
reshape, slices, get, set (master halves and kernels)."""
import math
from typing import NamedTuple

import numpy as np

from .. import backend, memory, remap as _remap
from ..comm import collectives
from ..comm.control import gather_objects
from ..errors import DMathError, LayoutError, ShapeError
from ..layout import ColBlock, RowBlock, Tiles, distribution
from ..layout.indexset import split_even
from ..runtime import Shard, define, protocol, runtime
from ..runtime.registry import collectives_in_graphs
from .base import as_int, check_scalar, dispatch, is_matrix, new_meta
from .creation import PARTIAL_ZERO, zeros


class RemapArgs(NamedTuple):
    """Static arguments of `remap`: the window's top-left corner in the source; sum in the background."""
    offset: tuple
    background: bool


REMAP = define("remap", RemapArgs)
REMAP_INTO = define("remap_into")
TRANSPOSE = define("transpose")
RESHAPE_ROWS = define("reshape_rows")
GET = define("get")
GET_MANY = define("get_many")
SET = define("set")


def remap(m, layout, dtype=None, offset=(0, 0), shape=None, background=False):
    """Master half: a new Matrix holding `m` (read from the window at `offset` of `shape`) in
    `layout` and `dtype` (None: m's). background only matters for a Partial source (a sum)."""
    out = new_meta(layout, shape or m.shape, m.dtype if dtype is None else dtype)
    args = REMAP.static(offset=tuple(offset), background=bool(background) and m.layout.partial)
    return dispatch("remap", [m], [out], static=args)[0][0]


def resolve_partial(m):
    """A Partial matrix as the RowBlock of its sums over the same workers (a reduce-scatter); others as they are."""
    return remap(m, RowBlock(m.layout.group)) if m.layout.partial else m


def remap_into(target, src):
    """Master half of Matrix.assign(Matrix): overwrite `target` in place with `src` (same shape) in
    target's layout and dtype."""
    dispatch("remap_into", [target, src], [0])


def transpose(m):
    """Master half of Matrix.T: a new matrix; every piece stays on its worker, transposed locally."""
    lay = m.layout.transposed(runtime().nworkers)
    out = dispatch("transpose", [m], [new_meta(lay, m.shape[::-1], m.dtype)])[0][0]
    out._derived = "A.T"
    return out


def getitem(m, key):
    """Master half of M[key]: an element (a float) for two integers, else the submatrix (a remap)."""
    rows, cols = _parse_key(key, m.shape)
    if isinstance(rows, int) and isinstance(cols, int):
        return get_element(m, (rows, cols))
    rows = slice(rows, rows + 1) if isinstance(rows, int) else rows
    cols = slice(cols, cols + 1) if isinstance(cols, int) else cols
    shape = (rows.stop - rows.start, cols.stop - cols.start)
    out = remap(m, _slice_layout(m.layout), None, offset=(rows.start, cols.start), shape=shape)
    out._derived = f"A[{rows.start}:{rows.stop}, {cols.start}:{cols.stop}]"
    return out


def get_element(m, index):
    """Master half of Matrix.get: the element at (i, j) as a Python float."""
    i, j = _check_index(index, m.shape)
    return dispatch("get", [m], scalars=(i, j))[1]


def get_elements(matrices, index):
    """The element at (i, j) of each of `matrices`, as Python floats, read by one command: the
    workers wait for their device once and answer in one gather, where a get per matrix is a
    round trip each (a training epoch's end read four sums and a finiteness flag so, while the
    GPUs sat drained). At most 255 matrices (one command's operands)."""
    if not isinstance(matrices, (list, tuple)):
        raise DMathError(f"get_elements takes a list of dmath matrices, got {type(matrices).__name__}")
    if not matrices:
        return []
    if len(matrices) > protocol.MAX_OPERANDS:
        raise DMathError(f"get_elements reads at most {protocol.MAX_OPERANDS} matrices in one command, "
                         f"got {len(matrices)}")
    for m in matrices:
        if not is_matrix(m):
            raise DMathError(f"get_elements takes dmath matrices, got {type(m).__name__}")
    i, j = _check_index(index, matrices[0].shape)
    for m in matrices[1:]:
        _check_index(index, m.shape)
    return dispatch("get_many", matrices, scalars=(i, j))[1]


def set_element(m, index, value):
    """Master half of Matrix.set: write one element (i, j) = value in place."""
    i, j = _check_index(index, m.shape)
    m._check_writable("set")
    dispatch("set", [m], [0], scalars=(i, j, check_scalar(value, "the value")))


def reshape(m, shape, layout):
    """Master half of Matrix.reshape (see there): row blocks on whole rows of both shapes, reshaped locally."""
    shape = _reshape_target(shape, m.shape)
    P = runtime().nworkers
    # the row blocks live on m's workers (inside `on_group` a RowBlock without a group would take
    # the scope's, and outside it the world's: either way not m's, with one size per worker)
    group = m.layout.members(P)
    if layout is None:
        layout = m.layout if _fits(m.layout, shape) else RowBlock(group)
    # the result's layout is checked before any command is sent: a bad one must leave nothing done
    layout = new_meta(layout, shape, m.dtype).layout
    if shape == m.shape:
        return remap(m, layout)
    if m.size == 0:
        return zeros(shape, m.dtype, layout)
    # a block of whole rows of both shapes holds a multiple of lcm(n, n2) elements
    (_, n), (_, n2) = m.shape, shape
    unit = math.lcm(n, n2)
    chunks = split_even(m.size // unit, len(group))
    src = remap(m, RowBlock(group, sizes=[c * unit // n for c in chunks]))
    out = new_meta(RowBlock(group, sizes=[c * unit // n2 for c in chunks]), shape, m.dtype)
    flat = dispatch("reshape_rows", [src], [out])[0][0]
    return flat if flat.layout == layout else remap(flat, layout)


# ---- validation of indices and shapes -------------------------------------------------------
def _check_index(index, shape):
    try:
        i, j = index
    except (TypeError, ValueError) as exc:
        raise ShapeError(f"an element index is a pair (i, j), got {index!r}") from exc
    i, j = as_int(i, "row index"), as_int(j, "column index")
    if i < 0:
        i += shape[0]
    if j < 0:
        j += shape[1]
    if not (0 <= i < shape[0] and 0 <= j < shape[1]):
        raise ShapeError(f"index {index} is out of bounds for a matrix of shape {shape}")
    return i, j


def _parse_axis_key(k, n, what):
    if isinstance(k, slice):
        # bounds are integers or None (as_int rejects 'a', 0.5 and bools); the step, when given, is 1
        for v, part in ((k.start, "start"), (k.stop, "stop"), (k.step, "step")):
            if v is not None:
                as_int(v, f"{what} slice {part}")
        if k.step is not None and k.step != 1:
            raise ShapeError(f"{what} slice step must be 1, got {k.step}")
        start, stop, _ = k.indices(n)
        return slice(start, max(start, stop))
    i = as_int(k, f"{what} index")
    if i < 0:
        i += n
    if not 0 <= i < n:
        raise ShapeError(f"{what} index {k} is out of bounds for size {n}")
    return i


def _parse_key(key, shape):
    """(rows, cols) of M[key], as NumPy reads a 2-D index: one index is the rows', and an ellipsis
    stands for as many full slices as the other indices leave (M[...] is the whole matrix)."""
    key = key if isinstance(key, tuple) else (key,)
    at = [i for i, k in enumerate(key) if k is Ellipsis]
    if len(at) > 1:
        raise ShapeError(f"an index can have only one ellipsis ('...'), got {len(at)}")
    if at and len(key) <= 3:
        key = key[:at[0]] + (slice(None),) * (3 - len(key)) + key[at[0] + 1:]
    if len(key) == 1:
        key = key + (slice(None),)
    if len(key) != 2:
        raise ShapeError(f"a Matrix takes two indices (rows, cols), got {len(key)}")
    return _parse_axis_key(key[0], shape[0], "row"), _parse_axis_key(key[1], shape[1], "column")


def _slice_layout(lay):
    """The layout of a submatrix: the source's kind; split sizes and tile grids refer to the old shape."""
    if isinstance(lay, (RowBlock, ColBlock)):
        return type(lay)(lay.group)
    if isinstance(lay, Tiles):
        return RowBlock()
    return lay


def _reshape_target(shape, old):
    if not isinstance(shape, (tuple, list)) or len(shape) != 2:
        raise ShapeError(f"a Matrix is 2-D: reshape needs two sizes (one may be -1), got {shape!r}")
    shape = tuple(as_int(v, "reshape size") for v in shape)
    if shape.count(-1) > 1 or any(v < -1 for v in shape):
        raise ShapeError(f"reshape needs two sizes (one may be -1), got {shape}")
    count = old[0] * old[1]
    if -1 in shape:
        other = shape[1 - shape.index(-1)]
        if other == 0 or count % other:
            raise ShapeError(f"cannot reshape a {old} matrix into {shape}")
        shape = tuple(count // other if v == -1 else v for v in shape)
    if shape[0] * shape[1] != count:
        raise ShapeError(f"cannot reshape a {old} matrix ({count} elements) into {shape}")
    return shape


def _fits(layout, shape):
    try:
        distribution(layout, shape, runtime().nworkers)
    except LayoutError:
        return False
    return True


# ---- kernels ------------------------------------------------------------------------------


def _stays_local(src, dst, offset=(0, 0), src_dtype=None, dst_dtype=None):
    """True when no element of the remap moves between workers (every step is local copies)."""
    if src_dtype is not None and _remap.narrows_partial(src, dst, src_dtype, dst_dtype):
        return False        # summed over the source group first (remap/execute.py `run`)
    for step in _remap.plan(src, dst, offset):
        if isinstance(step, _remap.AllReduce):
            if len(step.src.group) > 1:
                return False
        elif _remap.involved(step):
            return False
    return True


def _remap_capturable(entry):
    # local copies always; exchanges and all-reduces (NCCL on the compute stream, their buffers
    # from the capture's pool) when collectives may be captured. A background all-reduce runs on
    # the side stream: the capture joins it when the program ends (graphs.py)
    src, dst, offset = entry.in_dists[0], entry.out_dists[0], entry.static.offset
    return (_stays_local(src, dst, offset, entry.inputs[0].dtype, entry.outputs[0].dtype)
            or collectives_in_graphs())


def _remap_into_capturable(entry):
    return (_stays_local(entry.in_dists[1], entry.in_dists[0], (0, 0), entry.inputs[1].dtype, entry.inputs[0].dtype)
            or collectives_in_graphs())


@REMAP.kernel(capturable=_remap_capturable)
def _remap_kernel(call):
    """Redistribute input 0 (read from the window at `offset`) into the output's layout and dtype;
    background: sum a Partial input on the communication stream (Matrix.remap's `background`)."""
    src = call.inputs[0]
    dst, dtype = call.entry.out_dists[0], call.entry.outputs[0].dtype
    offset, background = call.entry.static.offset, call.entry.static.background
    pending = [] if background else None
    pieces = _remap.run(call.world, call.entry.cache, src.pieces, src.dist, dst, src.dtype, dtype, offset, pending)
    out = Shard(pieces, dst, dtype)
    if pending:
        out.pending = pending
    return [out]


@REMAP_INTO.kernel(capturable=_remap_into_capturable)
def _remap_into(call):
    """Overwrite input 0 in place with input 1 redistributed into input 0's layout and dtype.

    The target keeps its handle and its buffers (the remap's result is copied
    into them); the runtime gives it a new version.
    """
    target, src = call.inputs
    same = call.entry.cache.get("same")
    if same is None:    # (compared once per plan entry: a distribution may hold many pieces)
        # (a Partial source into the same Partial distribution: each worker's addend goes to itself, what
        # the remap would do by adding it to a -0.0 buffer: the same bits, through a scratch buffer that
        # an in-place command, never careful, could be refused: dnn's metrics reset under a tight limit)
        same = call.entry.cache["same"] = (src.dist == target.dist and src.dtype == target.dtype)
    xp = backend.current().xp
    if same and not any(t is not p and xp.may_share_memory(t, p) for t, p in zip(target.pieces, src.pieces)):
        # each piece copied straight into its place (the remap's copy would be a second one; a source
        # that overlaps its target in memory still goes through it)
        for t, p in zip(target.pieces, src.pieces):
            if t is not p:
                t[...] = p
        return [target]
    pieces = _remap.run(call.world, call.entry.cache, src.pieces, src.dist, target.dist, src.dtype,
                        target.dtype)
    for t, p in zip(target.pieces, pieces):
        if t is not p:
            t[...] = p
    return [target]


@TRANSPOSE.kernel(capturable=True)
def _transpose(call):
    """Each local piece transposed; the transposed layout puts it on the same worker."""
    src = call.inputs[0]
    dst = call.entry.out_dists[0]
    order = call.entry.cache.get("order")
    if order is None:
        # piece k of the result is the transpose of the source piece with rows and cols swapped
        mine = src.dist.pieces[call.rank]
        order = call.entry.cache["order"] = [
            next(i for i, q in enumerate(mine) if (q.cols, q.rows) == (p.rows, p.cols))
            for p in dst.pieces[call.rank]]
    pieces = src.pieces
    out = []
    for k in order:
        a = memory.empty(pieces[k].shape[::-1], src.dtype)
        a[...] = pieces[k].T
        out.append(a)
    return [Shard(out, dst, src.dtype)]


@RESHAPE_ROWS.kernel(capturable=True)
def _reshape_rows(call):
    """Row blocks whose boundaries are whole rows of both shapes: each local block reshaped (row-major)."""
    src = call.inputs[0]
    dst = call.entry.out_dists[0]
    out = []
    for a, p in zip(src.pieces, dst.pieces[call.rank]):
        b = memory.empty(p.shape, src.dtype)
        b[...] = a.reshape(p.shape)
        out.append(b)
    return [Shard(out, dst, src.dtype)]


def designated(dist, locs):
    """The stored copy of an element that speaks for it: the first, or all of them for Partial."""
    return locs if dist.partial else locs[:1]


def _elements(call):
    """On rank 0, the element (scalars i, j) of each input, summed over its designated holders (None
    elsewhere): each holder waits for its device once and sends its addends of every element (zeros
    where it holds none) in one message; only the holders answer, so a read of a worker group's
    matrices waits for that group alone."""
    i, j = int(call.scalars[0]), int(call.scalars[1])
    mine, holders, waited = [], set(), False
    for shard in call.inputs:
        value = -0.0            # IEEE's additive identity: a stored -0.0 reads back -0.0 (+0.0 lost its sign)
        locs = designated(shard.dist, shard.dist.locate(i, j))
        for r, k, li, lj in locs:
            if r == call.rank:
                if not waited:
                    collectives.device_done()   # polled: asnumpy's own wait blocks where no failure reaches it
                    waited = True
                value += float(backend.current().asnumpy(shard.pieces[k][li, lj]))
        holders.update(loc[0] for loc in locs)
        mine.append(value)
    answers = gather_objects(call.world, mine, sorted(holders))
    if call.rank != 0:
        return None
    return [float(np.dtype(shard.dtype).type(sum((a[n] for a in answers), -0.0)))
            for n, shard in enumerate(call.inputs)]


@GET.kernel()
def _get(call):
    values = _elements(call)
    if values is not None:
        call.result = values[0]
    return []


@GET_MANY.kernel()
def _get_many(call):
    values = _elements(call)
    if values is not None:
        call.result = values
    return []


@SET.kernel()
def _set(call):
    shard = call.inputs[0]
    i, j, v = int(call.scalars[0]), int(call.scalars[1]), call.scalars[2]
    locs = shard.dist.locate(i, j)
    for n, (r, k, li, lj) in enumerate(locs):
        if r == call.rank:
            # a Partial matrix: the first addend takes the value, the others -0.0 (x + -0.0 is x);
            # memory.fill keeps a zero's sign on GPUs (CuPy writes an element's 0 by a memset)
            value = PARTIAL_ZERO if (shard.dist.partial and n > 0) else v
            memory.fill(shard.pieces[k][li:li + 1, lj:lj + 1], value)
    shard.version += 1
    return [shard]
