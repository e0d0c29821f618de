"""GEMM planning: the strategies, their operand layouts and a cost model (pure functions).

Everything here works on metadata only (layouts, shapes, dtypes, worker
count, machine figures), so it runs identically on the master and in tests
without MPI, and is cached per signature.

`op(A)` is m x k, `op(B)` is k x n and C is m x n. A strategy names the
layouts it needs its operands in (Elemental's proxies: an operand in any
other layout is remapped into them first, which the cost counts) and the
layout its result comes out in:

- ``local``: every worker multiplies what it holds, no communication:
  rows of A with a replicated B (RowBlock result), a replicated A with
  columns of B (ColBlock result), both replicated (Replicated result).
- ``inner``: A's columns and B's rows split alike: each worker's product is
  an addend of C (a Partial result, then reduce-scattered if a non-Partial
  result is asked for).
- ``summa`` on a pr x pc grid: A, B and C aligned on the grid (A's row
  blocks are C's, B's column blocks are C's; Block2D or BlockCyclic).
  Workers broadcast their A blocks along grid rows and their B blocks along
  grid columns, in the background, while multiplying the panels that have
  arrived. Grid (P, 1) is the A-stationary 1D algorithm (an all-gather of
  B's row blocks overlapped with the products), grid (1, P) the
  B-stationary one (an all-gather of A's column blocks), and a 2D grid the
  C-stationary SUMMA; the cost model picks among them by shape.
"""
import functools
from dataclasses import dataclass, field

import numpy as np

from ..frozen import frozen
from ..layout import (Block2D, BlockCyclic, ColBlock, Partial, Replicated, RowBlock, Tiles, distribution,
                      indexset as ix, near_square_grid)
from ..remap.plan import AllReduce, moved_elements, plan as remap_plan


@frozen
class Machine:
    """Figures of one worker the cost model uses (measured by `dmath.calibrate`)."""
    bandwidth: float = 5e9          # bytes/s a worker receives from its peers
    latency: float = 30e-6          # seconds per message round
    rates: tuple = (("float16", 2e10), ("float32", 5e10), ("float64", 2.5e10))   # flop/s
    budget: int = 8 << 30           # bytes of temporaries a worker may hold for one GEMM

    def rate(self, dtype):
        return dict(self.rates)[dtype]


#: figures of one NVIDIA H200 (cuBLAS through CuPy; NVLink between every pair)
GPU_MACHINE = Machine(bandwidth=150e9, latency=30e-6,
                      rates=(("float16", 7e14), ("float32", 5e13), ("float64", 5.5e13)),
                      budget=48 << 30)
CPU_MACHINE = Machine()


@frozen
class Strategy:
    """A way to compute C = op(A) op(B): operand layouts it needs, the layout C comes out in."""
    name: str               # 'local', 'inner' or 'summa'
    a: object               # layout of op(A) it needs
    b: object               # layout of op(B) it needs
    c: object               # layout of the product it makes
    grid: tuple = None      # summa: (pr, pc)


@dataclass(frozen=True)
class Cost:
    """The expected cost of a strategy; `items` are (what, bytes per worker, seconds)."""
    seconds: float
    items: tuple
    memory: int             # peak temporary bytes per worker
    feasible: bool = True


@frozen
class GemmPlan:
    strategy: Strategy
    result: object          # the layout the caller gets
    cost: Cost
    considered: tuple = field(default=(), compare=False)   # (Strategy, Cost) of the others


# ---- grid structure of a distribution ----------------------------------------------
def grid_sets(dist, grid, group):
    """(row index sets per grid row, col index sets per grid col) if `dist` is aligned on the grid, else None.

    Aligned: worker group[i * pc + j] stores exactly one piece, whose rows
    depend only on i and whose columns depend only on j.
    """
    pr, pc = grid
    if len(group) != pr * pc or dist.partial or any(r >= len(dist.pieces) for r in group):
        return None
    members = set(group)
    if any(dist.pieces[r] for r in range(len(dist.pieces)) if r not in members):
        return None
    rows, cols = [None] * pr, [None] * pc
    for k, r in enumerate(group):
        i, j = divmod(k, pc)
        if len(dist.pieces[r]) != 1:
            return None
        p = dist.pieces[r][0]
        if rows[i] is None:
            rows[i] = p.rows
        if cols[j] is None:
            cols[j] = p.cols
        if rows[i] != p.rows or cols[j] != p.cols:
            return None
    # the grid rows (columns) must split the rows (columns): no index held twice
    if sum(ix.size(s) for s in rows) != dist.shape[0] or sum(ix.size(s) for s in cols) != dist.shape[1]:
        return None
    return tuple(rows), tuple(cols)


