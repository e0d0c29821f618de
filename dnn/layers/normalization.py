"""BatchNorm: per-feature (flat samples) or per-channel (image samples) batch normalization."""
import numbers

import numpy as np

import dmath

from ..checked import Checked
from ..errors import ConfigError
from ..ops import BatchNorm as BatchNormFn
from ..ops.normalization import check_training_batch
from .base import Layer
from .core import counter_value


def _momentum(value):
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not 0 <= value <= 1:
        raise ConfigError(f"BatchNorm: momentum must be in [0, 1], got {value!r}")
    return float(value)


def _eps(value):
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not value > 0 or value == float("inf"):
        raise ConfigError(f"BatchNorm: eps must be positive and finite, got {value!r}")
    return float(value)


class BatchNorm(Layer):
    """y = gamma (x - mean) / sqrt(var + eps) + beta; batch statistics in training (all-reduced over
    the batch's workers), running statistics in evaluation, updated as PyTorch (momentum 0.1,
    unbiased variance). Weights: gamma, beta (trained), running_mean, running_var (buffers).

    synchronized: True (the default), the statistics of the whole global batch at every worker
    count (PyTorch's SyncBatchNorm: the result of one worker); False, each data-parallel worker
    normalises its own samples by their own statistics (PyTorch's BatchNorm under DDP, Keras'
    default): no all-reduce on the step's path in either pass, the results depend on the worker
    count. The running statistics stay one value on every worker either way: with False, each
    worker's update is averaged over the workers by one all-reduce per step, beside the backward
    pass. A change takes effect at the next fit (its training step is recorded anew)."""
    #: normalises channels-last image rows as they are (a GPU model converts nothing around it)
    image_rows = "channels_last"
    #: an Add that this layer's output alone feeds may run inside its kernel, the other addend as the
    #: residual (dnn.functional.residual_tails: a residual block's tail)
    adds_residual = True
    #: its output, read by a Concatenate alone, may be written straight into its channels of the
    #: concatenation (dnn.functional.concat_branches: an Inception module's branches)
    writes_slices = True
    #: each call in training updates the running statistics: a model runs its calls in the order they
    #: were written (dnn.functional's ordering edges), so a shared BatchNorm's statistics are PyTorch's
    updates_on_call = True

    momentum = Checked(_momentum)
    eps = Checked(_eps)

    def __init__(self, momentum=0.1, eps=1e-5, synchronized=True, name=None):
        super().__init__(name)
        self.synchronized = synchronized
        self.momentum, self.eps = momentum, eps
        #: training steps that updated the running statistics (PyTorch's num_batches_tracked)
        self.batches_tracked = 0

    @property
    def synchronized(self):
        """Whether training normalises by the global batch's statistics (True) or each worker's own."""
        return self._synchronized

    @synchronized.setter
    def synchronized(self, value):
        # (set between fits too: a string such as "False" would read as True)
        if not isinstance(value, bool):
            raise ConfigError(f"BatchNorm: synchronized must be True or False, got {value!r}")
        self._synchronized = value

    def _create(self, sample_shape, dtype):
        c = sample_shape[0]
        rep = dmath.Replicated()
        self.gamma = self._add_weight("gamma", "ones", (1, c), dtype, rep, public_shape=(c,))
        self.beta = self._add_weight("beta", "zeros", (1, c), dtype, rep, public_shape=(c,))
        # the running statistics stay float32 or float64 (never float16): they average many batches
        self.running_mean = self._add_weight("running_mean", "zeros", (1, c), dtype, rep, public_shape=(c,),
                                             trainable=False)
        self.running_var = self._add_weight("running_var", "ones", (1, c), dtype, rep, public_shape=(c,),
                                            trainable=False, minimum=0)

    def check_training_batch(self, batch):
        if self.built and self.trainable:      # (a frozen one uses no batch statistics)
            check_training_batch(batch, self.input_shape, self.name,
                                 1 if self.synchronized else dmath.num_workers())

    def forward(self, x, ctx, activation=None, residual=None):
        """The layer's node; `activation` ('relu', a following Activation layer the model folds in)
        runs in the same kernel, after adding the node `residual` when given (an Add the model folds
        in: dnn.functional.residual_tails)."""
        fn, params = self.function(ctx, activation)
        return fn.apply(x, *params) if residual is None else fn.apply(x, *params, residual)

    def function(self, ctx, activation=None):
        """(this layer's batch norm Function for the program of ctx, its parameter nodes (gamma, beta))."""
        # a frozen BatchNorm normalises with its running statistics and leaves them as they are
        training = ctx.training and self.trainable
        fn = BatchNormFn(self.running_mean.value, self.running_var.value, training, self.momentum, self.eps,
                         activation, self.synchronized)
        return fn, (ctx.param(self.gamma), ctx.param(self.beta))

    def absorbs(self, layer):
        """True when `layer`, coming right after this one, can run inside this layer's kernel (a relu:
        one pass over the activations instead of two, forward and backward)."""
        return type(layer).__name__ == "Activation" and layer.activation == "relu"

    def get_state(self):
        return {"num_batches_tracked": np.array(self.batches_tracked, dtype=np.int64)}

    def check_state(self, arrays):
        """`get_state`'s arrays checked, changing nothing: {"num_batches_tracked": int}, or {} without it
        (an int64 in a file and in a state_dict: below 2**63)."""
        if "num_batches_tracked" not in arrays:
            return {}
        return {"num_batches_tracked": counter_value(arrays["num_batches_tracked"],
                                                     f"{self.name}: num_batches_tracked", 2 ** 63)}

    def set_state(self, arrays):
        checked = self.check_state(arrays)
        if "num_batches_tracked" in checked:
            self.batches_tracked = checked["num_batches_tracked"]

    def get_config(self):
        return {**super().get_config(), "momentum": self.momentum, "eps": self.eps,
                "synchronized": self.synchronized}
