"""dmath.nn.dense_backward: a dense layer's gradients over a batch in a row layout, at every worker count.

Oracles: NumPy in float64 for dX and the float64 sums; for the weight and bias gradients of a RowBlock
batch, each worker's own sum over its rows (its addend), rounded once to the weights' dtype: the
Partial matrices hold exactly those addends (no communication), and float32/float64 agree bit for bit
with the gemm and column-sum path they replace in dnn's Linear layer.
"""
import numpy as np
import pytest

import dmath

P = dmath.num_workers()
N, IN, OUT = 11, 7, 5          # 11 rows: uneven blocks at 2-4 workers, an empty block at none


def _data(dtype, seed=0):
    rng = np.random.default_rng(seed)
    x, w, dy = rng.standard_normal((N, IN)), rng.standard_normal((IN, OUT)), rng.standard_normal((N, OUT))
    return [a.astype(dtype) for a in (x, w, dy)]


def _blocks(n, p):
    """The row ranges of RowBlock over p workers (numpy's array_split)."""
    edges = np.cumsum([0] + [len(b) for b in np.array_split(np.arange(n), p)])
    return [(edges[k], edges[k + 1]) for k in range(p)]


@pytest.mark.parametrize("dtype", ["float64", "float32", "float16"])
def test_gradients_against_numpy(dtype):
    x, w, dy = _data(dtype)
    X = dmath.from_numpy(x, layout=dmath.RowBlock())
    W = dmath.from_numpy(w, layout=dmath.Replicated())
    DY = dmath.from_numpy(dy, layout=dmath.RowBlock())
    dx, dw, db = dmath.nn.dense_backward(DY, X, W)
    assert dx.layout == X.layout and dx.dtype == dtype
    assert dw.layout.partial and dw.dtype == dtype and db.shape == (1, OUT)   # (as conv2d_backward's)
    f = {"float64": 1e-12, "float32": 1e-5, "float16": 2e-2}[dtype]
    x64, w64, dy64 = (a.astype(np.float64) for a in (x, w, dy))
    np.testing.assert_allclose(dx.to_numpy(), dy64 @ w64.T, rtol=f, atol=f)
    # the sum over the workers: each worker's addend rounded once, then added (in float64 here)
    want_w = sum((x64[a:b].T @ dy64[a:b]).astype(dtype).astype(np.float64) for a, b in _blocks(N, P))
    want_b = sum(dy64[a:b].sum(axis=0, keepdims=True).astype(dtype).astype(np.float64) for a, b in _blocks(N, P))
    np.testing.assert_allclose(dw.remap(dmath.Replicated(), dtype="float64").to_numpy(), want_w, rtol=f, atol=f)
    np.testing.assert_allclose(db.remap(dmath.Replicated(), dtype="float64").to_numpy(), want_b, rtol=f, atol=f)


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_the_same_bits_as_gemm_and_the_column_sums(dtype):
    x, w, dy = _data(dtype, seed=1)
    X = dmath.from_numpy(x, layout=dmath.RowBlock())
    W = dmath.from_numpy(w, layout=dmath.Replicated())
    DY = dmath.from_numpy(dy, layout=dmath.RowBlock())
    dx, dw, db = dmath.nn.dense_backward(DY, X, W)
    np.testing.assert_array_equal(dx.to_numpy(), dmath.gemm(DY, W, trans_b=True).to_numpy())
    np.testing.assert_array_equal(dw.remap(dmath.Replicated()).to_numpy(),
                                  dmath.gemm(X, DY, trans_a=True).remap(dmath.Replicated()).to_numpy())
    np.testing.assert_array_equal(db.remap(dmath.Replicated()).to_numpy(),
                                  DY.sum(axis=0).remap(dmath.Replicated()).to_numpy())


