"""Master side of GEMM and replication: validation, the plan choice, dispatch.

`gemm` validates everything on the master, looks up which operand copies
the workers already hold (the replica cache, identical on every worker),
asks the cost model (`planning/gemm.py`) for the cheapest strategy and
sends one command. `explain_gemm` prints the same decision without running it.
"""
import functools
import numbers
from typing import NamedTuple, Optional

import numpy as np

from . import backend
from .errors import DMathError, LayoutError, ShapeError
from .layout import Layout, Replicated
from .ops.gemm import GEMM, GemmArgs
from .planning import gemm as gemm_plan
from .ops.base import dispatch, new_meta
from .runtime import Meta, runtime

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


def _is_matrix(x):
    return hasattr(x, "_handle") and hasattr(x, "layout")


def _scalar(v, what):
    if type(v) is float:          # the usual case, without the ABC check below (dispatch cost)
        return v
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, numbers.Real):
        raise DMathError(f"{what} must be a real number, got {v!r}")
    return float(v)


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
    dtype: str            # the result's
    static: GemmArgs
    out: Optional[Meta]   # the new result's Meta, or None when it is written into C
    kept: tuple           # planning/gemm.kept_copies: what the command leaves in the replica caches


def _prepare(A, B, C, alpha, beta, trans_a, trans_b, layout):
    """Validate a GEMM call; returns (its _Decision, (alpha, beta))."""
    if getattr(A, "_meta", None) is None or getattr(B, "_meta", None) is None:
        name, x = ("A", A) if getattr(A, "_meta", None) is None else ("B", B)
        raise DMathError(f"gemm: {name} must be a dmath.Matrix, got {type(x).__name__}")
    if C is not None and getattr(C, "_meta", None) is None:
        raise DMathError(f"gemm: C must be a dmath.Matrix or None, got {type(C).__name__}")
    trans_a, trans_b = _flag(trans_a, "trans_a"), _flag(trans_b, "trans_b")
    alpha, beta = _scalar(alpha, "alpha"), _scalar(beta, "beta")
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
    return _Decision(plan, shapes, dtype, static, out, kept)


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
        want, dtype = c.layout, c.dtype
    else:
        dtype = np.result_type(a.dtype, b.dtype).name
        want = None if layout is None else new_meta(layout, (m, n), dtype).layout
    a_op = a.layout.transposed(P) if trans_a else a.layout
    b_op = b.layout.transposed(P) if trans_b else b.layout
    return a_op, b_op, want, ((m, k), (k, n)), dtype


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
        dispatch("gemm", [A, B, C], (2,), static=d.static, scalars=scalars)
        if d.kept:
            _record_copies(runtime(), d.kept, (A._handle, B._handle), written=C._handle)
        return C
    result = dispatch("gemm", [A, B], (d.out,), static=d.static, scalars=scalars)[0][0]
    if d.kept:
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
    if not _is_matrix(M):
        raise DMathError(f"replicate needs a dmath.Matrix, got {type(M).__name__}")
    wait = _flag(wait, "wait")
    rt = runtime()
    layout = Replicated(tuple(range(rt.nworkers)))
    dispatch("replicate", [M], static=(layout, wait))
    rt.replicas.store(M._handle, (layout, M.dtype.name), M.nbytes)     # the copy the workers keep
    return M
