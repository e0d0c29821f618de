"""The host-batch place 'device_decode': JPEG files decoded on the GPU (nvImageCodec, dmath/gpu/nvimgcodec.py),
then cropped, resized, mirrored, normalised and cast there by the kernels of the place 'device_resize'.

host stage (the read-ahead thread, as every place's host stage: it overlaps the step)
    each sample in turn on this thread: the file's bytes (`source.encoded(index)`: None for a file
    the GPU should not take), its header (size, codec, components; nvImageCodec's parser) and the
    sample's crop and resampling geometry (`source.geometry(width, height, stream, random, seed)`:
    the draws of the host's `region()`); then (DMATH_GPU_DECODE_ORDER=overlap, the default) the
    batch's JPEG files decoded in one call on the GPU, waited for on this thread. A sample the GPU does
    not take (a PNG, a CMYK or truncated JPEG, a file the parser or the decoder refuses) is decoded and
    cropped on the decoding threads instead (`source.region()`: the host's pixels, its skipping or
    raising on a file that does not decode), and packed into the pinned staging buffer.
device stage (the step's stream, host_batches.Pipeline._device_resize)
    (DMATH_GPU_DECODE_ORDER=serial: first the decoding, issued now, ordered after the previous step
    and before this batch's kernels on the device, the host waiting for neither: `finish`), the
    packed host samples copied to the device, one kernel (`gather`) copying each GPU sample's crop out
    of its decoded image into the same packed buffer, then resize.resize_batch.

The decoded images stay alive until the step's stream has passed the batch (kept with the staging
slot's mark), as the pinned buffers do.
"""
import time

import numpy as np

from .. import settings
from ..gpu import launcher as cuda
from ..gpu import nvimgcodec
from . import resize

#: the columns of the gather table: a GPU-decoded image (device address, row pitch in bytes), its crop
#: (first row, first column, rows, columns) and the crop's byte offset in the packed batch
GATHER = ("src", "pitch", "y0", "x0", "h", "w", "dst")


def status(threads=0):
    """(True, what decodes) when this worker's GPU decodes JPEG files, else (False, why not)."""
    return nvimgcodec.status(threads)


def gather_table(views, boxes, start):
    """The (n, len(GATHER)) int64 table of the crops `boxes` ((left, top, right, bottom)) of the decoded
    images `views` ((address, row pitch, height, width)), packed one after another from byte `start` on,
    and the byte after the last."""
    table = np.zeros((len(views), len(GATHER)), dtype=np.int64)
    dst = start
    for k, ((address, pitch, _, _), (left, top, right, bottom)) in enumerate(zip(views, boxes)):
        table[k] = (address, pitch, top, left, bottom - top, right - left, dst)
        dst += (bottom - top) * (right - left) * 3
    return table, dst


def _gpu_job(source, dec, index, stream, random, seed):
    """(code stream, crop box, geometry, (height, width)) of a sample the GPU may decode, or None."""
    if not (hasattr(source, "encoded") and hasattr(source, "geometry")):
        return None
    data = source.encoded(index)
    parsed = dec.parse(data) if data is not None else None
    if parsed is None:
        return None
    cs, width, height = parsed
    box, geometry = source.geometry(width, height, stream, random, seed)
    return cs, box, geometry, (height, width)


def host_stage(pipe, staged, indices, streams, seed):
    """Fill `staged` (a host_batches._Staged of place 'device_decode') with the batch's samples: the
    host-decoded ones packed in its pinned buffer, the GPU-decoded images and the gather table of their
    crops, and the geometry table of all (resize.GEOM).

    This thread reads and parses the files and draws their crops, one after another: that work is
    Python's, under the GIL (one H100 host, session 23: 10,100 files/s on one thread, 5,800 on four,
    which then contend for the GIL; benchmarks/probes/decode_stages.py); the decoding threads decode
    the files the GPU does not take (Pillow releases the GIL). The GPU decodes the batch here, beside
    the step the read-ahead overlaps (DMATH_GPU_DECODE_ORDER=overlap), or later, in the step's stream
    order (=serial): `staged.pending` then holds what `finish` needs, and the
    device stage calls it."""
    src, t, m = pipe.source, pipe.t, len(indices)
    t0 = time.perf_counter()
    dec, why = nvimgcodec.batch_decoder(pipe.cores)
    if dec is None:
        pipe.note(f"GPU decoding unavailable on this worker ({why}): its samples were decoded on the host")
    jobs, regions = [None] * m, [None] * m
    if dec is not None:
        for i in range(m):
            jobs[i] = _gpu_job(src, dec, int(indices[i]), int(streams[i]), t.random, seed)
    refused = [i for i in range(m) if jobs[i] is None]

    def host(k):
        i = refused[k]
        regions[i] = src.region(int(indices[i]), int(streams[i]), t.random, seed)
    pipe._each(host, len(refused))
    staged.stages["read"] = time.perf_counter() - t0
    staged.pending = (dec, jobs, regions, indices, streams, seed)
    if settings.current.gpu_decode_order == "overlap" or not any(j is not None for j in jobs):
        finish(pipe, staged)


