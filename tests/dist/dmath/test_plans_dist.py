"""Recorded plans: a replay recomputes the block on current values with one control frame."""
import gc

import numpy as np
import pytest

import dmath
from dmath.comm.control import FRAME
from dmath.runtime import protocol

from _cases import layout, make, tol, values

P = dmath.num_workers()
SHAPE = (7, 5)
#: a spread of layout kinds (every kind is covered by the assign tests)
LAYOUTS = ["row", "col", "b2d", "bc23", "tiles", "rep", "partial"] + (["rep_g", "col_g"] if P > 1 else [])


def _handles():
    return dmath.stats()[0]["handles"]


def _settled_handles():
    """The live handles once two readings agree: at 2 H100s an earlier test's leftovers (700 handles,
    after a failed GoogLeNet test) were still being freed during a measurement that began after one
    reading."""
    gc.collect()
    n = _handles()
    while (m := _handles()) != n:
        n = m
    return n


def _block(x, y):
    """A few operations of several kinds: elementwise, broadcasting, remap, reductions."""
    z = x * y + 1.0
    w = dmath.relu(z - x.sum(axis=0))
    t = w.remap(dmath.ColBlock(), dtype="float32")
    total = t.sum()
    return z, w, t, total


def _oracle(x, y):
    z = x * y + 1.0
    w = np.maximum(z - x.sum(axis=0, keepdims=True), 0)
    return z, w, w.astype("float32"), float(w.astype("float32").sum())


@pytest.mark.parametrize("name", LAYOUTS)
def test_replay_equals_recompute(name):
    lay = layout(name, SHAPE, P)
    xv, yv = values(SHAPE, 1), values(SHAPE, 2)
    x, y = make(xv, lay, "float64"), make(yv, dmath.RowBlock(), "float64")
    with dmath.record() as plan:
        z, w, t, total = _block(x, y)
    for got, want in zip((z, w, t), _oracle(xv, yv)):
        np.testing.assert_allclose(got.to_numpy(), want, **tol(got.dtype))
    for k in range(2):
        xv, yv = values(SHAPE, 10 + k), values(SHAPE, 20 + k)
        x.assign(xv)
        y.assign(yv)
        (replayed_total,) = plan.replay()
        want = _oracle(xv, yv)
        for got, w_ in zip((z, w, t), want):
            np.testing.assert_allclose(got.to_numpy(), w_, **tol(got.dtype))
        np.testing.assert_allclose(replayed_total, want[3], rtol=1e-5)
        # the same as running the block again eagerly
        eager = _block(x, y)
        np.testing.assert_array_equal(t.to_numpy(), eager[2].to_numpy())


def test_replay_is_one_control_frame():
    x = make(values(SHAPE, 3), dmath.Block2D(), "float32")
    y = make(values(SHAPE, 4), dmath.ColBlock(), "float32")
    with dmath.record() as plan:
        a = x + y                  # y is remapped to Block2D: a temporary
        b = dmath.exp(a) * 0.5
        a = None                   # a temporary released inside the block
        c = b.sum(axis=1)
    assert plan.steps >= 4
    rt = dmath._runtime()
    dmath.stats()                  # flush pending frees so that the replay frame carries none
    sent = []
    original = rt.ctl.send

    def spy(message, total):
        sent.append(total)
        return original(message, total)

    s0 = dmath.stats()
    rt.ctl.send = spy
    try:
        plan.replay()
    finally:
        rt.ctl.send = original
    s1 = dmath.stats()
    assert sent == [protocol.HEADER.size] and sent[0] <= FRAME
    for r in range(P):
        # the replay and the second stats call, one frame each
        assert s1[r]["control_msgs"] - s0[r]["control_msgs"] == 2
        assert s1[r]["control_bytes"] - s0[r]["control_bytes"] == 2 * FRAME
        assert s1[r]["commands"] - s0[r]["commands"] == plan.steps + 1
    xv, yv = x.to_numpy().astype("f8"), y.to_numpy().astype("f8")
    np.testing.assert_allclose(c.to_numpy(), (np.exp(xv + yv) * 0.5).sum(axis=1, keepdims=True), rtol=1e-5)
    assert a is None and b.shape == SHAPE


