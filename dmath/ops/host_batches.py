"""Batches that each worker makes on its host from a source of its own (files), not from a resident matrix.

A dataset too large to hold (a folder of JPEG files) stays where it is; what
every worker holds is a *source*: an object built on each worker from a
small description sent once by the master (the file names and labels, never
the pixels), attached to a (N, 1) matrix of its labels. A batch is then made
like a `take_rows` batch (the epoch's order and a position read on the
workers, so a recorded step takes the next batch at every replay without a
message), but each worker builds only its own rows, on host threads:

    host stage    source.sample(index, stream, random, seed, out) per sample,
                  on `threads` threads, into a staging buffer: uint8 (H, W, C)
                  pixels, or (when the normalisation is placed there) the
                  normalised (C, H, W) floats;
    device stage  the staging buffer copied to the device (uint8: a quarter of
                  float32's bytes), then normalised, transposed to NCHW and
                  cast to the batch's dtype there (lazy promotion), and the
                  source's batch function, if any.

A source that can also hand over each sample's undecimated region (its
`region()`: the crop of the decoded image and where the output lies in the
resampled grid) may have the resize run on the device as well (place
'device_resize'): the host then only decodes and crops, and one kernel
resizes, mirrors, normalises and casts the whole batch (dmath/ops/resize.py).
A source that also hands over a sample's file bytes and its crop geometry
(`encoded()`, `geometry()`) may have its JPEG files decoded on the GPU
(place 'device_decode', dmath/ops/gpu_decode.py: nvImageCodec): the host then
only reads files, and the samples the GPU does not take are decoded there.

The host stages of the next batches run on background threads while the step
runs: DMATH_READ_AHEAD batches at once (1 by default; with 2 one batch is
read and parsed while the one before it is decoded), each into its own
staging buffer (one more buffer than batches ahead; the one the device may
still be copying from is never refilled). The pipeline measures its stages and tunes
itself (`Tuner`): where the stages run (among the places it is given) and
how many threads decode.
`report` gathers what each worker measured and chose.

The source is named by an importable "module:callable" (the factory) that
every worker calls with the description's bytes: dmath stays independent of
what a source reads (dnn.data.decode builds image folders on it).
"""
import collections
import importlib
import json
import os
import threading
import time
from concurrent import futures
from concurrent.futures import ThreadPoolExecutor
from typing import NamedTuple

import numpy as np

from .. import backend, memory, settings
from ..comm import collectives
from ..errors import DMathError, DTypeError, LayoutError, ShapeError
from ..layout import Replicated, RowBlock
from ..memory import kinds
from ..runtime import Shard, define, runtime
from . import gpu_decode, resize
from .nn import args, rows
from ..planning.host_stages import Tuner
from .base import as_int, dispatch, new_meta

#: packed regions are kept in buffers of a multiple of this many bytes
PACK_STEP = 8 << 20
#: where the stages run: 'device' (decoding, crop and resize on the host, normalisation on the device),
#: 'host' (all on the host threads), 'device_resize' (decoding and crop on the host, resize and
#: normalisation on the device: the source needs a region()), 'device_decode' (JPEG files decoded on
#: the GPU, then cropped, resized and normalised there: the source needs encoded() and geometry() too)
PLACES = ("device", "host", "device_resize", "device_decode")
#: the places whose host stage packs regions of varying size for the device resize kernel
_PACKED = ("device_resize", "device_decode")


# ---- the source on every worker -------------------------------------------------------------
class SourceShard(Shard):
    """The labels shard of a host source, carrying the source object and its pipelines."""
    __slots__ = ("source", "pipelines")


class SourceArgs(NamedTuple):
    """Static arguments of `host_source`."""
    factory: str          # "module:callable", called on every worker with the description's bytes


HOST_SOURCE = define("host_source", SourceArgs)


