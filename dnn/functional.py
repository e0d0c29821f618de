"""Graph models (Keras' functional API): symbolic tensors and the graph of layer calls.

    x = dnn.Input((3, 32, 32))
    h = L.Conv2D(16, 3, padding='same')(x)
    y = L.Add()([h, L.Conv2D(16, 1)(x)])
    model = dnn.Model(x, L.Dense(10, activation='softmax')(L.Flatten()(y)))

A layer called on a symbolic tensor (or, for Add and Concatenate, a list of
them) checks the shapes at once and returns the symbolic tensor of its
output; nothing is computed and no weight exists yet. `Graph` orders the
calls from a model's inputs to its outputs; the model builds each layer once
(its weights, in the model's precision) and every Program (dnn.training.programs)
turns the calls into graph nodes with `build_nodes`: one walk for a chain (a
Sequential) and for any graph, so both train through the same code.

A layer may be called more than once (shared weights); every call is a node
of its own, and the layer is listed once in `Model.layers`.
"""
import itertools
import math

from .errors import ConfigError, ShapeError
from .graph.function import Function
from .layers import Activation, Add, Concatenate, Input as InputLayer, from_config
from .ops import ConcatBatchNorm, activation as make_activation


class SymbolicTensor:
    """The output of a layer call in a graph model: its sample shape, the layer, the inbound tensors.

    Attributes:
        shape: the shape of one sample, (features,) or (C, H, W).
        layer: the layer whose call made it (an Input layer for dnn.Input's tensors).
        inbound: the symbolic tensors the call read (none for an input).
    """

    _made = itertools.count()

    def __init__(self, shape, layer, inbound=()):
        self.shape = tuple(shape)
        self.layer = layer
        self.inbound = tuple(inbound)
        self.made = next(SymbolicTensor._made)     # a tensor is made after those it reads

    def __repr__(self):
        return f"<SymbolicTensor {self.layer.name or type(self.layer).__name__} shape={self.shape}>"


def Input(shape, name=None):
    """A graph model's input: the symbolic tensor of samples of `shape`, (features,) or (C, H, W)."""
    layer = InputLayer(shape, name=name)
    return SymbolicTensor(layer.shape, layer)


def call_layer(layer, x):
    """The symbolic tensor of `layer` called on x: a symbolic tensor, or a list of them for a layer
    that joins several (Add, Concatenate); the shapes are checked here."""
    if isinstance(layer, InputLayer):
        raise ConfigError("an Input layer is not called on tensors: dnn.Input(shape) makes a graph's input")
    if getattr(layer, "joins", False):
        if not isinstance(x, (list, tuple)) or len(x) < 2 or not all(isinstance(t, SymbolicTensor) for t in x):
            raise ConfigError(f"{_label(layer)} is called on a list of two or more symbolic tensors, got {x!r}")
        inbound = tuple(x)
        shape = layer.output_shape([t.shape for t in inbound])
    else:
        if isinstance(x, (list, tuple)) and len(x) == 1:
            x = x[0]
        if not isinstance(x, SymbolicTensor):
            raise ConfigError(f"{_label(layer)} is called on one symbolic tensor (from dnn.Input or another "
                              f"layer call), got {type(x).__name__}")
        inbound = (x,)
        shape = layer.output_shape(x.shape)
    return SymbolicTensor(shape, layer, inbound)


def _label(layer):
    return f"{layer.name} ({type(layer).__name__})" if layer.name else type(layer).__name__


def _tensors(value, what):
    items = list(value) if isinstance(value, (list, tuple)) else [value]
    if not items or not all(isinstance(t, SymbolicTensor) for t in items):
        raise ConfigError(f"{what} must be a symbolic tensor or a list of them (dnn.Input(shape), layer "
                          f"calls), got {value!r}")
    if len({id(t) for t in items}) != len(items):
        raise ConfigError(f"{what} lists a tensor twice")
    return items


