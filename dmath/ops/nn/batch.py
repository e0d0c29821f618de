"""Batches made on the workers from a resident dataset: permutations, row gathers, image transforms.

A dataset lives on the workers as a matrix of samples (one row each),
Replicated over the batch's workers, so every worker can take any sample
without communication. A training step then needs no bytes from the master:

- `nn_permutation` writes the epoch's order into a (1, N) float64 matrix,
  computed on every worker from a key of integers alone (NumPy's PCG64 on
  the host, so any backend and worker count draws the same order);
- `nn_take_rows` overwrites a batch matrix with the samples
  order[position + i], the position read from a (1, 1) counter matrix on
  the device, so a recorded step that advances the counter in place gathers
  the next batch at every replay. With a device-resident source it is pure
  device work (capturable); a source in host memory or in a mapped file is
  gathered on the host, the next batch read ahead on a background thread;
- `nn_transform_images` shifts (random crop with zero padding), mirrors and
  normalises image rows, the random draws a hash of (seed, the sample's
  position in the stream of samples drawn so far, lane): independent of
  how the batch is split over workers.
"""
import numbers
import threading
from typing import NamedTuple

import numpy as np

from ... import backend, memory
from ...comm.counters import counters
from ...errors import DMathError, DTypeError, LayoutError, ShapeError
from ...layout import RowBlock
from ...layout import indexset as ix
from ...memory import kinds
from ...planning.conv import image, integer
from ...runtime import define, runtime
from ...gpu import launcher as cuda
from . import args, rows
from ..base import dispatch, new_meta
from ..creation import _U, _uniform, stream_key

#: generator lanes of the transform draws (dmath.random uses 0 and 1, dropout 2)
SHIFT_Y_LANE, SHIFT_X_LANE, FLIP_LANE = 3, 4, 5


# ---- permutations -----------------------------------------------------------------
# the key travels as scalars (dmath.random.permutation is the master half): no static arguments
PERMUTATION = define("nn_permutation")


def permutation_values(n, key):
    """The permutation of range(n) that `key` (a tuple of non-negative ints; () = identity) decides."""
    if not key:
        return np.arange(n, dtype=np.float64)
    gen = np.random.Generator(np.random.PCG64(np.random.SeedSequence([int(k) for k in key])))
    return gen.permutation(n).astype(np.float64)


@PERMUTATION.kernel()
def _permutation(call):
    """Input 0 (1, n) float64, overwritten in place; scalars = the key (empty: the identity)."""
    target = call.inputs[0]
    dist = target.dist
    if not dist.pieces[call.rank]:
        return [target]
    values = permutation_values(dist.shape[1], call.scalars).reshape(1, -1)
    be = backend.current()
    # staging kept per signature: the copy to the device is asynchronous (a synchronous one would
    # drain the GPU at every epoch). The host may run an epoch or more ahead of the device (recorded
    # steps, nothing read back until the end, as in dnn.search), so a refill first waits until the
    # device has passed the copy of the previous contents: without that wait the previous epoch
    # trained on this one's order (seen on two H200s as a different loss)
    cache = call.entry.cache
    staging = cache.get("staging")
    if staging is None:
        staging = cache["staging"] = [memory.host_empty(a.shape, a.dtype) for a in target.pieces]
    be.passed(cache.pop("staging_copied", None))
    for a, h, p in zip(target.pieces, staging, dist.pieces[call.rank]):
        h[...] = values[ix.selection(p.rows), ix.selection(p.cols)]
        be.copy_to_device(a, h)
    cache["staging_copied"] = be.mark()
    return [target]


# ---- gathering a batch ----------------------------------------------------------------
class TakeRowsArgs(NamedTuple):
    """Static arguments of `nn_take_rows`."""
    one_hot: bool    # the source holds (N, 1) class labels; the batch gets their one-hot rows


TAKE_ROWS = define("nn_take_rows", TakeRowsArgs)


def _resident(m, group, what):
    """`m` as it is, when it is Replicated on every worker of `group` (a dataset is never copied here)."""
    args.require(m, what)
    lay = m.layout
    if not lay.replicated or not set(group) <= set(lay.members(runtime().nworkers)):
        raise LayoutError(f"{what} must be Replicated on every worker of the batch {tuple(group)} (each takes "
                          f"any sample without communication); it is {lay}")
    return m


