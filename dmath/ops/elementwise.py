"""The elementwise family: n-ary functions over aligned pieces, with row/column-vector broadcasting.

One op unit (`ewise`) serves every function. A function is one `function(...)`
definition below: its name, operand names, how it computes into `out` with
the array module, how a Partial (sum of addends) operand may pass through it,
its docstring and, where dnn differentiates it, its gradient; the definition
returns the public function that `dmath/__init__.py` exports. Nothing else
names it (dnn's differentiable function of the same name reads the gradient
from the public function: `dnn/ops/elementwise.py`).

Master half (`apply`): validate, then align the operands (a cached pure plan):
the result takes the layout of the first operand of the result's shape;
other full-size operands are remapped to it; a row or column vector stays
where it is when every worker already holds the part its result pieces need
(a RowBlock column beside a RowBlock matrix), else it is replicated on the
workers that hold result pieces. Worker half (the kernel): combine local
pieces (and slices of the vectors' local pieces), one pass, written straight
into the result.
"""
import functools
import inspect
from typing import NamedTuple, Optional

import numpy as np

from .. import backend, memory
from ..errors import DMathError, LayoutError, ShapeError
from ..layout import Replicated, RowBlock, distribution
from ..layout import indexset as ix
from ..runtime import Meta, Shard, define, runtime
from .base import Known, as_list, check_scalar, dispatch, dispatch_known, is_matrix, meta
from .movement import remap, resolve_partial


class Function(NamedTuple):
    """One elementwise function of the family."""
    name: str
    params: tuple          # operand names, as the public function takes them
    compute: object        # f(xp, out, *operands): writes the result into out
    partial: Optional[str]  # 'linear': Partial operands stay Partial when all are alike (a sum of
    #                         addends maps to a sum); 'scale': a Partial first operand and scalars
    #                         only (each addend scaled); None: Partial operands are summed first
    cuda: Optional[str]    # the value as a CUDA C expression of the operands (named as in params,
    #                         each of the computing type C: float, or double for float64 results), for
    #                         the GPU kernel's one-launch path (elementwise_cuda.py); None: CuPy's
    typed: Optional[tuple]  # the operands whose dtypes the result's is promoted from (None: all; where:
    #                         the values, not the condition, as in NumPy)


#: name -> Function
FUNCTIONS = {}
#: the names of the public functions, in the order defined (dmath/__init__.py exports them): every
#: function but those whose only face is a Matrix operator
PUBLIC = []


def function(name, params, compute, doc, partial=None, grad=None, cuda=None, typed=None, operator=None):
    """Define elementwise function `name` with operands `params`; returns its public function.

    compute(xp, out, *operands) writes the value with the array module (every
    backend); cuda, where given, is the same value as one CUDA C expression,
    which GPUs launch directly for operands that are whole contiguous pieces
    and scalars. The two must agree bit for bit, as CuPy computes: each
    operand converted to the result's type (float for float16, whose result
    is rounded once at the end), scalars rounded to the result's dtype first.

    grad: for a function of one operand, g(x, y, gy) giving x's gradient from
    the operand x, the result y and y's gradient gy (reverse mode: gy times
    the derivative), written with dmath operations. The public function
    carries it as its `grad` attribute (`dmath.tanh.grad`), which dnn
    differentiates `name` with.

    typed: the names of the operands whose dtypes the result's dtype is
    promoted from (None: every operand's); a matrix result of scalars only
    takes the other operands' dtype.

    operator: the Matrix operator ('+', ...) that is the function's only
    public face; None: dmath exports the function under `name`.
    """
    if name in FUNCTIONS:
        raise ValueError(f"elementwise function {name!r} defined twice")
    if partial not in (None, "linear", "scale"):
        raise ValueError(f"{name}: partial must be None, 'linear' or 'scale', got {partial!r}")
    if grad is not None and len(params) != 1:
        raise ValueError(f"{name}: a gradient is defined for functions of one operand only")
    typed = None if typed is None else tuple(params.index(p) for p in typed)
    FUNCTIONS[name] = Function(name, tuple(params), compute, partial, cuda, typed)
    if operator is None:
        PUBLIC.append(name)
    sig = inspect.Signature([inspect.Parameter(p, inspect.Parameter.POSITIONAL_OR_KEYWORD) for p in params])

    arity = len(params)

    def public(*operands, **named):
        if named or len(operands) != arity:   # rare: the common call binds nothing (dispatch cost)
            operands = sig.bind(*operands, **named).args    # a wrong call: Python's TypeError
        return apply(name, *operands)
    public.__name__ = public.__qualname__ = name
    public.__doc__ = doc
    public.__signature__ = sig
    public.grad = grad
    return public


