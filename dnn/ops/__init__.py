"""Differentiable operations, one module per family; each holds Function classes and node builders.

    elementwise    Elementwise: a dmath elementwise function made differentiable by its name
    arithmetic     add, sub, mul, div, neg, pow, exp, log, sum, mean, add_n, cast
    activation     sigmoid, tanh, relu, softmax, log_softmax
    dense          matmul, linear (dense with bias)
    loss           softmax_cross_entropy, cross_entropy, binary_cross_entropy,
                   sigmoid_binary_cross_entropy, mse
    dropout        dropout
    conv           conv2d, pool2d, to_channels_last, to_channels_first
    normalization  batchnorm
    shape          reshape, flatten
    join           merge_add, concat, global_avg_pool, adaptive_avg_pool, pad (branchy networks)
    concat_norm    ConcatBatchNorm (a concatenation whose branches' batch norms write it in place)
"""
from .activation import (ACTIVATIONS, Identity, LogSoftmax, Relu, Sigmoid, Softmax, Tanh, activation,
                         log_softmax, relu, sigmoid, softmax, tanh)
from .elementwise import Elementwise
from .arithmetic import (Add, AddN, Affine, Cast, Div, Exp, Log, Mul, Neg, PowScalar, Sub, Sum, add, add_n, cast, div,
                         exp, log, mean, mul, neg, pow, sub, sum)
from .conv import (Conv2D, ImageFormat, Pool2D, conv2d, fold_relu_masks, pool2d, to_channels_first,
                   to_channels_last)
from .dense import Linear, MatMul, linear, matmul
from .dropout import Dropout, dropout
from .loss import (BinaryCrossEntropy, CrossEntropy, MeanSquaredError, SigmoidBinaryCrossEntropy,
                   SoftmaxCrossEntropy, binary_cross_entropy, cross_entropy, mse, sigmoid_binary_cross_entropy,
                   softmax_cross_entropy)
from .join import (AdaptiveAvgPool, Concat, GlobalAvgPool, Merge, Pad, adaptive_avg_pool, concat, global_avg_pool,
                   merge_add, pad)
from .normalization import BatchNorm, batchnorm
from .concat_norm import ConcatBatchNorm
from .shape import Reshape, flatten, reshape
