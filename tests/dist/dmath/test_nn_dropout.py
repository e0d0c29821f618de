"""dmath.nn.dropout: inverted dropout whose mask depends on (seed, step, global index) only."""
import numpy as np
import pytest

import dmath
import _nn_ref as ref
from _cases import make, values
from dmath.ops.creation import _uniform, stream_key
from dmath.ops.nn.dropout import DROPOUT_LANE

P = dmath.num_workers()
LAYOUTS = ref.batch_layouts(P)
SHAPE = (9, 13)


def _expected_mask(shape, p, seed, step):
    """The mask from the generator over the whole matrix at once, in this process: what every
    worker count and layout must reproduce."""
    index = (np.arange(shape[0], dtype=np.uint64)[:, None] * np.uint64(shape[1])
             + np.arange(shape[1], dtype=np.uint64)[None, :])
    with np.errstate(over="ignore"):
        u = _uniform(np, index, np.uint64(stream_key(seed, step, DROPOUT_LANE)))
    return (u >= p) / (1.0 - p)


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_mask_is_independent_of_layout_and_worker_count(name):
    x = values(SHAPE, 1)
    y, mask = dmath.nn.dropout(make(x, LAYOUTS[name](SHAPE[0]), "float64"), 0.3, seed=7, step=4)
    want = _expected_mask(SHAPE, 0.3, 7, 4)
    np.testing.assert_array_equal(mask.to_numpy(), want)
    np.testing.assert_array_equal(y.to_numpy(), x * want)
    assert type(y.layout) is dmath.RowBlock or y.layout.replicated


def test_mask_statistics_and_scaling():
    p = 0.25
    x = np.ones((200, 50))
    y, mask = dmath.nn.dropout(dmath.from_numpy(x, dtype="float32"), p, seed=1, step=0)
    m = mask.to_numpy()
    assert set(np.unique(m)) <= {0.0, np.float32(1 / (1 - p))}
    kept = (m > 0).mean()
    assert abs(kept - (1 - p)) < 0.02, kept            # 10,000 draws: 5 standard deviations
    assert abs(y.to_numpy().mean() - 1.0) < 0.03       # inverted dropout keeps the expectation


def test_step_and_seed_change_the_mask_and_p_zero_keeps_everything():
    xm = dmath.from_numpy(values(SHAPE, 2))
    masks = [dmath.nn.dropout(xm, 0.5, seed=s, step=t)[1].to_numpy() for s, t in ((3, 0), (3, 1), (4, 0), (3, 0))]
    assert not np.array_equal(masks[0], masks[1])
    assert not np.array_equal(masks[0], masks[2])
    np.testing.assert_array_equal(masks[0], masks[3])
    y, mask = dmath.nn.dropout(xm, 0.0, seed=3, step=0)
    np.testing.assert_array_equal(mask.to_numpy(), 1.0)
    np.testing.assert_array_equal(y.to_numpy(), xm.to_numpy())


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_counter_matrix_step_equals_the_scalar_step(dtype):
    xm = dmath.from_numpy(values(SHAPE, 7))
    counter = dmath.full((1, 1), 5.0, dtype, layout=dmath.Replicated())
    np.testing.assert_array_equal(dmath.nn.dropout(xm, 0.3, seed=2, step=counter)[1].to_numpy(),
                                  _expected_mask(SHAPE, 0.3, 2, 5))
    counter += 1.0
    np.testing.assert_array_equal(dmath.nn.dropout(xm, 0.3, seed=2, step=counter)[1].to_numpy(),
                                  _expected_mask(SHAPE, 0.3, 2, 6))
    # a counter held elsewhere (RowBlock on one worker) is replicated on the way
    other = dmath.full((1, 1), 9.0, dtype, layout=dmath.RowBlock())
    np.testing.assert_array_equal(dmath.nn.dropout(xm, 0.3, seed=2, step=other)[1].to_numpy(),
                                  _expected_mask(SHAPE, 0.3, 2, 9))


@pytest.mark.skipif(not hasattr(dmath, "record"), reason="recorded plans not in this dmath")
def test_recorded_plan_draws_a_new_mask_every_replay():
    x = values(SHAPE, 8)
    xm = make(x, dmath.RowBlock(), "float64")
    counter = dmath.zeros((1, 1), "float64", layout=dmath.Replicated())
    with dmath.record() as plan:
        y, mask = dmath.nn.dropout(xm, 0.5, seed=3, step=counter)
        counter += 1.0
    for step in range(3):
        if step:
            plan.replay()
        np.testing.assert_array_equal(mask.to_numpy(), _expected_mask(SHAPE, 0.5, 3, step))
        np.testing.assert_array_equal(y.to_numpy(), x * _expected_mask(SHAPE, 0.5, 3, step))


def test_backward_is_the_mask():
    """Y = X * mask is linear in X: dL/dX = R * mask, checked by central differences."""
    x = values(SHAPE, 3)
    r = values(SHAPE, 4)
    _, mask = dmath.nn.dropout(dmath.from_numpy(x), 0.4, seed=9, step=2)
    grad = r * mask.to_numpy()

    def loss(z):
        return float((dmath.nn.dropout(dmath.from_numpy(z), 0.4, seed=9, step=2)[0].to_numpy() * r).sum())
    ref.directional_check(loss, x, grad, seed=5)


@pytest.mark.parametrize("dtype", ["float16", "float32"])
def test_low_precision(dtype):
    x = values(SHAPE, 5)
    y, mask = dmath.nn.dropout(dmath.from_numpy(x, dtype=dtype), 0.5, seed=2, step=3)
    want = _expected_mask(SHAPE, 0.5, 2, 3)
    assert y.dtype == mask.dtype == dtype
    np.testing.assert_array_equal(mask.to_numpy(), want.astype(dtype))
    np.testing.assert_array_equal(y.to_numpy(), (x.astype(dtype) * want.astype(dtype)))


@pytest.mark.parametrize("bad", [dict(p=1.0), dict(p=-0.1), dict(p=float("nan")), dict(seed=-1), dict(seed=1.5),
                                 dict(step=2.0 ** 53), dict(step="1"), dict(step=float("inf")), dict(step=np.zeros((1, 1)))])
def test_errors_raise_on_the_master(bad):
    xm = dmath.from_numpy(values(SHAPE, 6))
    args = dict(p=0.5, seed=1, step=0)
    args.update(bad)
    with pytest.raises(dmath.DMathError):
        dmath.nn.dropout(xm, **args)
    with pytest.raises(dmath.ShapeError):
        dmath.nn.dropout(xm, 0.5, 1, dmath.zeros((1, 2)))
    with pytest.raises(dmath.DTypeError):
        dmath.nn.dropout(xm, 0.5, 1, dmath.zeros((1, 1), "float16"))
    assert dmath.nn.dropout(xm, 0.5, 1, 0)[0].shape == SHAPE