class _Ufunc(NamedTuple):
    """f(xp, out, *args): the array module's ufunc `name`, written straight into `out` (one pass, no
    temporary). A comparison or logical ufunc writes its booleans as 0/1 in out's dtype. The kernel
    looks the ufunc up once per signature and calls it directly (`_prepared`)."""
    name: str

    def __call__(self, xp, out, *args):
        return getattr(xp, self.name)(*args, out=out)


_ufunc = _Ufunc


def _sigmoid(xp, out, a):
    # tanh form: no overflow for large |a|
    return xp.multiply(xp.tanh(0.5 * a) + 1.0, 0.5, out=out)


def _sum_n(xp, out, *ops):
    """The sum of three or four operands left to right, as the CUDA expression adds them: in the
    result's dtype (float32 for float16, rounded once at the end)."""
    if out.dtype == np.float16:
        acc = xp.add(ops[0], ops[1], dtype=np.float32)
        for o in ops[2:]:
            acc = xp.add(acc, o, dtype=np.float32)
        out[...] = acc
        return out
    xp.add(ops[0], ops[1], out=out)
    for o in ops[2:]:
        xp.add(out, o, out=out)
    return out


def _where(xp, out, c, a, b):
    return backend.current().where(out, c, a, b)


# ---- the functions (the public API names; arithmetic operators use the first four) ----------
# NaN wins in maximum and minimum, as in NumPy (dm_nan: CUDA has no NAN macro under NVRTC)
_MAX = "(isnan(a) || isnan(b)) ? dm_nan<C>() : fmax(a, b)"
_MIN = "(isnan(a) || isnan(b)) ? dm_nan<C>() : fmin(a, b)"
add = function("add", ("a", "b"), _ufunc("add"), "a + b elementwise.", partial="linear", cuda="a + b",
               operator="+")
# the terms of add_n, one pass for three or four of them (not exported: add_n is their public face)
_add3 = function("add3", ("a", "b", "c"), _sum_n, "a + b + c elementwise.", partial="linear", cuda="a + b + c",
                 operator="add_n")
_add4 = function("add4", ("a", "b", "c", "d"), _sum_n, "a + b + c + d elementwise.", partial="linear",
                 cuda="a + b + c + d", operator="add_n")
sub = function("sub", ("a", "b"), _ufunc("subtract"), "a - b elementwise.", partial="linear", cuda="a - b",
               operator="-")
mul = function("mul", ("a", "b"), _ufunc("multiply"), "a * b elementwise.", partial="scale", cuda="a * b",
               operator="*")
div = function("div", ("a", "b"), _ufunc("true_divide"), "a / b elementwise.", partial="scale", cuda="a / b",
               operator="/")
neg = function("neg", ("m",), _ufunc("negative"), "-m elementwise.", partial="linear", cuda="-m",
               operator="unary -")
pow = function("pow", ("m", "p"), _ufunc("power"), "m ** p elementwise.", cuda="pow(m, p)")      # noqa: A001
maximum = function("maximum", ("a", "b"), _ufunc("maximum"), "The larger of a and b elementwise.", cuda=_MAX)
minimum = function("minimum", ("a", "b"), _ufunc("minimum"), "The smaller of a and b elementwise.", cuda=_MIN)
where = function("where", ("cond", "a", "b"), _where,
                 "Elementwise `a` where `cond` is non-zero, else `b` (matrices or scalars); the result "
                 "takes the dtype of a and b (of cond when both are scalars).", typed=("a", "b"))
exp = function("exp", ("m",), _ufunc("exp"), "e ** m elementwise.",
               grad=lambda x, y, gy: gy * y, cuda="exp(m)")
log = function("log", ("m",), _ufunc("log"), "The natural logarithm elementwise.",
               grad=lambda x, y, gy: gy / x, cuda="log(m)")
