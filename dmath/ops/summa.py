"""The GEMM kernel's products on the workers: each worker's local product, C-stationary SUMMA and
A-stationary with their panels broadcast in the background (kept in the replica cache). The
strategy is chosen on the master (planning/gemm.py); the kernel in gemm.py calls these."""
import numpy as np

from .. import backend, memory
from ..comm import collectives
from ..gpu import blas
from ..layout import distribution, indexset as ix
from ..memory import replicas
from ..planning.gemm import grid_sets, panel_kind


def global_bytes(shape, dtype):
    """A cached copy's size in global bytes: the same number on every worker, so that every worker
    keeps and evicts the same entries (a worker that kept what another evicted would skip a
    collective the other enters)."""
    return shape[0] * shape[1] * np.dtype(dtype).itemsize



def local_product(a, b, shapes, dtype, alpha):
    """Each worker multiplies what it holds (one piece of each operand, or none)."""
    out = [memory.empty(s, dtype) for s in shapes]
    if out and a and b:
        blas.gemm(a[0], b[0], out[0], alpha, 0.0)
    elif out:
        out[0].fill(0)
    return out


def summa(call, strategy, a, b, akey, bkey, mkn, dtype, alpha, trans_a, trans_b):
    """C-stationary SUMMA on the strategy's grid with every panel broadcast in the background.

    Worker (i, j) holds A[R_i, KA_j], B[KB_i, C_j] and makes C[R_i, C_j].
    All broadcasts are started at once (A blocks along grid row i, B blocks
    along grid column j), each into its own buffer; the products then run
    in an order that takes local panels first, each waiting only for the
    panels it needs. The gathered panels are kept in the replica cache, so
    a repeated product with an unchanged operand broadcasts nothing for it.
    """
    m, k, n = mkn
    P, rank = call.world.size, call.rank
    grid, group = strategy.grid, strategy.a.members(P)
    pr, pc = grid
    shape_c = distribution(strategy.c, (m, n), P).shard_shapes(rank)
    if rank not in group:
        return [memory.empty(s, dtype) for s in shape_c]
    i, j = divmod(group.index(rank), pc)
    geo = call.entry.cache.get("summa")
    if geo is None:
        ra, ka = grid_sets(distribution(strategy.a, (m, k), P), grid, group)
        kb, cb = grid_sets(distribution(strategy.b, (k, n), P), grid, group)
        steps = []
        for jj in range(pc):
            for ii in range(pr):
                kk = ix.intersect(ka[jj], kb[ii])
                if ix.size(kk):
                    steps.append((jj, ii, ix.positions(kk, ka[jj]), ix.positions(kk, kb[ii])))
        # local panels first, then those waiting for one broadcast, then two
        steps.sort(key=lambda s: (s[0] != j) + (s[1] != i))
        row_ranks = group[i * pc:(i + 1) * pc]
        col_ranks = group[j::pc]
        geo = call.entry.cache["summa"] = (ra[i], cb[j], ka, kb, steps, row_ranks, col_ranks)
    rows_i, cols_j, ka, kb, steps, row_ranks, col_ranks = geo
    a_pan, a_wait = _panels(call, {j: a[0]}, akey, panel_kind("summa", "A"), row_ranks,
                            [(ix.size(rows_i), ix.size(s)) for s in ka], dtype, global_bytes((m, k), dtype),
                            trans_a)
    b_pan, b_wait = _panels(call, {i: b[0]}, bkey, panel_kind("summa", "B"), col_ranks,
                            [(ix.size(s), ix.size(cols_j)) for s in kb], dtype, global_bytes((k, n), dtype),
                            trans_b)
    xp = backend.current().xp
    # float16 products accumulate in float32 inside each panel product (cuBLAS
    # compute type 32F); the sum over the few panels (pr * pc at most) is
    # kept in float16: a float32 accumulator would double the output traffic
    # and add a conversion pass, about 10% of a large half-precision GEMM
    out = memory.empty(shape_c[0], dtype)
    if not steps:
        out.fill(0)
    for n_done, (jj, ii, pa, pb) in enumerate(steps):
        a_wait[jj].wait()
        b_wait[ii].wait()
        ap = _select_cols(xp, a_pan[jj], pa)
        bp = _select_rows(xp, b_pan[ii], pb)
        blas.gemm(ap, bp, out, alpha, 0.0 if n_done == 0 else 1.0)
    return [out]


