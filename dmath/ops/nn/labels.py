"""Class labels: one-hot matrices built on the workers from integer labels, and row-wise argmax
gathered on the master (predictions, accuracy).

Only integer vectors travel between the master and the workers (N int64s
instead of N * classes floats).
"""
import numpy as np

from ... import backend
from ...backend import canonical_dtype
from ...comm import collectives
from ...errors import DMathError, ShapeError
from ...layout import RowBlock, distribution
from ...layout import indexset as ix
from ...planning.conv import integer
from ...runtime import define, runtime
from . import args, rows
from ..base import dispatch, new_meta
from ..data import senders

# neither has static arguments: the labels are the payload, the rows' places the signature's
ONE_HOT = define("nn_one_hot")
ARGMAX_ROWS = define("nn_argmax_rows")


# ---- master halves ----------------------------------------------------------------------
def argmax_rows(x):
    """The column index of each row's maximum (the first on ties) as a numpy int64 array (N,),
    gathered on the master (predicted classes)."""
    x = args.rows(x, "argmax_rows: x")
    if x.shape[1] == 0:
        raise ShapeError(f"argmax_rows needs at least one column, got shape {x.shape}")
    return dispatch("nn_argmax_rows", [x])[1]


def one_hot(labels, classes, dtype="float32", layout=None):
    """The (N, classes) one-hot Matrix of integer labels (a numpy array or sequence of N ints).

    layout None means RowBlock(). Only the labels travel to the workers,
    which build their rows themselves.
    """
    classes = integer(classes, "one_hot: classes", 1)
    a = np.asarray(labels)
    if a.ndim != 1:
        raise ShapeError(f"one_hot: labels must be 1-D, got shape {a.shape}")
    if a.size and (a.dtype == np.bool_ or not np.issubdtype(a.dtype, np.integer)):
        raise DMathError(f"one_hot: labels must be integers, got dtype {a.dtype}")
    a = np.ascontiguousarray(a, dtype=np.int64)
    if a.size and (a.min() < 0 or a.max() >= classes):
        raise DMathError(f"one_hot: labels must be in [0, {classes}), got values from {a.min()} to {a.max()}")
    canonical_dtype(dtype)
    target = new_meta(layout, (a.size, classes), dtype)
    lay = target.layout
    row_layout = lay if (type(lay) is RowBlock or lay.replicated) \
        else RowBlock(distribution(lay, target.shape, runtime().nworkers).group)
    made = dispatch("nn_one_hot", [], [new_meta(row_layout, target.shape, target.dtype)], payload=a)[0][0]
    return made if row_layout == lay else made.remap(lay)


# ---- kernels -------------------------------------------------------------------------------
@ONE_HOT.kernel()
def _one_hot(call):
    """Output (N, classes) in a row layout; the master's payload is the int64 labels (N,)."""
    xp = backend.current().xp
    dist, _ = rows.out_dist(call, 0)
    if call.rank == 0:
        labels = call.payload
        for r in range(1, dist.nworkers):
            for p in dist.pieces[r]:
                if p.shape[0]:
                    collectives.send_host(call.world, labels[ix.selection(p.rows)], r)
    out = rows.new_output(call, 0)
    for a, p in zip(out, dist.pieces[call.rank]):
        if call.rank == 0:
            mine = labels[ix.selection(p.rows)]
        else:
            mine = np.empty(p.shape[0], dtype=np.int64)
            if p.shape[0]:
                collectives.recv_host(call.world, mine, 0)
        a.fill(0)
        a[xp.arange(p.shape[0]), xp.asarray(mine)] = 1
    return [rows.shard(call, 0, out)]


@ARGMAX_ROWS.kernel()
def _argmax_rows(call):
    """Input X in a row layout; the master's result is the int64 column index of each row's maximum."""
    be = backend.current()
    src = call.inputs[0]
    dist = src.dist
    who = senders(dist)
    x = rows.local(src)
    if call.rank != 0:
        if call.rank in who and x.shape[0]:
            collectives.send_host(call.world, be.asnumpy(x.argmax(axis=1)).astype(np.int64), 0)
        return []
    out = np.empty(dist.shape[0], dtype=np.int64)
    for r in who:
        p = dist.pieces[r][0]
        if not p.shape[0]:
            continue
        sel = ix.selection(p.rows)
        if r == 0:
            out[sel] = be.asnumpy(x.argmax(axis=1))
        else:
            block = np.empty(p.shape[0], dtype=np.int64)
            collectives.recv_host(call.world, block, r)
            out[sel] = block
    call.result = out
    return []