def take_rows(source, order, position, out, one_hot=False):
    """Overwrite the batch `out` in place with the samples `source[order[position + i]]`; returns `out`.

    source (N, F): the samples, Replicated on the batch's workers (device
    memory: pure device work; host memory or a mapped file: gathered on
    the host, the next batch read ahead). order (1, M) float64: row
    numbers of `source` (a permutation of range(N) from
    dmath.random.permutation, or of a part of the rows), Replicated there
    too. position: a (1, 1) float32/float64 counter holding the first
    position in `order`; it is read on the device, so a recorded step that
    advances it in place (`position += batch`) takes the next batch at
    every replay. Keep position + batch <= M and the row numbers below N:
    they are not checked on the device. out (B, F) in a row layout
    (RowBlock or Replicated); each worker writes its own rows. one_hot:
    source is (N, 1) class labels and out (B, K) gets their one-hot rows;
    the labels are not checked on the device either: each must be an integer
    in 0 .. K - 1 (-1 made the last class's row, 2.5 class 2's, and one of K
    or more failed the worker); check them once where they are made
    (dmath.nn.one_hot and dnn's fit refuse such labels).
    """
    one_hot = args.flag(one_hot, "take_rows: one_hot")
    args.require(out, "take_rows: out")
    out._check_writable("take_rows")        # a slice or transpose is a copy: the batch would be lost
    if not (type(out.layout) is RowBlock or out.layout.replicated):
        raise LayoutError(f"take_rows: out must be in a row layout (RowBlock or Replicated), got {out.layout}")
    group = args.group_of(out)
    source = _resident(source, group, "take_rows: source")
    order = _resident(order, group, "take_rows: order")
    if order.shape[0] != 1:
        raise ShapeError(f"take_rows: order must be one row (1, M) of sample indices, got shape {order.shape}")
    if order.dtype != "float64":
        raise DTypeError(f"take_rows: order must be float64 (exact sample indices), got {order.dtype}")
    if out.shape[0] > order.shape[1]:
        raise ShapeError(f"take_rows: a batch of {out.shape[0]} rows from an order of {order.shape[1]} samples")
    if one_hot:
        if source.shape[1] != 1:
            raise ShapeError(f"take_rows: one_hot needs (N, 1) class labels, got source shape {source.shape}")
    elif source.shape[1] != out.shape[1]:
        raise ShapeError(f"take_rows: source rows have {source.shape[1]} values, out rows {out.shape[1]}")
    position = args.counter_matrix(position, group, "take_rows: position")
    dispatch("nn_take_rows", [out, source, order, position], [0], static=TAKE_ROWS.static(one_hot=one_hot))
    return out


def held_on_host(shard):
    """True when the shard's values live in host memory that kernels must not pull whole to the
    device: a GPU's 'host' or 'managed' kind, or a memory-mapped file."""
    return shard.home is not None or isinstance(shard.pieces[0] if shard.pieces else None, np.memmap)


def _batch_geometry(call):
    """(first global row of this worker's block of the batch, its number of rows) or None."""
    out = call.inputs[0]
    pieces = out.dist.pieces[call.rank]
    if not pieces:
        return None
    rows_ = pieces[0].rows
    return (rows_[0][0] if rows_ else 0), pieces[0].shape[0]


def _write_rows(out, values, one_hot, xp):
    """out[...] = values (rows of samples) or the one-hot rows of class labels (values (m, 1))."""
    if one_hot:
        out.fill(0)
        if out.shape[0]:
            out[xp.arange(out.shape[0]), values.reshape(-1).astype(xp.int64)] = 1
    else:
        out[...] = values


class _ReadAhead:
    """The next batch of a host-held source, gathered on a background thread while the step runs.

    A dataset in host memory (or a mapped file) is read one batch ahead:
    after serving rows starting at `pos`, this worker's rows of the next
    step are gathered into a second staging buffer. The next step starts
    where the last two calls' stride says (a feed taken by several groups
    moves by all their batches), else one whole batch later (not this
    worker's share of it: at several workers the position moves by the
    global batch). A guess that does not come true (a new epoch, another
    batch size, a write of the source or of the order) costs nothing but
    the wasted read:
    the rows are then gathered in the caller. The key names everything the
    rows depend on, so a guess is used only for the same rows of the same
    contents.
    """

    def __init__(self):
        self.key = None
        self.thread = None
        self.result = None
        self.in_flight = None       # the block last copied to the device (kept alive for the copy)
        self.last_pos = None        # the position of the last call (its stride guesses the next)

    def take(self, key, gather):
        """The rows for `key`, from the read-ahead when it guessed `key`, else gathered now."""
        self.join()
        result, self.result = self.result, None         # a guess serves one call
        if self.key == key and result is not None:
            counters["read_ahead_hits"] += 1
            return result
        counters["read_ahead_misses"] += 1
        return gather()

    def join(self):
        if self.thread is not None:
            self.thread.join()
            self.thread = None

    def start(self, key, gather, source):
        """Gather `key`'s rows of the shard `source` in the background."""
        self.key, self.result = key, None
        be = backend.current()

        def run():
            if be.is_gpu:
                # the current device is per thread (cudaSetDevice): without this the thread's pinned
                # allocation would create a context on GPU 0 in every process
                be.xp.cuda.Device(be.device_id).use()
            self.result = gather()
        self.thread = threading.Thread(target=run, name="dmath-read-ahead", daemon=True)
        self.thread.start()
        # the runtime settles a shard's pending work before any command reads, writes or frees it
        # (Shard.pending): so a write of the source waits for this read instead of racing it, and its
        # new version then keeps the guess from being used
        source.pending = (source.pending or []) + [_Joins(self)]