# ---- the copies a strategy keeps in the workers' replica caches ---------------------------
# One definition of each form, used by the kernel (its cache keys) and by the master (its ledger).
def operand_form(need, trans, P):
    """The layout operand X is stored in when op(X) must be in `need` (the transpose when trans)."""
    return need.transposed(P) if trans else need


def panel_kind(strategy_name, operand):
    """The replica-cache tag of the blocks a strategy broadcasts of operand 'A' or 'B' (None: none)."""
    if strategy_name == "summa":
        return f"{operand}-panels"
    if strategy_name == "astat":
        return "B-tiles" if operand == "B" else None
    if strategy_name == "bstat":
        return "A-tiles" if operand == "A" else None
    return None


def _panels_kept(strategy, operand):
    """Whether the kernel keeps operand's broadcast blocks: only when some arrive from other workers."""
    pr, pc = strategy.grid
    if strategy.name == "summa":
        return (pc if operand == "A" else pr) > 1
    return pr > 1 and pc > 1        # A- or B-stationary: tiles travel down grid columns


@functools.lru_cache(maxsize=1024)
def kept_copies(strategy, inputs, trans, dtype, P):
    """((operand index, form, global bytes), ...): the copies a GEMM with `strategy` keeps in the
    workers' replica caches, for input Metas `inputs` (A, B) transposed as `trans`; a form is
    (layout, dtype) for an operand remapped into place, ((kind, layout), dtype) for its panels."""
    kept = []
    isz = np.dtype(dtype).itemsize
    for k, (name, need, x, tr) in enumerate((("A", strategy.a, inputs[0], trans[0]),
                                             ("B", strategy.b, inputs[1], trans[1]))):
        raw = operand_form(need, tr, P)
        nbytes = x.shape[0] * x.shape[1] * isz
        as_is = (np.dtype(x.dtype) == np.dtype(dtype)
                 and distribution(x.layout, x.shape, P).same_placement(distribution(raw, x.shape, P)))
        if not as_is:
            kept.append((k, (raw, dtype), nbytes))
        kind = panel_kind(strategy.name, name) if strategy.grid is not None else None
        if kind is not None and _panels_kept(strategy, name):
            kept.append((k, ((kind, raw), dtype), nbytes))
    return tuple(kept)


def _grid_of(layout):
    return getattr(layout, "grid", None) if isinstance(layout, (Block2D, BlockCyclic)) else None


# ---- candidates ----------------------------------------------------------------------
def _row_like(lay):
    """True for layouts that give each member whole rows (RowBlock, or a (p, 1) grid)."""
    return isinstance(lay, RowBlock) and not isinstance(lay, ColBlock) or (
        isinstance(lay, (Block2D, BlockCyclic)) and lay.grid[1] == 1)


def _col_like(lay):
    return isinstance(lay, ColBlock) or (isinstance(lay, (Block2D, BlockCyclic)) and lay.grid[0] == 1)


