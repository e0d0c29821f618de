"""Layer: a builder of graph nodes that owns its parameters.

A layer is built once for the per-sample input shape (`build`), creating its
weights as dmath matrices in the layouts of its parallel strategy; after that
it can add its nodes to any number of graphs (`__call__`): one per batch size
and mode (training or evaluation), all sharing the same parameters.

Weights are listed trainable first (kernel, then bias), then the buffers
that are not trained (BatchNorm's running statistics); `get_weights` returns
them as numpy arrays of their public shapes (a Conv2D kernel as
(K, C, kh, kw), a bias as (out,)).
"""
import math

import numpy as np

from ..errors import ConfigError, ShapeError
from ..graph.node import Variable
from ..ops import Cast


class Weight:
    """One weight of a layer: a trainable Variable or a buffer matrix, with its public shape."""

    def __init__(self, name, value, public_shape, trainable=True, minimum=None):
        self.name = name
        self.public_shape = tuple(public_shape)
        self.trainable = trainable
        #: the least value the weight may hold (None: any): a BatchNorm's running variance is >= 0, and
        #: a negative one loaded from a file made its (var + eps) ** -0.5 NaN at every prediction
        self.minimum = minimum
        self.var = Variable(value, name=name) if trainable else None
        self._buffer = None if trainable else value

    @property
    def value(self):
        return self.var.value if self.trainable else self._buffer

    def numpy(self):
        return self.value.to_numpy().reshape(self.public_shape)

    def checked(self, array, finite=False):
        """`array` as this weight's values (a numpy array of its public shape and real numbers its
        dtype holds: initializers.check_values, FromArray's check too); finite: NaN and infinity
        refused too (set_weights, as load_state_dict; a model file keeps what it saved)."""
        from .. import initializers
        a = initializers.check_values(array, self.public_shape, self.value.dtype, f"weight {self.name}")
        if self.minimum is not None and a.size and not bool((a >= self.minimum).all()):
            # (not a < minimum: NaN compares false both ways, and a NaN running variance passed)
            raise ConfigError(f"weight {self.name}: values must be at least {self.minimum:g}, got "
                              f"{float(a[~(a >= self.minimum)].reshape(-1)[0]):g}")
        if finite and a.size and a.dtype.kind == "f" and not np.isfinite(a).all():
            raise ShapeError(f"set_weights: weight {self.name} holds NaN or infinity; weights must be finite")
        return a

    def write(self, array):
        """Overwrite the values in place (the matrix keeps its handle, so recorded steps stay valid)."""
        a = self.checked(array)
        m = self.value
        overwrite(m, a.reshape(m.shape))

    def relayout(self, layout):
        """Move the weight to another layout (a new matrix): through `Layer.move_weights`, which counts it."""
        if self.trainable:
            self.var.value = self.var.value.remap(layout)
        else:
            self._buffer = self._buffer.remap(layout)


def overwrite(m, array):
    """Write a numpy array into the existing matrix `m` in place (recorded steps keep reading it)."""
    m.assign(np.ascontiguousarray(array, dtype=m.dtype))


class Context:
    """What a layer needs to know while adding its nodes to a graph.

    training: training or evaluation mode (dropout, batch statistics).
    dtype: the precision of the activations; param_dtype: of the stored
    (master) weights. With float16 activations the weights stay float32 and
    enter the graph through one cast node per weight and graph.
    """

    def __init__(self, training, dtype, param_dtype):
        self.training, self.dtype, self.param_dtype = bool(training), dtype, param_dtype
        self._casts = {}

    def param(self, weight):
        """The node through which the graph reads a trainable weight (a cast in mixed precision)."""
        var = weight.var
        if var.dtype == self.dtype:
            return var
        node = self._casts.get(id(var))
        if node is None:
            node = self._casts[id(var)] = Cast(self.dtype).apply(var)
        return node

    def casts(self):
        """The cast nodes made so far (one per weight read in another precision)."""
        return list(self._casts.values())

    def read_node(self, var):
        """The node through which the graph read the variable `var`: its cast (mixed precision), if
        the graph made one, else `var`. A training step takes each weight's gradient there, in the
        graph's precision, and converts it once, where it moves to the weight's layout."""
        return self._casts.get(id(var), var)


