"""Sequential: a stack of layers trained with fit, used with evaluate and predict.

    model = dnn.Sequential([L.Input((1, 28, 28)), L.Flatten(), L.Dense(528), L.Activation('sigmoid'),
                            L.Dense(10), L.Output('softmax')],
                           loss='cross_entropy', optimizer=dnn.optim.SGD(lr=0.05), dtype='float32')
    history = model.fit(x, y, batch_size=100, epochs=5, validation_data=(xv, yv))

Training (fit, the recorded programs of each batch size and mode) is in
dnn/training, which the class inherits. The batch is in
row blocks over the workers (data parallelism); see dnn.parallel for the
per-layer strategies.

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

from . import losses, optim, serialization
from .data import Dataset
from .data.dataset import as_dataset
from .errors import ConfigError, ShapeError
from .graph.node import canonical_dtype
from .layers import Dropout, Input, Layer, from_config
from .training.fit import EVAL_BATCH, Training, positive_int as _positive_int
from .training.programs import Metrics

#: model seeds stay below this: Dropout layers without a seed of their own draw with seed * 1000 + i + 1
SEED_END = 2 ** 53 // 1000 - 1000


class Sequential(Training):
    """A linear stack of layers with a loss and an optimizer.

    Args:
        layers: the layers, the first an Input.
        loss: 'cross_entropy', 'binary_cross_entropy', 'mse' or a dnn.losses.Loss.
        optimizer: a dnn.optim optimizer, a name or None (SGD(lr=0.01)).
        dtype: 'float16', 'float32' or 'float64' (activations; weights are
            float32 for float16).
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
    dmath is initialised here if the program has not done so.
    """

    def __init__(self, layers, loss="cross_entropy", optimizer=None, dtype="float32", loss_scale=None,
                 record=True, seed=0, name="sequential", channels_last=None):
        if not dmath.is_initialized():
            dmath.init()
        layers = list(layers)
        if not layers or not all(isinstance(x, Layer) for x in layers):
            raise ConfigError("Sequential needs a non-empty list of dnn.layers layers")
        if not isinstance(layers[0], Input) or any(isinstance(x, Input) for x in layers[1:]):
            raise ConfigError("the first layer of a Sequential must be an Input (and only the first), e.g. "
                              "layers.Input((1, 28, 28)) or layers.Input(784)")
        if isinstance(seed, bool) or not isinstance(seed, numbers.Integral) or not 0 <= seed < SEED_END:
            # (Dropout layers draw with seed * 1000 + their place: dmath's draws take keys below 2**53)
            raise ConfigError(f"seed must be an integer in [0, {SEED_END}), got {seed!r}")
        if not isinstance(record, bool):
            raise ConfigError(f"record must be True or False, got {record!r}")
        if not isinstance(name, str):
            raise ConfigError(f"name must be a string, got {name!r}")
        self.name, self.seed, self.record = name, int(seed), record
        if channels_last not in (None, True, False):
            raise ConfigError(f"channels_last must be None (on GPUs with cuDNN), True or False, got {channels_last!r}")
        if channels_last is None:
            channels_last = dmath.device() == "gpu" and dmath.gpu.cudnn.available()
        self.channels_last = channels_last
        self.dtype = canonical_dtype(dtype)
        self.param_dtype = "float32" if self.dtype == "float16" else self.dtype
        self.loss = losses.get(loss)
        self.optimizer = optim.get(optimizer if optimizer is not None else optim.SGD())
        if self.dtype == "float16":
            self.loss_scale = loss_scale if loss_scale is not None else optim.DynamicLossScale()
            if not isinstance(self.loss_scale, optim.DynamicLossScale):
                raise ConfigError(f"loss_scale must be a dnn.optim.DynamicLossScale, got {loss_scale!r}")
            self.loss_scale.setup()
        elif loss_scale is not None:
            raise ConfigError("loss_scale applies to dtype='float16' only")
        else:
            self.loss_scale = None
        self.layers = layers
        self._name_layers()
        shape = layers[0].shape
        for layer in layers:
            shape = layer.build(shape, self.param_dtype)
        self.input_shape, self.output_shape = layers[0].shape, shape
        self.outputs = math.prod(shape)
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

    def _name_layers(self):
        counts, taken = {}, {x.name for x in self.layers if x.name}
        for i, layer in enumerate(self.layers):
            if layer.name is None:
                kind = type(layer).__name__.lower()
                while True:
                    counts[kind] = counts.get(kind, 0) + 1
                    name = f"{kind}_{counts[kind]}"
                    if name not in taken:
                        break
                layer.name = name
                taken.add(name)
            if isinstance(layer, Dropout) and layer.seed is None:
                layer.seed = self.seed * 1000 + i + 1
        if len(taken) != len(self.layers):
            raise ConfigError(f"layer names must be unique, got {[x.name for x in self.layers]}")

    # ---- parameters ------------------------------------------------------------------
    @property
    def params(self):
        """The trainable Variables, layer by layer (kernel, then bias)."""
        return [p for layer in self.layers for p in layer.params]

    def count_params(self):
        return sum(layer.count_params() for layer in self.layers)

    def get_weights(self):
        """Every weight as a numpy array, layer by layer (kernel, then bias; BatchNorm: gamma, beta,
        running mean, running variance)."""
        return [a for layer in self.layers for a in layer.get_weights()]

    def set_weights(self, weights):
        """Write weights in get_weights' order and shapes (in place: recorded steps stay valid)."""
        weights = list(weights)
        expected = sum(len(layer.weights) for layer in self.layers)
        if len(weights) != expected:
            raise ShapeError(f"set_weights: the model has {expected} weights, got {len(weights)} arrays")
        i = 0
        for layer in self.layers:
            n = len(layer.weights)
            layer.set_weights(weights[i:i + n])
            i += n

    # ---- data ---------------------------------------------------------------------------
    def _dataset(self, x, y, what="x", targets=True):
        """`x` as a Dataset checked against the model (arrays are checked first, then placed once)."""
        if isinstance(x, dmath.Matrix):
            raise ConfigError(f"{what}: pass numpy arrays or a dnn.data.Dataset; batches are made on the workers")
        _check_range(x, self.dtype, what)

        def check(features, kind, width, label_range):
            if features != math.prod(self.input_shape):
                raise ShapeError(f"{what}: samples must have shape {self.input_shape} (or be flat rows of "
                                 f"{math.prod(self.input_shape)}), got samples of {features} values")
            if targets:
                if kind is None:
                    raise ConfigError(f"{what}: targets are needed (y, or a Dataset built with y)")
                self.loss.one_hot(kind, width, label_range, self.outputs)      # raises on a misfit
        return as_dataset(x, y, what, check)

    def _feed(self, ds, reading=False):
        """This model's Feed over dataset `ds` (made once per dataset and use; dropped with the dataset).

        Training has a cursor of its own (reading=False), and evaluate and predict another: an
        evaluation of the training set from a callback in the middle of an epoch leaves the epoch's
        order and position as they were."""
        feeds = self._feeds.get(ds)
        if feeds is None:
            feeds = self._feeds[ds] = {}
        feed = feeds.get(reading)
        if feed is None:
            feed = feeds[reading] = ds.feed()
        return feed

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
        batch_size = EVAL_BATCH if batch_size is None else _positive_int(batch_size, "batch_size")
        return self._evaluate(self._dataset(x, y), batch_size)

    def _evaluate(self, ds, batch_size):
        feed = self._feed(ds, reading=True)
        feed.start_epoch(None, 0)
        metrics = self.eval_metrics
        metrics.reset()
        for size in self._batches(feed.n, batch_size):
            self._program("eval", size, feed).run()
            metrics.samples += size
        loss, acc = metrics.read()
        out = {"loss": loss}
        if self.loss.accuracy:
            out["accuracy"] = acc
        return out

    def predict(self, x, batch_size=None):
        """The network's outputs (after the output activation) for x (numpy samples or a Dataset),
        a numpy array (N, outputs)."""
        batch_size = EVAL_BATCH if batch_size is None else _positive_int(batch_size, "batch_size")
        if x is None:
            raise ConfigError("predict: x must be numpy samples or a dnn.data.Dataset, got None")
        if not isinstance(x, Dataset) and np.ndim(x) and len(x) == 0:
            features = math.prod(np.shape(x)[1:]) if np.ndim(x) > 1 else None
            if features != math.prod(self.input_shape):
                raise ShapeError(f"predict: samples must have shape {self.input_shape}, got an empty array of "
                                 f"shape {np.shape(x)}")
            return np.zeros(self._predicted_shape(0), dtype=self.dtype)
        ds = self._dataset(x, None, targets=False)
        feed = self._feed(ds, reading=True)
        feed.start_epoch(None, 0)
        out = []
        for size in self._batches(feed.n, batch_size):
            prog = self._program("predict", size, feed)
            prog.run()
            out.append(prog.output.value.to_numpy())
        return np.concatenate(out).reshape(self._predicted_shape(feed.n))

    def _predicted_shape(self, n):
        """The shape of predict's result for n samples: (n, outputs), or (n,) + an image output's shape."""
        return (n,) + tuple(self.output_shape) if len(self.output_shape) > 1 else (n, self.outputs)

    # ---- description -------------------------------------------------------------------------------
    def summary(self, print_fn=print):
        """Print (and return) the layers with output shapes, parameters, parallel strategy and layouts."""
        acts = self._activation_layouts()
        rows = [("Layer (type)", "Output shape", "Params", "Parallel", "Weights", "Activations")]
        shape = self.input_shape
        for i, layer in enumerate(self.layers):
            shape = layer.output_shape(shape)
            names = {_layout_name(w.value.layout) for w in layer.weights}
            lays = names.pop() if len(names) == 1 else \
                ", ".join(f"{w.name.split('/')[-1]} {_layout_name(w.value.layout)}" for w in layer.weights)
            strategy = (layer.strategy or "auto") if layer.weights else "-"
            rows.append((f"{layer.name} ({type(layer).__name__})", str(tuple(shape)), str(layer.count_params()),
                         strategy, lays or "-", acts.get(i, "RowBlock")))
        widths = [max(len(r[k]) for r in rows) for k in range(len(rows[0]))]
        line = lambda r: "  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip()  # noqa: E731
        rule = "-" * len(line(rows[0]).ljust(sum(widths) + 2 * (len(widths) - 1)))
        text = [f"Model: {self.name}  (dtype {self.dtype}, weights {self.param_dtype}, {dmath.num_workers()} "
                f"worker(s), batch RowBlock: data parallel)", rule, line(rows[0]), rule]
        text += [line(r) for r in rows[1:]]
        text += [rule, f"Total params: {self.count_params():,}",
                 f"Loss: {self.loss.name}   Optimizer: {type(self.optimizer).__name__} "
                 f"(lr {self.optimizer.current_lr():g})"
                 + ("   Loss scaling: dynamic" if self.loss_scale is not None else "")]
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

    def save(self, path):
        """Write a checkpoint to `path` (see dnn.serialization): the architecture, the weights as global
        arrays, the optimizer's state and clock, the loss scale, the epoch (and the batch, when called
        inside an epoch, e.g. by a callback), the layers' random counters and dmath's random streams.
        dnn.load resumes it at any worker count: fit(..., initial_epoch=k) continues as if never stopped."""
        serialization.save_model(self, path)

    def load_weights(self, path):
        """Load the weights and training state (optimizer, counters, epoch) of a model file into this
        model; they must match."""
        header, arrays = serialization.read_file(path)
        serialization.load_state(self, header, arrays, path)


def load(path):
    """The model saved in `path` by Model.save, ready to continue training at this run's worker count
    and layouts; dmath's random streams continue from where the saving run stood."""
    return serialization.load_model(path)


def _check_range(x, dtype, what):
    """Refuse numpy samples that the model's dtype turns into infinity (float16 above 65504)."""
    if dtype != "float16" or isinstance(x, Dataset):
        return
    a = np.asarray(x)
    if a.dtype.kind in "iuf" and a.size:
        biggest = float(np.nanmax(np.abs(a)))
        if biggest > float(np.finfo(np.float16).max):
            raise ConfigError(f"{what}: a float16 model needs inputs within +-{np.finfo(np.float16).max:g}; "
                              f"the largest magnitude here is {biggest:g}, which becomes infinity. Normalise "
                              f"the inputs (or Dataset(..., scale=...)), or use dtype='float32'")


def _layout_name(layout):
    return type(layout).__name__
