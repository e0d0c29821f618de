"""Neural-network operations on distributed batches: softmax, cross-entropy, convolution, pooling,
batch normalisation, dropout, labels; and fused optimizer steps (sgd_update, adam_update, their
_many forms over lists of parameters, all_finite).

A batch is a matrix of shape (N, features): row i is sample i, an image
batch is (N, C*H*W) in NCHW order with the image shape (C, H, W) passed as a
tuple, or channels-last (N, H*W*C) where conv2d and pool2d are told
`channels_last=True` (to_channels_last / to_channels_first convert; cuDNN's
fastest kernels read that order without converting). Every function accepts a batch in any layout and first puts it in a
row layout, where each worker holds whole samples: RowBlock (data
parallelism; any group and sizes) and Replicated are used as they are,
anything else is remapped to RowBlock over the same workers (a Partial
batch is reduced on the way). Results come back in that row layout.
Parameters (kernels, biases, gamma, beta) are replicated over the batch's
workers before dispatch; the kernels then run on each worker's own samples.

Sums over the batch:
- weight gradients of conv2d_backward and dense_backward come out Partial
  over the batch's workers for a RowBlock batch (each worker's sum over its
  samples, rounded to the weights' dtype: no communication until the caller
  remaps them to Replicated, typically all layers at once), and Replicated
  for a Replicated batch (every member already holds the complete sum);
- batch-norm statistics and gradients and the cross-entropy loss are
  all-reduced inside the kernel, so they equal the one-worker result.

Every argument is checked on the master before anything is sent to the
workers; a mistake raises ShapeError, LayoutError, DTypeError or DMathError
and leaves the runtime usable. This module is the public face: each
operation (its master half and its kernels) is defined once in its family
module, dmath/ops/nn/*.py, and the conv/pool window geometry in
dmath/planning/conv.py.
"""
from .ops.nn.batch import take_rows, transform_images
from .ops.nn.conv import conv2d, conv2d_backward, conv2d_output_shape, explain_conv2d
from .ops.nn.dense import dense_backward
from .ops.nn.dropout import dropout
from .ops.nn.adaptive import adaptive_avg_pool, adaptive_avg_pool_backward
from .ops.nn.join import concat_features, crop_images, pad_images, split_features
from .ops.nn.format import to_channels_first, to_channels_last
from .ops.nn.labels import argmax_rows, one_hot
from .ops.nn.norm import BatchNormSaved, batchnorm, batchnorm_backward
from .ops.nn.pool import pool2d, pool2d_backward
from .ops.nn.softmax import log_softmax, softmax, softmax_cross_entropy, softmax_cross_entropy_backward
from .ops.nn.update import adam_update, adam_update_many, all_finite, sgd_update, sgd_update_many

__all__ = ["sgd_update", "adam_update", "sgd_update_many", "adam_update_many", "all_finite", "take_rows",
           "transform_images", "explain_conv2d",
           "softmax", "log_softmax", "softmax_cross_entropy", "softmax_cross_entropy_backward",
           "conv2d", "conv2d_output_shape", "conv2d_backward", "dense_backward", "pool2d", "pool2d_backward",
           "batchnorm", "batchnorm_backward", "BatchNormSaved", "dropout", "argmax_rows", "one_hot",
           "to_channels_last", "to_channels_first", "concat_features", "split_features", "pad_images",
           "crop_images", "adaptive_avg_pool", "adaptive_avg_pool_backward"]