sqrt = function("sqrt", ("m",), _ufunc("sqrt"), "The square root elementwise.", cuda="sqrt(m)")
abs = function("abs", ("m",), _ufunc("absolute"), "|m| elementwise.", cuda="fabs(m)")          # noqa: A001
# the gradients of tanh and sigmoid read the result only
tanh = function("tanh", ("m",), _ufunc("tanh"), "The hyperbolic tangent elementwise.",
                grad=lambda x, y, gy: gy - gy * (y * y), cuda="tanh(m)")
sigmoid = function("sigmoid", ("m",), _sigmoid, "1 / (1 + e ** -m) elementwise.",
                   grad=lambda x, y, gy: gy * (y - y * y))
# y > 0 exactly where x > 0 (the subgradient at 0 is 0, as PyTorch's)
relu = function("relu", ("m",), lambda xp, out, a: xp.maximum(a, 0, out=out), "max(m, 0) elementwise.",
                grad=lambda x, y, gy: where(y, gy, 0.0), cuda="isnan(m) ? dm_nan<C>() : fmax(m, (C)0)")

# comparisons and logic: 1 where true, else 0, in the operands' dtype (NumPy's type promotion)
equal = function("equal", ("a", "b"), _ufunc("equal"), "1 where a == b, else 0.", cuda="a == b")
not_equal = function("not_equal", ("a", "b"), _ufunc("not_equal"), "1 where a != b, else 0.", cuda="a != b")
greater = function("greater", ("a", "b"), _ufunc("greater"), "1 where a > b, else 0.", cuda="a > b")
greater_equal = function("greater_equal", ("a", "b"), _ufunc("greater_equal"), "1 where a >= b, else 0.",
                         cuda="a >= b")
less = function("less", ("a", "b"), _ufunc("less"), "1 where a < b, else 0.", cuda="a < b")
less_equal = function("less_equal", ("a", "b"), _ufunc("less_equal"), "1 where a <= b, else 0.", cuda="a <= b")
isfinite = function("isfinite", ("m",), _ufunc("isfinite"), "1 where m is neither inf nor NaN, else 0.",
                    cuda="isfinite(m)")
isnan = function("isnan", ("m",), _ufunc("isnan"), "1 where m is NaN, else 0.", cuda="isnan(m)")
logical_and = function("logical_and", ("a", "b"), _ufunc("logical_and"),
                       "1 where both a and b are non-zero, else 0.", cuda="a != (C)0 && b != (C)0")
logical_or = function("logical_or", ("a", "b"), _ufunc("logical_or"), "1 where a or b is non-zero, else 0.",
                      cuda="a != (C)0 || b != (C)0")
logical_not = function("logical_not", ("m",), _ufunc("logical_not"), "1 where m is zero, else 0.",
                       cuda="m == (C)0")


def add_n(matrices):
    """The elementwise sum of the matrices of a list (one shape, or row and column vectors broadcast as
    `+` broadcasts them), left to right: one pass over up to four of them, and one more per three more,
    where a chain of `+` made a pass (and a new matrix) per operand. A float16 pass adds in float32
    and rounds once. The result takes the layout `+` gives; a list of one matrix gives its copy."""
    mats = as_list(matrices, "add_n")
    if not mats:
        raise DMathError("add_n needs at least one matrix, got an empty list")
    for i, m in enumerate(mats):
        if not is_matrix(m):
            raise DMathError(f"add_n: matrices[{i}] must be a dmath.Matrix, got {type(m).__name__}")
    if len(mats) == 1:
        return mats[0].copy()
    total, rest = _terms(mats[:4]), mats[4:]
    while rest:
        total, rest = _terms([total] + rest[:3]), rest[3:]
    return total


def _terms(mats):
    """The sum of two to four matrices in one pass."""
    return {2: add, 3: _add3, 4: _add4}[len(mats)](*mats)


# ---- the op unit -------------------------------------------------------------------------------
class EwiseArgs(NamedTuple):
    """Static arguments of `ewise`."""
    fn: str               # the Function's name
    pattern: tuple        # per operand: (kind, index) with kind 'full', 'row', 'col', 'one' or 'scalar'
    out_index: Optional[int]   # the input overwritten in place, or None: a new result


EWISE = define("ewise", EwiseArgs)


