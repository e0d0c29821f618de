"""Model: a graph of layers (Keras' functional API) with a loss and an optimizer; Sequential: a chain.

    x = dnn.Input((3, 32, 32))
    h = L.Conv2D(16, 3, padding='same', activation='relu')(x)
    model = dnn.Model(x, L.Dense(10, activation='softmax')(L.Flatten()(h)), loss='cross_entropy')
    model = dnn.Sequential([L.Input((1, 28, 28)), L.Flatten(), L.Dense(10), L.Output('softmax')])
    history = model.fit(x, y, batch_size=100, epochs=5, validation_data=(xv, yv))

A Sequential is a Model whose graph is a chain: one code path trains both.
Training (fit, the recorded programs of each batch size and mode) is in
dnn/training, which Model inherits. The batch is in row blocks over the
workers (data parallelism); see dnn.parallel for the per-layer strategies.

Precision: dtype='float16' runs activations and gradients in float16 with
float32 master weights (cast into the graph once per step) and dynamic loss
scaling (dnn.optim.DynamicLossScale): the loss and its gradient are computed
in float32, steps with inf/NaN gradients are skipped on the workers and the
scale adjusts.
"""
import math
import numbers
import weakref

import numpy as np

import dmath

from . import losses, optim, serialization, state_dict
from .data import Dataset
from .data.dataset import as_dataset, rectangular
from .errors import ConfigError, NotSupportedError, ShapeError
from .functional import Graph, SymbolicTensor, call_layer, graph_from_config
from .graph.node import canonical_dtype
from .layers import Dropout, Input, Layer, from_config
from .training.fit import EVAL_BATCH, Training, positive_int as _positive_int
from .training.programs import Metrics

#: model seeds stay below this: Dropout layers without a seed of their own draw with seed * 1000 + i + 1
SEED_END = 2 ** 53 // 1000 - 1000


def _check_shape(got, want, what):
    """ShapeError when samples of shape `got` hold an input of shape `want` (several dimensions) in
    another shape of as many values (flat rows and a count that the feature check words pass)."""
    if len(want) < 2 or got == want or len(got) <= 1 or math.prod(got) != math.prod(want):
        return
    hint = ""
    if len(want) == 3 and got == want[1:] + want[:1]:
        hint = ": these are channels-last (N, H, W, C) images, the model reads NCHW; pass x.transpose(0, 3, 1, 2)"
    raise ShapeError(f"{what}: samples must have shape {want} (or be flat rows of {math.prod(want)}), got "
                     f"samples of shape {got}{hint}")