def deadline_s():
    """Seconds a worker waits for the user's code on its host threads (a source's factory, its
    sample() calls): DMATH_TIMEOUT_S, or None for no limit. The heartbeat answers the master's pings
    from a thread of its own, so a user function that blocks (a sleep, a read that never returns)
    hung the job for good (a hostile-use probe); past the deadline the worker fails instead, and
    the master reports it as WorkerError."""
    t = settings.current.timeout_s
    return t if 0 < t < float("inf") else None


def _stuck(what):
    return DMathError(f"{what} did not finish within DMATH_TIMEOUT_S = {settings.current.timeout_s:g} s on this "
                      f"worker: does a user function block (a sleep, a read that never returns)?")


def resolve(ref):
    """The object an importable reference "module:qualified.name" names (imported on first use)."""
    module, _, name = ref.partition(":")
    obj = importlib.import_module(module)
    for part in name.split("."):
        obj = getattr(obj, part)
    return obj


def host_source(factory, description, n):
    """A (n, 1) float32 matrix, Replicated on every worker, of the labels of a source that every
    worker builds by calling `factory` ("module:callable") with `description` (bytes, sent once).

    The callable must return an object with `labels` (n numbers) and
    `sample(index, stream, random, seed, out)` (see the module docstring;
    dnn.data.decode.FolderSource is one). Raises DMathError on the master
    when the factory cannot be imported there (the workers import the same).
    """
    if not isinstance(factory, str) or ":" not in factory:
        raise DMathError(f"host_source: factory must be 'module:callable', got {factory!r}")
    try:
        resolve(factory)
    except (ImportError, AttributeError) as exc:
        raise DMathError(f"host_source: cannot import {factory!r} ({exc})") from exc
    if not isinstance(description, (bytes, bytearray)):
        raise DMathError(f"host_source: description must be bytes, got {type(description).__name__}")
    n = as_int(n, "host_source: n")
    if n < 1:
        raise DMathError(f"host_source: a source needs at least one sample, got n={n}")
    out = new_meta(Replicated(tuple(range(runtime().nworkers))), (n, 1), "float32")
    payload = np.frombuffer(bytes(description), dtype=np.uint8)
    return dispatch("host_source", [], [out], static=HOST_SOURCE.static(factory=factory), payload=payload)[0][0]


def _built(factory, description):
    """factory(description), waited for at most deadline_s() (on a thread of its own: this one must
    be able to give up)."""
    box = []

    def build():
        try:
            box.append((True, factory(description)))
        except BaseException as exc:        # noqa: BLE001 - raised on the worker's thread below
            box.append((False, exc))
    th = threading.Thread(target=build, name="dmath-source-factory", daemon=True)
    th.start()
    th.join(deadline_s())
    if not box:
        raise _stuck("host_source: the source's factory")
    ok, value = box[0]
    if not ok:
        raise value
    return value


@HOST_SOURCE.kernel()
def _host_source(call):
    dist, dtype = rows.out_dist(call, 0)
    group = call.world.group(dist.group)
    size = np.zeros(1, dtype=np.int64)
    if call.rank == 0:
        size[0] = call.payload.size
    collectives.wait_host(collectives.bcast_host_start(group, size), size.nbytes)
    data = call.payload if call.rank == 0 else np.empty(int(size[0]), dtype=np.uint8)
    collectives.wait_host(collectives.bcast_host_start(group, data), data.nbytes)
    source = _built(resolve(call.entry.static.factory), data.tobytes())
    labels = np.asarray(source.labels, dtype=np.float32).reshape(-1, 1)
    if labels.shape != tuple(dist.shape):
        raise DMathError(f"host_source: the source has {labels.shape[0]} labels, the master announced "
                         f"{dist.shape[0]}")
    (out,) = rows.new_output(call, 0)
    backend.current().copy_to_device(out, labels)
    backend.current().synchronize()        # (the host labels go when this returns)
    s = SourceShard([out], dist, dtype)
    s.source, s.pipelines = source, {}
    return [s]