def test_float16_addends_are_rounded_on_each_worker_without_communication():
    # each worker's addend is its own float32 sum rounded once to float16; nothing is exchanged
    x, w, dy = _data("float16", seed=2)
    X = dmath.from_numpy(x, layout=dmath.RowBlock())
    W = dmath.from_numpy(w, layout=dmath.Replicated())
    DY = dmath.from_numpy(dy, layout=dmath.RowBlock())
    before = dmath.stats()
    _, dw, db = dmath.nn.dense_backward(DY, X, W, need_dx=False)
    after = dmath.stats()
    sent = [a["data_bytes_sent"] - b["data_bytes_sent"] for a, b in zip(after, before)]
    assert sent == [0] * P
    total = np.zeros((IN, OUT))
    for a, b in _blocks(N, P):
        total += (x[a:b].astype(np.float32).T @ dy[a:b].astype(np.float32)).astype(np.float16).astype(np.float64)
    np.testing.assert_allclose(dw.remap(dmath.Replicated(), dtype="float64").to_numpy(), total, rtol=1e-3, atol=1e-3)


def test_a_replicated_batch_gives_complete_sums():
    x, w, dy = _data("float64", seed=3)
    X = dmath.from_numpy(x, layout=dmath.Replicated())
    W = dmath.from_numpy(w, layout=dmath.Replicated())
    DY = dmath.from_numpy(dy, layout=dmath.Replicated())
    dx, dw, db = dmath.nn.dense_backward(DY, X, W)
    assert dw.layout.replicated and db.layout.replicated and dx.layout.replicated
    np.testing.assert_allclose(dw.to_numpy(), x.T @ dy, rtol=1e-12)
    np.testing.assert_allclose(db.to_numpy(), dy.sum(axis=0, keepdims=True), rtol=1e-12)


def test_only_what_is_asked_for_and_a_recorded_replay():
    x, w, dy = _data("float32", seed=4)
    X = dmath.from_numpy(x, layout=dmath.RowBlock())
    W = dmath.from_numpy(w, layout=dmath.Replicated())
    DY = dmath.from_numpy(dy, layout=dmath.RowBlock())
    assert dmath.nn.dense_backward(DY, X, W, need_dx=False, need_dw=False, need_db=False) == (None, None, None)
    dx, dw, db = dmath.nn.dense_backward(DY, X, W, need_dx=False, need_db=False)
    assert dx is None and db is None and dw is not None
    out = dmath.zeros((IN, OUT), dtype="float32", layout=dmath.Replicated())
    with dmath.record() as plan:
        out.assign(dmath.nn.dense_backward(DY, X, W, need_dx=False, need_db=False)[1].remap(dmath.Replicated()))
    for _ in range(2):
        plan.replay()
        np.testing.assert_allclose(out.to_numpy(), x.astype(np.float64).T @ dy, rtol=1e-5, atol=1e-5)
    plan.close()


def test_bad_arguments_are_refused_on_the_master():
    x, w, dy = _data("float32")
    X = dmath.from_numpy(x, layout=dmath.RowBlock())
    W = dmath.from_numpy(w, layout=dmath.Replicated())
    DY = dmath.from_numpy(dy, layout=dmath.RowBlock())
    with pytest.raises(dmath.ShapeError):
        dmath.nn.dense_backward(DY, X, dmath.from_numpy(w[:3], layout=dmath.Replicated()))
    with pytest.raises(dmath.ShapeError):
        dmath.nn.dense_backward(dmath.from_numpy(dy[:, :2], layout=dmath.RowBlock()), X, W)
    with pytest.raises(dmath.DTypeError, match="share a dtype"):
        dmath.nn.dense_backward(DY, X, dmath.from_numpy(w, layout=dmath.Replicated(), dtype="float64"))
    with pytest.raises(dmath.DMathError, match="need_dw"):
        dmath.nn.dense_backward(DY, X, W, need_dw="yes")
    # usable after the refusals
    np.testing.assert_allclose(dmath.nn.dense_backward(DY, X, W)[0].to_numpy(), dy @ w.T, rtol=1e-5, atol=1e-5)