def a_stationary(call, x_layout, y_tiles, x, y, ykey, nkm, dtype, alpha, y_transposed, kind):
    """A-stationary 2D: X never moves; Y's tiles travel down grid columns, the addends are reduced.

    Computes X @ Y with X (n x k) aligned on x_layout's grid and Y (k x m)
    in `y_tiles`. Worker (i, j) holds X[R_i, K_j] and some of the tiles
    Y[K_j, C_q] (tile (j, q) lives on grid row q mod pr of column j). It
    broadcasts them along its grid column, makes X[R_i, K_j] @ Y[K_j, C_q]
    for every q as the tiles arrive, each into the block of a send buffer
    that grid-row member q will own, and a reduce-scatter along the grid row
    leaves sum_j X[R_i, K_j] Y[K_j, C_q] on worker (i, q): the result in
    x_layout. The choice when Y and the result are small next to X. With
    X = A it is the A-stationary GEMM; with X = B^T (and Y = A^T) the
    B-stationary one, on the transposed problem.
    """
    n_, k, m_ = nkm
    P, rank = call.world.size, call.rank
    grid, group = x_layout.grid, x_layout.members(P)
    pr, pc = grid
    shape_c = distribution(x_layout, (n_, m_), P).shard_shapes(rank)
    if rank not in group:
        return [memory.empty(s, dtype) for s in shape_c]
    i, j = divmod(group.index(rank), pc)
    geo = call.entry.cache.get(kind)
    if geo is None:
        ra, ka = grid_sets(distribution(x_layout, (n_, k), P), grid, group)
        cs = y_tiles.col_splits
        widths = [cs[q + 1] - cs[q] for q in range(pc)]
        row_ranks = group[i * pc:(i + 1) * pc]
        owners = tuple(group[(q % pr) * pc + j] for q in range(pc))
        # send-buffer blocks in the row communicator's member order (sorted ranks)
        order = [row_ranks.index(r) for r in sorted(row_ranks)]
        rows_i = ix.size(ra[i])
        offsets, o = {}, 0
        for q in order:
            offsets[q] = o
            o += rows_i * widths[q]
        mine = [q for q in range(pc) if owners[q] == rank]
        todo = mine + [q for q in range(pc) if q not in mine]
        geo = call.entry.cache[kind] = (rows_i, ix.size(ka[j]), widths, row_ranks, owners, order, offsets,
                                        mine, todo)
    rows_i, kj, widths, row_ranks, owners, order, offsets, mine, todo = geo
    tiles, waits = _panels(call, dict(zip(mine, y)), ykey, kind, owners, [(kj, w) for w in widths], dtype,
                           global_bytes((k, m_), dtype), y_transposed, members=group[j::pc])
    send = memory.empty((rows_i * m_,), dtype)
    for q in todo:
        waits[q].wait()
        blk = send[offsets[q]:offsets[q] + rows_i * widths[q]].reshape(rows_i, widths[q])
        blas.gemm(x, tiles[q], blk, alpha, 0.0)
    counts = [rows_i * widths[q] for q in order]
    out = memory.empty(shape_c[0], dtype)
    collectives.reduce_scatter(call.world.group(tuple(sorted(row_ranks))), send, out.reshape(-1), counts)
    return [out]


def _panels(call, mine, key, kind, ranks, shapes, dtype, nbytes, transposed, members=None):
    """The blocks of one operand along a grid row or column: ([block views], [Pending]).

    `mine` maps a block index to this worker's own block (an op(X) view,
    transposed when the operand is); block t of the others arrives by
    broadcast from its owner ranks[t] over the communicator of `members`
    (default: the owners), or from the replica cache. Blocks travel in their
    stored orientation (the transpose of the view when `transposed`), which
    every worker knows from the command, never from array strides (a block
    with a single row or column looks contiguous both ways).
    """
    if len(ranks) == 1 or len(mine) == len(shapes):
        return [mine[t] for t in range(len(shapes))], [collectives.Pending() for _ in shapes]
    # (key None: an operand of which no copy may be kept, a mapped file read on use)
    ckey = None if key is None else (key[0], key[1], (kind, key[2], ranks), dtype)
    cached = None if ckey is None else replicas.cache.lookup(ckey)
    if cached is not None:
        return cached, [collectives.Pending() for _ in shapes]
    group = call.world.group(tuple(sorted(set(members or ranks))))
    bufs = []
    for t, shape in enumerate(shapes):
        if t in mine:
            buf = mine[t].T if transposed else mine[t]
            if not _c_contiguous(buf):
                buf = backend.current().xp.ascontiguousarray(buf)
        else:
            buf = memory.empty(shape[::-1] if transposed else shape, dtype)
        bufs.append(buf)
    # the side stream sees only compute work queued before side_begin(): the
    # contiguous copies of own blocks above must be queued first
    collectives.side_begin()
    waits = [collectives.bcast_start(group, buf, group.index(ranks[t])) for t, buf in enumerate(bufs)]
    bufs = [buf.T if transposed else buf for buf in bufs]
    # the cache entry is complete only when every broadcast has arrived
    if ckey is not None:
        replicas.cache.store(ckey, bufs, nbytes, pending=lambda ws=list(waits): [w.wait() for w in ws])
    return bufs, waits


def _c_contiguous(x):
    return x.flags.c_contiguous


def _select_cols(xp, x, sel):
    return x[:, sel] if isinstance(sel, slice) else xp.take(x, xp.asarray(sel), axis=1)


def _select_rows(xp, x, sel):
    return x[sel] if isinstance(sel, slice) else xp.take(x, xp.asarray(sel), axis=0)
