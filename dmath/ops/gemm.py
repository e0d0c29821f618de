"""GEMM and replication: `gemm`, `explain_gemm`, `replicate` (master halves) and their kernels.

Master half: `gemm` validates everything on the master, looks up which
operand copies the workers already hold (the master's replica ledger,
which mirrors the replica caches, identical on every worker), asks the cost
model (`planning/gemm.py`) for the cheapest strategy and sends one command.
`explain_gemm` prints the same decision without running it.

Kernel: operands into the strategy's layouts (through the replica cache),
the strategy's products (summa.py: local, A-stationary, or SUMMA with
background panel broadcasts), the result into the requested layout, and the alpha/beta
update of C. The whole GEMM is one command: a repeated product with cached
operands costs one control frame and moves no operand bytes.
"""
import functools
from typing import NamedTuple, Optional

import numpy as np

from .. import backend, memory, remap as _remap
from ..remap.execute import PARTIAL_SUM, sums_wider
from ..comm import collectives
from ..errors import DMathError, LayoutError, ShapeError
from ..gpu import blas
from ..layout import Layout, Replicated, RowBlock, distribution
from ..memory import replicas
from ..planning import gemm as gemm_plan
from ..planning.gemm import Strategy, operand_form, panel_kind
from ..runtime import Meta, Shard, define, runtime
from ..runtime.registry import capture_hook, collectives_in_graphs
from . import summa
from .base import Known, check_scalar, dispatch, dispatch_known, is_matrix, new_meta

# cuBLAS sets up its capture workspace before a plan with products is captured
capture_hook(blas.prepare_capture)


class GemmArgs(NamedTuple):
    """Static arguments of `gemm` (chosen on the master by planning/gemm.py)."""
    strategy: Strategy       # the operands' layouts, the product's natural layout, the algorithm
    result: Layout           # the layout the product is delivered in
    trans_a: bool
    trans_b: bool
    has_c: bool              # the product is written into input 2 (C)


GEMM = define("gemm", GemmArgs)


class ReplicateArgs(NamedTuple):
    """Static arguments of `replicate`."""
    layout: Layout        # the Replicated layout over every worker that the copy is kept in
    wait: bool            # False: the copy is made in the background


REPLICATE = define("replicate", ReplicateArgs)


# ---- master half ----------------------------------------------------------------------------
_machine = None


def machine():
    """The figures the GEMM cost model uses (defaults per backend until `set_machine`)."""
    if _machine is not None:
        return _machine
    return gemm_plan.GPU_MACHINE if backend.current().is_gpu else gemm_plan.CPU_MACHINE


def set_machine(m):
    """Replace the cost model's machine figures (a `dmath.planning.gemm.Machine`)."""
    global _machine
    if m is not None and not isinstance(m, gemm_plan.Machine):
        raise DMathError(f"set_machine needs a gemm_plan.Machine, got {type(m).__name__}")
    _machine = m


def _flag(v, what):
    if v is True or v is False:
        return v
    if not isinstance(v, np.bool_):
        raise DMathError(f"{what} must be True or False, got {v!r}")
    return bool(v)


class _Decision(NamedTuple):
    """Everything a GEMM call decides from its operands' metadata (cached per distinct call)."""
    plan: object          # the GemmPlan
    shapes: tuple         # ((m, k), (k, n))
    dtype: str            # the product's: the result's, or with C the compute dtype (`compute_dtype`)
    static: GemmArgs
    out: Optional[Meta]   # the new result's Meta, or None when it is written into C
    outputs: tuple        # the command's outputs: (out,), or (2,) into C
    kept: tuple           # planning/gemm.kept_copies: what the command leaves in the replica caches
    known: Known          # the command's Entry once sent (the decision determines the command)