# ---- one batch ----------------------------------------------------------------------------
class BatchArgs(NamedTuple):
    """Static arguments of `host_batch`."""
    image: tuple          # (C, H, W) of a sample
    random: bool          # draw augmentations (training), else the deterministic transform
    mean: tuple           # per channel, on the 0..255 pixel scale
    std: tuple            # per channel, on the 0..255 pixel scale
    threads: int          # decoding threads per worker; 0: tuned at run time
    places: tuple         # the PLACES to choose among (tuned when more than one), the first tried first


HOST_BATCH = define("host_batch", BatchArgs)


def host_batch(source, order, position, out, *, image, random, mean, std, counter=None, seed=0, threads=0,
               places=("device", "host")):
    """Overwrite the batch `out` (B, C*H*W) with samples order[position + i] of a host source.

    source: a `host_source` labels matrix; order (1, M) float64 and position
    (1, 1): as for take_rows (Replicated on the batch's workers, read there:
    a recorded step that advances position takes the next batch at every
    replay). random: draw the augmentations of the samples from (seed,
    counter + row), counter a (1, 1) matrix of the samples drawn before the
    batch. Each worker makes only its own rows of `out`. mean, std: one
    value per channel on the 0..255 scale ((v - mean) / std). threads: 0
    tunes the number of decoding threads at run time; places: the PLACES
    the stages may run in, tried in turn and the fastest kept when more
    than one. Returns out.
    """
    args.require(out, "host_batch: out")
    out._check_writable("host_batch")
    if not (type(out.layout) is RowBlock or out.layout.replicated):
        raise LayoutError(f"host_batch: out must be in a row layout (RowBlock or Replicated), got {out.layout}")
    if str(out.dtype) not in ("float16", "float32", "float64"):
        raise DTypeError(f"host_batch: out must be float16, float32 or float64, got {out.dtype}")
    group = args.group_of(out)
    args.require(source, "host_batch: source")
    if source.shape[1] != 1 or not source.layout.replicated or \
            not set(group) <= set(source.layout.members(runtime().nworkers)):
        raise LayoutError("host_batch: source must be a host_source matrix (Replicated on every worker)")
    order = args.replicated(args.require(order, "host_batch: order"), group, "host_batch: order")
    if order.shape[0] != 1 or order.dtype != "float64":
        raise ShapeError(f"host_batch: order must be one float64 row (1, M), got {order.shape} {order.dtype}")
    if out.shape[0] > order.shape[1]:
        raise ShapeError(f"host_batch: a batch of {out.shape[0]} rows from an order of {order.shape[1]} samples")
    c, h, w = (int(v) for v in image)
    if c * h * w != out.shape[1]:
        raise ShapeError(f"host_batch: images of {(c, h, w)} are {c * h * w} values, out rows have {out.shape[1]}")
    mean, std = tuple(float(v) for v in mean), tuple(float(v) for v in std)
    if len(mean) != c or len(std) != c or min(std) <= 0:
        raise DMathError(f"host_batch: mean and std need {c} values each (std positive), got {mean}, {std}")
    if isinstance(threads, bool) or not isinstance(threads, (int, np.integer)) or threads < 0:
        raise DMathError(f"host_batch: threads must be 0 (tuned) or a positive integer, got {threads!r}")
    places = tuple(places) if isinstance(places, (tuple, list)) else (places,)
    if not places or not set(places) <= set(PLACES) or len(set(places)) != len(places):
        raise DMathError(f"host_batch: places must be distinct values of {PLACES}, got {places!r}")
    position = args.counter_matrix(position, group, "host_batch: position")
    inputs = [out, source, order, position]
    if random:
        if counter is None:
            raise DMathError("host_batch: random augmentation needs counter=, a (1, 1) matrix of samples drawn")
        inputs.append(args.counter_matrix(counter, group, "host_batch: counter"))
    static = HOST_BATCH.static(image=(c, h, w), random=bool(random), mean=mean, std=std, threads=int(threads),
                               places=places)
    dispatch("host_batch", inputs, [0], static=static, scalars=(args.counter(seed, "host_batch: seed"),))
    return out


