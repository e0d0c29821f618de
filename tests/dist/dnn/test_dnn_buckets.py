"""Gradient buckets (dnn.training.buckets): data-parallel weight gradients summed several at a time.

Oracle: the same training with every gradient summed alone (bucket_mb = 0), in float64, at every
worker count, and the one-worker run (where nothing is summed at all).
"""
import numpy as np
import pytest

import dmath
import dnn
from dnn import layers as L

P = dmath.num_workers()


def _train(bucket_mb, dtype="float64", epochs=2, sum_dtype=None):
    rng = np.random.default_rng(3)
    x, y = rng.standard_normal((96, 1, 8, 8)), rng.integers(0, 5, 96)
    dmath.random.seed(11)
    m = dnn.Sequential([L.Input((1, 8, 8)), L.Conv2D(4, 3, padding=1, activation="relu"), L.BatchNorm(),
                        L.Pool2D(2), L.Flatten(), L.Dense(32, activation="relu"), L.Dense(16, activation="tanh"),
                        L.Dense(5), L.Output("softmax")],
                       dtype=dtype, optimizer=dnn.optim.SGD(lr=0.05, momentum=0.9))
    m.bucket_mb = bucket_mb
    if sum_dtype is not None:
        m.gradient_sum_dtype = sum_dtype
    m.data = dnn.data.Dataset(x, y)       # held: the recorded programs live with their dataset's feed
    m.fit(m.data, batch_size=24, epochs=epochs, shuffle=True, verbose=0)
    return m


def _buckets(m):
    return m._last_program().buckets


@pytest.fixture(scope="module")
def alone():
    return _train(0)


@pytest.mark.parametrize("bucket_mb", [25, 0.002])
def test_buckets_train_as_gradients_summed_alone(alone, bucket_mb):
    m = _train(bucket_mb)
    for a, b in zip(m.get_weights(), alone.get_weights()):
        np.testing.assert_allclose(a, b, rtol=1e-11, atol=1e-12)
    buckets = _buckets(m)
    nparams = len(m.params)
    if P == 1:
        assert buckets == []              # one worker: nothing to sum
        return
    # every Partial gradient summed exactly once (BatchNorm's come out of its kernel summed already)
    flat = [k for b in buckets for k in b]
    assert len(set(flat)) == len(flat) and set(flat) <= set(range(nparams))
    assert len(flat) == nparams - 2
    if bucket_mb == 25:
        assert len(buckets) == 1          # a small model: one all-reduce for the whole step
    else:
        # 2 KiB buckets: several, none past the cap by more than its last gradient, the final one small
        assert len(buckets) > 2
        sizes = [sum(m.params[k].value.size * 8 for k in b) for b in buckets]
        assert sizes[-1] <= 2048 or len(buckets[-1]) == 1
    assert _buckets(alone) == []          # bucket_mb = 0: each gradient moved alone, as it completed
    assert f"{len(buckets)} all-reduces of" in m.explain_parallel()


def _train16(bucket_mb, sum_dtype):
    return _train(bucket_mb, "float16", epochs=1, sum_dtype=sum_dtype)


@pytest.mark.parametrize("sum_dtype", ["float16", "float32"])
def test_float16_training_with_buckets_matches_per_weight_sums(sum_dtype):
    a, b = _train16(0, sum_dtype), _train16(25, sum_dtype)
    # the sums' grouping differs (one buffer or one per weight): float16 sums may round apart
    tol = 2e-3 if sum_dtype == "float16" and P > 1 else 1e-6
    for u, v in zip(a.get_weights(), b.get_weights()):
        np.testing.assert_allclose(u, v, rtol=tol, atol=tol)


def test_float16_sums_stay_close_to_float32_sums():
    a, b = _train16(25, "float16"), _train16(25, "float32")
    if P == 1:          # nothing is summed: the same step
        for u, v in zip(a.get_weights(), b.get_weights()):
            np.testing.assert_array_equal(u, v)
        return
    for u, v in zip(a.get_weights(), b.get_weights()):
        np.testing.assert_allclose(u, v, rtol=1e-2, atol=1e-2)


def test_gradient_sum_dtype_is_checked():
    m = dnn.Sequential([L.Input(4), L.Dense(3), L.Output("softmax")], dtype="float16")
    assert m.gradient_sum_dtype == "float16"
    with pytest.raises(dnn.ConfigError, match="'float16' or 'float32'"):
        m.gradient_sum_dtype = "float64"
    m32 = dnn.Sequential([L.Input(4), L.Dense(3), L.Output("softmax")], dtype="float32")
    assert m32.gradient_sum_dtype == "float32"
    with pytest.raises(dnn.ConfigError, match="float16 model's choice"):
        m32.gradient_sum_dtype = "float16"


@pytest.mark.parametrize("bad", [-1, float("inf"), "25", True, None])
def test_bucket_mb_is_checked(bad):
    m = dnn.Sequential([L.Input(4), L.Dense(3), L.Output("softmax")])
    with pytest.raises(dnn.ConfigError, match="bucket_mb"):
        m.bucket_mb = bad
