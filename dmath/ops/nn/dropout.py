"""Inverted dropout with a counter-based mask: the same mask at any worker count and layout.

The keep decision of element (i, j) is a hash of (seed, step, i * ncols + j)
through the generator of dmath.random (creation.py), so it depends on the
global index only, never on which worker holds the element or in what order
workers draw. The mask holds 0 or 1 / (1 - p): the backward pass is dY * mask.

The step comes either as a dynamic scalar or from a (1, 1) counter matrix
that lives on the workers. A recorded plan replays its scalars unchanged, so
a recorded training step takes the counter matrix and advances it in place
(counter += 1, itself a recorded command): every replay then draws a new
mask without a message from the master. Both forms give the same key for the
same step: the key is stream_key's hash, evaluated on the device for the
counter.
"""
import numpy as np

from ... import backend
from ...errors import DMathError
from ...layout import indexset as ix
from ...runtime import define
from ...gpu import launcher as cuda
from . import args, rows
from ..base import dispatch, is_matrix, new_meta
from ..creation import _mix, _uniform

#: the generator lane of dropout masks (dmath.random uses lanes 0 and 1 of a stream)
DROPOUT_LANE = 2
_MASK64 = (1 << 64) - 1
# creation.stream_key's multipliers of the seed, the stream (here: the step) and the lane
_SEED_MUL, _STEP_MUL, _LANE_MUL = 0x9E3779B97F4A7C15, 0xD1B54A32D192ED03, 0x8CB92BA72F3D8DD7

# p, the seed and the step travel as scalars (the signature stays cached): no static arguments
DROPOUT = define("nn_dropout")


def dropout(x, p, seed, step):
    """Inverted dropout: (Y, mask) with Y = x * mask.

    mask holds 0 (dropped, probability p) or 1 / (1 - p) (kept), so the
    backward pass is dY * mask. The mask depends only on (seed, step, the
    element's global index): the same at any worker count and layout. seed
    is an integer below 2**53. step is either an integer below 2**53 (a
    dynamic scalar: the signature stays cached) or a (1, 1) float32/float64
    Matrix holding one: a counter that stays on the workers. A recorded
    plan replays its scalars unchanged, so a recorded training step passes
    the counter and advances it in place inside the block (`counter += 1`):
    each replay then draws a new mask. Both forms give the same mask for the
    same step.
    """
    x = args.rows(x, "dropout: x")
    p = args.real(p, "dropout: p")
    if not 0.0 <= p < 1.0:
        raise DMathError(f"dropout: p must be in [0, 1), got {p}")
    inputs, scalars = [x], [p, args.counter(seed, "dropout: seed")]
    if is_matrix(step):
        inputs.append(args.counter_matrix(step, args.group_of(x), "dropout: step counter"))
    else:
        scalars.append(args.counter(step, "dropout: step"))
    outs = [new_meta(x.layout, x.shape, x.dtype)] * 2
    made, _ = dispatch("nn_dropout", inputs, outs, scalars=scalars)
    return made[0], made[1]


def _global_index(call, piece, ncols):
    """uint64 global linear indices of this worker's block (the row and column parts cached per signature)."""
    index = call.entry.cache.get("index")
    if index is None:
        xp = backend.current().xp
        r = xp.asarray(ix.to_array(piece.rows)).astype(xp.uint64)
        c = xp.asarray(ix.to_array(piece.cols)).astype(xp.uint64)
        index = call.entry.cache["index"] = (r[:, None] * np.uint64(ncols), c[None, :])
    return index[0] + index[1]


def _key(seed, step):
    """The generator key of (seed, step): creation.stream_key(seed, step, DROPOUT_LANE), evaluated
    with array arithmetic so that `step` may be a uint64 on the device (the counter matrix)."""
    base = np.uint64((int(seed) * _SEED_MUL + DROPOUT_LANE * _LANE_MUL) & _MASK64)
    return _mix(base + step * np.uint64(_STEP_MUL))