def _scalar(shard):
    return int(kinds.host_arrays(shard)[0].reshape(-1)[0])


def _host_order(cache, order_shard):
    """The order as a host float64 vector, fetched once per version of the order matrix."""
    if cache.get("order_version") != order_shard.version:
        # a new array, not a refill: a read-ahead may still be reading the old one
        cache["order_host"] = np.concatenate([a.reshape(-1) for a in kinds.host_arrays(order_shard)])
        cache["order_version"] = order_shard.version
    return cache["order_host"]


@HOST_BATCH.kernel()
def _host_batch(call):
    """inputs: out (written in place), source, order, position[, counter]; scalars (seed,)."""
    out, source, order, position = call.inputs[:4]
    pieces = out.dist.pieces[call.rank]
    if not pieces:
        return [out]
    if not isinstance(source, SourceShard):
        raise DMathError("host_batch: source is not a host_source matrix on this worker")
    r0 = pieces[0].rows[0][0] if pieces[0].rows else 0
    m = pieces[0].shape[0]
    t = call.entry.static
    key = (call.handles[1], r0, m, t, str(out.dtype))
    pipe = source.pipelines.get(key)
    if pipe is None:
        pipe = source.pipelines[key] = Pipeline(source.source, t, m, out.dtype)
    order_host = _host_order(call.entry.cache, order)
    pos = _scalar(position)
    drawn = _scalar(call.inputs[4]) if t.random else 0
    pipe.run(out.pieces[0], order_host, pos, drawn, r0, out.dist.shape[0], int(call.scalars[0]),
             (order.version, source.version))
    return [out]


# ---- the pipeline -----------------------------------------------------------------------------
def _cpus():
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:          # (not Linux)
        return os.cpu_count() or 1


def local_workers():
    """How many dmath workers share this host (their threads share its cores)."""
    for var in ("MPI_LOCALNRANKS", "OMPI_COMM_WORLD_LOCAL_SIZE", "MV2_COMM_WORLD_LOCAL_SIZE"):
        if os.environ.get(var, "").isdigit():
            return max(1, int(os.environ[var]))
    return max(1, runtime().nworkers)