def apply(fn, *operands, inplace=False):
    """Master half: validate, align and dispatch elementwise function `fn` of matrices and scalars."""
    metas = []
    for x in operands:
        m = getattr(x, "_meta", None)      # a Matrix (one attribute lookup: this runs per operand)
        if m is None:
            if isinstance(x, np.ndarray):
                raise DMathError(f"{fn}: numpy arrays must be made Matrices first (dmath.from_numpy)")
            check_scalar(x, f"{fn}: an operand")
        metas.append(m)
    if inplace and metas and metas[0] is not None:
        operands[0]._check_writable(f"in-place {fn}")
    # the whole decision is a pure function of the metadata, cached: a repeated
    # operation costs a dictionary lookup before its command is sent
    metas = tuple(metas)
    p = plan(fn, metas, inplace, runtime().nworkers)
    if p.scales_partial and not _addends_may_scale(FUNCTIONS[fn], operands[1:], inplace):
        return _summed_first(fn, operands, inplace)
    if p.aligned:       # every operand already where the result needs it (the usual case)
        if p.scalars:
            inputs, scalars = [], []
            for x, m in zip(operands, metas):
                if m is None:
                    scalars.append(float(x))
                else:
                    inputs.append(x)
        else:
            inputs, scalars = operands, ()
        new = dispatch_known(p.known, "ewise", inputs, p.in_metas, p.outputs, p.args, scalars)[0]
    else:
        inputs, scalars = [], []
        for x, (how, target) in zip(operands, p.aligns):
            if how == "scalar":
                scalars.append(float(x))
                continue
            if how == "resolve":
                x = resolve_partial(x)
            elif how == "remap":
                x = remap(x, target)      # a Partial operand reduces straight into place
            inputs.append(x)
        new = dispatch("ewise", inputs, p.outputs, static=p.args, scalars=scalars)[0]
    return operands[0] if inplace else new[0]


class Plan(NamedTuple):
    """What `plan` decides for an elementwise call."""
    aligns: tuple         # per operand: (how, target layout): 'as-is', 'scalar', 'resolve' or 'remap'
    args: "EwiseArgs"
    out: Optional[Meta]   # the new result's Meta, or None in place
    aligned: bool         # no operand moves
    outputs: tuple        # the command's outputs: (out,), or (0,) in place
    scalars: int          # how many operands are scalars
    in_metas: tuple       # the Metas of the matrix operands (the command's inputs when aligned)
    known: Known          # the command's Entry once sent (when aligned: the plan determines the command)
    scales_partial: bool  # a Partial operand stays Partial, each addend scaled ('scale'), where
    #                       `_addends_may_scale` allows


def _partial_stays(f, metas, lay, shape, inplace):
    """Whether a Partial result of layout `lay` is right for function f: only for functions linear
    in the addends; a scalar term is not (every member would add it: P times in the sum)."""
    mats = [m for m in metas if m is not None]
    if f.partial == "linear":
        alike = len(mats) == len(metas) and all(m.layout == lay and m.shape == shape for m in mats)
        # a new matrix: one operand (negation) only. Two Partial matrices added addend by addend
        # overflow where an addend does, though the total may not (1e308 and -1e308 on two workers:
        # 0 + 0 made NaN); summed first, the result is the same at every worker count. In place
        # (M += N on a Partial M) the addends are what is written: added one by one, as documented
        return alike and (inplace or len(mats) == 1)
    if f.partial == "scale":
        return len(mats) == 1 and metas[0] is not None
    return False


