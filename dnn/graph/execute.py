"""Running a graph: topological order, forward evaluation, reverse-mode gradients."""
import itertools

import dmath

from ..errors import GraphError
from .function import GradientTerms
from .node import Node, Placeholder


def _before(node):
    """The nodes that must run before `node`: its inputs, then its ordering edges (`Node.after`)."""
    return itertools.chain(node.inputs, node.after) if node.after else iter(node.inputs)


def topological_order(outputs):
    """Every node the `outputs` depend on, each after all of its inputs and of the nodes it is
    ordered after (`Node.after`); iterative: deep graphs are fine."""
    order, state = [], {}          # state: 1 = on the stack, 2 = done
    for root in outputs:
        if not isinstance(root, Node):
            raise GraphError(f"expected graph nodes, got {type(root).__name__}")
        stack = [(root, _before(root))]
        if state.get(root.id) == 2:
            continue
        state[root.id] = 1
        while stack:
            node, children = stack[-1]
            child = next(children, None)
            if child is None:
                stack.pop()
                state[node.id] = 2
                order.append(node)
            elif state.get(child.id) is None:
                state[child.id] = 1
                stack.append((child, _before(child)))
    return order


class Releases:
    """When a training step may drop each computed value: right after the last forward or backward
    step that reads it (PyTorch frees what autograd saved as each node's backward runs).

    forward[i]: nodes whose value goes after the forward of order[i]; backward[j]: after step j of
    the backward pass (order reversed). A value is read by the forward of its consumers, by the
    backward of the consumers on the gradient path that save it (`Function.saves_input`), and by its own
    backward when its function declares `saves_output`. Pure: built once per graph.
    """

    def __init__(self, order, wrt, keep=()):
        needed = needed_ids(order, {n.id for n in wrt})
        n = len(order)
        last_fwd, last_bwd = {}, {}
        for i, node in enumerate(order):
            if node.fn is None:
                continue
            runs_backward = node.id in needed
            j = n - 1 - i                           # this node's step in the backward pass
            for k, x in enumerate(node.inputs):
                last_fwd[x.id] = i
                if runs_backward and node.fn.saves_input(k):
                    last_bwd[x.id] = max(last_bwd.get(x.id, j), j)
            if runs_backward and node.fn.saves_output:
                last_bwd[node.id] = max(last_bwd.get(node.id, j), j)
        kept = {k.id for k in keep}
        self.forward = [[] for _ in range(n)]
        self.backward = [[] for _ in range(n)]
        for i, node in enumerate(order):
            if node.fn is None or node.id in kept:
                continue
            if node.id in last_bwd:
                self.backward[last_bwd[node.id]].append(node)
            else:
                self.forward[last_fwd.get(node.id, i)].append(node)


def _drop(nodes):
    for node in nodes:
        node.value = None


def forward(outputs, order=None, releases=None, given=()):
    """Evaluate `outputs` (and everything before them); `order` may be a cached topological order.

    releases: None, or the graph's `Releases`: each value no backward step reads is dropped as soon
    as its last consumer has run. given: ids of function nodes whose values the caller has set
    (a training step's weight casts, made together in one command): they are not computed again."""
    for i, node in enumerate(order if order is not None else topological_order(outputs)):
        if node.id in given:
            if node.value is None:
                raise GraphError(f"{node.name} was to be given a value before evaluation, and has none")
        elif node.fn is None:
            if node.value is None:
                kind = "fed (Placeholder.feed)" if isinstance(node, Placeholder) else "given"
                raise GraphError(f"{node.name} has no value: it must be {kind} before evaluation")
        else:
            node.value = node.fn.forward(*[x.value for x in node.inputs])
        if releases is not None:
            node.layout = node.value.layout     # what Model.summary shows once the value is gone
            _drop(releases.forward[i])
    return [node.value for node in outputs]


def needed_ids(order, targets):
    """Ids of the nodes on a path from a target id to the end of `order` (those a gradient flows through)."""
    needed = set()
    for node in order:
        if node.id in targets or (node.fn is not None and any(x.id in needed for x in node.inputs)):
            needed.add(node.id)
    return needed