class Model(Training):
    """A graph of layers with a loss and an optimizer (Keras' functional API); `Sequential` is a
    Model whose graph is a chain, trained by the same code.

        x = dnn.Input((3, 32, 32))
        h = L.Conv2D(16, 3, padding='same', activation='relu')(x)
        y = L.Dense(10, activation='softmax')(L.Flatten()(L.Add()([h, L.Conv2D(16, 1)(x)])))
        model = dnn.Model(x, y, loss='cross_entropy', optimizer=dnn.optim.SGD(lr=0.1))

    Args:
        inputs: a symbolic tensor from dnn.Input(shape), or a list of them (numpy samples are
            then a list of arrays, one per input, in this order).
        outputs: the symbolic tensor of the last layer call, or a list of them; each output is
            trained against the same targets y (Inception v3's auxiliary head) with
            loss_weights, and its last layer's activation is fused with the loss as in a
            Sequential (an Output layer, or Dense(n, activation='softmax')).
        loss: 'cross_entropy', 'binary_cross_entropy', 'mse' or a dnn.losses.Loss.
        optimizer: a dnn.optim optimizer, a name or None (SGD(lr=0.01)).
        dtype: 'float16', 'float32' or 'float64' (activations; weights are
            float32 for float16). A layer that another model built keeps the weights it
            made; one of another weight dtype is refused (ConfigError).
        loss_weights: None (1 per output) or one number per output: the training loss is the
            weighted sum of the outputs' losses; accuracy is the first output's.
        name: the model's name (None: 'model').
        loss_scale: float16 only: None (a DynamicLossScale with its defaults)
            or a DynamicLossScale.
        record: record each training and evaluation step as a dmath plan and
            replay it (False: run every step eagerly, e.g. for debugging).
        seed: the seed of the shuffling (with the epoch count) and of Dropout layers without their own.
        channels_last: run the convolution and pooling layers on channels-last
            image rows (converted once before the first and back before the
            first layer that reads NCHW, e.g. Flatten): cuDNN's fastest
            kernels read that order without converting. None (default): on
            GPUs with cuDNN; the results are the same either way.
        fuse: which layer calls run as one kernel: True (default): a relu Activation that is the
            only reader of a Conv2D or a BatchNorm runs inside it, and an Add of a BatchNorm's
            output (its only reader) with another tensor, with the relu Activation that follows
            it, runs inside that BatchNorm (a residual block's tail: dmath.nn.batchnorm's
            residual), and a Concatenate whose inputs are all BatchNorms (or their relus) that
            nothing else reads is written in place by them (an Inception module: no copy);
            'relu': the relu folds only; False: every layer call is a node of its own. The layers, their weights and the results are the same (up to rounding); this
            is for tests and for measuring what fusing gains (not saved with the model).
    dmath is initialised here if the program has not done so.
    """

    def __init__(self, inputs, outputs, loss="cross_entropy", optimizer=None, dtype="float32", loss_weights=None,
                 name=None, loss_scale=None, record=True, seed=0, channels_last=None, fuse=True):
        if not dmath.is_initialized():
            dmath.init()
        self.graph = Graph(inputs, outputs)
        layers = self.graph.layers
        if isinstance(seed, bool) or not isinstance(seed, numbers.Integral) or not 0 <= seed < SEED_END:
            # (Dropout layers draw with seed * 1000 + their place: dmath's draws take keys below 2**53)
            raise ConfigError(f"seed must be an integer in [0, {SEED_END}), got {seed!r}")
        if not isinstance(record, bool):
            raise ConfigError(f"record must be True or False, got {record!r}")
        name = "model" if name is None else name
        if not isinstance(name, str):
            raise ConfigError(f"name must be a string, got {name!r}")
        try:
            name.encode("utf-8")        # (a lone surrogate loaded from a file, then summary() crashed)
        except UnicodeEncodeError as exc:
            raise ConfigError(f"name must be text that UTF-8 encodes, got {name!r}") from exc
        self.name, self.seed, self.record = name, int(seed), record
        if channels_last not in (None, True, False):
            raise ConfigError(f"channels_last must be None (on GPUs with cuDNN), True or False, got {channels_last!r}")
        if channels_last is None:
            channels_last = dmath.device() == "gpu" and dmath.gpu.cudnn.available()
        self.channels_last = channels_last
        if not (fuse is True or fuse is False or fuse == "relu"):
            raise ConfigError(f"fuse must be True, 'relu' or False, got {fuse!r}")
        self.fuse = fuse
        self.dtype = canonical_dtype(dtype)
        self.param_dtype = "float32" if self.dtype == "float16" else self.dtype
        for layer in layers:    # before any layer is named or built: a refusal leaves them as they were
            layer.check_param_dtype(self.param_dtype, self.dtype)
        self.loss = losses.get(loss)
        self.loss_weights = loss_weights
        self.optimizer = optim.get(optimizer if optimizer is not None else optim.SGD())
        self.loss_scale = loss_scale
        self.layers = layers
        g = self.graph
        # every check first (the symbolic shapes hold all it needs): a refused model names and builds
        # nothing, so the layers it was given serve the next model as they were
        shapes = [g.tensors[i].shape for i in g.outputs]
        widths = {math.prod(s) for s in shapes}
        if len(widths) > 1:
            raise ConfigError(f"the outputs are trained against the same targets, so they need the same number "
                              f"of values; got outputs of shapes {shapes}")
        self.outputs = widths.pop()      # the target columns
        self.output_shape = shapes[0] if len(shapes) == 1 else shapes
        _check_builds(g)
        _check_names(layers)
        self._name_and_build()
        shapes = [g.tensors[i].shape for i in g.inputs]
        self.input_shape = shapes[0] if len(shapes) == 1 else shapes
        self.features = sum(math.prod(s) for s in shapes)     # a batch row: the inputs' samples side by side
        self.one = dmath.ones((1, 1), dtype="float32" if self.dtype == "float16" else self.dtype,
                              layout=dmath.Replicated())
        # the ranks the model lives on: every worker, or the group of the dmath.on_group block it was built in
        self.workers = tuple(self.one.layout.group)
        self.train_metrics, self.eval_metrics = Metrics(), Metrics()
        self._feeds = weakref.WeakKeyDictionary()    # Dataset -> {reading: its Feed (with this model's programs)}
        self._last_program = None
        self.epochs_trained = 0
        self.stop_training = False
        self.position = None      # (epoch, batches done, batch_size) while an epoch runs: what a checkpoint saves
        self.resume = None        # {'epoch', 'batch', 'batch_size', 'metrics'}: a loaded mid-epoch checkpoint
        #: {batch size: what parallel='auto' timed and chose} (explain_parallel() prints it)
        self.parallel_report = {}
        self._trials = {}         # batch size -> its dnn.training.strategy.Trial

    @property
    def loss_weights(self):
        """One weight per output (a tuple of floats): the training and evaluation loss is the weighted
        sum of the outputs' losses. Set as the constructor's argument (None: 1 each), checked alike:
        one finite number >= 0 per output (an assignment of too few silently dropped an output's loss,
        a negative one trained it away from its targets). A change takes effect at the next call."""
        return self._loss_weights

    @loss_weights.setter
    def loss_weights(self, value):
        self._loss_weights = _loss_weights(value, len(self.graph.outputs))

    #: see `bucket_mb`
    _bucket_mb = 25.0

    @property
    def bucket_mb(self):
        """Megabytes (MiB) of weight gradients summed over the workers by one all-reduce in data-parallel
        training (dnn.training.buckets): 25 by default, as DDP's bucket_cap_mb; 0 sums each weight's
        gradient alone. A change takes effect when the next training step is recorded."""
        return self._bucket_mb

    @bucket_mb.setter
    def bucket_mb(self, value):
        if isinstance(value, bool) or not isinstance(value, numbers.Real) or not 0 <= value < float("inf"):
            raise ConfigError(f"bucket_mb must be a number of megabytes >= 0, got {value!r}")
        self._bucket_mb = float(value)

    @property
    def gradient_sum_dtype(self):
        """The dtype data-parallel float16 gradients are summed over the workers in: 'float16' (the
        default of float16 models: half the bytes; an overflowing sum is skipped by the loss scale's
        check, as an overflowing backward pass is) or 'float32' (the weights' dtype). Either way each
        worker's gradient over its own samples is rounded to float16 first (as PyTorch's float16
        gradients under DDP), so float16 training differs by the worker count at float16's precision.
        Models of other dtypes sum in their weights' dtype."""
        if self.dtype != "float16":
            return self.param_dtype
        return self._gradient_sum_dtype

    @gradient_sum_dtype.setter
    def gradient_sum_dtype(self, value):
        if self.dtype != "float16" and value != self.param_dtype:
            raise ConfigError(f"gradient_sum_dtype is a float16 model's choice; a {self.dtype} model sums "
                              f"its gradients in {self.param_dtype}")
        if value not in ("float16", "float32"):
            raise ConfigError(f"gradient_sum_dtype must be 'float16' or 'float32', got {value!r}")
        self._gradient_sum_dtype = value

    _gradient_sum_dtype = "float16"

    @property
    def trainable(self):
        """False when every layer is frozen; setting it freezes (False) or unfreezes (True) every layer."""
        return any(layer.trainable for layer in self.layers)

    @trainable.setter
    def trainable(self, value):
        if not isinstance(value, bool):
            raise ConfigError(f"trainable must be True or False, got {value!r}")
        for layer in self.layers:
            layer.trainable = value

    def _name_and_build(self):
        """Name the layers that have no name (`_name_layers`) and build each for the samples its
        calls read, in the model's weight dtype. The checks ran before (`_check_builds`,
        `_check_names`); should a build still fail (an initializer that refuses its values, memory),
        what this model named, seeded and built is undone before the error goes on."""
        named = [layer for layer in self.layers if not layer.named]
        built = [layer for layer in self.layers if not layer.built]
        seeded = [layer for layer in self.layers if isinstance(layer, Dropout) and layer.seed is None]
        g = self.graph
        try:
            self._name_layers()
            for i, t in enumerate(g.tensors):
                t.layer.build(t.shape if not g.inbound[i] else g.sample_shapes(i), self.param_dtype)
        except BaseException:
            for layer in built:
                layer.unbuild()
            for layer in named:
                layer.name = None       # (auto_named goes with it)
            for layer in seeded:
                layer.seed = None
            raise

    def _name_layers(self):
        """Name each layer without a name by its kind and a number ('dense_1'), counted within this
        model: a model built in a new process gets the same names, which its model files and state
        dicts are keyed by."""
        counts, taken = {}, {x.name for x in self.layers if x.named}
        for i, layer in enumerate(self.layers):
            if not layer.named:
                kind = type(layer).__name__.lower()
                while True:
                    counts[kind] = counts.get(kind, 0) + 1
                    name = f"{kind}_{counts[kind]}"
                    if name not in taken:
                        break
                layer.name = name
                layer.auto_named = True
                taken.add(name)
            if isinstance(layer, Dropout) and layer.seed is None:
                layer.seed = self.seed * 1000 + i + 1

    # ---- parameters ------------------------------------------------------------------
    @property
    def params(self):
        """The Variables fit trains, layer by layer (kernel, then bias); frozen layers' are left out."""
        return [p for layer in self.layers for p in layer.params]

    def count_params(self):
        """The number of parameters (trained or frozen; not the buffers such as running statistics)."""
        return sum(layer.count_params() for layer in self.layers)

    def count_trainable_params(self):
        """The number of parameters fit trains (those of layers that are not frozen)."""
        return sum(layer.count_params() for layer in self.layers if layer.trainable)

    #: True while an asynchronous epoch's steps run (dnn.training.asgd): see `_refuse_mid_async`
    _in_async_epoch = False

    def _refuse_mid_async(self, what):
        """Refuse `what` (a weight read or write, an evaluation, a save) from a callback inside an
        asynchronous epoch: the weights then live in the parameter store and the groups' copies, and
        the model's own matrices hold the epoch's start. A read gave those silently and a write was
        lost when the epoch ended (the store's weights overwrite the model's); at the epoch's end
        (on_epoch_end) the model holds the store's weights again."""
        if self._in_async_epoch:
            raise ConfigError(f"{what} was called inside an asynchronous epoch (from a callback's on_batch_end?): "
                              f"the model's weights are the parameter store's only at the epoch's end. Call it "
                              f"from on_epoch_end, or train with asynchronous=False")

    def get_weights(self):
        """Every weight as a numpy array, layer by layer (kernel, then bias; BatchNorm: gamma, beta,
        running mean, running variance)."""
        self._refuse_mid_async("get_weights")
        return [a for layer in self.layers for a in layer.get_weights()]

    def set_weights(self, weights):
        """Write weights in get_weights' order and shapes (in place: recorded steps stay valid). Every
        array is checked first (shape, numbers the weight's dtype holds, no NaN or infinity, as
        load_state_dict): a refused one leaves every weight as it was."""
        self._refuse_mid_async("set_weights")
        weights = list(weights)
        expected = sum(len(layer.weights) for layer in self.layers)
        if len(weights) != expected:
            raise ShapeError(f"set_weights: the model has {expected} weights, got {len(weights)} arrays")
        # every array checked before any is written: a misfit leaves the model as it was
        checked, i = [], 0
        for layer in self.layers:
            n = len(layer.weights)
            checked.append(layer.checked_weights(weights[i:i + n], finite=True))
            i += n
        for layer, arrays in zip(self.layers, checked):
            layer.write_checked(arrays)

    def __call__(self, *args, **kwargs):
        """Refused (NotSupportedError): a model is not a layer, so it cannot be nested in another
        model by calling it on symbolic tensors (Keras' nesting); the error says what to do instead."""
        raise NotSupportedError(
            f"a {type(self).__name__} cannot be called on tensors: models do not nest. Call its layers on the "
            f"tensors instead (they keep their weights), e.g. t = layer(t) for each layer of model.layers "
            f"after its Input, or build the whole network as one dnn.Model; model.predict(x) runs it on data")

    def __reduce_ex__(self, protocol):
        raise NotSupportedError(f"a {type(self).__name__} holds dmath matrices, which cannot be pickled: "
                                f"save it with model.save(path) and read it back with dnn.load(path)")

    def state_dict(self):
        """{PyTorch name: numpy array} of every weight and buffer, keyed by the layers' names as
        PyTorch's modules ('conv1.weight', 'layer1.0.bn1.running_mean', 'fc.bias'; dnn.state_dict)."""
        self._refuse_mid_async("state_dict")
        return state_dict.state_dict(self)

    def load_state_dict(self, mapping):
        """Write a PyTorch-named mapping of arrays (e.g. a torchvision model's state_dict()) into the
        weights, in place; a missing or unexpected key or a shape mismatch raises and changes nothing."""
        self._refuse_mid_async("load_state_dict")
        state_dict.load_state_dict(self, mapping)

    # ---- data ---------------------------------------------------------------------------
    def _dataset(self, x, y, what="x", targets=True, joined=False):
        """`x` as a Dataset checked against the model (arrays are checked first, then placed once)."""
        if isinstance(x, dmath.Matrix):
            raise ConfigError(f"{what}: pass numpy arrays or a dnn.data.Dataset; batches are made on the workers")
        if not joined:
            x = self._side_by_side(x, what)
        if not isinstance(x, Dataset):
            x = rectangular(x, what)
        if len(self.graph.inputs) == 1:
            self._check_sample_shape(x, what)
        _check_range(x, self.dtype, what)
        self._check_not_per_output(x, y, what)

        def check(features, kind, width, label_range):
            if features != self.features:
                raise ShapeError(f"{what}: samples must have shape {self.input_shape} (or be flat rows of "
                                 f"{self.features}), got samples of {features} values")
            if targets:
                if kind is None:
                    raise ConfigError(f"{what}: targets are needed (y, or a Dataset built with y)")
                self.loss.one_hot(kind, width, label_range, self.outputs)      # raises on a misfit
        return as_dataset(x, y, what, check)

    def _check_not_per_output(self, x, y, what):
        """ConfigError for targets given as a list of one array per output (Keras' way for several
        outputs): every output here is trained against the same targets, and such a list read as
        one array said only '2 targets for 3 samples', or passed with rows of the wrong width."""
        n_out = len(self.graph.outputs)
        if n_out == 1 or not isinstance(y, (list, tuple)) or isinstance(x, Dataset) or not np.ndim(x):
            return
        if y and all(isinstance(v, np.ndarray) and v.ndim >= 1 and len(v) == len(x) for v in y):
            where = "" if what == "x" else f"{what}: "        # (the training data's y is just 'y')
            raise ConfigError(f"{where}y is a list of {len(y)} arrays of {len(x)} targets each (one per output?); "
                              f"this model's {n_out} outputs are all trained against the same targets: pass "
                              f"one array y with one target per sample (a class label, or a row of "
                              f"{self.outputs} values)")

    def _side_by_side(self, x, what):
        """A model with several inputs reads a list of arrays, one per input (each (N, ...) of its
        samples), as one array whose rows hold each sample's inputs side by side (a Dataset of such
        rows is taken as it is)."""
        if len(self.graph.inputs) == 1 or isinstance(x, Dataset):
            return x
        if not isinstance(x, (list, tuple)) or len(x) != len(self.graph.inputs):
            raise ConfigError(f"{what}: this model has {len(self.graph.inputs)} inputs: pass a list of as many "
                              f"arrays (or a Dataset whose samples hold the inputs side by side)")
        arrays = [rectangular(a, f"{what}[{i}]") for i, a in enumerate(x)]
        n = {len(a) if a.ndim else -1 for a in arrays}
        if len(n) != 1 or -1 in n:
            raise ShapeError(f"{what}: the inputs' arrays must hold the same number of samples, got shapes "
                             f"{[a.shape for a in arrays]}")
        for a, shape in zip(arrays, self.input_shape):
            if math.prod(a.shape[1:]) != math.prod(shape):
                raise ShapeError(f"{what}: an input of samples {shape} got an array of shape {a.shape}")
            _check_shape(tuple(a.shape[1:]), tuple(shape), what)
        # (each width named: reshape(n, -1) cannot infer one for n = 0 samples, and empty inputs
        # take the single-input model's way)
        return np.concatenate([a.reshape(len(a), math.prod(a.shape[1:])) for a in arrays], axis=1)

    def _check_sample_shape(self, x, what):
        """Samples of an image (or any multi-dimensional) input must have its shape or be flat rows:
        the same number of values in another shape (channels-last images for an NCHW Input) would be
        read in the wrong order and train or predict garbage."""
        got = tuple(x.sample_shape) if isinstance(x, Dataset) else tuple(np.shape(x)[1:])
        _check_shape(got, tuple(self.input_shape), what)

    def _feed(self, ds, reading=False):
        """This model's Feed over dataset `ds` (made once per dataset and use; dropped with the dataset).

        Training has a cursor of its own (reading=False), and evaluate and predict another: an
        evaluation of the training set from a callback in the middle of an epoch leaves the epoch's
        order and position as they were. A feed made before the dataset's settings changed (augment,
        scale, mean, std: Dataset._feed_settings) is replaced, with its recorded steps."""
        feeds = self._feeds.get(ds)
        if feeds is None:
            feeds = self._feeds[ds] = {}
        feed = feeds.get(reading)
        settings = ds._feed_settings()
        if feed is not None and feed.settings != settings:
            # the dataset's augment, scale, mean or std changed since (its recorded steps bake them in:
            # they kept the old values, silently, where a new model took the new ones): a new feed
            for prog in feed.programs.values():
                if prog.plan is not None:
                    prog.plan.close()
            feed = None
        if feed is None:
            feed = feeds[reading] = ds.feed()
        return feed

    # ---- the loss scale ------------------------------------------------------------------
    @property
    def loss_scale(self):
        """The dnn.optim.DynamicLossScale of a float16 model's training steps (None for other dtypes).
        Set as the constructor's argument and checked alike: a float16 model takes a
        DynamicLossScale, or None for one with the defaults; other dtypes take None only. A new one
        is set up (its scale matrices made) here, so the next fit starts from its init_scale; a
        refused value (a number, a scaler on a float32 model) changes nothing."""
        return self._loss_scale

    @loss_scale.setter
    def loss_scale(self, value):
        if self.dtype != "float16":
            if value is not None:
                raise ConfigError(f"loss_scale applies to dtype='float16' only (this model is {self.dtype}); "
                                  f"it takes None, got {value!r}")
            self._loss_scale = None
            return
        if value is None:
            value = optim.DynamicLossScale()
        if not isinstance(value, optim.DynamicLossScale):
            raise ConfigError(f"loss_scale must be a dnn.optim.DynamicLossScale (or None: one with the "
                              f"defaults), got {value!r}")
        value.setup()
        self._loss_scale = value

    # ---- the optimizer -------------------------------------------------------------------
    @property
    def optimizer(self):
        """The dnn.optim optimizer of the training steps. It may be replaced, or its hyper-parameters
        changed, between fit calls (or epochs): the next epoch's step is then recorded anew
        (`_program_key`)."""
        return self._optimizer

    @optimizer.setter
    def optimizer(self, value):
        self._optimizer = optim.get(value)

    # ---- evaluation ------------------------------------------------------------------------------
    def evaluate(self, x, y=None, batch_size=None):
        """{'loss': mean loss, 'accuracy': fraction correct (classification losses)} over x:
        a dnn.data.Dataset, or numpy samples with their targets y."""
        self._refuse_mid_async("evaluate")
        batch_size = EVAL_BATCH if batch_size is None else _positive_int(batch_size, "batch_size")
        return self._evaluate(self._dataset(x, y), batch_size)

    def _evaluate(self, ds, batch_size):
        feed = self._feed(ds, reading=True)
        feed.start_epoch(None, 0)
        metrics = self.eval_metrics
        metrics.reset()
        key = None          # (worked out once a call: it reads every layer's configuration)
        for size in self._batches(feed.n, batch_size):
            prog = self._program("eval", size, feed, key)
            prog.run()
            key = prog.key
            metrics.samples += size
        loss, acc = metrics.read()
        out = {"loss": loss}
        if self.loss.accuracy:
            out["accuracy"] = acc
        return out

    def predict(self, x, batch_size=None):
        """The network's outputs (after the output activation) for x (numpy samples or a Dataset),
        a numpy array (N, outputs); a list of arrays, one per output, for a model with several."""
        self._refuse_mid_async("predict")
        batch_size = EVAL_BATCH if batch_size is None else _positive_int(batch_size, "batch_size")
        if x is None:
            raise ConfigError("predict: x must be numpy samples or a dnn.data.Dataset, got None")
        x = self._side_by_side(x, "predict")
        if not isinstance(x, (Dataset, dmath.Matrix)):
            x = rectangular(x, "predict")
        if not isinstance(x, Dataset) and np.ndim(x) and len(x) == 0:
            features = math.prod(np.shape(x)[1:]) if np.ndim(x) > 1 else None
            if features != self.features:
                raise ShapeError(f"predict: samples must have shape {self.input_shape}, got an empty array of "
                                 f"shape {np.shape(x)}")
            return self._one_or_list([np.zeros(self._predicted_shape(0, s), dtype=self.dtype)
                                      for s in self._output_shapes()])
        ds = self._dataset(x, None, targets=False, joined=True)
        feed = self._feed(ds, reading=True)
        feed.start_epoch(None, 0)
        out = [[] for _ in self.graph.outputs]
        key = None
        for size in self._batches(feed.n, batch_size):
            prog = self._program("predict", size, feed, key)
            prog.run()
            key = prog.key
            for parts, node in zip(out, prog.output_nodes):
                parts.append(node.value.to_numpy())
        return self._one_or_list([np.concatenate(parts).reshape(self._predicted_shape(feed.n, s))
                                  for parts, s in zip(out, self._output_shapes())])

    def _output_shapes(self):
        return [self.graph.tensors[i].shape for i in self.graph.outputs]

    def _one_or_list(self, arrays):
        return arrays[0] if len(arrays) == 1 else arrays

    @staticmethod
    def _predicted_shape(n, shape):
        """The shape of predict's result for n samples: (n, outputs), or (n,) + an image output's shape."""
        return (n,) + tuple(shape) if len(shape) > 1 else (n, math.prod(shape))

    # ---- description -------------------------------------------------------------------------------
    def summary(self, print_fn=print):
        """Print (and return) the layer calls with output shapes, parameters, parallel strategy and
        layouts (a graph model adds the layers each call reads), and the trainable and frozen counts."""
        acts = self._activation_layouts()
        chain = self.graph.is_chain()
        head = ("Layer (type)", "Output shape", "Params", "Parallel", "Weights", "Activations")
        rows = [head if chain else head + ("Connected to",)]
        seen = set()
        for i, t in enumerate(self.graph.tensors):
            layer = t.layer
            names = {_layout_name(w.value.layout) for w in layer.weights}
            lays = names.pop() if len(names) == 1 else \
                ", ".join(f"{w.name.split('/')[-1]} {_layout_name(w.value.layout)}" for w in layer.weights)
            strategy = (layer.strategy or "auto") if layer.weights else "-"
            if not layer.trainable and layer.weights:
                strategy += ", frozen"
            params = layer.count_params() if id(layer) not in seen else 0       # a shared layer's, once
            seen.add(id(layer))
            row = (f"{layer.name} ({type(layer).__name__})", str(tuple(t.shape)), str(params), strategy,
                   lays or "-", acts.get(i, "RowBlock"))
            if not chain:
                row += (", ".join(self.graph.tensors[k].layer.name for k in self.graph.inbound[i]) or "-",)
            rows.append(row)
        widths = [max(len(r[k]) for r in rows) for k in range(len(rows[0]))]
        line = lambda r: "  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip()  # noqa: E731
        rule = "-" * len(line(rows[0]).ljust(sum(widths) + 2 * (len(widths) - 1)))
        text = [f"Model: {self.name}  (dtype {self.dtype}, weights {self.param_dtype}, {dmath.num_workers()} "
                f"worker(s), batch RowBlock: data parallel)", rule, line(rows[0]), rule]
        text += [line(r) for r in rows[1:]]
        total, trained = self.count_params(), self.count_trainable_params()
        text += [rule, f"Total params: {total:,}   Trainable params: {trained:,}   Frozen params: {total - trained:,}",
                 f"Loss: {self.loss.name}   Optimizer: {type(self.optimizer).__name__} "
                 f"(lr {self.optimizer.current_lr():g})"
                 + ("   Loss scaling: dynamic" if self.loss_scale is not None else "")
                 + (f"   Loss weights: {list(self.loss_weights)}" if self.loss_weights != (1.0,) else "")]
        out = "\n".join(text)
        if print_fn is not None:
            print_fn(out)
        return out

    def _activation_layouts(self):
        """Layer index -> the layout of its output in the latest training program (once one has run)."""
        prog = self._last_program() if self._last_program is not None else None
        if prog is None or not prog.training:
            return {}
        # a node's layout is set by the training step's forward pass (None until one has run)
        return {i: _layout_name(n.layout) for i, n in enumerate(prog.layer_nodes) if n.layout is not None}

    # ---- configuration and files --------------------------------------------------------------------
    def get_config(self):
        return {"class": "Model", "name": self.name, "dtype": self.dtype, "loss": self.loss.name,
                "seed": self.seed, "record": self.record, "loss_weights": list(self.loss_weights),
                "loss_scale": self.loss_scale.get_config() if self.loss_scale is not None else None,
                "graph": self.graph.get_config()}

    @classmethod
    def from_config(cls, config, optimizer=None):
        """A new model (fresh weights) from get_config()'s dict (a Model's or a Sequential's)."""
        if not isinstance(config, dict) or config.get("class") not in ("Model", "Sequential"):
            raise ConfigError(f"not a Model config: {config!r}")
        if config["class"] == "Sequential":
            return Sequential.from_config(config, optimizer)
        ls = config.get("loss_scale")
        inputs, outputs = graph_from_config(config["graph"])
        return cls(inputs, outputs, loss=config["loss"], optimizer=optimizer, dtype=config["dtype"],
                   loss_weights=config.get("loss_weights"), name=config.get("name", "model"),
                   loss_scale=optim.DynamicLossScale(**ls) if ls else None, record=config.get("record", True),
                   seed=config.get("seed", 0))

    def save(self, path):
        """Write a checkpoint to `path` (see dnn.serialization): the architecture, the weights as global
        arrays, the optimizer's state and clock, the loss scale, the epoch (and the batch, when called
        inside an epoch, e.g. by a callback), the layers' random counters and dmath's random streams.
        dnn.load resumes it at any worker count: fit(..., initial_epoch=k) continues as if never stopped."""
        self._refuse_mid_async("save")
        serialization.save_model(self, path)

    def load_weights(self, path):
        """Load the weights and training state (optimizer, counters, epoch) of a model file into this
        model; they must match."""
        header, arrays = serialization.read_file(path)
        serialization.load_state(self, header, arrays, path)