def test_results_of_the_block_are_returned_in_order():
    xv = values(SHAPE, 5, lo=0.5, hi=2.0)
    x = make(xv, dmath.BlockCyclic((2, 2)), "float64")
    with dmath.record() as plan:
        first = [x.sum(), x.mean(), x.max(), x.min(), x.norm(), x.get((3, 2))]
        y = x * 3.0
        second = [y.to_numpy(), y.sum(axis=0)]      # a Matrix result is not a returned value
    assert len(first) == 6
    for k in range(2):
        xv = values(SHAPE, 50 + k, lo=0.5, hi=2.0)
        x.assign(xv)
        got = plan.replay()
        want = [xv.sum(), xv.mean(), xv.max(), xv.min(), np.linalg.norm(xv), xv[3, 2]]
        assert len(got) == 7
        np.testing.assert_allclose(got[:6], want, rtol=1e-12)
        np.testing.assert_allclose(got[6], 3 * xv, rtol=1e-12)
        np.testing.assert_allclose(second[1].to_numpy(), 3 * xv.sum(axis=0, keepdims=True), rtol=1e-12)


def test_in_place_updates_accumulate_over_replays():
    xv = values(SHAPE, 6)
    x = make(xv, dmath.RowBlock(), "float64")
    acc = dmath.zeros(SHAPE, "float64", dmath.ColBlock())
    with dmath.record() as plan:
        acc += x * 2.0
    for _ in range(3):
        plan.replay()
    np.testing.assert_allclose(acc.to_numpy(), 8 * xv, rtol=1e-12)


def test_replay_makes_new_versions():
    """Every write of a replay is a new shard version (the replica cache is keyed by it)."""
    rt = dmath._runtime()
    x = make(values(SHAPE, 7), dmath.RowBlock(), "float64")
    with dmath.record() as plan:
        y = x + 1.0
        x *= 0.5
    v_y, v_x = rt.table[y._handle].version, rt.table[x._handle].version
    plan.replay()
    assert rt.table[y._handle].version > v_y and rt.table[x._handle].version > v_x
    assert rt.table[y._handle].version != rt.table[x._handle].version


def test_temporaries_and_dropped_outputs_do_not_pile_up():
    x = make(values(SHAPE, 8), dmath.ColBlock(), "float64")
    with dmath.record() as plan:
        y = dmath.tanh(x.remap(dmath.RowBlock()) * 2.0) + x
        z = y * y
    before = _settled_handles()     # leftovers of earlier tests freed before the baseline, not during it
    for _ in range(5):
        plan.replay()
    assert _handles() == before
    del y                      # an output dropped after the block: each replay writes it, then frees it
    gc.collect()
    for _ in range(5):
        plan.replay()
    after = _handles()
    assert after == before - 1, (before, after)
    xv = x.to_numpy()
    yv = np.tanh(xv * 2.0) + xv
    np.testing.assert_allclose(z.to_numpy(), yv * yv, rtol=1e-12)
    plans = dmath.stats()[0]["plans"]
    plan.close()
    dmath.stats()
    assert dmath.stats()[0]["plans"] == plans - 1
    with pytest.raises(dmath.PlanError, match="closed"):
        plan.replay()


def test_freed_input_raises_and_runtime_stays_usable():
    xv, yv = values(SHAPE, 9), values(SHAPE, 10)
    x, y = make(xv, dmath.RowBlock(), "float64"), make(yv, dmath.Block2D(), "float64")
    with dmath.record() as plan:
        z = x - y
    del y
    gc.collect()
    s0 = dmath.stats()
    with pytest.raises(dmath.PlanError, match="freed"):
        plan.replay()
    s1 = dmath.stats()
    # nothing was sent for the failed replay: only the second stats call
    assert s1[0]["control_msgs"] - s0[0]["control_msgs"] == 1
    np.testing.assert_allclose(z.to_numpy(), xv - yv, rtol=1e-12)
    np.testing.assert_allclose((x * 2.0).to_numpy(), 2 * xv, rtol=1e-12)


def test_input_freed_inside_the_block_raises_on_replay():
    x = make(values(SHAPE, 11), dmath.RowBlock(), "float64")
    with dmath.record() as plan:
        x = x + 1.0            # the input is rebound: the plan's input is gone
    with pytest.raises(dmath.PlanError, match="freed"):
        plan.replay()
    np.testing.assert_allclose(x.to_numpy(), values(SHAPE, 11) + 1.0, rtol=1e-12)


