"""dmath.nn's True/False arguments are checked on the master (a string such as 'no' is truthy: taken as
True, batchnorm trained when asked not to and conv2d read an NCHW batch as channels-last), and an
update refuses one matrix given as two of the things it writes (the one state was lost)."""
import numpy as np
import pytest

import dmath
import dmath.nn as nn


def _m(a, layout=None):
    return dmath.from_numpy(np.asarray(a, dtype=np.float64), layout=layout)


def _calls():
    """(name of the flag, call with the flag set to `bad`) for each True/False argument."""
    x = _m(np.arange(16.0).reshape(2, 8))                       # 2 images of (2, 2, 2)
    w = _m(np.ones((1, 2)))
    img = (2, 2, 2)
    g, b = _m(np.ones((1, 2))), _m(np.zeros((1, 2)))
    rm, rv = _m(np.zeros((1, 2)), dmath.Replicated()), _m(np.ones((1, 2)), dmath.Replicated())
    dy = _m(np.ones((2, 4)))
    order, pos = _m(np.arange(2.0).reshape(1, 2), dmath.Replicated()), _m([[0.0]], dmath.Replicated())
    out = _m(np.zeros((2, 8)))
    p, grad = _m(np.ones((2, 2))), _m(np.ones((2, 2)))
    return [
        ("training", lambda bad: nn.batchnorm(x, g, b, rm, rv, img, training=bad)),
        ("channels_last", lambda bad: nn.conv2d(x, w, None, img, kernel_hw=(1, 1), channels_last=bad)),
        ("need_dx", lambda bad: nn.conv2d_backward(dy, x, w, img, (1, 1), need_dx=bad)),
        ("need_dw", lambda bad: nn.conv2d_backward(dy, x, w, img, (1, 1), need_dw=bad)),
        ("ceil_mode", lambda bad: nn.pool2d(x, img, (2, 2), ceil_mode=bad)),
        ("after_relu", lambda bad: nn.pool2d(x, img, (2, 2), after_relu=bad)),
        ("channels_last", lambda bad: nn.adaptive_avg_pool(x, img, (1, 1), channels_last=bad)),
        ("channels_last", lambda bad: nn.pad_images(x, img, (1, 0, 0, 1), channels_last=bad)),
        ("one_hot", lambda bad: nn.take_rows(_m(np.arange(16.0).reshape(2, 8), dmath.Replicated()), order, pos,
                                             out, one_hot=bad)),
        ("nesterov", lambda bad: nn.sgd_update(p, grad, 0.1, _m(np.zeros((2, 2))), momentum=0.9, nesterov=bad)),
    ]


@pytest.mark.parametrize("bad", ["no", 1, None, 0.0])
def test_flags_must_be_true_or_false(bad):
    for name, call in _calls():
        with pytest.raises(dmath.DMathError, match=f"{name} must be True or False"):
            call(bad)


def test_numpy_bools_are_flags():
    x = _m(np.arange(16.0).reshape(2, 8))
    y = nn.conv2d(x, _m(np.array([[1.0, 0.0]])), None, (2, 2, 2), kernel_hw=(1, 1), channels_last=np.False_)
    np.testing.assert_array_equal(y.to_numpy(), np.arange(16.0).reshape(2, 8)[:, :4])


def test_one_matrix_as_two_of_what_an_update_writes_is_refused():
    p, g, s = _m(np.ones((2, 2))), _m(np.full((2, 2), 2.0)), _m(np.zeros((2, 2)))
    with pytest.raises(dmath.DMathError, match="appears twice"):
        nn.adam_update(p, g, s, s, 0.1)
    with pytest.raises(dmath.DMathError, match="appears twice"):
        nn.sgd_update(p, g, 0.1, p, momentum=0.9)
    np.testing.assert_array_equal(p.to_numpy(), np.ones((2, 2)))      # nothing was sent
    np.testing.assert_array_equal(s.to_numpy(), np.zeros((2, 2)))