def host_cores():
    """The cores of this host one worker may keep busy (its share among the workers on the host)."""
    return max(1, _cpus() // local_workers())


def gpu_decode_status():
    """(True, what decodes) or (False, why not) of the place 'device_decode' on this worker."""
    return gpu_decode.status(host_cores())


class _Staged:
    """One staging buffer of a batch's host stage and what made it. Places that pack regions: `total`
    bytes, `host_total` of them staged, the rest gathered on the device (`gather`: GPU-decoded `images`)."""
    __slots__ = ("key", "place", "array", "streams", "host_s", "error", "copied", "geom", "total", "host_total",
                 "gather", "images", "pending", "stages")

    def __init__(self, key, place, array):
        self.key, self.place, self.array = key, place, array
        self.streams = self.error = self.copied = self.geom = self.gather = self.images = None
        self.pending = None        # place 'device_decode', serial order: the decoding still to issue
        self.total = self.host_total = 0
        self.host_s = 0.0
        self.stages = {}           # a place's own stages (reading, decoding, ...) -> seconds, for report()


class Pipeline:
    """One worker's batches of one signature: host stages on threads, read DMATH_READ_AHEAD batches ahead."""

    def __init__(self, source, static, m, dtype):
        self.source, self.t, self.m, self.dtype = source, static, m, np.dtype(dtype)
        self.cores = host_cores()
        self.tuner = Tuner(static.threads, static.places, self.cores)
        self.decoded = {"gpu": 0, "host": 0}     # samples of place 'device_decode' decoded on each
        self.notes = []
        if "device_decode" in static.places:      # the GPU decoder started now, not in a timed batch
            gpu_decode.status(self.cores)
        self.pool = None
        self.pool_threads = 0
        self.pool_lock = threading.Lock()     # the read-ahead threads share the decoding threads
        self.depth = settings.current.read_ahead
        self.buffers = {}          # place -> depth + 1 staging arrays, used in turn
        self.turn = 0
        # (thread, _Staged, position, draw counter) of each batch read ahead, in order; allocated their
        # buffers in turn, so the live ones are always the last depth + 1 the turn handed out
        self.ahead = collections.deque()
        self.last_pos = None
        self.last_end = None       # when the previous call returned (the step's time runs from there)
        self.affine = None

    # -- buffers and threads
    def _buffer(self, place):
        bufs = self.buffers.get(place)
        if bufs is None:
            c, h, w = self.t.image
            if place in _PACKED:
                # packed regions of varying size: allocated (and grown) by the host stage; a third
                # entry keeps the GPU-decoded images of the batch until the device has passed it, a
                # fourth is the pinned copy of the batch's tables (geometry, gather), kept across batches
                bufs = self.buffers[place] = [[None, None, None, None] for _ in range(self.depth + 1)]
            else:
                shape, dt = ((self.m, h, w, c), np.uint8) if place == "device" else ((self.m, c * h * w), self.dtype)
                bufs = self.buffers[place] = [[memory.host_empty(shape, dt), None] for _ in range(self.depth + 1)]
        slot = bufs[self.turn % len(bufs)]
        self.turn += 1
        # never refill a buffer the device may still be copying from (its copy's mark)
        backend.current().passed(slot[1])
        slot[1] = None
        if len(slot) > 2:
            slot[2] = None             # the GPU-decoded images it kept (its pinned tables stay for reuse)
        return slot

    def _drop_buffers(self, keep):
        """Free the staging buffers of every place but `keep` (once the tuner has chosen), each after
        the device has passed its last copy."""
        for place in [p for p in self.buffers if p != keep]:
            for slot in self.buffers.pop(place):
                backend.current().passed(slot[1])

    def note(self, text):
        """A remark for report() (once)."""
        if text not in self.notes:
            self.notes.append(text)

    def _executor(self):
        """The decoding threads (the tuner's number); the caller holds pool_lock. A pool replaced while
        another read-ahead's tasks are queued on it runs them before its threads end."""
        want = self.tuner.threads
        if self.pool is None or self.pool_threads != want:
            if self.pool is not None:
                self.pool.shutdown(wait=False)
            be = backend.current()
            init = (lambda: be.xp.cuda.Device(be.device_id).use()) if be.is_gpu else None
            self.pool = ThreadPoolExecutor(max_workers=want, thread_name_prefix="dmath-decode", initializer=init)
            self.pool_threads = want
        return self.pool

    # -- the host stage
    def _produce(self, staged, indices, streams, seed):
        """Fill staged.array with the samples `indices` (runs on the read-ahead thread or the caller)."""
        t0 = time.perf_counter()
        try:
            src, t, arr = self.source, self.t, staged.array
            c, h, w = t.image
            host_norm = staged.place == "host"
            # the device stage's arithmetic, in its dtype: either place gives the same values
            cdt = rows.compute_dtype(self.dtype)
            mean = np.asarray(t.mean, dtype=cdt).reshape(c, 1, 1)
            inv = (1.0 / np.asarray(t.std, dtype=np.float64)).astype(cdt).reshape(c, 1, 1)

            def one(i):
                if host_norm:
                    pix = np.empty((h, w, c), dtype=np.uint8)
                    src.sample(int(indices[i]), int(streams[i]), t.random, seed, pix)
                    chw = pix.transpose(2, 0, 1).astype(cdt)
                    chw -= mean
                    chw *= inv
                    arr[i] = chw.reshape(-1)
                else:
                    src.sample(int(indices[i]), int(streams[i]), t.random, seed, arr[i])
            if staged.place == "device_resize":
                self._produce_regions(staged, indices, streams, seed)
            elif staged.place == "device_decode":
                gpu_decode.host_stage(self, staged, indices, streams, seed)
            else:
                self._each(one, len(indices))
        except BaseException as exc:         # carried to the step, which raises it there
            staged.error = exc
        staged.host_s = time.perf_counter() - t0

    def _each(self, fn, n):
        """fn(0) .. fn(n - 1) on the decoding threads; every call ends before this returns (a failed
        one too: the others still write into the buffer), then the first failure is raised."""
        with self.pool_lock:
            pool = self._executor()
            tasks = [pool.submit(fn, i) for i in range(n)]
        _, late = futures.wait(tasks, timeout=deadline_s())
        if late:
            raise _stuck(f"{len(late)} of {n} samples of a batch (the source's sample() calls)")
        for task in tasks:
            task.result()

    def _produce_regions(self, staged, indices, streams, seed):
        """The host stage of place 'device_resize': each sample's region, packed into staged.array."""
        m, t, src = len(indices), self.t, self.source
        regions = [None] * m
        geom = np.zeros((m, len(resize.GEOM)), dtype=np.int64)

        def decode(i):
            pix, (full_h, full_w, off_y, off_x, mirrored) = src.region(int(indices[i]), int(streams[i]), t.random,
                                                                       seed)
            regions[i] = pix
            geom[i, 1:] = (pix.shape[0], pix.shape[1], full_h, full_w, off_y, off_x, int(mirrored))
        self._each(decode, m)
        geom[:, 0], total = self._pack(staged, regions)
        staged.geom, staged.total, staged.host_total = geom, total, total

    def _pack(self, staged, arrays):
        """Pack the uint8 `arrays` one after another into the staging slot's pinned buffer (staged.array,
        grown as needed); returns their byte offsets and the bytes in all."""
        sizes = [a.size for a in arrays]
        offsets = np.cumsum([0] + sizes, dtype=np.int64)[:-1]
        total = int(sum(sizes))
        slot = staged.copied
        if slot[0] is None or slot[0].size < total:
            # grown in steps of PACK_STEP bytes: a few sizes over a run, so pinned memory is rarely reallocated
            slot[0] = memory.host_empty((-(-max(total, 1) // PACK_STEP) * PACK_STEP,), np.uint8)
        staged.array = packed = slot[0]

        def pack(i):
            o = int(offsets[i])
            packed[o:o + sizes[i]] = arrays[i].reshape(-1)
        self._each(pack, len(arrays))
        return offsets, total

    def _start(self, key, indices, streams, seed):
        slot = self._buffer(self.tuner.place)
        staged = _Staged(key, self.tuner.place, slot[0])
        staged.copied, staged.streams = slot, streams
        be = backend.current()

        def run():
            if be.is_gpu:
                be.xp.cuda.Device(be.device_id).use()
            self._produce(staged, indices, streams, seed)
        th = threading.Thread(target=run, name="dmath-host-batch", daemon=True)
        th.start()
        self.ahead.append((th, staged, key[1], key[2]))

    def join(self):
        for entry in self.ahead:
            entry[0].join()

    # -- one call
    def run(self, target, order_host, pos, drawn, r0, batch, seed, contents):
        """Fill `target` (this worker's rows r0 .. r0 + m - 1 of the batch) with the samples
        order_host[pos + r0 + i], drawn as samples drawn + r0 + i, starting the next batch's host
        stage (guessed one stride on) first. contents names the order and source versions."""
        if not self.m:
            return
        t_enter = time.perf_counter()
        step_s = t_enter - self.last_end if self.last_end is not None else 0.0
        m = self.m
        indices = order_host[pos + r0:pos + r0 + m].astype(np.int64)
        streams = drawn + r0 + np.arange(m, dtype=np.int64)
        key = (contents, pos, drawn, seed)
        staged, ahead = None, True
        if self.ahead:
            th, guess = self.ahead[0][:2]
            th.join(deadline_s())
            if th.is_alive():
                raise _stuck("the host stage of a batch read ahead (the source's sample() calls)")
            self.ahead.popleft()
            if guess.key == key:
                staged = guess
            else:                     # guessed wrong (a new epoch, order or batch size): all of them
                self.join()
                self.ahead.clear()
        stall = time.perf_counter() - t_enter
        if staged is None:            # not read ahead (the first batch, a new epoch or batch size)
            ahead = False
            slot = self._buffer(self.tuner.place)
            staged = _Staged(key, self.tuner.place, slot[0])
            staged.copied, staged.streams = slot, streams
            self._produce(staged, indices, streams, seed)
            stall = time.perf_counter() - t_enter
        if staged.error is not None:
            err, staged.error = staged.error, None
            raise err
        # the next batches' host stages start now, each into a buffer of its own: they overlap this
        # batch's device stage (host work on the CPU backend) as well as the step. Guessed: the stride
        # of the last two calls, else one whole batch later
        last, self.last_pos = self.last_pos, pos
        stride = pos - last if last is not None and pos > last else batch
        tail_pos, tail_drawn = (self.ahead[-1][2], self.ahead[-1][3]) if self.ahead else (pos, drawn)
        while len(self.ahead) < self.depth and tail_pos + stride + r0 + m <= order_host.size:
            tail_pos += stride
            # the draw counter moves with the position (Feed.advance); without draws it stays 0
            tail_drawn = tail_drawn + stride if self.t.random else tail_drawn
            nxt = order_host[tail_pos + r0:tail_pos + r0 + m].astype(np.int64)
            self._start((contents, tail_pos, tail_drawn, seed), nxt,
                        tail_drawn + r0 + np.arange(m, dtype=np.int64), seed)
        t_dev = time.perf_counter()
        self._device_stage(target, staged)
        device_s = time.perf_counter() - t_dev
        tuning = self.tuner.trials is not None
        self.tuner.record(m, staged.host_s, stall, device_s, step_s, ahead, staged.stages)
        if tuning and self.tuner.trials is None:
            # (a read-ahead already started in a dropped buffer keeps it alive until it is used)
            self._drop_buffers(keep=self.tuner.place)
        self.last_end = time.perf_counter()

    def _affine(self, dtype):
        """(mean, 1 / std) as (1, C, 1, 1) device arrays of the compute dtype (made once: a host-to-device
        copy per batch would synchronise)."""
        if self.affine is None:
            c = self.t.image[0]
            cdt = rows.compute_dtype(dtype)
            xp = backend.current().xp
            inv = (1.0 / np.asarray(self.t.std, dtype=np.float64)).astype(cdt)
            self.affine = (xp.asarray(np.asarray(self.t.mean, dtype=cdt).reshape(1, c, 1, 1)),
                           xp.asarray(inv.reshape(1, c, 1, 1)))
        return self.affine

    def _device_resize(self, target, staged):
        """Resize, mirror, normalise and cast the packed regions into `target` on the device."""
        be = backend.current()
        c, h, w = self.t.image
        mean, inv = self._affine(target.dtype)
        if staged.pending is not None:
            # (DMATH_GPU_DECODE_ORDER=serial) the GPU decodes the batch now, between the previous step
            # and this batch's kernels in the step's stream order
            gpu_decode.finish(self, staged, after=be.xp.cuda.get_current_stream() if be.is_gpu else None)
        packed, geom = staged.array, staged.geom
        if be.is_gpu:
            total, host_total = staged.total, staged.host_total
            # sized in PACK_STEP steps: the pool keeps a few sizes, not one per batch
            dev = memory.empty((-(-max(total, 1) // PACK_STEP) * PACK_STEP,), np.uint8)
            if host_total:
                be.copy_to_device(dev[:host_total], packed[:host_total])
            geom, table = self._tables_to_device(staged)
            if table is not None:
                # the GPU-decoded crops after the host's regions
                gpu_decode.gather(dev, table, host_total, total)
            packed = dev
        resize.resize_batch(be.xp, packed, geom, target.reshape(self.m, c, h, w), mean, inv)

    def _tables_to_device(self, staged):
        """The batch's geometry and gather tables as device arrays, copied in one asynchronous copy from
        the staging slot's pinned buffer (a copy from pageable memory would wait for the whole stream:
        the step before it, every batch). The slot is refilled only after the device passed its mark."""
        geom, table = staged.geom, staged.gather
        parts = [geom] + ([table] if table is not None and len(table) else [])
        n = sum(p.size for p in parts)
        slot = staged.copied
        if slot[3] is None or slot[3].size < n:
            slot[3] = memory.host_empty((max(n, 64) * 2,), np.int64)
        flat = memory.empty((n,), np.int64)
        o = 0
        for p in parts:
            slot[3][o:o + p.size] = p.reshape(-1)
            o += p.size
        backend.current().copy_to_device(flat, slot[3][:n])
        geom_dev = flat[:geom.size].reshape(geom.shape)
        table_dev = flat[geom.size:].reshape(table.shape) if len(parts) > 1 else None
        return geom_dev, table_dev

    def _device_stage(self, target, staged):
        be = backend.current()
        xp = be.xp
        c, h, w = self.t.image
        m = self.m
        if staged.place in _PACKED:
            self._device_resize(target, staged)
        elif staged.place == "host":
            if target.dtype == staged.array.dtype and target.flags.c_contiguous:
                be.copy_to_device(target, staged.array)
            else:
                target[...] = be.asarray(staged.array)
        else:
            pix = memory.empty((m, h, w, c), np.uint8) if be.is_gpu else None
            if pix is not None:
                be.copy_to_device(pix, staged.array)        # uint8 to the device: a quarter of float32's bytes
            else:
                pix = staged.array
            mean, inv = self._affine(target.dtype)
            y = pix.transpose(0, 3, 1, 2).astype(mean.dtype)     # the one promotion, on the device
            y -= mean
            y *= inv
            target.reshape(m, c, h, w)[...] = y
        finish = getattr(self.source, "finish", None)
        if finish is not None and self.t.random:
            # the source's own function on training batches, on the device, with each sample's place
            # in the stream of samples drawn
            finish(target.reshape(m, c, h, w), staged.streams, xp)
        staged.copied[1] = be.mark()
        if staged.images is not None:
            staged.copied[2] = staged.images        # freed once the device has passed the mark


# ---- what every worker measured -----------------------------------------------------------------
REPORT = define("host_source_report")


def report(source):
    """Per worker (a list indexed by rank): its pipelines' tuner summaries and its source's own
    report (`source.report()`, e.g. the files it skipped)."""
    args.require(source, "host_source_report: source")
    return dispatch("host_source_report", [source])[1]


@REPORT.kernel()
def _report(call):
    shard = call.inputs[0]
    mine = {"rank": call.rank, "pipelines": [], "source": {}}
    if isinstance(shard, SourceShard):
        for (_, r0, m, t, dtype), pipe in shard.pipelines.items():
            pipe.join()
            mine["pipelines"].append({"rows": [r0, r0 + m], "random": t.random, "dtype": dtype,
                                      **pipe.tuner.summary(), "decoded_on": dict(pipe.decoded),
                                      "notes": list(pipe.notes)})
        rep = getattr(shard.source, "report", None)
        mine["source"] = rep() if rep is not None else {}
    data = np.frombuffer(json.dumps(mine).encode(), dtype=np.uint8)
    if call.rank != 0:
        size = np.array([data.size], dtype=np.int64)
        collectives.send_host(call.world, size, 0)
        collectives.send_host(call.world, data, 0)
        return []
    out = [mine]
    for r in range(1, call.world.size):
        size = np.empty(1, dtype=np.int64)
        collectives.recv_host(call.world, size, r)
        buf = np.empty(int(size[0]), dtype=np.uint8)
        collectives.recv_host(call.world, buf, r)
        out.append(json.loads(buf.tobytes().decode()))
    call.result = out
    return []