def test_a_memory_limit_is_not_recorded():
    """set_limit inside a record block is refused: a replay set the workers' limit again behind the
    master's account (a limit lifted after the block came back at every replay; a hostile-use probe)."""
    x = make(values(SHAPE, 13), dmath.RowBlock(), "float64")
    with pytest.raises(dmath.PlanError, match="set_limit cannot be recorded"):
        with dmath.record():
            y = x * 2.0
            dmath.memory.set_limit(1 << 30)
    assert dmath.memory.limit() is None
    np.testing.assert_allclose(y.to_numpy(), 2 * values(SHAPE, 13), rtol=1e-12)


def test_nested_record_raises():
    x = make(values(SHAPE, 12), dmath.RowBlock(), "float64")
    with pytest.raises(dmath.PlanError, match="nested"):
        with dmath.record() as outer:
            y = x * 2.0
            with dmath.record():
                pass
    with pytest.raises(dmath.PlanError, match="discarded"):
        outer.replay()
    np.testing.assert_allclose(y.to_numpy(), 2 * values(SHAPE, 12), rtol=1e-12)
    with dmath.record() as again:       # recording works again
        y = x * 3.0
    again.replay()
    np.testing.assert_allclose(y.to_numpy(), 3 * values(SHAPE, 12), rtol=1e-12)


@pytest.mark.parametrize("error", ["python", "shape", "payload"])
def test_error_inside_the_block_discards_the_plan(error):
    xv = values(SHAPE, 13)
    x = make(xv, dmath.ColBlock(), "float64")
    expected = {"python": KeyError, "shape": dmath.ShapeError, "payload": dmath.PlanError}[error]
    with pytest.raises(expected):
        with dmath.record() as plan:
            y = x + 1.0
            if error == "python":
                raise KeyError("user code")
            if error == "shape":
                y + dmath.ones((3, 3), "float64")
            dmath.from_numpy(xv)      # data from the master cannot be recorded
    with pytest.raises(dmath.PlanError, match="discarded"):
        plan.replay()
    # the block ran as usual up to the error, and the runtime goes on
    np.testing.assert_allclose(y.to_numpy(), xv + 1.0, rtol=1e-12)
    with dmath.record() as plan:
        z = x * y
    plan.replay()
    np.testing.assert_allclose(z.to_numpy(), xv * (xv + 1.0), rtol=1e-12)


def test_assign_numpy_inside_the_block_raises():
    x = make(values(SHAPE, 14), dmath.RowBlock(), "float64")
    with pytest.raises(dmath.PlanError, match="assign"):
        with dmath.record():
            x.assign(values(SHAPE, 15))
    np.testing.assert_allclose(x.to_numpy(), values(SHAPE, 14), rtol=1e-12)


def test_stream_draws_inside_the_block_repeat_at_every_replay():
    """A draw's stream is fixed in its command: a replay runs the same sequence, so it draws the same
    values again (documented in dmath.random's functions)."""
    with dmath.record() as plan:
        a = dmath.random.rand((4, 3))
        order = dmath.random.permutation(6)
    first, first_order = a.to_numpy(), order.to_numpy()
    plan.replay()
    np.testing.assert_array_equal(a.to_numpy(), first)
    np.testing.assert_array_equal(order.to_numpy(), first_order)
    assert not np.array_equal(dmath.random.rand((4, 3)).to_numpy(), first)     # outside: a new stream


def test_assign_of_a_matrix_is_recorded():
    x = make(values(SHAPE, 16), dmath.RowBlock(), "float64")
    buf = dmath.zeros(SHAPE, "float32", dmath.Block2D())
    with dmath.record() as plan:
        buf.assign(x * 2.0)
    x.assign(values(SHAPE, 17))
    plan.replay()
    np.testing.assert_allclose(buf.to_numpy(), 2 * values(SHAPE, 17), **tol("float32"))


def test_replay_inside_a_record_block_raises():
    x = make(values(SHAPE, 18), dmath.RowBlock(), "float64")
    with dmath.record() as plan:
        y = x + 1.0
    with pytest.raises(dmath.PlanError):
        with dmath.record():
            plan.replay()
    plan.replay()
    np.testing.assert_allclose(y.to_numpy(), values(SHAPE, 18) + 1.0, rtol=1e-12)


def test_empty_plan():
    with dmath.record() as plan:
        pass
    assert plan.replay() == []