def backward(loss, wrt, seed=None, order=None, ready=None, releases=None):
    """Gradients of `loss` with respect to the nodes `wrt` (a list of matrices, None where no path).

    seed: the gradient of `loss` itself (a dmath.Matrix of its shape); None
    means ones. A node read by several consumers gets the sum of their
    gradients. Only nodes on a path from some `wrt` to `loss` are visited,
    and a function is asked only for the input gradients that are needed
    (so the first layer never computes a gradient for the data).
    ready: None, or f(k, gradient) -> gradient, called as soon as the
    gradient of wrt[k] is complete (its last consumer is done), while the
    rest of the backward pass is still to be issued: data parallelism starts
    that gradient's all-reduce there, so it overlaps the layers below. It
    may return None for a target that passes no gradient on (a weight or
    its cast): the caller took the gradient (a bucket sums it later) and
    the returned list holds None there, so no reference here keeps it.
    releases: None, or the `Releases` of (order, wrt): each value is dropped after the last
    backward step that reads it, and each function forgets what its forward saved (masks,
    indices) once its backward has run. A function is handed the only reference to its output's
    gradient, so a gradient it replaces (a relu mask applied) is freed at once.
    """
    order = order if order is not None else topological_order([loss])
    if loss.value is None:
        raise GraphError(f"{loss.name} has not been evaluated: run forward (or node.eval()) first")
    targets = {n.id for n in wrt}
    needed = needed_ids(order, targets)
    if seed is None:
        seed = dmath.ones(loss.shape, dtype=loss.dtype, layout=plain_layout(loss.value))
    elif tuple(seed.shape) != loss.shape:
        raise GraphError(f"the seed gradient must have the loss's shape {loss.shape}, got {tuple(seed.shape)}")
    grads = {loss.id: seed}
    # consumers still to contribute to each target's gradient (for `ready`)
    waiting = {}
    if ready is not None:
        for node in order:
            if node.fn is not None and node.id in needed:
                for x in node.inputs:
                    if x.id in targets:
                        waiting[x.id] = waiting.get(x.id, 0) + 1
        index = {n.id: k for k, n in enumerate(wrt)}
    for j, node in enumerate(reversed(order)):
        if node.id not in grads or node.fn is None or node.id not in needed:
            if releases is not None:
                _drop(releases.backward[j])
            continue
        needs = tuple(x.id in needed for x in node.inputs)
        if not any(needs):
            # a target none of whose inputs needs a gradient (a weight's cast): its own gradient stays
            if releases is not None:
                node.fn.drop_saved()
                _drop(releases.backward[j])
            continue
        # an intermediate gradient leaves `grads` as it is used: the function holds the only reference
        gy = _settled(grads, node, node.id in targets)
        if node.id not in targets:
            del grads[node.id]
        gxs = node.fn.backward([x.value for x in node.inputs], node.value, gy, needs)
        if releases is not None:
            node.fn.drop_saved()
            _drop(releases.backward[j])
        if len(gxs) != len(node.inputs):
            raise GraphError(f"{node.fn.name}.backward returned {len(gxs)} gradients for "
                             f"{len(node.inputs)} inputs")
        for x, gx, need in zip(node.inputs, gxs, needs):
            if not need or gx is None:
                continue
            if gx.dtype != x.dtype:
                gx = gx.astype(x.dtype)     # a gradient has its node's precision
            prev = grads.get(x.id)
            if prev is None:
                grads[x.id] = gx
            elif isinstance(prev, _Terms):
                prev.append(gx)
            else:
                # added when x's gradient is read: by x's backward as its kernels read them (two terms
                # to a function that takes_gradient_terms), or by one pass of dmath.add_n
                grads[x.id] = _Terms([prev, gx])
        if ready is not None:
            for x in node.inputs:
                if x.id in waiting:
                    waiting[x.id] -= 1
                    if waiting[x.id] == 0 and x.id in grads and x.id in index:
                        g = ready(index[x.id], _settled(grads, x, True))
                        if g is not None:
                            grads[x.id] = g
                        elif x.fn is None or not any(i.id in needed for i in x.inputs):
                            del grads[x.id]
                        else:
                            raise GraphError(f"backward's ready hook took the gradient of {x.name}, which "
                                             "passes a gradient on to its inputs")
    return [_settled(grads, n, True) if n.id in grads else None for n in wrt]


class _Terms(list):
    """The contributions of several consumers to one node's gradient, kept apart until it is read, so
    that they are added in one pass (an Inception module's input: four terms, one pass where a chain
    of sums made three)."""


def _settled(grads, node, whole):
    """node's gradient as its reader takes it (stored back in grads): several terms summed by
    dmath.add_n, or two of them as GradientTerms to a function that takes_gradient_terms (its kernels
    add them as they read them) unless `whole` (a target's gradient is one matrix)."""
    g = grads[node.id]
    if isinstance(g, _Terms):
        if len(g) == 2 and not whole and node.fn is not None and node.fn.takes_gradient_terms:
            g = GradientTerms(g[0], g[1])
        else:
            g = dmath.add_n(g)
        grads[node.id] = g
    return g


def plain_layout(m):
    """m's layout, or the row blocks of its group where m is Partial (a new matrix cannot be a sum)."""
    lay = m.layout
    return dmath.RowBlock(lay.group) if lay.partial else lay