def _prepare(A, B, C, alpha, beta, trans_a, trans_b, layout):
    """Validate a GEMM call; returns (its _Decision, (alpha, beta))."""
    for x, name in ((A, "A"), (B, "B")):
        if not is_matrix(x):
            raise DMathError(f"gemm: {name} must be a dmath.Matrix, got {type(x).__name__}")
    if C is not None:
        if not is_matrix(C):
            raise DMathError(f"gemm: C must be a dmath.Matrix or None, got {type(C).__name__}")
        C._check_writable("gemm into C")       # a transpose or a slice is a copy: the result would be lost
    trans_a, trans_b = _flag(trans_a, "trans_a"), _flag(trans_b, "trans_b")
    if type(alpha) is not float or type(beta) is not float:     # (the usual floats need no check)
        alpha, beta = check_scalar(alpha, "alpha"), check_scalar(beta, "beta")
    if C is None and beta != 0.0:
        raise DMathError("gemm: beta is only meaningful with C (C=None means beta must be 0)")
    if layout is not None and not isinstance(layout, Layout):
        raise LayoutError(f"gemm: layout must be a dmath layout or None, got {layout!r}")
    rt = runtime()
    P = rt.nworkers
    c_meta = None if C is None else C._meta
    replicas = rt.replicas
    if replicas.holds_any(A._handle) or replicas.holds_any(B._handle):
        a_op, b_op, want, shapes, dtype = _operands(A._meta, B._meta, c_meta, trans_a, trans_b, layout, P)
        cached = _cached(replicas, A, B, a_op, b_op, want, (trans_a, trans_b), dtype, P, shapes)
    else:
        cached = _NONE_CACHED
    decision = _decide(A._meta, B._meta, c_meta, trans_a, trans_b, layout, P, machine(), rt.ledger.limit, cached)
    return decision, (alpha, beta)


_NONE_CACHED = frozenset()


@functools.lru_cache(maxsize=1024)
def _decide(a, b, c, trans_a, trans_b, layout, P, mach, limit, cached):
    """The _Decision of a GEMM of operand Metas a, b (c: C's, or None): a pure function, cached."""
    a_op, b_op, want, shapes, dtype = _operands(a, b, c, trans_a, trans_b, layout, P)
    plan = gemm_plan.choose(a_op, b_op, want, shapes, dtype, P, _budgeted(mach, limit), cached)
    static = GEMM.static(strategy=plan.strategy, result=plan.result, trans_a=trans_a, trans_b=trans_b,
                         has_c=c is not None)
    out = None if c is not None else Meta(plan.result, (shapes[0][0], shapes[1][1]), dtype)
    kept = gemm_plan.kept_copies(plan.strategy, (a, b), (trans_a, trans_b), dtype, P)
    return _Decision(plan, shapes, dtype, static, out, (2,) if c is not None else (out,), kept, Known())


@functools.lru_cache(maxsize=1024)
def _operands(a, b, c, trans_a, trans_b, layout, P):
    """(op(A) layout, op(B) layout, wanted result layout or None, ((m, k), (k, n)), result dtype) for
    operand Metas a, b (and c, or None); raises ShapeError/LayoutError for what does not fit."""
    m, k = a.shape[::-1] if trans_a else a.shape
    k2, n = b.shape[::-1] if trans_b else b.shape
    if k != k2:
        raise ShapeError(f"gemm: op(A) is {m} x {k} but op(B) is {k2} x {n}; the inner sizes must agree")
    if c is not None:
        if c.shape != (m, n):
            raise ShapeError(f"gemm: C is {c.shape[0]} x {c.shape[1]}, the product is {m} x {n}")
        if layout is not None and layout.resolved(P) != c.layout:
            raise LayoutError(f"gemm: layout={layout!r} differs from C's layout {c.layout!r}; "
                              f"the result is written into C")
        want, dtype = c.layout, compute_dtype(a.dtype, b.dtype, c.dtype)
    else:
        dtype = np.result_type(a.dtype, b.dtype).name
        want = None if layout is None else new_meta(layout, (m, n), dtype).layout
    a_op = a.layout.transposed(P) if trans_a else a.layout
    b_op = b.layout.transposed(P) if trans_b else b.layout
    return a_op, b_op, want, ((m, k), (k, n)), dtype


def compute_dtype(a_dtype, b_dtype, c_dtype=None):
    """The dtype a GEMM's operands are converted to and its product made in: the operands'
    (NumPy's result_type), or C's where C is wider.

    Never C's where C is narrower: C[...] = alpha A @ B + beta C computes in
    the operands' precision and rounds once into C, as NumPy and the BLAS-Ex
    routines do; operands converted to a narrower C first would overflow
    (1e5 in float16) or lose the digits a cancellation keeps. float16
    operands keep float16 (their products accumulate in float32, `blas`)."""
    dtype = np.result_type(a_dtype, b_dtype) if c_dtype is None else np.result_type(a_dtype, b_dtype, c_dtype)
    return dtype.name