class Graph:
    """The layer calls of a model, from its inputs to its outputs.

    tensors: every symbolic tensor the outputs depend on, the inputs first (in their order), then
    the calls in the order they were written (so each comes after its inbound tensors, and
    `layers` lists a zoo model's layers in torchvision's order of its modules); inbound[i]: the indices of tensor i's inbound tensors; layers: each layer once, in
    the order of its first call; inputs, outputs: indices into tensors.
    """

    def __init__(self, inputs, outputs):
        inputs, outputs = _tensors(inputs, "inputs"), _tensors(outputs, "outputs")
        for t in inputs:
            if not isinstance(t.layer, InputLayer) or t.inbound:
                raise ConfigError(f"inputs must be made by dnn.Input(shape), got {t!r}")
        order = list(inputs)
        index = {id(t): i for i, t in enumerate(order)}
        for root in outputs:
            stack = [(root, iter(root.inbound))]
            if id(root) in index:
                continue
            on_stack = {id(root)}
            while stack:
                t, rest = stack[-1]
                nxt = next(rest, None)
                if nxt is None:
                    stack.pop()
                    on_stack.discard(id(t))
                    if not t.inbound and id(t) not in index:
                        raise ConfigError(f"the outputs depend on the input {t!r}, which is not among the "
                                          f"model's inputs")
                    index[id(t)] = len(order)
                    order.append(t)
                elif id(nxt) not in index and id(nxt) not in on_stack:
                    on_stack.add(id(nxt))
                    stack.append((nxt, iter(nxt.inbound)))
        order = order[:len(inputs)] + sorted(order[len(inputs):], key=lambda t: t.made)
        index = {id(t): i for i, t in enumerate(order)}
        self.tensors = order
        self.inbound = [[index[id(u)] for u in t.inbound] for t in order]
        self.inputs = list(range(len(inputs)))
        self.outputs = [index[id(t)] for t in outputs]
        consumers = [[] for _ in order]
        for i, ins in enumerate(self.inbound):
            for k in ins:
                consumers[k].append(i)
        self.consumers = consumers
        for i in self.inputs:
            if not consumers[i] and i not in self.outputs:
                raise ConfigError(f"the input {order[i]!r} reaches none of the outputs")
        layers, seen = [], set()
        for t in order:
            if id(t.layer) not in seen:
                seen.add(id(t.layer))
                layers.append(t.layer)
        self.layers = layers

    def is_chain(self):
        """True for a Sequential's graph: one input, one output, each call reading the one before."""
        return len(self.inputs) == 1 and self.outputs == [len(self.tensors) - 1] and \
            all(ins == [i - 1] for i, ins in enumerate(self.inbound) if i)

    def sample_shapes(self, i):
        """The sample shape(s) tensor i's layer reads: one shape, or a list for a joining layer."""
        shapes = [self.tensors[k].shape for k in self.inbound[i]]
        return shapes if getattr(self.tensors[i].layer, "joins", False) else shapes[0]

    def get_config(self):
        """The calls as JSON: {'layers': [config], 'calls': [[layer index, [inbound indices]]],
        'inputs': [...], 'outputs': [...]}."""
        where = {id(layer): k for k, layer in enumerate(self.layers)}
        return {"layers": [layer.get_config() for layer in self.layers],
                "calls": [[where[id(t.layer)], list(ins)] for t, ins in zip(self.tensors, self.inbound)],
                "inputs": list(self.inputs), "outputs": list(self.outputs)}