class Sequential(Model):
    """A linear stack of layers: a Model whose graph is a chain (the same training code).

    Args:
        layers: the layers, the first an Input (layers.Input((C, H, W)) or layers.Input(features)).
        loss, optimizer, dtype, loss_scale, record, seed, name, channels_last, fuse: as Model's.
    """

    def __init__(self, layers, loss="cross_entropy", optimizer=None, dtype="float32", loss_scale=None,
                 record=True, seed=0, name="sequential", channels_last=None, fuse=True):
        layers = list(layers)
        if not layers or not all(isinstance(x, Layer) for x in layers):
            raise ConfigError("Sequential needs a non-empty list of dnn.layers layers")
        if not isinstance(layers[0], Input) or any(isinstance(x, Input) for x in layers[1:]):
            raise ConfigError("the first layer of a Sequential must be an Input (and only the first), e.g. "
                              "layers.Input((1, 28, 28)) or layers.Input(784)")
        if len({id(x) for x in layers}) != len(layers):
            raise ConfigError("a Sequential lists each layer once")
        if not dmath.is_initialized():
            dmath.init()
        first = t = SymbolicTensor(layers[0].shape, layers[0])
        for layer in layers[1:]:
            if getattr(layer, "joins", False):
                raise ConfigError(f"{type(layer).__name__} joins several tensors: build such a network with "
                                  f"dnn.Model (the functional API), not Sequential")
            t = call_layer(layer, t)
        super().__init__(first, t, loss=loss, optimizer=optimizer, dtype=dtype, name=name, loss_scale=loss_scale,
                         record=record, seed=seed, channels_last=channels_last, fuse=fuse)

    def get_config(self):
        return {"class": "Sequential", "name": self.name, "dtype": self.dtype, "loss": self.loss.name,
                "seed": self.seed, "record": self.record,
                "loss_scale": self.loss_scale.get_config() if self.loss_scale is not None else None,
                "layers": [layer.get_config() for layer in self.layers]}

    @classmethod
    def from_config(cls, config, optimizer=None):
        """A new model (fresh weights) from get_config()'s dict."""
        if not isinstance(config, dict) or config.get("class") != "Sequential":
            raise ConfigError(f"not a Sequential config: {config!r}")
        ls = config.get("loss_scale")
        return cls([from_config(c) for c in config["layers"]], loss=config["loss"], optimizer=optimizer,
                   dtype=config["dtype"], loss_scale=optim.DynamicLossScale(**ls) if ls else None,
                   record=config.get("record", True), seed=config.get("seed", 0),
                   name=config.get("name", "sequential"))