@functools.lru_cache(maxsize=4096)
def plan(fn, metas, inplace, nworkers):
    """The `Plan` of an elementwise call (alignment, EwiseArgs, output Meta, ...): a pure function."""
    f = FUNCTIONS.get(fn)
    if f is None:
        raise DMathError(f"unknown elementwise function {fn!r}")
    if len(metas) != len(f.params):
        raise DMathError(f"{fn} takes {len(f.params)} operands, got {len(metas)}")
    mats = [m for m in metas if m is not None]
    if not mats:
        raise DMathError(f"{fn} needs at least one dmath.Matrix operand")
    try:
        shape = tuple(np.broadcast_shapes(*[m.shape for m in mats]))
    except ValueError as exc:
        raise ShapeError(f"{fn}: shapes {[m.shape for m in mats]} do not broadcast "
                         f"(a (1, n) row or (m, 1) column vector broadcasts against (m, n))") from exc
    if inplace and metas[0].shape != shape:
        raise ShapeError(f"in-place {fn}: the result shape {shape} differs from the target's {metas[0].shape}")
    typed = mats if f.typed is None else [metas[k] for k in f.typed if metas[k] is not None] or mats
    dtype = metas[0].dtype if inplace else np.result_type(*[m.dtype for m in typed]).name
    # the result takes the layout of the first operand of its shape; a row
    # vector against a column vector (an outer broadcast) has none: RowBlock
    primary = 0 if inplace else next((k for k, m in enumerate(metas) if m is not None and m.shape == shape),
                                     None)
    lay = metas[primary].layout if primary is not None else RowBlock()
    if lay.partial and not _partial_stays(f, metas, lay, shape, inplace):
        if inplace:
            raise LayoutError(f"in-place {fn} on a Partial matrix is not linear in its addends; "
                              f"remap it first (M = M.remap(dmath.RowBlock()))")
        lay = RowBlock(lay.group)
    pdist = distribution(lay, shape, nworkers)
    rep = Replicated(tuple(r for r in range(nworkers) if pdist.pieces[r]) or (0,))
    aligns, pattern, n_in, n_sc = [], [], 0, 0
    for k, m in enumerate(metas):
        if m is None:
            aligns.append(("scalar", None))
            pattern.append(("scalar", n_sc))
            n_sc += 1
            continue
        if m.shape == shape:
            here = distribution(m.layout, shape, nworkers)
            if here.same_placement(pdist):
                aligns.append(("as-is", None))
            elif k == primary and m.layout.partial and lay == RowBlock(m.layout.group):
                aligns.append(("resolve", None))
            else:
                aligns.append(("remap", lay))
            kind = "full"
        else:
            here = distribution(m.layout, m.shape, nworkers)
            kind = "one" if m.shape == (1, 1) else ("row" if m.shape[0] == 1 else "col")
            if kind == "one":
                held = here.same_placement(distribution(rep, m.shape, nworkers))
            else:       # a vector already split as the result is (a RowBlock column beside RowBlock rows) stays
                held = all(holding_piece(mine, p, kind) is not None
                           for mine, need in zip(here.pieces, pdist.pieces) for p in need) and not here.partial
            aligns.append(("as-is", None) if held else ("remap", rep))
        pattern.append((kind, n_in))
        n_in += 1
    out = None if inplace else Meta(lay.resolved(nworkers), shape, dtype)
    args = EWISE.static(fn=fn, pattern=tuple(pattern), out_index=0 if inplace else None)
    return Plan(tuple(aligns), args, out, all(how in ("as-is", "scalar") for how, _ in aligns),
                (0,) if inplace else (out,), n_sc, tuple(mats), Known(), bool(lay.partial) and f.partial == "scale")


def holding_piece(pieces, p, kind):
    """(index, local positions) of the first of a worker's vector `pieces` that holds every row (kind
    'col') or column ('row') result piece `p` needs, the positions of those in it (a slice when they
    are one run, else an index array); or None (a pure function: the master plans with it, every
    worker selects with it)."""
    want = p.rows if kind == "col" else p.cols
    for j, q in enumerate(pieces):
        have, other = (q.rows, q.cols) if kind == "col" else (q.cols, q.rows)
        if other and ix.size(ix.intersect(want, have)) == ix.size(want):     # `other`: the vector's one index
            return j, ix.positions(want, have)
    return None


def _addends_may_scale(f, scalars, inplace):
    """Whether 'scale' function f by `scalars` may scale a Partial matrix's addends one by one, by its
    factor f(1, s). An infinite factor, or a division by 0, turns the zero addends into NaN where the
    sum's value is +-inf: never. A new matrix: only a factor of magnitude at most 1, which cannot
    overflow an addend and rounds each within the error of the addends' sum itself (addends 1e308
    and -1e308 times 10 made inf - inf = NaN, the value 0 * 10). In place the addends are what is
    written: any finite factor."""
    with np.errstate(all="ignore"):
        factors = [f.compute(np, None, 1.0, float(v)) for v in scalars]
    # (np.abs: `abs` is dmath's function in this module)
    return all(np.isfinite(x) if inplace else np.abs(x) <= 1.0 for x in factors)


def _summed_first(fn, operands, inplace):
    """`apply` of 'scale' function fn whose factor may not scale the addends (`_addends_may_scale`): the
    Partial operand summed first."""
    if inplace:
        raise LayoutError(f"in-place {fn} of a Partial matrix by {operands[1]!r} is not exact on its addends "
                          f"(zero addends become NaN); remap it first (M = M.remap(dmath.RowBlock()))")
    return apply(fn, resolve_partial(operands[0]), *operands[1:])