@DROPOUT.kernel(capturable=True)
def _dropout(call):
    """inputs X[, counter (1, 1)]; outputs Y, mask; scalars = (p, seed[, step])."""
    xp = backend.current().xp
    src = call.inputs[0]
    x = rows.local(src)
    if x is None:
        return rows.nothing_here(call)
    p, seed = call.scalars[0], call.scalars[1]
    counter = rows.local(call.inputs[1]) if len(call.inputs) > 1 else None
    (y,) = rows.new_output(call, 0)
    (mask,) = rows.new_output(call, 1)
    # a step from the counter stays on the device: reading it would synchronise every call
    step = np.uint64(int(call.scalars[2])) if counter is None else counter.reshape(()).astype(np.uint64)
    with np.errstate(over="ignore"):   # the hash multiplies modulo 2**64 on purpose
        u = _uniform(xp, _global_index(call, src.dist.pieces[call.rank][0], src.dist.shape[1]),
                     _key(seed, step))
    mask[...] = (u >= p) * (1.0 / (1.0 - p))
    y[...] = x * mask
    return [rows.shard(call, 0, [y]), rows.shard(call, 1, [mask])]


_CUDA_SOURCE = r"""
__device__ unsigned long long dm_mix(unsigned long long z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

// creation.py's _uniform of the element's global index, keyed as nn_dropout._key(seed, step)
template <typename T>
__global__ void dm_dropout(const T* x, T* y, T* mask, const double* step, unsigned long long base,
                           long long first_row, long long ncols, long long total, double p, double keep) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= total) return;
    unsigned long long key = dm_mix(base + (unsigned long long)step[0] * 0xD1B54A32D192ED03ULL);
    unsigned long long index = (unsigned long long)(first_row + i / ncols) * (unsigned long long)ncols
                               + (unsigned long long)(i % ncols);
    unsigned long long z = dm_mix(index * 0x9E3779B97F4A7C15ULL + key);
    double u = (double)(z >> 11) * (1.0 / 9007199254740992.0);
    T m = dm_cast<T>(u >= p ? keep : 0.0);
    mask[i] = m;
    y[i] = dm_cast<T>((double)(dm_val(x[i]) * dm_val(m)));     // rounded once, as NumPy's x * mask
}
"""
_INSTANCES = [f"dm_dropout<{t}>" for t in cuda.C_TYPES.values()]


@DROPOUT.kernel(backend="gpu", capturable=True)
def _dropout_cuda(call):
    """nn_dropout as one CUDA kernel: the hash, the mask and the product in a single pass."""
    import cupy
    src = call.inputs[0]
    x = rows.local(src)
    if x is None:
        return rows.nothing_here(call)
    p, seed = call.scalars[0], call.scalars[1]
    (y,) = rows.new_output(call, 0)
    (mask,) = rows.new_output(call, 1)
    if len(call.inputs) > 1:
        step = rows.local(call.inputs[1]).reshape(1).astype(cupy.float64)    # stays on the device
    else:
        step = cupy.full(1, float(int(call.scalars[2])), dtype=cupy.float64)
    fn = cuda.function(_CUDA_SOURCE, f"dm_dropout<{cuda.C_TYPES[str(x.dtype)]}>", _INSTANCES)
    piece = src.dist.pieces[call.rank][0]
    first_row = piece.rows[0][0] if piece.rows else 0
    base = np.uint64((int(seed) * _SEED_MUL + DROPOUT_LANE * _LANE_MUL) & _MASK64)
    cuda.launch(fn, x.size, (cupy.ascontiguousarray(x), y, mask, step, base, np.int64(first_row),
                             np.int64(src.dist.shape[1]), np.int64(x.size), np.float64(p), np.float64(1.0 / (1.0 - p))))
    return [rows.shard(call, 0, [y]), rows.shard(call, 1, [mask])]