def load(path):
    """The model saved in `path` by Model.save, ready to continue training at this run's worker count
    and layouts; dmath's random streams continue from where the saving run stood."""
    return serialization.load_model(path)


def _check_range(x, dtype, what):
    """Refuse samples that the model's dtype turns into infinity: float16 above 65504, float32
    above 3.4e38 (float64 samples of 1e39 gave a float32 model NaN predictions and losses, silently).

    numpy samples are scanned here (unless their dtype holds nothing beyond the model's range); a
    Dataset's values were looked at once, as they were placed from arrays, or by a reduction on the
    workers where they keep them in memory (Dataset._largest_magnitude). The values of a
    Dataset.from_npy with placement='mapped' are not checked (that would read the whole file
    again on every worker): a value beyond the model's range there gives an infinite loss, which
    fit's TerminateOnNaN stops at.
    """
    top = float(np.finfo(dtype).max)
    if isinstance(x, Dataset):
        biggest = x._largest_magnitude(dtype)
        if biggest is None or biggest <= top:
            return
    else:
        a = np.asarray(x)
        if a.dtype.kind not in "iuf" or not a.size:
            return
        wide = np.finfo(a.dtype).max if a.dtype.kind == "f" else max(abs(np.iinfo(a.dtype).min), np.iinfo(a.dtype).max)
        if float(wide) <= top:
            return                                  # (no value of the samples' type can pass it: no scan)
        biggest = float(np.nanmax(np.abs(a)))
        if biggest <= top:
            return
    wider = {"float16": "dtype='float32'", "float32": "dtype='float64'"}.get(dtype, "a wider dtype")
    # (a Dataset's scale= is no cure: batches become the model's dtype before it applies)
    raise ConfigError(f"{what}: a {dtype} model needs inputs within +-{top:g}; the largest magnitude "
                      f"here is {biggest:g}, which becomes infinity. Normalise the inputs before they are "
                      f"placed (a Dataset's scale= applies after the conversion), or use {wider}")