def _budgeted(m, limit):
    """The machine with its memory budget capped by the memory limit (the master's ledger), if set."""
    if limit is not None and limit < m.budget:
        return gemm_plan.Machine(m.bandwidth, m.latency, m.rates, int(limit))
    return m


def _cached(ledger, A, B, a_op, b_op, want, trans, dtype, P, shapes):
    """The operand copies and panels the workers hold for the candidate strategies, from the
    master's replica ledger (`runtime/replica_ledger.py`), as (operand or panel tag, layout) pairs."""
    found = set()
    inputs = (A._meta, B._meta)
    for s in gemm_plan.candidates(a_op, b_op, want, P, shapes):
        for k, form, _ in gemm_plan.kept_copies(s, inputs, trans, dtype, P):
            if ledger.holds((A, B)[k]._handle, form):
                layout, _ = form
                name = "AB"[k]
                need = s.a if k == 0 else s.b
                found.add((layout[0], need) if isinstance(layout, tuple) else (name, need))
    return frozenset(found)


def _record_copies(rt, kept, handles, written=None):
    """Note in the master's replica ledger the copies the GEMM just sent keeps on the workers."""
    for k, form, nbytes in kept:
        if handles[k] != written:          # an operand that is also C was written: its copies are stale
            rt.replicas.store(handles[k], form, nbytes)


def gemm(A, B, C=None, alpha=1.0, beta=0.0, trans_a=False, trans_b=False, layout=None):
    """alpha * op(A) @ op(B) (+ beta * C): correct for any layouts of A, B and C.

    op(X) is X.T when trans_x. With C given the result is written into C (in
    its layout and dtype) and C is returned; otherwise a new Matrix in
    `layout`, or, with layout=None, in the layout the cheapest strategy
    produces (which may be Partial: the sum of the workers' addends, e.g.
    for A ColBlock times B RowBlock, when that needs no communication).
    The strategy comes from a cost model and is cached per signature; see
    `explain_gemm`.
    """
    d, scalars = _prepare(A, B, C, alpha, beta, trans_a, trans_b, layout)
    if C is not None:
        dispatch_known(d.known, "gemm", [A, B, C], (A._meta, B._meta, C._meta), (2,), d.static, scalars)
        if d.kept and scalars[0] != 0.0:        # alpha == 0 makes no copies (the kernel's `_alpha_zero`)
            _record_copies(runtime(), d.kept, (A._handle, B._handle), written=C._handle)
        return C
    result = dispatch_known(d.known, "gemm", [A, B], (A._meta, B._meta), d.outputs, d.static, scalars)[0][0]
    if d.kept and scalars[0] != 0.0:
        _record_copies(runtime(), d.kept, (A._handle, B._handle))
    return result


def explain_gemm(A, B, C=None, alpha=1.0, beta=0.0, trans_a=False, trans_b=False, layout=None, file=None):
    """Print (and return) the plan `gemm` would run: strategy, operand remaps, bytes, expected time."""
    d, _ = _prepare(A, B, C, alpha, beta, trans_a, trans_b, layout)
    text = gemm_plan.describe(d.plan, d.shapes, d.dtype)
    print(text, file=file)
    return text


def replicate(M, wait=True):
    """Make (and keep, in the replica cache) a Replicated copy of M on every worker; returns M.

    With wait=False the copy is made in the background (on the GPU's side
    stream, or by non-blocking MPI broadcasts) and any later operation that
    uses it waits for it first. Operations that need M replicated (e.g. the
    B of a GEMM with row-split A) then move no bytes for it.
    """
    if not is_matrix(M):
        raise DMathError(f"replicate needs a dmath.Matrix, got {type(M).__name__}")
    wait = _flag(wait, "wait")
    rt = runtime()
    layout = Replicated(tuple(range(rt.nworkers)))
    dispatch("replicate", [M], static=REPLICATE.static(layout=layout, wait=wait))
    rt.replicas.store(M._handle, (layout, M.dtype.name), M.nbytes)     # the copy the workers keep
    return M