@functools.lru_cache(maxsize=1024)
def candidates(a, b, want, P, shapes):
    """Every strategy worth costing for op(A) layout `a`, op(B) layout `b` and wanted result `want` (or None).

    The strategies use the workers that hold an operand or the result (all
    P for the usual layouts): a product of matrices on a worker group is
    computed by that group, and the other workers, which may be busy with
    another group's work, take no part (PyTorch DTensor's ops likewise run
    on their operands' device mesh).
    """
    everyone = involved(a, b, want, P)
    n = len(everyone)
    out = []
    # local products: keep the operand that is split, replicate the other
    # (a row-split A times a replicated B is split like A, and symmetrically for B's columns)
    ra = a if _row_like(a) else RowBlock(everyone)
    out.append(Strategy("local", ra, Replicated(everyone), ra))
    cb = b if _col_like(b) else ColBlock(everyone)
    out.append(Strategy("local", Replicated(everyone), cb, cb))
    out.append(Strategy("local", Replicated(everyone), Replicated(everyone), Replicated(everyone)))
    # inner products: A's columns and B's rows split alike, a Partial result
    if isinstance(a, ColBlock):
        ia, ib = a, RowBlock(a.group, a.sizes)
    elif _row_like(b) and isinstance(b, RowBlock):
        ia, ib = ColBlock(b.group, b.sizes), b
    else:
        ia, ib = ColBlock(everyone), RowBlock(everyone)
    out.append(Strategy("inner", ia, ib, Partial(ia.group)))
    if n > 1:
        grids = {near_square_grid(n), (n, 1), (1, n)}
        for lay in (a, b, want):
            g = _grid_of(lay)
            if g is not None and lay.group == everyone:
                grids.add(g)
        for grid in sorted(grids):
            out.append(_summa(a, b, want, grid, everyone))
            if grid[0] > 1 and grid[1] > 1:
                out.append(_a_stationary(grid, everyone, shapes))
                out.append(_b_stationary(grid, everyone, shapes, P))
    return tuple(dict.fromkeys(out))


def involved(a, b, want, P):
    """The ranks (ascending) that hold op(A), op(B) or the wanted result."""
    ranks = set(a.members(P)) | set(b.members(P))
    if want is not None:
        ranks |= set(want.members(P))
    return tuple(sorted(ranks))


def stationary_tiles(grid, group, k, n):
    """Tiles of a k x n operand for the stationary kernels: tile (j, q) on grid (q mod pr, j)."""
    pr, pc = grid
    ksplit = (0,) + tuple(int(v) for v in np.cumsum(ix.split_even(k, pc)))
    nsplit = (0,) + tuple(int(v) for v in np.cumsum(ix.split_even(n, pc)))
    owners = tuple(tuple(group[(q % pr) * pc + j] for q in range(pc)) for j in range(pc))
    return Tiles(ksplit, nsplit, owners)


def _a_stationary(grid, group, shapes):
    """The A-stationary 2D strategy: A in Block2D, B in tiles B[K_j, C_q] on grid column j."""
    (m, k), (_, n) = shapes
    lay = Block2D(grid, group)
    return Strategy("astat", lay, stationary_tiles(grid, group, k, n), lay, grid)


def _b_stationary(grid, group, shapes, P):
    """The B-stationary 2D strategy: B in Block2D, A's tiles travel (A-stationary on C^T = B^T A^T)."""
    (m, k), (_, n) = shapes
    lay = Block2D(grid, group)
    x = lay.transposed(P)                       # op(B)^T, stationary
    y = stationary_tiles(x.grid, x.group, k, m)  # op(A)^T in tiles on x's grid
    return Strategy("bstat", y.transposed(P), lay, lay, x.grid)


def _summa(a, b, want, grid, group):
    """A SUMMA strategy on `grid`: keeps block-cyclic operands block-cyclic when their grid fits."""
    a_bc = isinstance(a, BlockCyclic) and a.grid == grid and a.group == group
    b_bc = isinstance(b, BlockCyclic) and b.grid == grid and b.group == group
    if a_bc or b_bc:
        mb, kb = a.block if a_bc else (b.block[0], b.block[0])
        nb = b.block[1] if b_bc else kb
        sa = BlockCyclic((mb, kb), grid, group)
        sb = BlockCyclic((kb, nb), grid, group)
        sc = BlockCyclic((mb, nb), grid, group)
    else:
        sa = sb = sc = Block2D(grid, group)
    if isinstance(want, (Block2D, BlockCyclic)) and want.grid == grid and want.group == group:
        # C-stationary: worker (i, j) makes C[R_i, C_j] from op(A)'s rows R_i and op(B)'s columns C_j,
        # so op(A) takes the wanted result's row split and op(B) its column split (the inner
        # dimension's split is free: the kernel multiplies the intersections of A's and B's). Keeping
        # an operand's own block there labelled the product with rows or columns it does not hold
        # (wrong results for a result block unlike the operands')
        sc = want
        if isinstance(want, BlockCyclic):
            mb, nb = want.block
            kb = sa.block[1] if isinstance(sa, BlockCyclic) else mb
            sa, sb = BlockCyclic((mb, kb), grid, group), BlockCyclic((kb, nb), grid, group)
        else:
            sa = sb = Block2D(grid, group)
    return Strategy("summa", sa, sb, sc, grid)


