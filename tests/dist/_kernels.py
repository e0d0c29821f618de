"""Test-only kernels, registered by conftest.py before dmath.init (workers never import test modules)."""
import time

from dmath.runtime import kernel


@kernel("test_nap")
def _nap(call):
    """Every worker but 0 sleeps for scalars[0] seconds: a long queue there, on any machine."""
    if call.rank != 0:
        time.sleep(call.scalars[0])
    return []


@kernel("test_message_limits")
def _message_limits(call):
    """Every rank cuts host messages at scalars[0] bytes and sends collectives past scalars[1] bytes
    as point-to-point parts (what buffers past 2 GiB do under an MPI-3 library), with small buffers."""
    from dmath.comm import collectives
    collectives.MAX_MESSAGE_BYTES, collectives.MAX_COLLECTIVE_BYTES = int(call.scalars[0]), int(call.scalars[1])
    return []


@kernel("test_partial_addends")
def _partial_addends(call):
    """A (rows, 1) Partial whose addend on worker w is column w of the (rows, P) ColBlock input, as
    it is: addends that a sum would round or overflow in their dtype (dmath's own Partial results
    of float16 hold sums rounded once), for the tests of what a remap does with them."""
    from dmath.runtime import Shard
    dist, dtype = call.entry.out_dists[0], call.entry.outputs[0].dtype
    return [Shard([p.copy() for p in call.inputs[0].pieces], dist, dtype)]


@kernel("test_graph_streams")
def _graph_streams(call):
    """Every rank plans the captures of the plans defined from now on with up to scalars[0] streams
    (DMATH_GRAPH_STREAMS, which a test cannot set on the workers after init)."""
    from dmath import settings
    settings.current.graph_streams = int(call.scalars[0])
    return []


@kernel("test_cudnn_workspace_keep")
def _cudnn_workspace_keep(call):
    """Every rank keeps cuDNN workspaces up to scalars[0] bytes between calls and gives every larger
    one its call's own buffer (DMATH_CUDNN_WORKSPACE_KEEP, which a test cannot set on the workers
    after init)."""
    from dmath import settings
    settings.current.cudnn_workspace_keep = int(call.scalars[0])
    return []


@kernel("test_gpu_decode_order")
def _gpu_decode_order(call):
    """Every rank decodes image folders on the GPU in the order scalars[0] names (0: 'overlap', 1:
    'serial'; DMATH_GPU_DECODE_ORDER, which a test cannot set on the workers after init)."""
    from dmath import settings
    settings.current.gpu_decode_order = ("overlap", "serial")[int(call.scalars[0])]
    return []


@kernel("test_read_ahead")
def _read_ahead(call):
    """Every rank's new host-batch pipelines read scalars[0] batches ahead (DMATH_READ_AHEAD)."""
    from dmath import settings
    settings.current.read_ahead = int(call.scalars[0])
    return []


@kernel("test_host_scale")
def _host_scale(call):
    """inputs[0] *= scalars[0] in place, after reading its first value on the host: a step that may
    not be captured into a CUDA graph (a host synchronisation), for the tests of segmented plans."""
    shard = call.inputs[0]
    for p in shard.pieces:
        if p.size:
            float(p.reshape(-1)[0])           # (a device-to-host read: uncapturable)
            p *= call.scalars[0]
    return [shard]


@kernel("test_host_copy")
def _host_copy(call):
    """A new shard holding inputs[0] * scalars[0], after a host read: an uncapturable step whose
    output is a new buffer at every run."""
    from dmath.runtime import Shard
    dist, dtype = call.entry.out_dists[0], call.entry.outputs[0].dtype
    pieces = [p * call.scalars[0] for p in call.inputs[0].pieces]
    for p in pieces:
        if p.size:
            float(p.reshape(-1)[0])
    return [Shard(pieces, dist, dtype)]