# ---- kernels --------------------------------------------------------------------------------


def operand(call, k, need, trans, dtype):
    """Input k's local pieces in layout `need` (of op(X)), as op(X) views, converted to `dtype`."""
    x, handle = call.inputs[k], call.handles[k]
    # what the operand needs is a function of the signature: decided once per entry
    decided = call.entry.cache.get(_NEED[k])
    if decided is None:
        P = call.world.size
        raw_layout = operand_form(need, trans, P)
        target = distribution(raw_layout, x.dist.shape, P)
        as_is = x.dist.same_placement(target) and np.dtype(x.dtype) == np.dtype(dtype)
        decided = call.entry.cache[_NEED[k]] = (raw_layout, target, as_is)
    raw_layout, target, as_is = decided
    if as_is:
        pieces = x.pieces
    else:
        # inside a CUDA graph capture the remap is captured with the product and nothing is cached:
        # a cached copy would be read at its captured address on every launch, long after x changed
        # (a mapped file is read on use: a kept copy would miss a rewrite in place)
        keep = not memory.capturing() and not x.read_on_use
        key = (handle, x.version, raw_layout, dtype)
        pieces = replicas.cache.lookup(key) if keep else None
        if pieces is None:
            pieces = _remap.run(call.world, call.entry.cache.setdefault(("operand", k), {}), x.pieces,
                                x.dist, target, x.dtype, dtype)
            if keep:
                replicas.cache.store(key, pieces, summa.global_bytes(x.dist.shape, dtype))
    if trans:
        pieces = [p.T for p in pieces]
    # the key of the operand's panels in the replica cache (summa), None where none may be kept
    return pieces, (None if x.read_on_use else (handle, x.version, raw_layout, dtype))


#: the entry.cache keys of the operands' decisions (made once, not per product)
_NEED = (("need", 0), ("need", 1))


def _capturable(entry):
    """A GEMM may be captured into a CUDA graph when it is a local or inner product (no SUMMA
    panels on the side stream): of operands in place, or, when collectives may be captured,
    with its operand and result remaps (NCCL exchanges and all-reduces on the compute stream)
    captured with it; during a capture the replica cache is bypassed (`operand`). (dmath.gpu.blas
    calls cuBLAS itself during a capture: CuPy's bindings refuse to.)"""
    if entry.static.strategy.name not in ("local", "inner"):
        return False
    return collectives_in_graphs() or _no_communication(entry)


def _no_communication(entry):
    """Whether a GEMM command never communicates (registry's `local`: the master may queue it): a local
    or inner product of operands already in the strategy's layouts and the result's dtype (no operand
    remap, so no replica-cache lookup either), delivered where the product lands (no result remap)."""
    strategy, result_layout, trans_a, trans_b, has_c = entry.static
    if strategy.name not in ("local", "inner"):
        return False
    P = entry.in_dists[0].nworkers
    out = entry.inputs[2] if has_c else entry.outputs[0]
    for k, (need, trans) in enumerate(((strategy.a, trans_a), (strategy.b, trans_b))):
        raw = operand_form(need, trans, P)
        if (entry.inputs[k].dtype != out.dtype
                or not entry.in_dists[k].same_placement(distribution(raw, entry.inputs[k].shape, P))):
            return False
    natural = distribution(strategy.c, out.shape, P)
    if sums_wider(natural, out.dtype):
        return False        # its addends are summed among the workers (in float32) before the result
    return natural.same_placement(distribution(result_layout, out.shape, P))


class _Prepared(NamedTuple):
    """What the GEMM kernel derives from its signature (entry.cache['prep']), on its first command."""
    dtype: str
    mkn: tuple              # op(A) is m x k, op(B) k x n
    natural: object         # the Distribution of the strategy's product
    final: object           # the Distribution of the result
    in_place: bool          # the product is already where the result goes
    local_shapes: tuple     # this worker's pieces of the product