def graph_from_config(config):
    """(input tensors, output tensors) rebuilt (new layers) from Graph.get_config()'s dict; every
    index in it must be a whole number in range (ConfigError otherwise)."""
    try:
        layers = [from_config(c) for c in config["layers"]]
        tensors = []
        for li, ins in config["calls"]:
            c = len(tensors)
            layer = layers[_index(li, len(layers), f"call {c}'s layer (an index into the graph's layers)")]
            if not isinstance(ins, list):
                raise ConfigError(f"call {c}'s inbound tensors must be a list of indices, got {ins!r}")
            if not ins:
                if not isinstance(layer, InputLayer):
                    raise ConfigError(f"call {c} reads nothing but is not an Input")
                tensors.append(SymbolicTensor(layer.shape, layer))
                continue
            # a call reads tensors made before it (the calls are listed in an order that builds the graph)
            args = [tensors[_index(k, c, f"call {c} reads tensor {ins}: each index")] for k in ins]
            tensors.append(call_layer(layer, args if getattr(layer, "joins", False) else args[0]))
        ends = []
        for key in ("inputs", "outputs"):
            if not isinstance(config[key], list):
                raise ConfigError(f"the graph's {key} must be a list of tensor indices, got {config[key]!r}")
            ends.append([tensors[_index(k, len(tensors), f"{key[:-1]} {j} (a tensor index)")]
                         for j, k in enumerate(config[key])])
        return tuple(ends)
    except (KeyError, IndexError, TypeError, ValueError) as exc:
        raise ConfigError(f"malformed graph model config: {exc}") from exc


def _index(i, n, what):
    """`i` when it is a whole number in [0, n): an index of a graph config. A negative one would
    count from the end (Python's indexing) and a bool or a float pass for a number, so a crafted
    file would describe another graph, silently; ConfigError naming `what` instead."""
    if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < n:
        raise ConfigError(f"{what} must be a whole number in [0, {n}), got {i!r}")
    return i


def config_weight_shapes(config):
    """[(weight name, public shape)] that the layers of a model config (a chain's 'layers' or a
    graph's 'graph') create, found without allocating (a model file is checked with it)."""
    if config.get("graph") is not None:
        inputs, outputs = graph_from_config(config["graph"])
        graph = Graph(inputs, outputs)
    else:
        layers = [from_config(c) for c in config["layers"]]
        if not layers or not isinstance(layers[0], InputLayer):
            raise ConfigError("the model's first layer is not an Input")
        t = SymbolicTensor(layers[0].shape, layers[0])
        for layer in layers[1:]:
            t = call_layer(layer, t)
        graph = Graph(_first(t), t)
    return graph_weight_shapes(graph)


def graph_weight_shapes(graph):
    """[(weight name, public shape)] of the layers of `graph`, found without allocating anything."""
    shapes, done = [], set()
    for i, t in enumerate(graph.tensors):
        if id(t.layer) in done:
            continue
        done.add(id(t.layer))
        shapes += t.layer.weight_shapes(t.shape if not graph.inbound[i] else graph.sample_shapes(i))
    return shapes


def _first(t):
    while t.inbound:
        t = t.inbound[0]
    return t


class Columns(Function):
    """The columns [start, start + width) of the batch: one input of a model with several (the
    inputs' samples travel side by side in one batch row, so one feed serves them all)."""
    name = "input_columns"
    saves_inputs = saves_output = False

    def __init__(self, start, sample_shape):
        self.start, self.sample_shape = int(start), tuple(sample_shape)

    def infer(self, x):
        width = math.prod(self.sample_shape)
        if self.start + width > x.shape[1]:
            raise ShapeError(f"{self.name}: columns {self.start}..{self.start + width} past the batch's "
                             f"{x.shape[1]}")
        return (x.shape[0], width), x.dtype, self.sample_shape

    def forward(self, x):
        return x[:, self.start:self.start + math.prod(self.sample_shape)]

    def backward(self, xs, y, gy, needs):
        return (None,)       # the data: no gradient is ever asked for


class Head:
    """One output of a model as a Program built it: z, what the loss reads (before the output
    activation, NCHW rows); act, the output activation fused with the loss (or None); out, the
    output predict returns (after it)."""

    def __init__(self, z, act, out):
        self.z, self.act, self.out = z, act, out


