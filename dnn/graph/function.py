"""Function: one differentiable operation of the graph (Chainer's FunctionNode).

A Function instance belongs to one node. `infer` checks the input nodes and
gives the output's shape, dtype and sample shape when the graph is built;
`forward` computes the output matrix from the input matrices (keeping on
`self` what `backward` needs); `backward` turns the output's gradient into
one gradient per input. Everything runs as dmath commands, so a whole
training step (forward, backward, update) is a fixed sequence of commands on
fixed matrices: it can be recorded once and replayed.
"""
from typing import NamedTuple

from ..errors import GraphError
from .node import Node


class GradientTerms(NamedTuple):
    """The gradient of a node read by two consumers, as their two contributions: handed to a backward
    whose function `takes_gradient_terms`, which adds them where its kernels read the gradient (the sum
    is never written out: a residual block's output, BatchNorm's backward)."""
    first: object
    second: object


class Function:
    """Base of the differentiable operations in dnn.ops.

    Subclasses set `name` and implement:
        infer(*inputs)              -> (shape, dtype, sample_shape or None); raise ShapeError on misfit
        forward(*xs)                -> the output dmath.Matrix
        backward(xs, y, gy, needs)  -> a tuple with one gradient (Matrix) or None per input;
                                       needs[i] says whether input i's gradient is wanted;
                                       xs or y may be None where saves_inputs / saves_output
                                       say that backward does not read them
    A value that must change at every step (a dropout mask) is computed on the
    workers from a counter matrix that the forward pass advances in place, so
    that a recorded step draws a new one at every replay.
    """

    name = "function"
    #: whether backward reads the input values / the output value (a training step drops each value
    #: after its last reader: execute.Releases); narrow these only where backward truly does not
    saves_inputs = True
    saves_output = True
    #: whether an image input may be channels-last rows (the output then is too): elementwise
    #: functions of one image, whose result does not depend on where a value sits in the row
    keeps_channels_last = False
    #: whether backward takes its output's gradient as GradientTerms (two matrices to add) as well as
    #: one matrix: then the graph hands it the two contributions of a value read twice unsummed
    takes_gradient_terms = False

    def infer(self, *inputs):
        """(shape, dtype, sample_shape) of the output for the input nodes, when the node is built (so a
        misfit raises where the network is written); default: the first input's."""
        first = inputs[0]
        return first.shape, first.dtype, first.sample_shape

    def forward(self, *xs):
        """The output matrix from the input matrices (dmath commands; keep on `self` what backward needs
        beyond xs and y)."""
        raise NotImplementedError

    def backward(self, xs, y, gy, needs):
        """The gradients of the inputs from the output's gradient `gy`: a list with one entry per input,
        None where `needs[k]` is False (input k needs no gradient). xs and y are the values of forward."""
        raise NotImplementedError

    def saves_input(self, k):
        """Whether backward reads the value of input k (`saves_inputs` for every input unless a
        function narrows it: a fused residual is added, its value never read again)."""
        return self.saves_inputs

    def drop_saved(self):
        """Forget what forward kept on `self` for backward (a mask, pooling indices): called once
        backward has run in a training step, so that nothing holds it until the next step."""

    def running_terms(self):
        """((Partial terms, target matrix, keep), ...) that the training step sums over the workers
        and assigns to their targets once its forward has run: the running statistics of a batch
        norm with each worker's own statistics, whose update keeps the share `keep` of the old value
        (1 - momentum: a second call's update combines with the first's by it). () for every other
        function."""
        return ()

    def apply(self, *inputs, name=None):
        """Build the node that computes this function of `inputs` (nodes)."""
        for x in inputs:
            if not isinstance(x, Node):
                raise GraphError(f"{self.name}: inputs must be graph nodes, got {type(x).__name__} "
                                 f"(wrap matrices with dnn.graph.constant or dnn.graph.var)")
        shape, dtype, sample_shape = self.infer(*inputs)
        node = Node(shape, dtype, fn=self, inputs=inputs, name=name, sample_shape=sample_shape)
        node.channels_last = self.output_channels_last(inputs)
        return node

    def output_channels_last(self, inputs):
        """Whether the output rows are channels-last; a function that cannot read such an input
        refuses it here, when the graph is built (its result would be silently wrong)."""
        last = any(x.channels_last for x in inputs)
        if last and not self.keeps_channels_last:
            raise GraphError(f"{self.name}: an input holds channels-last image rows, which {self.name} does not "
                             f"read; convert it first with dnn.ops.to_channels_first")
        return last