def _check_builds(graph):
    """Raise what building the layers of `graph` would (ShapeError), changing nothing: a built layer
    called on samples of another shape than it was built for, or a new one called on two shapes (a
    layer's weights fit one input shape)."""
    planned = {}
    for i, t in enumerate(graph.tensors):
        layer = t.layer
        shape = tuple(t.shape if not graph.inbound[i] else graph.sample_shapes(i))
        if layer.built:
            if shape != layer.input_shape:
                raise ShapeError(f"{layer.name} was built for samples of shape {layer.input_shape}, now given "
                                 f"{shape}")
            continue
        first = planned.setdefault(id(layer), shape)
        if shape != first:
            raise ShapeError(f"{layer.name} ({type(layer).__name__}) is called on samples of shape {first} and "
                             f"of shape {shape}; a layer (its weights) serves one input shape: give the other "
                             f"call a layer of its own")


def _check_names(layers):
    """ConfigError when two of `layers` have one name (a model's names key its files and state dicts).
    Layers without a name are named by the model, never so; two layers named by two separate models
    (each numbers its own: 'dense_1' in both) and then combined collide, and the message says which
    and what to do."""
    names = {}
    for layer in layers:
        if layer.named:
            names.setdefault(layer.name, []).append(layer)
    twice = {name: group for name, group in names.items() if len(group) > 1}
    if twice:
        which = "; ".join(f"{name!r} names {len(group)} layers ({', '.join(type(x).__name__ for x in group)})"
                          for name, group in twice.items())
        why = ("Layers named automatically by separate models ('dense_1' in each) collide when combined: "
               if any(x.auto_named for group in twice.values() for x in group) else "")
        raise ConfigError(f"layer names must be unique within a model: {which}. {why}Give the layers names of "
                          f"their own when you create them (L.Dense(3, name='encoder_out'))")


def _loss_weights(weights, n):
    """One finite non-negative float per output (None: 1 each)."""
    if weights is None:
        return (1.0,) * n
    if isinstance(weights, (str, bytes)):       # (a str of two digits passed as two weights)
        raise ConfigError(f"loss_weights must be a list of one number per output, got {weights!r}")
    try:
        weights = [float(w) for w in weights]
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"loss_weights must be a list of one number per output, got {weights!r}") from exc
    if len(weights) != n or not all(math.isfinite(w) and w >= 0 for w in weights):
        raise ConfigError(f"loss_weights must be {n} finite non-negative numbers (one per output), got {weights!r}")
    return tuple(weights)


def _layout_name(layout):
    return type(layout).__name__