class Layer:
    """Base of the layers.

    Subclasses implement `output_shape(sample_shape)`, `_create(sample_shape, dtype)`
    (make the weights with `self._add_weight`), `forward(x, ctx)` (add nodes) and
    `get_config()`.
    """

    #: strategies this layer accepts
    strategies = ("data",)
    #: the order of image rows the layer reads (dnn.training.programs converts between layers): 'nchw';
    #: 'any' (elementwise: as they come); 'channels_last' (convolution, pooling: channels-last
    #: when the model runs so)
    image_rows = "nchw"
    #: True for a layer whose every call updates state it keeps (a BatchNorm's running statistics):
    #: a model runs such a layer's calls in the order they were written (dnn.functional)
    updates_on_call = False
    #: how many times the weights moved to new matrices (`move_weights`); part of every recorded step's
    #: key with the strategy, so that no step replays reading matrices the move freed
    moves = 0

    def __init__(self, name=None, parallel="data"):
        if name is not None and not isinstance(name, str):
            raise ConfigError(f"{type(self).__name__}: name must be a string or None, got {name!r}")
        self._name = name
        self.weights = []
        self.input_shape = None
        self.built = False
        self.parallel = parallel          # as asked (checked); `strategy`: as decided
        #: the dtype of the weights, as the first build made them (None before)
        self.param_dtype = None
        #: False freezes the layer: fit leaves its weights as they are (a BatchNorm then normalises
        #: with its running statistics, which stay fixed too)
        self.trainable = True
        self._dry = None          # a list while weight_shapes runs _create without allocating

    @property
    def parallel(self):
        """The parallel strategy asked for: one of `strategies` or 'auto' (the cost model's choice,
        timed by fit). Assigned after construction it is checked by the constructor's rule and
        takes effect at once: a built layer's weights move to the new strategy's layouts (`adopt`:
        the recorded steps, keyed on the strategy and the count of moves, are recorded again), and
        'auto' is decided again at the next step. An assignment that was only stored left the layer
        running its old strategy while get_config and the saved file said the new one."""
        return self._parallel

    @parallel.setter
    def parallel(self, value):
        if not isinstance(value, str) or (value != "auto" and value not in self.strategies):
            # every layer takes 'auto' (the cost model's choice: `decide`, here always 'data')
            accepted = tuple(dict.fromkeys(self.strategies + ("auto",)))
            why = (" (model parallelism is a Dense layer's: a convolution's weights are small beside its "
                   "activations, so it stays data parallel)" if value == "model" else "")
            raise ConfigError(f"{type(self).__name__}: parallel must be one of {accepted}, got {value!r}{why}")
        if getattr(self, "_parallel", None) == value:
            return              # (the same request: an 'auto' already decided stays decided)
        self._parallel = value
        if value == "auto":
            self.strategy = None        # decided at the next step (the weights stay until then)
        elif self.built:
            self.adopt(value)           # the weights move now
        else:
            self.strategy = value       # the build makes them in its layouts

    @property
    def name(self):
        """The layer's name: given, or set by the model it joins ('dense_1'); before that its kind
        ('dense'), so that messages never say None."""
        return self._name if self._name is not None else type(self).__name__.lower()

    @name.setter
    def name(self, value):
        self._name = value
        self.auto_named = False

    #: whether a model gave the name (its kind and a number, counted per model: dnn.Model)
    auto_named = False

    @property
    def named(self):
        """Whether the layer has a name of its own (given, or set by a model)."""
        return self._name is not None

    # ---- shapes and building -------------------------------------------------
    def output_shape(self, sample_shape):
        """The sample shape of the output for inputs of `sample_shape` (a tuple, or a list of them for a
        layer called on a list); raise ShapeError for inputs the layer cannot take. Called when the
        layer is called on symbolic tensors, before anything is built (override it; default: the
        input's shape)."""
        return sample_shape

    def build(self, sample_shape, param_dtype):
        """Create the weights for samples of `sample_shape` (once), in `param_dtype`. A built layer
        is built again only for the same sample shape and weight dtype (the weights it has serve
        every model that uses it; ShapeError or ConfigError otherwise)."""
        if self.built:
            self.check_param_dtype(param_dtype)
            if tuple(sample_shape) != self.input_shape:
                raise ShapeError(f"{self.name} was built for samples of shape {self.input_shape}, "
                                 f"now given {tuple(sample_shape)}")
            return self.output_shape(sample_shape)
        out = self.output_shape(tuple(sample_shape))
        self.input_shape = tuple(sample_shape)
        try:
            self._create(self.input_shape, param_dtype)
        except BaseException:
            self.weights = []           # (a refused initial value: the build may be tried again)
            raise
        self.param_dtype = np.dtype(param_dtype).name
        self.built = True
        return out

    def unbuild(self):
        """Forget a build (the weights go with their matrices): a model whose constructor failed after
        it built this layer leaves it as it found it, for a model of any dtype or shape."""
        self.weights = []
        self.input_shape = None
        self.param_dtype = None
        self.built = False

    def check_param_dtype(self, param_dtype, model_dtype=None):
        """ConfigError when an earlier build (another model's) made the layer's weights in another
        dtype than `param_dtype`, the weight dtype of a model of precision `model_dtype`. A layer
        has one set of weights, which every model that uses it shares: a model of another precision
        would train them in the dtype they have (a float64 model with float32 weights), silently.
        A layer without weights serves any precision."""
        if not self.built or not self.weights or np.dtype(param_dtype).name == self.param_dtype:
            return
        want = np.dtype(param_dtype).name
        model = f"a {model_dtype or want!r} model " + ("keeps" if (model_dtype or want) != want else "needs")
        raise ConfigError(f"{self.name} ({type(self).__name__}) has {self.param_dtype} weights (another model "
                          f"built it); {model} {want} weights, and a layer's weights serve every model that "
                          f"uses it. Give this model new layers (dnn.layers.from_config(layer.get_config()) "
                          f"makes one) or dtype={self.param_dtype!r}")

    def _create(self, sample_shape, dtype):
        """Make the weights (none by default)."""

    def weight_shapes(self, sample_shape):
        """[(weight name, public shape)] that `build` would create for `sample_shape`, found without
        allocating anything (a model file is checked with it before its model is built)."""
        self._dry = []
        try:
            self._create(tuple(sample_shape), None)
            return self._dry
        finally:
            self._dry = None

    def _add_weight(self, name, init, shape, dtype, layout, public_shape=None, fans=None, trainable=True,
                    minimum=None):
        if self._dry is not None:
            self._dry.append((f"{self.name}/{name}", tuple(public_shape or shape)))
            return None
        from .. import initializers
        full = f"{self.name}/{name}"
        value = initializers.get(init)(shape, dtype=dtype, layout=layout, fans=fans, public_shape=public_shape,
                                       name=f"weight {full}")
        w = Weight(full, value, public_shape or shape, trainable, minimum)
        self.weights.append(w)
        return w

    def check_training_batch(self, batch):
        """Raise ShapeError when a training batch of `batch` samples cannot pass this layer (fit asks
        before its first step, so that a short last batch fails before any step, not after)."""

    def decide(self, batch, nworkers):
        """Resolve parallel='auto' for a batch size by the cost model (a program built before fit
        measured the candidates, e.g. evaluate's; fit times them: dnn.training.strategy)."""
        if self.strategy is None:
            self.adopt(self.proposal(batch, nworkers))

    def proposal(self, batch, nworkers):
        """The strategy the cost model gives parallel='auto' for `batch` on `nworkers` ('data' here)."""
        return "data"

    def adopt(self, strategy):
        """Take `strategy` (one of `strategies`): the weights move to its layouts (`move_weights`)."""
        self.strategy = strategy

    def move_weights(self, weights, layout):
        """Move `weights` (some of this layer's) to `layout`: new matrices. The count `moves` goes up,
        so every step recorded with the old matrices is recorded again: parallel='auto' timing
        data -> model -> data ends on the strategy it started from, and a key of strategies alone
        matched, replaying an evaluation that read the freed matrices (a PlanError)."""
        weights = list(weights)
        for w in weights:
            w.relayout(layout)
        if weights:
            self.moves += 1

    # ---- graph building ----------------------------------------------------------
    def forward(self, x, ctx):
        """The layer's graph nodes on input node `x` (a list for a list input): return the output node,
        made from `dnn.functional`/`dnn.ops` functions of x and of the weights' nodes (ctx gives them:
        `ctx.param(self.kernel)`, and `ctx.training`). Override it; it is called once per program
        built (a fit's step, an evaluation), never per sample."""
        raise NotImplementedError

    def __call__(self, x, ctx=None):
        """Called on a symbolic tensor (or a list of them) without ctx: the symbolic tensor of the
        output, for a graph model (dnn.Model). Called on a graph node with a Context: the layer's
        nodes (a Program builds its graph so)."""
        if ctx is None:
            from ..functional import call_layer
            return call_layer(self, x)
        if not self.built:
            raise ConfigError(f"{self.name} is not built: build it for an input shape first")
        return self.forward(x, ctx)

    # ---- weights -------------------------------------------------------------------
    @property
    def trainable(self):
        """Whether fit trains the layer's weights (True or False; a frozen BatchNorm also normalises with
        its running statistics)."""
        return self._trainable

    @trainable.setter
    def trainable(self, value):
        if not isinstance(value, bool):
            raise ConfigError(f"{type(self).__name__}: trainable must be True or False, got {value!r}")
        self._trainable = value

    @property
    def params(self):
        """The Variables fit trains (kernel, then bias): none while the layer is frozen."""
        return [w.var for w in self.weights if w.trainable] if self.trainable else []

    def count_params(self):
        """The number of parameters (frozen or not; buffers such as running statistics not counted)."""
        return sum(math.prod(w.public_shape) for w in self.weights if w.trainable)

    def get_weights(self):
        """The weights as NumPy arrays, in their public shapes and the layer's order (kernel, then bias;
        BatchNorm: gamma, beta, running mean and variance)."""
        return [w.numpy() for w in self.weights]

    def set_weights(self, arrays):
        """Write `arrays` (get_weights' order and shapes; finite numbers); all are checked before any
        is written."""
        self.write_checked(self.checked_weights(arrays, finite=True))

    def checked_weights(self, arrays, finite=False):
        """`arrays` checked against the weights (count, shapes, numbers; finite: no NaN or infinity),
        ready for write_checked."""
        arrays = list(arrays)
        if len(arrays) != len(self.weights):
            raise ShapeError(f"{self.name} has {len(self.weights)} weights "
                             f"({', '.join(w.name for w in self.weights) or 'none'}), got {len(arrays)} arrays")
        return [w.checked(a, finite) for w, a in zip(self.weights, arrays)]

    def write_checked(self, arrays):
        """Write arrays that `checked_weights` accepted, one per weight, in order."""
        for w, a in zip(self.weights, arrays):
            w.write(a)

    def get_state(self):
        """{name: numpy array} of what the layer keeps besides its weights to continue training
        identically (a Dropout's mask counter); saved in checkpoints."""
        return {}

    def set_state(self, arrays):
        """Restore `get_state`'s arrays (missing names keep their values)."""

    def get_config(self):
        """The layer's settings as JSON (from_config rebuilds the layer). It holds every setting the
        layer's nodes compute with: it is part of every recorded step's key (Model._settings), so a
        setting changed between calls records the steps anew."""
        config = {"class": type(self).__name__, "name": self.name}
        if not self.trainable:
            config["trainable"] = False
        return config

    def describe(self):
        """The parallel strategy and weight layouts, for Model.summary()."""
        if not self.weights:
            return "-"
        lays = ", ".join(_short(w.value.layout) for w in self.weights if w.trainable)
        return f"{self.strategy or 'auto'}: {lays}"

    def __repr__(self):
        return f"<{type(self).__name__} {self.name}>"


def _short(layout):
    return type(layout).__name__
