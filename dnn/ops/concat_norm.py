"""A channel concatenation whose branches each end in a batch norm (and its relu): every batch norm
writes its channels of the concatenation where they lie (dmath.nn.batchnorm's window), so the
concatenation's copy, and the split of its gradient, disappear. An Inception module's branches
(conv -> BatchNorm -> relu, read by the Concatenate only) run so; dnn.functional.concat_branches
finds them when a model is built.
"""
import dmath

from ..errors import GraphError, ShapeError
from ..graph.function import Function


class ConcatBatchNorm(Function):
    """The channel concatenation of act_k(batchnorm_k(x_k)), the batch norms written in place.

    Inputs: (x, gamma, beta) of each branch in the concatenation's order; `norms`: each branch's
    dnn.ops.BatchNorm function (its running statistics, mode, eps, momentum and fused activation),
    used for its checks and what its forward saves. Backward reads each x, gamma and beta (a relu's
    mask is recomputed from them: dmath.nn.batchnorm_backward's beta=), never the output.
    """
    name = "concat_batchnorm"
    keeps_channels_last = True
    saves_output = False            # the relus' masks come from x, gamma and beta

    def __init__(self, norms):
        self.norms = list(norms)
        if len(self.norms) < 2 or any(bn.activation not in (None, "relu") for bn in self.norms):
            raise GraphError(f"{self.name}: needs two or more batch norms (activation None or 'relu')")

    def infer(self, *ins):
        if len(ins) != 3 * len(self.norms):
            raise GraphError(f"{self.name}: {len(self.norms)} branches take {3 * len(self.norms)} inputs "
                             f"(x, gamma, beta each), got {len(ins)}")
        n, dtype, hw = ins[0].shape[0], ins[0].dtype, None
        for k, bn in enumerate(self.norms):
            x = ins[3 * k]
            bn.infer(*ins[3 * k:3 * k + 3])
            if bn.image_shape is None or x.shape[0] != n or x.dtype != dtype or \
                    bn.image_shape[1:] != (hw or bn.image_shape[1:]) or x.channels_last != ins[0].channels_last:
                raise ShapeError(f"{self.name}: the branches must be batches of {n} {dtype} images of one height "
                                 f"and width, in one row order; branch {k} is {x.shape} {x.dtype}, samples "
                                 f"{x.sample_shape}")
            hw = bn.image_shape[1:]
        self.widths = [bn.image_shape[0] for bn in self.norms]
        total = sum(self.widths)
        return (n, total * hw[0] * hw[1]), dtype, (total,) + hw

    def forward(self, *ins):
        out, offset, total = None, 0, sum(self.widths)
        for k, bn in enumerate(self.norms):
            x, gamma, beta = ins[3 * k:3 * k + 3]
            if out is not None and x.layout != out.layout:
                x = x.remap(out.layout)         # (a branch of other rows: where the concatenation's are)
            out, bn.saved = dmath.nn.batchnorm(x, gamma, beta, bn.running_mean, bn.running_var, bn.image_shape,
                                               bn.training, bn.momentum, bn.eps, channels_last=bn.channels_last,
                                               activation=bn.activation, window=(total, offset), out=out,
                                               synchronized=bn.synchronized)
            offset += self.widths[k]
        return out

    def saves_input(self, k):
        # each branch's x and gamma, and its beta where a relu's mask is recomputed from them
        return k % 3 != 2 or self.norms[k // 3].activation == "relu"

    def backward(self, xs, y, gy, needs):
        grads, offset, total = [], 0, sum(self.widths)
        for k, bn in enumerate(self.norms):
            if any(needs[3 * k:3 * k + 3]):
                grads += dmath.nn.batchnorm_backward(gy, xs[3 * k], xs[3 * k + 1], bn.saved, bn.image_shape,
                                                     channels_last=bn.channels_last, window=(total, offset),
                                                     beta=xs[3 * k + 2] if bn.activation == "relu" else None)
            else:
                grads += [None] * 3
            offset += self.widths[k]
        return tuple(grads)

    def running_terms(self):
        """Every branch's running-statistics terms (see dnn.ops.BatchNorm.running_terms)."""
        return tuple(entry for bn in self.norms for entry in bn.running_terms())

    def drop_saved(self):
        for bn in self.norms:
            bn.saved = None
