"""Elementwise kernels: n-ary functions over aligned pieces, with row/column-vector broadcasting.

The master aligns the operands before dispatch: full-size operands are
remapped to the result's layout, vectors to Replicated, so that a kernel only
ever combines local pieces (and slices of replicated vectors).
"""
import numpy as np

from .. import backend, memory
from ..layout import indexset as ix
from ..runtime import Shard, kernel


def _sigmoid(xp, out, a):
    # tanh form: no overflow for large |a|
    return xp.multiply(xp.tanh(0.5 * a) + 1.0, 0.5, out=out)


def _ufunc(name):
    """f(xp, out, *args): the array module's ufunc `name`, written straight into `out` (one pass, no
    temporary: an elementwise command reads its operands and writes its result once)."""
    return lambda xp, out, *args: getattr(xp, name)(*args, out=out)


#: name -> (function of (xp, out, *args) that writes the result into out, number of operands)
FUNCTIONS = {
    "add": (_ufunc("add"), 2),
    "sub": (_ufunc("subtract"), 2),
    "mul": (_ufunc("multiply"), 2),
    "div": (_ufunc("true_divide"), 2),
    "pow": (_ufunc("power"), 2),
    "maximum": (_ufunc("maximum"), 2),
    "minimum": (_ufunc("minimum"), 2),
    "where": (lambda xp, out, c, a, b: backend.current().where(out, c, a, b), 3),
    "neg": (_ufunc("negative"), 1),
    "exp": (_ufunc("exp"), 1),
    "log": (_ufunc("log"), 1),
    "sqrt": (_ufunc("sqrt"), 1),
    "abs": (_ufunc("absolute"), 1),
    "tanh": (_ufunc("tanh"), 1),
    "sigmoid": (_sigmoid, 1),
    "relu": (lambda xp, out, a: xp.maximum(a, 0, out=out), 1),
}

#: functions for which a Partial (sum of addends) operand can stay Partial
LINEAR = {"add", "sub", "neg"}


def _operand_selections(call):
    """Per output piece, per operand: how to read it (piece index, vector slice, or scalar)."""
    sel = call.entry.cache.get("sel")
    if sel is not None:
        return sel
    xp = backend.current().xp
    fn, pattern, out_index = call.entry.static
    dist = call.entry.out_dists[0] if out_index is None else call.entry.in_dists[out_index]
    to_dev = (lambda s: s if isinstance(s, slice) else xp.asarray(s))
    sel = []
    for k, p in enumerate(dist.pieces[call.rank]):
        row = []
        for kind, idx in pattern:
            if kind == "full":
                row.append(("piece", idx, k))
            elif kind == "row":        # (1, n): columns of this piece
                row.append(("cols", idx, to_dev(ix.selection(p.cols))))
            elif kind == "col":        # (m, 1): rows of this piece
                row.append(("rows", idx, to_dev(ix.selection(p.rows))))
            elif kind == "one":        # (1, 1)
                row.append(("one", idx, None))
            else:                      # a dynamic scalar
                row.append(("scalar", idx, None))
        sel.append(row)
    call.entry.cache["sel"] = sel
    return sel


@kernel("ewise", capturable=True)
def _ewise(call):
    """static = (function, operand pattern, index of the input overwritten in place or None)."""
    xp = backend.current().xp
    fn, pattern, out_index = call.entry.static
    f = FUNCTIONS[fn][0]
    if out_index is None:
        out_meta, dist = call.entry.outputs[0], call.entry.out_dists[0]
        dtype = out_meta.dtype
        out = [memory.empty(p.shape, dtype) for p in dist.pieces[call.rank]]
    else:
        target = call.inputs[out_index]
        dtype, out = target.dtype, target.pieces
    ins = call.inputs
    with backend.current().quiet():
        for k, row in enumerate(_operand_selections(call)):
            args = []
            for what, idx, s in row:
                if what == "piece":
                    args.append(ins[idx].pieces[s])
                elif what == "cols":
                    args.append(ins[idx].pieces[0][:, s])
                elif what == "rows":
                    args.append(ins[idx].pieces[0][s, :])
                elif what == "one":
                    args.append(ins[idx].pieces[0])
                else:
                    args.append(call.scalars[idx])   # a Python float: no device transfer
            f(xp, out[k], *args)
    if out_index is not None:
        target.version += 1
        return [target]
    return [Shard(out, dist, dtype)]