class _Joins:
    """A Shard.pending entry whose wait() joins a read-ahead's thread."""
    __slots__ = ("ahead",)

    def __init__(self, ahead):
        self.ahead = ahead

    def wait(self):
        self.ahead.join()


#: read-aheads kept per take_rows signature, one per source (the least recent one goes first)
_READ_AHEADS = 4


def _read_ahead(cache, handle):
    """The read-ahead of source `handle` in this signature's cache (two sources of one shape walked
    with one order, as inputs and targets are, each keep theirs)."""
    aheads = cache.setdefault("read_ahead", {})
    ahead = aheads.pop(handle, None)
    if ahead is None:
        ahead = _ReadAhead()
        if len(aheads) >= _READ_AHEADS:
            aheads.pop(next(iter(aheads))).join()
    aheads[handle] = ahead              # the most recent last
    return ahead


def _host_order(call, order_shard):
    """The order as a host float64 vector, fetched once per version of the order matrix."""
    cache = call.entry.cache
    version = order_shard.version      # unique in the process: it names the matrix and its contents
    if cache.get("order_version") != version:
        # a new array, not a refill: a read-ahead thread may still be reading the old one
        cache["order_host"] = np.concatenate([a.reshape(-1) for a in kinds.host_arrays(order_shard)])
        cache["order_version"] = version
    return cache["order_host"]


def _gather_host(source, idx, dtype):
    """Rows `idx` of the host array `source` as a fresh host array of `dtype` (pinned on a GPU)."""
    buf = memory.host_empty((len(idx), source.shape[1]), dtype)
    if len(idx):
        if source.dtype == dtype:
            np.take(source, idx, axis=0, out=buf)
        else:
            buf[...] = source[idx]
    return buf


@TAKE_ROWS.kernel(capturable=lambda entry: entry.cache.get("device_source", True))
def _take_rows(call):
    """inputs: out (batch, written in place), source (N, F), order (1, N) float64, position (1, 1):
    out[i] = source[order[position + i]] (one-hot of that label when static.one_hot).

    Only the rows of this worker's block of the batch are taken.
    """
    xp = backend.current().xp
    out, source, order, position = call.inputs
    one_hot = call.entry.static.one_hot
    on_host = held_on_host(source)
    # decided from the memory kind, the same on every rank (read by the capture rule)
    call.entry.cache["device_source"] = not on_host
    geo = _batch_geometry(call)
    if geo is None:
        return [out]
    r0, m = geo
    target = out.pieces[0]
    if not on_host:
        # resident on the device: every index stays there (no synchronisation, capturable)
        offsets = call.entry.cache.get("offsets")
        if offsets is None:
            offsets = call.entry.cache["offsets"] = xp.arange(r0, r0 + m, dtype=xp.float64)
        slots = (position.pieces[0].reshape(1) + offsets).astype(xp.int64)
        idx = order.pieces[0].reshape(-1)[slots].astype(xp.int64)
        _write_rows(target, source.pieces[0][idx], one_hot, xp)
        return [out]
    # held in host memory (a GPU's pinned 'host' kind, or a memory-mapped file): gather on the host
    order_host = _host_order(call, order)
    pos = int(kinds.host_arrays(position)[0].reshape(-1)[0])
    # host_arrays(): a 'managed' source written on the device has its current values there
    host_src = source.home.host_arrays()[0] if source.home is not None else source.pieces[0]
    n = order_host.size
    ahead = _read_ahead(call.entry.cache, call.handles[1])
    stype = np.dtype(target.dtype)
    # the rows depend on the source and the order matrices' contents and the position (r0, m and
    # stype are the signature's); a version is unique in the process and new at every write, so it
    # names both a matrix and its contents
    contents = (source.version, order.version)

    # a mapped file is checked before each gather (also on the read-ahead thread, after the command
    # that checked it has ended): a page past the end of a file that shrank kills with SIGBUS
    verify = getattr(source, "verify", None) or (lambda: None)

    def gather_at(p):
        return lambda: (verify(), _gather_host(host_src, order_host[p + r0:p + r0 + m].astype(np.int64), stype))[1]
    block = ahead.take((contents, pos), gather_at(pos))
    if one_hot:
        _write_rows(target, backend.current().asarray(block), True, xp)
    else:
        # straight into the batch, asynchronously from pinned memory on a GPU; the block is kept
        # until the next call, whose read of the position waits for the stream to pass this copy
        backend.current().copy_to_device(target, block)
        ahead.in_flight = block
    last, ahead.last_pos = ahead.last_pos, pos
    step = pos - last if last is not None and pos > last else out.dist.shape[0]
    if pos + step + r0 + m <= n:
        ahead.start((contents, pos + step), gather_at(pos + step), source)
    return [out]