def build_nodes(model, x, ctx, rows_for):
    """The graph nodes of `model`'s calls on the batch node x (a Placeholder of the inputs'
    samples side by side), through the layers.Context ctx: (a node per tensor, a Head per output).

    A model output made by an Activation (an Output layer) or by a layer with an output activation
    of its own (Dense(n, activation='softmax')) leaves that activation to the loss (dnn.losses fuses
    it exactly); as model.fuse allows, a Conv2D or BatchNorm whose only reader is a relu Activation
    runs it inside its kernel, and so does a BatchNorm with the Add it alone feeds (residual_tails);
    a Concatenate of batch norms (and their relus) is written by them in place (concat_branches).
    rows_for(node, reads): the node in the image-row order a layer reads (dnn.training.programs)."""
    graph = model.graph
    tensors = graph.tensors
    fuse = getattr(model, "fuse", True)
    tails = residual_tails(graph) if fuse is True else {}
    joins = concat_branches(graph) if fuse is True else {}
    inside = set(tails.values()) | {j for branches in joins.values() for pair in branches for j in pair
                                    if j is not None}
    values = [None] * len(tensors)
    if len(graph.inputs) == 1:
        values[0] = x
    else:
        start = 0
        for i in graph.inputs:
            values[i] = Columns(start, tensors[i].shape).apply(x)
            start += math.prod(tensors[i].shape)
    outputs = set(graph.outputs)
    heads = {}
    for i, t in enumerate(tensors):
        if values[i] is not None or i in inside:     # (computed by the Add or Concatenate it feeds)
            continue
        layer = t.layer
        if i in tails:
            _residual_tail(graph, values, i, tails[i], ctx, rows_for, outputs)
            continue
        if i in joins:
            _concat_in_place(graph, values, i, joins[i], ctx, rows_for)
            continue
        ins = [rows_for(values[k], layer.image_rows) for k in graph.inbound[i]]
        arg = ins if getattr(layer, "joins", False) else ins[0]
        readers = graph.consumers[i]
        if i in outputs:
            if isinstance(layer, Activation):
                z = rows_for(values[graph.inbound[i][0]], "nchw")
                heads[i] = Head(z, layer.activation, layer(z, ctx))
            elif getattr(layer, "activation", None) is not None and hasattr(layer, "pre_activation"):
                z = rows_for(layer.pre_activation(arg, ctx), "nchw")
                heads[i] = Head(z, layer.activation, make_activation(layer.activation).apply(z))
            else:
                z = rows_for(layer(arg, ctx), "nchw")
                heads[i] = Head(z, None, z)
            values[i] = heads[i].out
        elif (fuse and len(readers) == 1 and readers[0] not in outputs and getattr(layer, "absorbs", None)
              and layer.absorbs(tensors[readers[0]].layer)):
            # Conv2D then relu: one fused kernel (cuDNN's epilogue), one node for both calls
            values[i] = values[readers[0]] = layer.forward(arg, ctx, activation="relu")
        else:
            values[i] = layer(arg, ctx)
    for i in graph.outputs:
        if i not in heads:          # an input that is also an output (Model(x, [x, y]))
            z = rows_for(values[i], "nchw")
            heads[i] = Head(z, None, z)
    _order_calls(graph, values)
    return values, [heads[i] for i in graph.outputs]


def _order_calls(graph, values):
    """Order the nodes of each layer that `updates_on_call` (a BatchNorm: its running statistics) in
    the order its calls were written: each call's node runs after the previous call's. The graph's
    order is a walk from the loss, which reached a shared BatchNorm's second call first when it
    fed the Add's first operand, and updated the running statistics in the wrong order."""
    last = {}
    for i, t in enumerate(graph.tensors):
        if not getattr(t.layer, "updates_on_call", False):
            continue
        prev = last.get(id(t.layer))
        if prev is not None and values[i] is not prev:
            values[i].after += (prev,)
        last[id(t.layer)] = values[i]


def _calls(graph):
    """{id(layer): the number of its calls in `graph`}."""
    counts = {}
    for t in graph.tensors:
        counts[id(t.layer)] = counts.get(id(t.layer), 0) + 1
    return counts