def test_training_loop_pattern():
    """Linear regression by SGD: assign each batch, replay the recorded step, compare with NumPy."""
    n, f, lr = 12, 4, 0.1
    rng = np.random.default_rng(19)
    w_true = rng.normal(size=(1, f))
    batches = []
    for _ in range(4):
        xb = rng.normal(size=(n, f))
        batches.append((xb, (xb * w_true).sum(axis=1, keepdims=True)))
    X = dmath.zeros((n, f), "float64", dmath.RowBlock())       # data-parallel batch
    Y = dmath.zeros((n, 1), "float64", dmath.RowBlock())
    W = dmath.zeros((1, f), "float64", dmath.Replicated())     # replicated weights
    X.assign(batches[0][0])
    Y.assign(batches[0][1])
    with dmath.record() as step:
        err = (X * W).sum(axis=1) - Y
        grad = (X * err).mean(axis=0)
        W -= lr * grad
        loss = (err * err).mean()
    w = np.zeros((1, f))
    losses = []
    for k, (xb, yb) in enumerate(batches):
        e = (xb * w).sum(axis=1, keepdims=True) - yb
        losses.append(float((e * e).mean()))
        w = w - lr * (xb * e).mean(axis=0, keepdims=True)
        if k == 0:
            got = loss
        else:
            X.assign(xb)
            Y.assign(yb)
            (got,) = step.replay()
        np.testing.assert_allclose(got, losses[-1], rtol=1e-12)
    np.testing.assert_allclose(W.to_numpy(), w, rtol=1e-12, atol=1e-14)
    assert losses[-1] < losses[0]


def _graphs():
    return dmath.stats()[0]["plan_graphs"]