# ---- worker half -------------------------------------------------------------------------------
def _prepared(call):
    """What the kernel derives from its signature, worked out on the first command only:
    (the ufunc to call or None, else the Function's compute, the result's piece shapes or None when
    written in place, its dtype and distribution, per output piece the operand selections, and for
    the usual case, a ufunc into one new piece of whole pieces and scalars, per operand
    (True, input index) or (False, scalar index); else None)."""
    prep = call.entry.cache.get("prep")
    if prep is not None:
        return prep
    args = call.entry.static
    compute = FUNCTIONS[args.fn].compute
    ufunc = getattr(backend.current().xp, compute.name) if isinstance(compute, _Ufunc) else None
    if args.out_index is None:
        out_meta, dist = call.entry.outputs[0], call.entry.out_dists[0]
        shapes, dtype = tuple(p.shape for p in dist.pieces[call.rank]), out_meta.dtype
    else:
        shapes, dtype, dist = None, None, None
    selections = _operand_selections(call)
    simple = None
    if ufunc is not None and shapes is not None and len(selections) == 1 \
            and all(what in ("piece", "scalar") for what, _, _ in selections[0]):
        simple = tuple((what == "piece", idx) for what, idx, _ in selections[0])
    prep = call.entry.cache["prep"] = (ufunc, compute, shapes, dtype, dist, selections, simple)
    return prep


def _operand_selections(call):
    """Per output piece, per operand: how to read it (piece index, (vector piece, local positions), or
    scalar)."""
    xp = backend.current().xp
    args = call.entry.static
    dist = call.entry.out_dists[0] if args.out_index is None else call.entry.in_dists[args.out_index]
    to_dev = (lambda s: s if isinstance(s, slice) else xp.asarray(s))
    in_dists = call.entry.in_dists
    sel = []
    for k, p in enumerate(dist.pieces[call.rank]):
        row = []
        for kind, idx in args.pattern:
            if kind == "full":
                row.append(("piece", idx, k))
            elif kind in ("row", "col"):    # a vector: the local positions of this piece's columns/rows
                j, at = holding_piece(in_dists[idx].pieces[call.rank], p, kind)
                row.append(("cols" if kind == "row" else "rows", idx, (j, to_dev(at))))
            elif kind == "one":        # (1, 1)
                row.append(("one", idx, None))
            else:                      # a dynamic scalar
                row.append(("scalar", idx, None))
        sel.append(tuple(row))
    return tuple(sel)


@EWISE.kernel(capturable=True, local=True)
def _ewise(call):
    """Function `fn` of the aligned operands, into a new result or in place into input `out_index`.

    Local (the master may queue it): the master half aligned every operand before this command."""
    ufunc, compute, shapes, dtype, dist, selections, simple = _prepared(call)
    if simple is not None:
        # the usual case (one new piece of whole pieces and scalars): what the loops below do, without
        # their per-operand branches (this runs once per operation on every worker)
        ins, scalars = call.inputs, call.scalars
        operands = []
        for piece, idx in simple:
            operands.append(ins[idx].pieces[0] if piece else scalars[idx])
        out = memory.empty(shapes[0], dtype)
        with backend.current().quiet():
            ufunc(*operands, out=out)
        return [Shard([out], dist, dtype)]
    if shapes is not None:
        empty = memory.empty
        out = [empty(s, dtype) for s in shapes]
    else:
        target = call.inputs[call.entry.static.out_index]
        out = target.pieces
    ins = call.inputs
    be = backend.current()
    with be.quiet():
        for k, row in enumerate(selections):
            operands = []
            for what, idx, s in row:
                if what == "piece":
                    operands.append(ins[idx].pieces[s])
                elif what == "scalar":
                    operands.append(call.scalars[idx])   # a Python float: no device transfer
                elif what == "cols":
                    operands.append(ins[idx].pieces[s[0]][:, s[1]])
                elif what == "rows":
                    operands.append(ins[idx].pieces[s[0]][s[1], :])
                else:                  # "one"
                    operands.append(ins[idx].pieces[0])
            if ufunc is not None:
                ufunc(*operands, out=out[k])
            else:
                compute(be.xp, out[k], *operands)
    if shapes is None:
        target.version += 1
        return [target]
    return [Shard(out, dist, dtype)]
