"""Independent branches on their own CUDA streams inside a captured training step (DMATH_GRAPH_STREAMS,
dmath/runtime/streams.py): every rank plans the recorded programs of a branchy model on several
streams, and training with streams gives the losses and weights of training without them (on a GPU,
where the captured graphs follow the plans: an Inception-like model and GoogLeNet). Runs at every
worker count."""
import gc

import numpy as np
import pytest

import dmath
import dnn
from dmath.ops.base import dispatch
from dnn import layers as L

GPU = dmath.device() == "gpu"


def _set_streams(n):
    # (a test-only kernel: the setting is read at init, and a plan is planned when it is defined)
    dispatch("test_graph_streams", scalars=[n])


@pytest.fixture
def streams():
    """Set the streams of the plans defined next on every rank; back to the setting's value at the end."""
    before = dmath.settings.current.graph_streams
    yield _set_streams
    _set_streams(before)


def _inception_like(dtype):
    """A stem, then two modules of four branches (1x1 | 1x1-3x3 | 1x1-3x3-3x3 | pool-1x1) concatenated."""
    x = dnn.Input((3, 8, 8))
    h = L.Activation("relu")(L.BatchNorm()(L.Conv2D(8, 3, padding=1, use_bias=False)(x)))
    for _ in range(2):
        a = L.Conv2D(4, 1)(h)
        b = L.Conv2D(4, 3, padding=1)(L.Activation("relu")(L.Conv2D(3, 1)(h)))
        c = L.Conv2D(2, 3, padding=1)(L.Conv2D(2, 3, padding=1)(L.Conv2D(2, 1)(h)))
        d = L.Conv2D(2, 1)(L.Pool2D(3, stride=1, padding=1)(h))
        h = L.Activation("relu")(L.Concatenate()([a, b, c, d]))
    out = L.Output("softmax")(L.Dense(5)(L.GlobalAvgPool2D()(h)))
    return dnn.Model(x, out, dtype=dtype, optimizer=dnn.optim.SGD(lr=0.05, momentum=0.9))


def _googlenet(dtype):
    return dnn.models.googlenet(num_classes=5, input_shape=(3, 32, 32), dtype=dtype, dropout=0.0,
                                optimizer=dnn.optim.SGD(lr=0.02, momentum=0.9))


def _train(build, n_streams, x, y, set_streams):
    """(losses, weights, per-rank stats with the model alive) of a model trained from seed 7."""
    gc.collect()
    dmath.stats()       # (earlier models' graphs dropped on the workers: the stats below are this one's)
    set_streams(n_streams)
    dmath.random.seed(7)
    model = build()
    # 4 steps an epoch: recorded, replayed step by step, captured (GPU), then launched
    hist = model.fit(x, y, batch_size=len(x) // 4, epochs=2, shuffle=False, verbose=0)
    return hist["loss"], model.get_weights(), dmath.stats()


CASES = [("inception_like", _inception_like, (3, 8, 8)),
         pytest.param("googlenet", _googlenet, (3, 32, 32),
                      marks=pytest.mark.skipif(not GPU, reason="GoogLeNet's step is for the GPU run (slow on CPUs)"))]


@pytest.mark.parametrize("name,build,shape", CASES)
def test_training_with_streams_gives_the_same_step(streams, name, build, shape):
    # float64 on every backend: cuDNN's float64 kernels give the same bits run to run, so any
    # difference is the streams' (float32 weight gradients differ in their last bits from run to run,
    # on one stream too, and eight SGD steps with momentum amplify that past any useful tolerance)
    dtype = "float64"
    rng = np.random.default_rng(3)
    x, y = rng.normal(size=(32,) + shape), rng.integers(0, 5, 32)
    loss1, w1, stats1 = _train(lambda: build(dtype), 1, x, y, streams)
    loss4, w4, stats = _train(lambda: build(dtype), 4, x, y, streams)
    # every rank planned the training step on several streams (four branches), never more than allowed
    assert all(1 < s["plan_streams"] <= 4 for s in stats), [s["plan_streams"] for s in stats]
    if GPU:
        assert stats[0]["plan_graphs"] >= 1           # the step ran as a graph captured on those streams
        # every stream takes its blocks from one free list: the graphs' pools stay about one stream's
        # size (with a free list per stream, Inception v3's grew 1.7x and ran out of memory)
        shared = dmath.settings.current.graph_streams_memory == "shared"
        for one, four in zip(stats1, stats if shared else ()):
            assert four["pool"]["graphs"] <= 1.25 * one["pool"]["graphs"] + (8 << 20), \
                (four["pool"]["graphs"], one["pool"]["graphs"])
    # the streams change the order of kernels on a GPU, never what they compute: a race between
    # streams (a buffer reused too early, a missed wait) gives errors of the size of the values
    # (0.016 in the bucket model's weights at 2 H100s). At 2 GPUs GoogLeNet's weights after 8 steps
    # differed in one of 160 values by 1.8e-12 (relative 1e-8): float64 rounding amplified, not a race
    tol = dict(rtol=1e-7, atol=1e-10) if GPU else dict(rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(loss4, loss1, **tol)
    for a, b in zip(w4, w1):
        np.testing.assert_allclose(a, b, **tol)



@pytest.mark.skipif(not GPU, reason="cuDNN's workspaces: GPU only")
@pytest.mark.parametrize("n_streams", [1, 4])
def test_workspaces_of_their_call_give_the_kept_workspaces_results(streams, n_streams):
    """Every cuDNN workspace allocated for its call (DMATH_CUDNN_WORKSPACE_KEEP=0: inside the captured
    step from the graph's pool, freed after the convolution, on each stream its own) trains the
    Inception-like model to the losses and weights of one kept buffer per stream: a block of a
    freed workspace reused before its convolution ended would show as errors of the values' size."""
    keep = dmath.settings.current.cudnn_workspace_keep
    rng = np.random.default_rng(5)
    x, y = rng.normal(size=(32, 3, 8, 8)), rng.integers(0, 5, 32)
    try:
        loss_kept, w_kept, _ = _train(lambda: _inception_like("float64"), n_streams, x, y, streams)
        dispatch("test_cudnn_workspace_keep", scalars=[0])
        loss_own, w_own, stats = _train(lambda: _inception_like("float64"), n_streams, x, y, streams)
    finally:
        dispatch("test_cudnn_workspace_keep", scalars=[keep])
    assert stats[0]["plan_graphs"] >= 1
    tol = dict(rtol=1e-7, atol=1e-10)
    np.testing.assert_allclose(loss_own, loss_kept, **tol)
    for a, b in zip(w_own, w_kept):
        np.testing.assert_allclose(a, b, **tol)
