"""Every operation that has a backend kernel of its own (on a GPU: cuDNN's convolutions, the CUDA C
pooling, dropout, update and all-finite kernels, the one-launch elementwise path), run through the
op-case harness: against a NumPy oracle, and each backend kernel against the generic kernel of the
same command. On the CPU no production op has such a kernel, and these are oracle checks only."""
import numpy as np
import pytest

import dmath
import _nn_ref as ref

from _cases import make, values
from _harness import check_cases

P = dmath.num_workers()
N, C, H, W, K = 2 * P + 1, 3, 6, 7, 4
DTYPES = ["float16", "float32", "float64"]


def _images(seed):
    return values((N, C * H * W), seed)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", ["row", "rep"])
def test_convolution(dtype, layout):
    x, w, b = _images(1), values((K, C * 3 * 3), 2), values((1, K), 3)
    lay = dmath.RowBlock() if layout == "row" else dmath.Replicated()
    xm, wm, bm = make(x, lay, dtype), make(w, dmath.Replicated(), dtype), make(b, dmath.Replicated(), dtype)
    q = lambda a: a.astype(dtype).astype(np.float64)       # noqa: E731 - the operands as stored
    want = ref.conv2d(q(x).reshape(N, C, H, W), q(w).reshape(K, C, 3, 3), q(b).reshape(-1), padding=(1, 1))
    relu = np.maximum(want, 0).reshape(N, -1)
    check_cases([("conv2d", lambda: dmath.nn.conv2d(xm, wm, bm, (C, H, W), kernel_hw=(3, 3), padding=(1, 1)),
                  want.reshape(N, -1)),
                 ("conv2d + relu", lambda: dmath.nn.conv2d(xm, wm, bm, (C, H, W), kernel_hw=(3, 3), padding=(1, 1),
                                                           activation="relu"), relu)],
                dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("mode", ["max", "average"])
def test_pooling_and_its_backward(dtype, mode):
    x = _images(4)
    xm = make(x, dmath.RowBlock(), dtype)
    q = x.astype(dtype).astype(np.float64).reshape(N, C, H, W)
    want = ref.pool2d(q, (2, 2), (2, 2), (0, 0), mode).reshape(N, -1)
    dy = values(want.shape, 5)
    dym = make(dy, dmath.RowBlock(), dtype)
    y, argmax = dmath.nn.pool2d(xm, (C, H, W), 2, mode=mode)
    # the gradient of pooling: each output's gradient to the input(s) it came from (an odd width: the
    # last column of every row is in no window)
    qy = want.reshape(N, C, H // 2, W // 2)
    dx = np.zeros((N, C, H, W))
    for i in range(H // 2):
        for j in range(W // 2):
            win = q[:, :, 2 * i:2 * i + 2, 2 * j:2 * j + 2]
            g = dy.astype(dtype).astype(np.float64).reshape(N, C, H // 2, W // 2)[:, :, i, j][:, :, None, None]
            if mode == "max":
                first = (win == qy[:, :, i, j][:, :, None, None]).reshape(N, C, 4)
                first = (np.cumsum(first, axis=2) == 1) & first        # the first maximum takes it
                dx[:, :, 2 * i:2 * i + 2, 2 * j:2 * j + 2] += (first.reshape(N, C, 2, 2) * g)
            else:
                dx[:, :, 2 * i:2 * i + 2, 2 * j:2 * j + 2] += g / 4
    check_cases([("pool2d", lambda: dmath.nn.pool2d(xm, (C, H, W), 2, mode=mode)[0], want),
                 ("pool2d_backward", lambda: dmath.nn.pool2d_backward(dym, argmax, (C, H, W), 2, mode=mode),
                  dx.reshape(N, -1))], dtype)
    assert y.shape == want.shape


@pytest.mark.parametrize("dtype", DTYPES)
def test_dropout(dtype):
    x = values((N, 40), 6)
    xm = make(x, dmath.RowBlock(), dtype)
    mask = dmath.nn.dropout(xm, 0.25, seed=7, step=3)[1].to_numpy().astype(np.float64)
    assert set(np.unique(mask)) <= {0.0, np.float64(np.asarray(1 / 0.75, dtype))}
    check_cases([("dropout", lambda: dmath.nn.dropout(xm, 0.25, seed=7, step=3)[0],
                  x.astype(dtype).astype(np.float64) * mask)], dtype)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_fused_updates_and_all_finite(dtype):
    p, g, v = values((9, 5), 8), values((9, 5), 9), values((9, 5), 10)
    pm, gm, vm = (make(a, dmath.RowBlock(), dtype) for a in (p, g, v))
    # SGD with momentum 0.9 and weight decay 0.01 (PyTorch's rule), lr 0.1
    d = g + 0.01 * p
    v_new = 0.9 * v + d
    check_cases([("sgd_update", lambda: dmath.nn.sgd_update(pm, gm, 0.1, vm, momentum=0.9, weight_decay=0.01),
                  p - 0.1 * v_new),
                 ("its momentum buffer", lambda: vm, v_new),
                 ("all_finite", lambda: dmath.nn.all_finite([pm, gm]), np.ones((1, 1)))], dtype)
