"""Class labels: one-hot matrices built on the workers from integer labels, and row-wise argmax
gathered on the master (predictions, accuracy).

Only integer vectors travel between the master and the workers (N int64s
instead of N * classes floats).
"""
import numpy as np

from .. import backend
from ..comm import collectives
from ..layout import indexset as ix
from ..runtime import kernel
from . import nn_rows as rows
from .data import senders


@kernel("nn_one_hot")
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


@kernel("nn_argmax_rows")
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