def finish(pipe, staged, after=None):
    """Decode the GPU's share of a batch read by `host_stage` and assemble it into `staged`.

    after: None (the decoding thread waits for the decoder), or the step's stream: the decoder starts
    after what that stream has queued (the previous step) and the stream waits for the decoder before
    the batch's device stage; the host waits for neither. On one GPU the decoder's kernels then have
    the device to themselves instead of queueing behind the step's (beside a training step nvImageCodec
    decoded ~810 images/s, 13,000-18,000 alone: benchmarks/probes/decode_contention.py)."""
    dec, jobs, regions, indices, streams, seed = staged.pending
    staged.pending = None
    src, t, m = pipe.source, pipe.t, len(indices)

    def host(i):
        regions[i] = src.region(int(indices[i]), int(streams[i]), t.random, seed)
    on_gpu = [i for i in range(m) if jobs[i] is not None]
    t0 = time.perf_counter()
    images, failure = dec.decode([jobs[i][0] for i in on_gpu], after=after) if on_gpu else ([], None)
    t1 = time.perf_counter()
    staged.stages["decode"] = t1 - t0
    if failure:
        pipe.note(f"{failure}: its samples were decoded on the host")
    views = {}
    for i, img in zip(on_gpu, images):
        view = dec.view(img)
        if view is not None and view[2:] == jobs[i][3]:
            views[i] = view
    refused = [i for i in on_gpu if i not in views]
    if refused:                 # (decoded on the host after all, as if they had never been tried)
        pipe._each(lambda k: host(refused[k]), len(refused))
    on_host = [i for i in range(m) if regions[i] is not None]
    offsets, host_total = pipe._pack(staged, [regions[i][0] for i in on_host])
    geom = np.zeros((m, len(resize.GEOM)), dtype=np.int64)
    for i, offset in zip(on_host, offsets):
        pix, (full_h, full_w, off_y, off_x, mirrored) = regions[i]
        geom[i] = (offset, pix.shape[0], pix.shape[1], full_h, full_w, off_y, off_x, int(mirrored))
    order = sorted(views)
    table, total = gather_table([views[i] for i in order], [jobs[i][1] for i in order], host_total)
    for row, i in zip(table, order):
        full_h, full_w, off_y, off_x, mirrored = jobs[i][2]
        geom[i] = (row[6], row[4], row[5], full_h, full_w, off_y, off_x, int(mirrored))
    staged.geom, staged.gather, staged.images = geom, table, images
    staged.host_total, staged.total = host_total, total
    staged.stages["assemble"] = time.perf_counter() - t1
    pipe.decoded["gpu"] += len(order)
    pipe.decoded["host"] += len(on_host)


def gather(packed, table, begin, end):
    """packed[begin:end] = the crops of the gather `table` (an int64 device array: the caller copies it
    from pinned memory, Pipeline._tables_to_device), one kernel on the current stream (the decoded images
    must be complete: BatchDecoder.decode waited for them)."""
    if not len(table) or end <= begin:
        return
    fn = cuda.function(_SOURCE, "dm_gather_crops", ["dm_gather_crops"])
    cuda.launch(fn, end - begin, (table, np.int32(len(table)), packed, np.int64(begin), np.int64(end)))


def gather_reference(images, table, packed):
    """NumPy's gather: images[k] (H, W, 3) uint8 host arrays in the table's order (its address and pitch
    columns are not read); what the kernel computes."""
    for img, (_, _, y0, x0, h, w, dst) in zip(images, table):
        packed[dst:dst + h * w * 3] = img[y0:y0 + h, x0:x0 + w].reshape(-1)
    return packed


_SOURCE = r"""
// One thread per byte of packed[begin:end]: the crop k whose destination holds it (the last whose
// offset is at or before it; the table's offsets increase), then that byte of the crop's row.
__global__ void dm_gather_crops(const long long* table, int n, unsigned char* packed, long long begin, long long end) {
    long long t = begin + (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= end) return;
    int lo = 0, hi = n - 1;
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (table[7LL * mid + 6] <= t) lo = mid; else hi = mid - 1;
    }
    const long long* g = table + 7LL * lo;
    const long long row_bytes = g[5] * 3, local = t - g[6];
    const long long r = local / row_bytes, c = local - r * row_bytes;
    const unsigned char* src = (const unsigned char*)g[0];
    packed[t] = src[(g[2] + r) * g[1] + g[3] * 3 + c];
}
"""