def _prepared(call):
    strategy, result_layout, trans_a, trans_b, has_c = call.entry.static
    P = call.world.size
    out_meta = call.entry.outputs[0] if not has_c else call.entry.inputs[2]
    m, n = out_meta.shape
    k = call.inputs[0].dist.shape[0 if trans_a else 1]
    natural, final = distribution(strategy.c, (m, n), P), distribution(result_layout, (m, n), P)
    # into C: the product is made in the dtype the master planned it in (never a narrower C's)
    dtype = compute_dtype(call.entry.inputs[0].dtype, call.entry.inputs[1].dtype, out_meta.dtype) if has_c \
        else out_meta.dtype
    prep = call.entry.cache["prep"] = _Prepared(dtype, (m, k, n), natural, final,
                                                natural.same_placement(final), natural.shard_shapes(call.rank))
    return prep


def _direct(call):
    """What the usual local product needs per command, or False: each worker multiplies the one
    piece of each operand it holds, both as held (no remap, no cast), into a new result where the
    product lands. (blas.Product, result shape, result Distribution, dtype), from the first command."""
    strategy, result_layout, trans_a, trans_b, has_c = call.entry.static
    if strategy.name != "local" or has_c or not _no_communication(call.entry):
        return False        # (_no_communication also rules out a float16 Partial product: sums_wider)
    prep = call.entry.cache.get("prep") or _prepared(call)
    a, b = call.inputs[0].pieces, call.inputs[1].pieces
    if len(prep.local_shapes) != 1 or len(a) != 1 or len(b) != 1:
        return False
    product = blas.product(a[0], b[0], prep.dtype, trans_a, trans_b)
    return False if product is None else (product, prep.local_shapes[0], prep.final, prep.dtype)


@GEMM.kernel(capturable=_capturable, local=_no_communication)
def _gemm(call):
    """alpha op(A) op(B) (+ beta C) by the strategy of the static GemmArgs; scalars: alpha, beta."""
    if call.scalars[0] == 0.0:
        return _alpha_zero(call)
    direct = call.entry.cache.get("direct")
    if direct is None:
        direct = call.entry.cache["direct"] = _direct(call)
    if direct is not False:
        # the usual local product: one library call on the pieces as held
        product, shape, final, dtype = direct
        a, b = call.inputs[0].pieces[0], call.inputs[1].pieces[0]
        if (a.strides, b.strides) == product.strides:
            out = memory.empty(shape, dtype)
            product.run(a, b, out, call.scalars[0])
            return [Shard([out], final, dtype)]
    strategy, result_layout, trans_a, trans_b, has_c = call.entry.static
    prep = call.entry.cache.get("prep") or _prepared(call)
    alpha, beta = call.scalars
    dtype = prep.dtype
    a, akey = operand(call, 0, strategy.a, trans_a, dtype)
    b, bkey = operand(call, 1, strategy.b, trans_b, dtype)
    name = strategy.name
    if name == "summa":
        prod = summa.summa(call, strategy, a, b, akey, bkey, prep.mkn, dtype, alpha, trans_a, trans_b)
    elif name == "astat":
        prod = summa.a_stationary(call, strategy.a, strategy.b, a[0], b, bkey, prep.mkn, dtype, alpha, trans_b,
                             panel_kind("astat", "B"))
    elif name == "bstat":
        # C^T = op(B)^T op(A)^T with op(B)^T stationary; the result comes back transposed
        P = call.world.size
        m, k, n = prep.mkn
        ct = summa.a_stationary(call, strategy.b.transposed(P), strategy.a.transposed(P), b[0].T,
                           [p.T for p in a], akey, (n, k, m), dtype, alpha, not trans_a,
                           panel_kind("bstat", "A"))
        prod = [backend.current().xp.ascontiguousarray(p.T) for p in ct]
    else:
        if sums_wider(prep.natural, dtype):
            # float16 addends made in float32 (blas accumulates in it anyway) and summed in it below,
            # by the remap into the result or into C: the value is rounded once, at any worker count
            dtype = PARTIAL_SUM[dtype]
        prod = summa.local_product(a, b, prep.local_shapes, dtype, alpha)
    final = prep.final
    # the dtype the product is delivered in: the result's (rounded from a wider Partial product on
    # the way), or the product's own for C (_round_into converts into a C of another dtype)
    delivered = dtype if has_c else prep.dtype
    if not prep.in_place or delivered != dtype:
        prod = _remap.run(call.world, call.entry.cache.setdefault("result", {}), prod, prep.natural, final,
                          dtype, delivered)
    if not has_c:
        return [Shard(prod, final, delivered)]
    c = call.inputs[2]
    if np.dtype(c.dtype) != np.dtype(dtype):
        _round_into(call, final, c, prod, dtype, beta)
        return [c]
    for cp, pp in zip(c.pieces, prod):
        if beta == 0.0:
            cp[...] = pp
        else:
            if beta != 1.0:
                cp *= beta
            cp += pp
    return [c]