@pytest.mark.skipif(dmath.device() != "gpu", reason="CUDA graphs need the GPU backend")
def test_cuda_graph_replay():
    """From the second replay on, a plan of capturable kernels is launched as one CUDA graph per worker."""
    gc.collect()
    dmath.stats()                              # earlier tests' plans are dropped before the count
    lay = dmath.RowBlock()
    xv, yv = values(SHAPE, 60), values(SHAPE, 61)
    x, y = make(xv, lay, "float32"), make(yv, lay, "float32")
    acc = dmath.zeros(SHAPE, "float32", lay)
    with dmath.record() as plan:
        t = dmath.tanh(x * 2.0 - y)            # temporaries in the graph's own pool
        z = t.T.T + dmath.sigmoid(y)           # transposes: local on every worker
        acc += z                               # an input written in place
        h = z.remap(lay, dtype="float16")      # a local remap with a dtype change
    graphs = _graphs()
    expect_acc = np.tanh(2 * xv - yv) + 1 / (1 + np.exp(-yv))
    for k in range(4):
        xv, yv = values(SHAPE, 62 + k), values(SHAPE, 70 + k)
        x.assign(xv)
        y.assign(yv)
        v0 = dmath._runtime().table[z._handle].version if P == 1 else None
        assert plan.replay() == []
        want = np.tanh(2 * xv - yv) + 1 / (1 + np.exp(-yv))
        expect_acc = expect_acc + want
        np.testing.assert_allclose(z.to_numpy(), want, **tol("float32"))
        np.testing.assert_allclose(h.to_numpy().astype("f8"), want, **tol("float16"))
        np.testing.assert_allclose(acc.to_numpy(), expect_acc, rtol=1e-5, atol=1e-5)
        if P == 1:
            assert dmath._runtime().table[z._handle].version > v0
        # the first replay runs step by step, the second captures, later ones launch
        assert _graphs() == graphs + (1 if k >= 1 else 0)
    before = dmath.stats()[0]["pool"]["new_allocs"]
    plan.replay()
    assert dmath.stats()[0]["pool"]["new_allocs"] == before       # a launch allocates nothing
    pool = dmath.memory.stats()[0]
    # the graph's buffers: its outputs between launches, its temporaries at their peak; its pool
    # is one arena of the peak the step-by-step run measured, so it holds little more than that
    out_bytes = sum(int(np.prod(SHAPE)) // P * m.dtype.itemsize for m in (t, z, h))
    assert out_bytes <= pool["graphs_in_use"] + 3 * 512 and pool["graphs_in_use"] <= pool["graphs_peak"]
    assert pool["graphs_peak"] <= pool["graphs"] <= 2 * pool["graphs_peak"] + 2 ** 20
    # giving back cached memory while keeping graphs: the plan launches on, captured as it was
    dmath.memory.clear(graphs=False)
    assert dmath.memory.stats()[0]["graphs"] == pool["graphs"]
    plan.replay()
    assert _graphs() == graphs + 1
    np.testing.assert_allclose(z.to_numpy(), want, **tol("float32"))


@pytest.mark.skipif(dmath.device() != "gpu" or P != 1, reason="one GPU worker (replaces a shard by hand)")
def test_cuda_graph_recaptured_when_an_input_shard_is_replaced():
    from dmath.runtime import Shard
    rt = dmath._runtime()
    xv = values(SHAPE, 80)
    x = make(xv, dmath.RowBlock(), "float64")
    with dmath.record() as plan:
        y = x * 3.0
    plan.replay()
    plan.replay()
    old = rt.table[x._handle]
    new = Shard([p.copy() + 1.0 for p in old.pieces], old.dist, old.dtype)
    rt.table[x._handle] = new            # what an operation replacing x's buffers would leave
    plan.replay()
    np.testing.assert_allclose(y.to_numpy(), 3 * (xv + 1.0), rtol=1e-12)


@pytest.mark.skipif(dmath.device() != "gpu", reason="CUDA graphs need the GPU backend")
@pytest.mark.parametrize("middle", ["in_place", "new_buffer"])
def test_cuda_graph_segments_around_an_uncapturable_step(middle):
    """A plan with an uncapturable step between two long runs of capturable ones: each run is captured
    into a graph of its own and launched from the second replay on, the step between runs step by step
    in program order. A middle step that makes its output anew at every run (a new buffer) leaves the
    run after it step by step (its capture would be invalid at the next replay); results stay right."""
    from dmath.ops.base import dispatch, new_meta
    from dmath.runtime.graphs import MIN_SEGMENT
    gc.collect()
    dmath.stats()
    lay = dmath.RowBlock()
    x = make(values(SHAPE, 90), lay, "float64")
    with dmath.record() as plan:
        y = x
        for _ in range(MIN_SEGMENT):
            y = y * 1.5 - 0.25
        if middle == "in_place":
            dispatch("test_host_scale", [y], [0], scalars=[2.0])
        else:
            (y,), _ = dispatch("test_host_copy", [y], [new_meta(y.layout, y.shape, y.dtype)], scalars=[2.0])
        z = y
        for _ in range(MIN_SEGMENT):
            z = z * 0.5 + 1.0
    graphs = _graphs()

    def expect(xv):
        yv = xv
        for _ in range(MIN_SEGMENT):
            yv = yv * 1.5 - 0.25
        zv = 2.0 * yv
        for _ in range(MIN_SEGMENT):
            zv = zv * 0.5 + 1.0
        return zv
    for k in range(4):
        xv = values(SHAPE, 91 + k)
        x.assign(xv)
        plan.replay()
        np.testing.assert_allclose(z.to_numpy(), expect(xv), rtol=1e-12)
        # the first replay runs step by step; the second captures the segments, later ones launch
        assert _graphs() == graphs + (1 if k >= 1 else 0)
    stats = dmath.stats()[0]
    assert stats["plan_blockers"].get("test_host_scale" if middle == "in_place" else "test_host_copy", 0) >= 1


@pytest.mark.skipif(dmath.device() != "gpu", reason="CUDA graphs need the GPU backend")
def test_no_graph_for_plans_with_uncapturable_steps():
    gc.collect()
    x = make(values(SHAPE, 81), dmath.RowBlock(), "float32")
    with dmath.record() as plan:
        s = (x * 2.0).sum()                  # a value for the master: a host synchronisation
    graphs = _graphs()
    for _ in range(3):
        (got,) = plan.replay()
    assert _graphs() == graphs
    np.testing.assert_allclose(got, s, rtol=1e-5)


def test_a_replay_whose_temporaries_no_longer_fit_is_refused_before_it_is_sent():
    """A replay makes its block's temporaries again: when matrices made since leave no room for them
    under the limit, the replay is refused on the master (nothing sent, the runtime goes on) instead of
    a worker running out of memory inside it (a hostile-use probe: that ended the job)."""
    shape = (64 * dmath.num_workers(), 512)
    xv = values(shape, 21)
    x = make(xv, dmath.RowBlock(), "float64")
    with dmath.record() as plan:
        t = x * 2.0                     # temporaries: x's size each, two alive at once
        u = t + 1.0
        del t
        y = (u * u).sum()
        del u
    assert plan._need and max(plan._need) >= 2 * x.nbytes // dmath.num_workers()
    piece = max(plan._need)
    try:
        filler = [make(xv, dmath.RowBlock(), "float64") for _ in range(3)]
        # a limit that holds the live matrices and half the temporaries, not all of them
        held = max(s["matrices"] for s in dmath.memory.stats())
        dmath.memory.set_limit(int(held + piece // 2))
        with pytest.raises(dmath.OutOfMemoryError, match=r"replaying dmath.Plan.*needs .* bytes at once.*short"):
            plan.replay()
        # nothing was sent: the runtime goes on, and with room again the replay runs
        np.testing.assert_allclose(x.sum(), xv.sum(), rtol=1e-12)
        del filler
        dmath.memory.set_limit(None)
        (total,) = plan.replay()
        np.testing.assert_allclose(total, ((2 * xv + 1.0) ** 2).sum(), rtol=1e-12)
    finally:
        dmath.memory.set_limit(None)
    del y


def _held():
    return [s["matrices"] for s in dmath.memory.stats()]


@pytest.mark.parametrize("case", ["output", "remap", "gemm"])
def test_a_replay_is_admitted_for_all_it_holds_at_once(case):
    """What a replay needs is what its block held at once on each worker, measured while it was
    recorded: outputs made again while their old values live, a remap's exchange buffers, a GEMM's
    copies (a hostile-use probe: each of these passed a check of the temporaries alone and ended the
    job with a WorkerError). One byte less than that is refused on the master; exactly that runs."""
    P = dmath.num_workers()
    xv = values((64 * P + (3 if P > 1 else 0), 96), 31)
    wv = values((96, 40), 32)
    x = make(xv, dmath.RowBlock(), "float64")
    w = make(wv, dmath.RowBlock(), "float64")
    with dmath.record() as plan:
        if case == "output":
            y = x * 2.0
        elif case == "remap":
            t = x.remap(dmath.ColBlock())
            y = t.sum()
            del t
        else:
            t = x @ w
            y = dmath.relu(t).sum()
            del t
    need = plan._need
    assert need and len(need) == P
    expect = {"output": lambda: 2 * xv, "remap": lambda: xv.sum(),
              "gemm": lambda: np.maximum(xv @ wv, 0).sum()}[case]()
    held = _held()
    short = [h + n for h, n in zip(held, need)]
    try:
        # one byte short on the worker that needs the most beside what it holds
        dmath.memory.set_limit(max(short) - 1)
        with pytest.raises(dmath.OutOfMemoryError, match="bytes short. Nothing was sent"):
            plan.replay()
        assert _held() == held
        dmath.memory.set_limit(max(short))
        results = plan.replay()
    finally:
        dmath.memory.set_limit(None)
    got = y.to_numpy() if case == "output" else results[0]
    np.testing.assert_allclose(got, expect, rtol=1e-11)


def test_a_command_refused_inside_a_block_leaves_no_matrix_behind():
    """A temporary freed with a command that was refused for memory (and undone) inside a record block
    became an output of the plan that every replay made again and nothing freed, not even close()
    (a hostile-use probe). The plan frees it where the next recorded command does."""
    P = dmath.num_workers()
    xv = values((128 * P, 128 * P), 33)
    x = make(xv, dmath.RowBlock(), "float64")
    gc.collect()
    dmath.memory.clear()                # (earlier tests' matrices gone first: the counts are this test's)
    base = _held()
    in_use = [d["in_use"] for d in dmath.memory.stats()]
    held = max(base)
    dmath.memory.set_careful("always")
    # room for one more matrix of x's size beside what is in use (x, and what earlier tests left in use:
    # kernels' caches), not for a remap's copy and its exchange buffers
    dmath.memory.set_limit(max(in_use) + held + 256)
    try:
        with dmath.record() as plan:
            t = x * 2.0
            del t
            try:
                y = x.remap(dmath.ColBlock())       # refused for memory at P >= 2 (a whole copy)
            except dmath.OutOfMemoryError:
                y = None
            s = x.sum()
    finally:
        dmath.memory.set_limit(None)
        dmath.memory.set_careful("auto")
    gc.collect()
    assert not (set(plan._outputs) - ({y._handle} if y is not None else set()))
    for _ in range(3):
        (again,) = plan.replay()[-1:]
    np.testing.assert_allclose(again, xv.sum(), rtol=1e-11)
    np.testing.assert_allclose(s, xv.sum(), rtol=1e-11)
    del y
    gc.collect()
    plan.close()
    dmath.memory.clear()
    st = dmath.memory.stats()
    assert [d["matrices"] for d in st] == base
    # (a kernel's small cache may stay in use: the leak was a whole matrix a worker)
    assert all(d["in_use"] <= u + 4096 for d, u in zip(st, in_use)), ([d["in_use"] for d in st], in_use)


def test_a_replay_counts_matrices_released_on_another_thread():
    """A matrix collected on another thread leaves the account at the next command; a replay took its
    memory as still held and refused (a hostile-use probe), until some other command ran."""
    import threading
    P = dmath.num_workers()
    xv = values((64 * P, 512), 34)
    x = make(xv, dmath.RowBlock(), "float64")
    with dmath.record() as plan:
        t = x * 2.0
        s = t.sum()
        del t
    held = _held()
    box = [dmath.zeros((64 * P, 512), "float64", layout=dmath.RowBlock())]
    try:
        dmath.memory.set_limit(int(max(h + n for h, n in zip(held, plan._need))))
        th = threading.Thread(target=box.clear)
        th.start()
        th.join()
        (v,) = plan.replay()
    finally:
        dmath.memory.set_limit(None)
    np.testing.assert_allclose(v, 2 * xv.sum(), rtol=1e-11)
    del s


def test_a_replays_need_is_what_its_block_allocated():
    """The need is what the block's own allocations held at once: a replica copy kept from before the
    block no longer inflates it (it was 5-17x the real peak), and a matrix made before the block and
    freed inside it no longer hides the block's scratch (a replay admitted on that ended the job). On
    the CPU pool the measure is exact: the peak of an unlimited replay."""
    P = dmath.num_workers()
    xv = values((64 * P + (3 if P > 1 else 0), 96), 35)
    x = make(xv, dmath.RowBlock(), "float64")
    big = make(values((256 * P, 512), 36), dmath.RowBlock(), "float64")
    big.replicate()                                   # a replica copy, in use while the block records
    old = dmath.zeros((1024 * P, 512), "float64", layout=dmath.RowBlock())
    with dmath.record() as plan:
        del old                                       # freed with the block's first command
        t = x.remap(dmath.ColBlock())
        s = t.sum()
        del t
    gc.collect()
    dmath.memory.clear()
    held = _held()
    dmath.reset_stats()
    plan.replay()
    real = [p["allocated"] - h for p, h in zip(dmath.memory.peak(), held)]
    assert list(plan._need) == real
    del s, big


def test_replica_copies_made_after_recording_do_not_end_a_replay():
    """A replica copy a GEMM kept after the block was recorded takes memory the master's account of
    matrices does not see: a replay admitted at the bound ended the job (a hostile-use probe). Near
    the ceiling every worker drops its copies first."""
    P = dmath.num_workers()
    xv, wv = values((256 * P, 512), 37), values((512, 256), 38)
    x = make(xv, dmath.RowBlock(), "float64")
    with dmath.record() as plan:
        t = x * 2.0
        s = t.sum()
        del t
    w = make(wv, dmath.RowBlock(), "float64")
    y = x @ w                   # keeps a copy of w on every worker
    del y
    held = _held()
    try:
        dmath.memory.set_limit(max(h + n for h, n in zip(held, plan._need)))
        (v,) = plan.replay()
    finally:
        dmath.memory.set_limit(None)
    np.testing.assert_allclose(v, 2 * xv.sum(), rtol=1e-11)
    del s


@pytest.mark.parametrize("call", ["memory.stats", "memory.available", "memory.clear", "memory.peak", "stats",
                                  "reset_stats"])
def test_calls_answered_on_the_master_are_not_recorded(call):
    """dmath.memory.stats()/available()/clear()/peak() and dmath.stats()/reset_stats() inside a record
    block were recorded: every replay ran them again (a clear dropped every cache at each step) and
    gave the workers' raw answers back (a hostile-use probe). Refused like set_limit."""
    x = make(values(SHAPE, 39), dmath.RowBlock(), "float64")
    fn = dmath
    for part in call.split("."):
        fn = getattr(fn, part)
    with pytest.raises(dmath.PlanError, match="cannot be recorded"):
        with dmath.record():
            y = x * 2.0
            fn()
    assert fn() is None or isinstance(fn(), list)          # outside a block they answer
    np.testing.assert_allclose(y.to_numpy(), 2 * values(SHAPE, 39), rtol=1e-12)