# ---- cost ------------------------------------------------------------------------------
def remap_volume(src, dst, shape, P):
    """(max bytes-worth of elements any worker receives, rounds) to remap `src` to `dst`."""
    s, d = distribution(src, shape, P), distribution(dst, shape, P)
    if s.same_placement(d):
        return 0, 0
    worst, rounds = 0, 0
    for step in remap_plan(s, d):
        rounds += 1
        if isinstance(step, AllReduce):
            m, n = shape
            worst += 2 * m * n        # reduce-scatter + all-gather, about 2x the matrix per member
            continue
        worst += max(moved_elements(step, r)[1] for r in range(P))
    return worst, rounds


def _piece_elems(layout, shape, P):
    d = distribution(layout, shape, P)
    return max((sum(p.shape[0] * p.shape[1] for p in ps) for ps in d.pieces), default=0)


def cost(strategy, a, b, result, shapes, dtype, P, machine, cached=frozenset()):
    """The `Cost` of `strategy`: remaps of the operands (free when `cached`), its own traffic and flops."""
    (m, k), (_, n) = shapes
    isz = np.dtype(dtype).itemsize
    bw, lat = machine.bandwidth, machine.latency
    items, mem, seconds = [], 0, 0.0
    for name, have, need, shape in (("A", a, strategy.a, (m, k)), ("B", b, strategy.b, (k, n))):
        if (name, need) in cached:
            items.append((f"{name}: cached {_short(need)}", 0, 0.0))
            continue
        elems, rounds = remap_volume(have, need, shape, P)
        if rounds:
            t = elems * isz / bw + rounds * lat
            items.append((f"remap {name} {_short(have)} -> {_short(need)}", elems * isz, t))
            seconds += t
            mem += _piece_elems(need, shape, P) * isz
    flops, comm, reduce, panels = _work(strategy, shapes, P, cached)
    compute = flops / machine.rate(dtype)
    c_elems = _piece_elems(strategy.c, (m, n), P)
    mem += (panels + c_elems) * isz
    if comm:
        pr, pc = strategy.grid
        # broadcasts run under the products; the first panel pair is exposed
        t_comm = comm * isz / bw
        exposed = max(0.0, t_comm - compute) + t_comm / max(pr, pc) + (pr + pc) * lat
        items.append((f"panels on grid {strategy.grid}", comm * isz, exposed))
        seconds += exposed
    if reduce:
        t = reduce * isz / bw + strategy.grid[1] * lat
        items.append(("reduce-scatter of C's addends along grid rows", reduce * isz, t))
        seconds += t
        mem += reduce * isz
    items.append(("multiply", 0, compute))
    seconds += compute
    if strategy.c != result:
        elems, rounds = remap_volume(strategy.c, result, (m, n), P)
        if rounds:
            t = elems * isz / bw + rounds * lat
            items.append((f"remap C {_short(strategy.c)} -> {_short(result)}", elems * isz, t))
            seconds += t
            mem += _piece_elems(result, (m, n), P) * isz
    return Cost(seconds, tuple(items), mem, mem <= machine.budget)