_TAKE_SOURCE = r"""
// out[i, :] = src[order[position + r0 + i], :], converted to out's dtype: one pass, one launch (the
// generic path is an index computation, a gather into a temporary and a converting copy).
template <typename S, typename T, typename P>
__global__ void dm_take_rows(const S* src, T* out, const double* order, const P* position, long long r0, int m,
                             long long f) {
    const long long first = (long long)position[0] + r0;
    for (int i = blockIdx.y; i < m; i += gridDim.y) {
        const S* s = src + (long long)order[first + i] * f;
        T* o = out + (long long)i * f;
        for (long long j = (long long)blockIdx.x * blockDim.x + threadIdx.x; j < f;
             j += (long long)gridDim.x * blockDim.x)
            o[j] = dm_cast<T>((double)dm_val(s[j]));
    }
}
"""
_TAKE_INSTANCES = [f"dm_take_rows<{s}, {t}, {p}>" for s in cuda.C_TYPES.values() for t in cuda.C_TYPES.values()
                   for p in ("float", "double")]


@TAKE_ROWS.kernel(backend="gpu", capturable=lambda entry: entry.cache.get("device_source", True))
def _take_rows_cuda(call):
    """nn_take_rows of a device-resident source as one gathering, converting kernel; the generic
    kernel otherwise (a host-held source, one-hot labels, non-contiguous pieces, or float64 samples
    into a float16 batch, which NumPy rounds once and this kernel would round twice)."""
    out, source, order, position = call.inputs
    geo = None if call.entry.static.one_hot or held_on_host(source) else _batch_geometry(call)
    if geo is None:
        return _take_rows(call)
    target, src = out.pieces[0], source.pieces[0]
    ordr, pos = order.pieces[0], position.pieces[0]
    if (not (target.flags.c_contiguous and src.flags.c_contiguous and ordr.flags.c_contiguous)
            or (src.dtype == np.float64 and target.dtype == np.float16)
            or ordr.dtype != np.float64 or pos.dtype not in (np.float32, np.float64)):
        return _take_rows(call)
    call.entry.cache["device_source"] = True
    r0, m = geo
    f = target.shape[1]
    if m and f:
        fn = cuda.function(_TAKE_SOURCE, f"dm_take_rows<{cuda.C_TYPES[str(src.dtype)]}, "
                           f"{cuda.C_TYPES[str(target.dtype)]}, {cuda.C_TYPES[str(pos.dtype)]}>", _TAKE_INSTANCES)
        threads = 256
        fn((min((f + threads - 1) // threads, 1024), min(m, 65535)), (threads,),
           (src, target, ordr, pos, np.int64(r0), np.int32(m), np.int64(f)))
    return [out]


# ---- image transforms -------------------------------------------------------------------
def draws(xp, seed, counter, first_row, m, shift, flip):
    """Per-sample random (dy, dx, flip) of the rows first_row .. first_row + m - 1 of a batch.

    counter: the number of samples drawn before the batch (a device scalar);
    a sample's draws depend on (seed, counter + its row, lane) only.
    """
    q = (counter.reshape(1).astype(_U) + xp.arange(first_row, first_row + m, dtype=_U))
    out = []
    with np.errstate(over="ignore"):
        for lane, span in ((SHIFT_Y_LANE, shift), (SHIFT_X_LANE, shift)):
            if span:
                u = _uniform(xp, q, _U(stream_key(seed, 0, lane)))
                out.append(xp.floor(u * (2 * span + 1)).astype(xp.int32) - span)
            else:
                out.append(xp.zeros(m, dtype=xp.int32))
        if flip:
            out.append((_uniform(xp, q, _U(stream_key(seed, 0, FLIP_LANE))) < 0.5).astype(xp.int8))
        else:
            out.append(xp.zeros(m, dtype=xp.int8))
    return out


class ImageTransform(NamedTuple):
    """What nn_transform_images does to each (C, H, W) sample row: its static arguments."""
    image: tuple          # (C, H, W)
    shift: int            # largest random shift in pixels each way (0: none)
    flip: bool            # mirror left-right with probability 1/2
    scale: float          # applied to the raw values first
    mean: tuple           # per channel, subtracted after scaling
    std: tuple            # per channel, divided by last

    @property
    def random(self):
        return bool(self.shift or self.flip)


TRANSFORM_IMAGES = define("nn_transform_images", ImageTransform)


def _per_channel(value, channels, what, positive=False):
    vals = (value,) * channels if isinstance(value, numbers.Real) and not isinstance(value, (bool, np.bool_)) \
        else tuple(value)
    if len(vals) != channels:
        raise ShapeError(f"transform_images: {what} needs one value per channel ({channels}), got {len(vals)}")
    vals = tuple(args.real(v, f"transform_images: {what}") for v in vals)
    if positive and min(vals) <= 0:
        raise DMathError(f"transform_images: {what} must be positive, got {vals}")
    return vals


def transform_images(x, image_shape, shift=0, flip=False, scale=1.0, mean=0.0, std=1.0, counter=None, seed=0):
    """Per-sample image augmentation and normalisation of a batch x (N, C*H*W): a new matrix.

    Each sample is moved by a random (dy, dx) in [-shift, shift]^2 (pixels
    moved in are 0: a random crop of the image padded by `shift`),
    mirrored left-right with probability 1/2 when flip, then scaled and
    normalised per channel: (scale * v - mean_c) / std_c. The draws of a
    sample depend on (seed, counter + its row) only: counter is a (1, 1)
    matrix holding the number of samples drawn before this batch (read on
    the device, so a recorded step advances it in place), required when
    shift or flip is on. With neither, it is the affine normalisation only.
    """
    x = args.rows(x, "transform_images: x")
    c, h, w = image(image_shape, x.shape[1], "transform_images")
    shift = integer(shift, "transform_images: shift", 0)
    if shift >= min(h, w):
        raise ShapeError(f"transform_images: shift {shift} must be smaller than the image ({h}x{w})")
    t = TRANSFORM_IMAGES.static(image=(c, h, w), shift=shift, flip=args.flag(flip, "transform_images: flip"),
                                scale=args.real(scale, "transform_images: scale"),
                                mean=_per_channel(mean, c, "mean"), std=_per_channel(std, c, "std", positive=True))
    inputs = [x]
    if t.random:
        if counter is None:
            raise DMathError("transform_images: random shifts or flips need counter=, a (1, 1) matrix of the "
                             "samples drawn so far")
        inputs.append(args.counter_matrix(counter, args.group_of(x), "transform_images: counter"))
    out = new_meta(x.layout, x.shape, x.dtype)
    return dispatch("nn_transform_images", inputs, [out], static=t,
                    scalars=(args.counter(seed, "transform_images: seed"),))[0][0]


def _affine(t, cdt):
    """(scale, mean (C,), 1/std (C,)) of transform `t` as host values of the compute dtype."""
    return (cdt.type(t.scale), np.asarray(t.mean, dtype=cdt),
            (1.0 / np.asarray(t.std, dtype=np.float64)).astype(cdt))


def source_pixels(xp, t, dy, dx, fl):
    """Per sample, the source row (m, H) and column (m, W) of every output pixel, unclipped."""
    _, h, w = t.image
    ys = xp.arange(h, dtype=xp.int32)[None, :] - dy[:, None]
    cols = xp.arange(w, dtype=xp.int32)[None, :]
    xs = xp.where(fl[:, None] != 0, w - 1 - cols, cols) - dx[:, None]
    return ys, xs


@TRANSFORM_IMAGES.kernel(capturable=True)
def _transform_images(call):
    """inputs X[, counter (1, 1)]; output Y of X's shape and layout; static: the ImageTransform;
    scalars = (seed,).

    Y(h, w) = (s X(h - dy, w' - dx) - mean_c) / std_c, with w' = W - 1 - w
    when the sample is mirrored, and s X = 0 where (h - dy, w' - dx) falls
    outside the image (zero padding: a padded random crop).
    """
    xp = backend.current().xp
    src = call.inputs[0]
    x = rows.local(src)
    if x is None:
        return rows.nothing_here(call)
    t = call.entry.static
    c, h, w = t.image
    m = x.shape[0]
    (out,) = rows.new_output(call, 0)
    cdt = rows.compute_dtype(x.dtype)
    scale, mean, inv_std = _affine(t, cdt)
    x4 = x.reshape(m, c, h, w)
    if t.random and m:
        r0 = src.dist.pieces[call.rank][0].rows[0][0]
        dy, dx, fl = draws(xp, int(call.scalars[0]), rows.local(call.inputs[1]), r0, m, t.shift, t.flip)
        ys, xs = source_pixels(xp, t, dy, dx, fl)
        valid = ((ys >= 0) & (ys < h))[:, None, :, None] & ((xs >= 0) & (xs < w))[:, None, None, :]
        g = x4[xp.arange(m)[:, None, None, None], xp.arange(c)[None, :, None, None],
               xp.clip(ys, 0, h - 1)[:, None, :, None], xp.clip(xs, 0, w - 1)[:, None, None, :]]
        g = xp.where(valid, g.astype(cdt), cdt.type(0))
    else:
        g = x4.astype(cdt, copy=False)
    y4 = out.reshape(m, c, h, w)
    y4[...] = (g * scale - xp.asarray(mean).reshape(1, c, 1, 1)) * xp.asarray(inv_std).reshape(1, c, 1, 1)
    return [rows.shard(call, 0, [out])]


_TRANSFORM_SOURCE = r"""
template <typename T>
__global__ void dm_transform(const T* x, T* y, const int* dy, const int* dx, const signed char* fl,
                             const double* mean, const double* inv_std, double scale,
                             int C, int H, int W, long long total) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= total) return;
    int w = (int)(i % W), h = (int)((i / W) % H);
    long long sc = i / ((long long)W * H);
    int c = (int)(sc % C);
    long long s = sc / C;
    int sy = h - dy[s];
    int sx = (fl[s] ? W - 1 - w : w) - dx[s];
    double v = 0.0;
    if (sy >= 0 && sy < H && sx >= 0 && sx < W) v = (double)dm_val(x[(sc * H + sy) * W + sx]) * scale;
    y[i] = dm_cast<T>((v - mean[c]) * inv_std[c]);
}
"""
_TRANSFORM_INSTANCES = [f"dm_transform<{t}>" for t in cuda.C_TYPES.values()]


@TRANSFORM_IMAGES.kernel(backend="gpu", capturable=True)
def _transform_images_cuda(call):
    """nn_transform_images as one CUDA kernel: each output pixel reads its one source pixel."""
    import cupy
    src = call.inputs[0]
    x = rows.local(src)
    if x is None:
        return rows.nothing_here(call)
    t = call.entry.static
    c, h, w = t.image
    m = x.shape[0]
    (out,) = rows.new_output(call, 0)
    if not m:
        return [rows.shard(call, 0, [out])]
    cache = call.entry.cache
    if "affine" not in cache:
        _, mean, inv_std = _affine(t, np.dtype(np.float64))
        cache["affine"] = (cupy.asarray(mean), cupy.asarray(inv_std))
    mean, inv_std = cache["affine"]
    if t.random:
        r0 = src.dist.pieces[call.rank][0].rows[0][0]
        dy, dx, fl = draws(cupy, int(call.scalars[0]), rows.local(call.inputs[1]), r0, m, t.shift, t.flip)
    else:
        if "still" not in cache:
            cache["still"] = (cupy.zeros(m, np.int32), cupy.zeros(m, np.int32), cupy.zeros(m, np.int8))
        dy, dx, fl = cache["still"]
    fn = cuda.function(_TRANSFORM_SOURCE, f"dm_transform<{cuda.C_TYPES[str(x.dtype)]}>", _TRANSFORM_INSTANCES)
    cuda.launch(fn, out.size, (cupy.ascontiguousarray(x), out, dy, dx, fl, mean, inv_std, np.float64(t.scale),
                               np.int32(c), np.int32(h), np.int32(w), np.int64(out.size)))
    return [rows.shard(call, 0, [out])]
