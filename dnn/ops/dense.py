"""Matrix products: matmul, and the dense (fully-connected) layer y = x W + b.

Everything goes through dmath.gemm, which is correct for any layouts. With
the batch x in row blocks and W replicated (data parallelism) the forward
product and dx stay in row blocks, and the dense layer's backward is
dmath.nn.dense_backward: dW = x^T dy and db come out Partial, each worker's
sum over its own samples rounded to W's dtype (a convolution's weight
gradients alike), with no communication; the step's gradient buckets sum
them. (A float16 gemm sums the workers' addends in float32 before its
rounding: an exchange in the middle of the backward pass where every worker
waited for the slowest, and then the bucket summed the result again.) With
W in column blocks (model parallelism) dmath moves the activations instead.
"""
import dmath

from ..errors import ShapeError
from ..graph.function import Function
from ._util import result_dtype


class MatMul(Function):
    """y = a @ b."""
    name = "matmul"
    saves_output = False

    def infer(self, a, b):
        if a.shape[1] != b.shape[0]:
            raise ShapeError(f"matmul: {a.shape} @ {b.shape} does not fit (inner dimensions differ)")
        return (a.shape[0], b.shape[1]), result_dtype(a, b), None

    def forward(self, a, b):
        return dmath.gemm(a, b)

    def backward(self, xs, y, gy, needs):
        a, b = xs
        return (dmath.gemm(gy, b, trans_b=True) if needs[0] else None,
                dmath.gemm(a, gy, trans_a=True) if needs[1] else None)


class Linear(Function):
    """y = x W (+ b): x (N, in), W (in, out), b (1, out)."""
    name = "dense"
    saves_output = False

    def infer(self, x, w, b=None):
        if x.shape[1] != w.shape[0]:
            raise ShapeError(f"dense: input of {x.shape[1]} features does not fit a kernel of shape "
                             f"{w.shape} (in_features, out_features)")
        if b is not None and b.shape != (1, w.shape[1]):
            raise ShapeError(f"dense: the bias must be (1, {w.shape[1]}), got {b.shape}")
        return (x.shape[0], w.shape[1]), x.dtype, None

    def forward(self, x, w, b=None):
        y = dmath.gemm(x, w)
        if b is not None:
            y += b
        return y

    def backward(self, xs, y, gy, needs):
        x, w = xs[0], xs[1]
        if _data_parallel(x, w, gy):
            grads = dmath.nn.dense_backward(gy, x, w, need_dx=needs[0], need_dw=needs[1],
                                            need_db=len(xs) == 3 and needs[2])
            return grads[:len(xs)]
        gx = dmath.gemm(gy, w, trans_b=True) if needs[0] else None
        gw = dmath.gemm(x, gy, trans_a=True) if needs[1] else None
        if len(xs) == 2:
            return gx, gw
        return gx, gw, (gy.sum(axis=0) if needs[2] else None)


def _data_parallel(x, w, gy):
    """Whether a dense layer's backward is dmath.nn.dense_backward's case: the batch in a row layout,
    its gradient in the same, the kernel replicated over the batch's workers, one dtype."""
    p = dmath.num_workers()
    rows = isinstance(x.layout, dmath.RowBlock) or x.layout.replicated
    return (rows and gy.layout == x.layout and w.layout.replicated
            and set(x.layout.members(p)) <= set(w.layout.members(p)) and x.dtype == w.dtype == gy.dtype)


def matmul(a, b):
    """The matrix product a @ b of two nodes."""
    return MatMul().apply(a, b)


def linear(x, w, b=None):
    """x @ w + b (b a (1, out) row broadcast over the batch, or None)."""
    return Linear().apply(x, w) if b is None else Linear().apply(x, w, b)