def residual_tails(graph):
    """{Add tensor: BatchNorm tensor} of the sums a BatchNorm call can compute in its kernel: an Add of
    two tensors, not a model output, one of which is made by a layer that `adds_residual` (a
    BatchNorm) and read by nothing else (a residual block's tail: bn3(h) + shortcut). The first such
    addend of each Add; pure (the graph only), so a test checks it without building anything. A
    layer called more than once is left out: its call would run at the Add's place, after its later
    calls (the running statistics updated out of call order), or never before them at all when
    the Add's other operand is one of them."""
    outputs = set(graph.outputs)
    calls = _calls(graph)
    tails = {}
    for a, t in enumerate(graph.tensors):
        ins = graph.inbound[a]
        if not isinstance(t.layer, Add) or a in outputs or len(ins) != 2:
            continue
        for k in ins:
            if (getattr(graph.tensors[k].layer, "adds_residual", False) and graph.consumers[k] == [a]
                    and k not in outputs and calls[id(graph.tensors[k].layer)] == 1):
                tails[a] = k
                break
    return tails


def concat_branches(graph):
    """{Concatenate tensor: [(BatchNorm tensor, relu tensor or None) per input]} of the image
    concatenations, not model outputs, whose every input is a layer that `writes_slices` (a
    BatchNorm), or a relu Activation of one, read by nothing else: each batch norm can write its
    channels of the concatenation in place (an Inception module). Pure, as residual_tails; a batch
    norm called more than once is left out as there (its call would move to the Concatenate's place)."""
    outputs, tensors, consumers = set(graph.outputs), graph.tensors, graph.consumers
    calls = _calls(graph)
    joins = {}
    for c, t in enumerate(tensors):
        if not isinstance(t.layer, Concatenate) or c in outputs or len(t.shape) != 3:
            continue
        branches = []
        for j in graph.inbound[c]:
            relu = None
            if isinstance(tensors[j].layer, Activation) and tensors[j].layer.activation == "relu":
                relu, j = j, graph.inbound[j][0]
            if not getattr(tensors[j].layer, "writes_slices", False) or calls[id(tensors[j].layer)] > 1 or \
                    j in outputs or relu in outputs or \
                    consumers[j] != [relu if relu is not None else c] or (relu is not None and consumers[relu] != [c]):
                break
            branches.append((j, relu))
        else:
            joins[c] = branches
    return joins


def _concat_in_place(graph, values, c, branches, ctx, rows_for):
    """The node of Concatenate tensor `c` whose branches' batch norms write it (ops.ConcatBatchNorm)."""
    tensors = graph.tensors
    norms, ins = [], []
    for b, relu in branches:
        bn = tensors[b].layer
        fn, params = bn.function(ctx, "relu" if relu is not None else None)
        norms.append(fn)
        ins += [rows_for(values[graph.inbound[b][0]], bn.image_rows), *params]
    node = ConcatBatchNorm(norms).apply(*ins)
    values[c] = node
    for b, relu in branches:
        values[b] = node
        if relu is not None:
            values[relu] = node


def _residual_tail(graph, values, a, k, ctx, rows_for, outputs):
    """The node of Add tensor `a` computed by the call of BatchNorm tensor `k` with the Add's other
    input as its residual, and with the relu Activation that follows as the Add's only reader."""
    tensors = graph.tensors
    bn = tensors[k].layer
    other = next(j for j in graph.inbound[a] if j != k)
    x = rows_for(values[graph.inbound[k][0]], bn.image_rows)
    r = rows_for(values[other], bn.image_rows)
    readers = graph.consumers[a]
    relu = len(readers) == 1 and readers[0] not in outputs and bn.absorbs(tensors[readers[0]].layer)
    node = bn.forward(x, ctx, activation="relu" if relu else None, residual=r)
    values[k] = values[a] = node
    if relu:
        values[readers[0]] = node