def _alpha_zero(call):
    """The BLAS rule for alpha == 0: op(A) op(B) is not formed, so an inf or NaN in A or B does not
    reach the result: C = beta C (zero when beta == 0, whatever C holds), or a new result of zeros.

    Decided here, on every worker alike (alpha travels in the command), for every backend: NumPy's
    matmul would multiply (0 * inf is NaN) where cuBLAS skips the product."""
    strategy, result_layout, trans_a, trans_b, has_c = call.entry.static
    if has_c:
        c, beta = call.inputs[2], call.scalars[1]
        for cp in c.pieces:
            if beta == 0.0:
                cp.fill(0)
            elif beta != 1.0:
                cp *= beta
        return [c]
    prep = call.entry.cache.get("prep") or _prepared(call)
    return [Shard([memory.zeros(s, prep.dtype) for s in prep.final.shard_shapes(call.rank)], prep.final, prep.dtype)]


def _round_into(call, final, c, prod, dtype, beta):
    """C = prod + beta C for a C narrower than the product's `dtype`: made in `dtype`, rounded once.

    prod (this worker's pieces of alpha op(A) op(B) in C's layout) is ours to
    overwrite. A Partial C holds addends: rounding each one alone could
    overflow or round twice where their sum does not, so the remap into C's
    dtype sums them first (remap/execute.py `run`)."""
    if beta != 0.0:
        for cp, pp in zip(c.pieces, prod):
            t = memory.empty(cp.shape, dtype)
            t[...] = cp
            if beta != 1.0:
                t *= beta
            pp += t
    if final.partial:
        prod = _remap.run(call.world, call.entry.cache.setdefault("into C", {}), prod, final, final, dtype, c.dtype)
    for cp, pp in zip(c.pieces, prod):
        cp[...] = pp



@REPLICATE.kernel()
def _replicate(call):
    """Keep a Replicated copy of input 0 in the replica cache.

    A RowBlock source is broadcast block by block straight into the rows of
    the full copy (in the background when not waiting); any other layout is
    first remapped to RowBlock over every worker (one exchange).
    """
    layout, wait = call.entry.static.layout, call.entry.static.wait
    x, handle = call.inputs[0], call.handles[0]
    if x.read_on_use:
        return []           # a mapped file is read on use: a kept copy would miss a rewrite in place
    key = (handle, x.version, layout, x.dtype)
    if replicas.cache.peek(key):
        return []
    P, rank = call.world.size, call.rank
    shape = x.dist.shape
    rows = RowBlock(tuple(range(P)))
    src = distribution(rows, shape, P)
    pieces = x.pieces
    if not x.dist.same_placement(src):
        pieces = _remap.run(call.world, call.entry.cache.setdefault("rows", {}), pieces, x.dist, src,
                            x.dtype, x.dtype)
    full = memory.empty(shape, x.dtype)
    group = call.world.group(tuple(range(P)))
    spans = [src.pieces[r][0].rows[0] if src.pieces[r][0].rows else (0, 0) for r in range(P)]
    lo, hi = spans[rank]
    full[lo:hi] = pieces[0]
    # the side stream sees only compute work queued before side_begin(): this
    # worker's rows must be in `full` before its broadcast reads them
    collectives.side_begin()
    waits = [collectives.bcast_start(group, full[lo:hi], r) for r, (lo, hi) in enumerate(spans) if hi > lo]
    finish = lambda ws=waits: [w.wait() for w in ws]
    if wait:
        finish()
        finish = None
    if not replicas.cache.store(key, [full], summa.global_bytes(shape, x.dtype), pending=finish) and finish:
        finish()
    return []