def _work(strategy, shapes, P, cached):
    """Per worker at most: (flops, panel elements received under the products, elements reduced after
    them, panel elements held) of the strategy itself."""
    (m, k), (_, n) = shapes
    if strategy.name in ("astat", "bstat"):
        pr, pc = strategy.grid
        if strategy.name == "bstat":            # the same kernel on C^T = op(B)^T op(A)^T
            m, n = n, m
            key = ("A-tiles", strategy.a)
        else:
            key = ("B-tiles", strategy.b)
        rows = max(ix.split_even(m, pr))
        kj = max(ix.split_even(k, pc))
        # the worker owning the fewest tiles (pc // pr of them) receives the most
        recv = 0 if key in cached else kj * (n - (pc // pr) * min(ix.split_even(n, pc)))
        return 2 * rows * kj * n, recv, rows * n * (pc - 1) // pc, kj * n + rows * n
    if strategy.name != "summa":
        a = distribution(strategy.a, (m, k), P)
        c = distribution(strategy.c, (m, n), P)
        if strategy.name == "inner":
            flops = max((2 * m * n * p.shape[1] for ps in a.pieces for p in ps), default=0)
        else:
            flops = max((2 * p.shape[0] * p.shape[1] * k for ps in c.pieces for p in ps), default=0)
        return flops, 0, 0, 0
    pr, pc = strategy.grid
    group = strategy.a.members(P)
    ra, ka = grid_sets(distribution(strategy.a, (m, k), P), strategy.grid, group)
    kb, cb = grid_sets(distribution(strategy.b, (k, n), P), strategy.grid, group)
    flops = recv = held = 0
    for i in range(pr):
        for j in range(pc):
            rows, cols = ix.size(ra[i]), ix.size(cb[j])
            flops = max(flops, 2 * rows * cols * k)
            ga = 0 if ("A-panels", strategy.a) in cached or pc == 1 else rows * (k - ix.size(ka[j]))
            gb = 0 if ("B-panels", strategy.b) in cached or pr == 1 else (k - ix.size(kb[i])) * cols
            recv = max(recv, ga + gb)
            held = max(held, (rows * k if pc > 1 else 0) + (k * cols if pr > 1 else 0))
    return flops, recv, 0, held


def _short(layout):
    r = repr(layout)
    return r.replace("group=", "").replace("grid=", "")


# ---- the choice ----------------------------------------------------------------------------
@functools.lru_cache(maxsize=1024)
def choose(a, b, want, shapes, dtype, P, machine, cached=frozenset()):
    """The cheapest feasible `GemmPlan` for op(A) in layout `a` times op(B) in `b` (pure, cached).

    want: the requested result layout, or None for the strategy's own.
    cached: ("A" | "B" | "A-panels" | "B-panels", layout) pairs the workers
    already hold (replica cache), which cost nothing.
    """
    scored = []
    for s in candidates(a, b, want, P, shapes):
        result = want if want is not None else s.c
        if want is None and s.name == "inner" and (a, b) != (s.a, s.b):
            # a Partial result is offered only when it costs no communication at
            # all (e.g. X.T @ dY of two row-split batches, a data-parallel weight
            # gradient); after remapping operands the caller gets a plain matrix
            result = RowBlock(s.c.group)
        scored.append((s, result, cost(s, a, b, result, shapes, dtype, P, machine, cached)))
    feasible = [t for t in scored if t[2].feasible] or scored
    # ties (equal cost to the nanosecond) go to the earlier candidate: no communication first
    best = min(feasible, key=lambda t: t[2].seconds)
    return GemmPlan(best[0], best[1], best[2], tuple((s, c) for s, _, c in scored))


def describe(plan, shapes, dtype):
    """A readable account of a plan (what `dmath.explain_gemm` prints)."""
    (m, k), (_, n) = shapes
    s = plan.strategy
    on_grid = f" on grid {s.grid}" if s.grid else ""
    lines = [f"GEMM ({m} x {k}) @ ({k} x {n}) {dtype}: strategy {s.name}{on_grid}"]
    lines.append(f"  op(A) as {_short(s.a)}, op(B) as {_short(s.b)}, product as {_short(s.c)}, "
                 f"result as {_short(plan.result)}")
    for what, nbytes, secs in plan.cost.items:
        lines.append(f"  {what}: {nbytes} bytes per worker, {secs * 1e3:.3f} ms")
    lines.append(f"  expected {plan.cost.seconds * 1e3:.3f} ms, {plan.cost.memory} bytes of temporaries "
                 f"per worker")
    others = sorted(((c.seconds, st) for st, c in plan.considered if st != s), key=lambda t: t[0])
    for secs, st in others[:4]:
        # candidates of one name differ by their operands' layouts (two 'local' ones read alike before)
        lines.append(f"  (alternative {st.name}{'' if st.grid is None else ' ' + str(st.grid)}, op(A) as "
                     f"{_short(st.a)}, op(B) as {_short(st.b)}: {secs * 1e3:.3f} ms)")
    return "\n".join(lines)
