"""Batches made on the workers: dmath.random.permutation, dmath.nn.take_rows, dmath.nn.transform_images
and dmath.from_file, against NumPy at every worker count and batch layout."""
import time

import numpy as np
import pytest

import dmath
import _nn_ref as ref
from _cases import make, values
from dmath.ops.creation import _uniform, stream_key
from dmath.ops.nn.batch import FLIP_LANE, SHIFT_X_LANE, SHIFT_Y_LANE
from dmath.ops.nn.batch import take_rows

P = dmath.num_workers()
LAYOUTS = {k: v for k, v in ref.batch_layouts(P).items() if k != "col"}   # take_rows writes row layouts
REP = dmath.Replicated()
N, F, B = 23, 5, 7


def _counter(v):
    return dmath.full((1, 1), v, dtype="float64", layout=REP)


# ---- permutation -----------------------------------------------------------------------------
def test_permutation_depends_on_the_key_alone():
    a = dmath.random.permutation(N, key=(3, 1)).to_numpy().ravel()
    want = np.random.Generator(np.random.PCG64(np.random.SeedSequence([3, 1]))).permutation(N)
    np.testing.assert_array_equal(a, want)
    b = dmath.random.permutation(N, key=(3, 2)).to_numpy().ravel()
    assert sorted(b) == list(range(N)) and not np.array_equal(a, b)
    np.testing.assert_array_equal(dmath.random.permutation(N, key=()).to_numpy().ravel(), np.arange(N))
    # into an existing matrix of any layout (a recorded plan reading it stays valid)
    out = dmath.zeros((1, N), dtype="float64", layout=dmath.ColBlock())
    assert dmath.random.permutation(N, key=(3, 1), out=out) is out
    np.testing.assert_array_equal(out.to_numpy().ravel(), want)


def test_permutation_without_key_draws_from_the_seed():
    dmath.random.seed(5)
    a = dmath.random.permutation(N).to_numpy()
    dmath.random.seed(5)
    np.testing.assert_array_equal(dmath.random.permutation(N).to_numpy(), a)


def test_permutations_into_one_matrix_keep_their_order_while_the_device_lags_behind():
    # the host issues orders faster than a busy device runs them (recorded steps read nothing back):
    # each copy of an order must reach the matrix before the next order is written on the host.
    # On the CPU every command is done when it returns; on a GPU the queued products keep the
    # device behind the host while the orders are issued
    n, m = 4000, (4096 if dmath.device() == "gpu" else 64)
    a = dmath.random.randn((m, m), dtype="float64")
    for _ in range(8):                      # about 20 ms of work on an H200
        a = (a @ a) * (1.0 / m)
    order = dmath.zeros((1, n), dtype="float64", layout=REP)
    seen = []
    for k in range(4):
        dmath.random.permutation(n, key=(7, k), out=order)
        seen.append(order * 1.0)            # a copy queued behind this order's copy to the device
    for k, s in enumerate(seen):
        want = np.random.Generator(np.random.PCG64(np.random.SeedSequence([7, k]))).permutation(n)
        np.testing.assert_array_equal(s.to_numpy().ravel(), want)
    assert np.isfinite(a.to_numpy()).all()


@pytest.mark.parametrize("bad", [dict(key=(-1,)), dict(key=(1.5,)), dict(key="ab"),
                                 dict(out="x"), dict(n=-3)])
def test_permutation_errors(bad):
    kwargs = dict(n=N, key=(1,))
    kwargs.update(bad)
    with pytest.raises((dmath.DMathError, dmath.ShapeError)):
        dmath.random.permutation(kwargs.pop("n"), **kwargs)


# ---- take_rows ------------------------------------------------------------------------------------
def _source(dtype="float64", memory=None):
    x = values((N, F), 1)
    return x, dmath.from_numpy(x, layout=REP, dtype=dtype, memory=memory)


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_take_rows_gathers_order_at_position(name):
    x, src = _source()
    order = dmath.random.permutation(N, key=(9,))
    perm = order.to_numpy().ravel().astype(int)
    out = dmath.zeros((B, F), dtype="float64", layout=LAYOUTS[name](B))
    assert dmath.nn.take_rows(src, order, _counter(4), out) is out
    np.testing.assert_array_equal(out.to_numpy(), x[perm[4:4 + B]])


def test_take_rows_one_hot_and_dtype_conversion():
    labels = (np.arange(N) * 7 % 4).astype(np.float64)[:, None]
    lab = dmath.from_numpy(labels, layout=REP, dtype="float32")
    order = dmath.random.permutation(N, key=(2,))
    perm = order.to_numpy().ravel().astype(int)
    y = dmath.zeros((B, 4), dtype="float16")
    dmath.nn.take_rows(lab, order, _counter(10), y, one_hot=True)
    np.testing.assert_array_equal(y.to_numpy(), np.eye(4)[labels[perm[10:10 + B], 0].astype(int)])
    x, src = _source("float32")
    xb = dmath.zeros((B, F), dtype="float16")
    dmath.nn.take_rows(src, order, _counter(0), xb)
    np.testing.assert_array_equal(xb.to_numpy(), x[perm[:B]].astype(np.float32).astype(np.float16))


@pytest.mark.parametrize("pos_dtype", ["float32", "float64"])
@pytest.mark.parametrize("out_dtype", ["float64", "float32", "float16"])
@pytest.mark.parametrize("src_dtype", ["float64", "float32", "float16"])
def test_take_rows_converts_every_dtype_pair(src_dtype, out_dtype, pos_dtype):
    """Every (samples, batch, counter) dtype, with rows wider than one block of GPU threads: the
    batch is the samples' rows converted once (as NumPy's astype)."""
    f = 300
    x = values((N, f), 3).astype(src_dtype)
    src = dmath.from_numpy(x, layout=REP)
    order = dmath.random.permutation(N, key=(7,))
    perm = order.to_numpy().ravel().astype(int)
    out = dmath.zeros((B, f), dtype=out_dtype)
    dmath.nn.take_rows(src, order, dmath.full((1, 1), 3, dtype=pos_dtype, layout=REP), out)
    np.testing.assert_array_equal(out.to_numpy(), x[perm[3:3 + B]].astype(out_dtype))


@pytest.mark.parametrize("memory", ["device", "host"])
def test_recorded_step_takes_the_next_batch_at_every_replay(memory):
    """The position is read on the workers: a replay advances it and gathers the next batch, with no
    sample bytes from the master (a source in host memory is gathered on the host, read ahead)."""
    x, src = _source(memory=memory)
    order = dmath.random.permutation(N, key=(4,))
    perm = order.to_numpy().ravel().astype(int)
    pos = _counter(0)
    out = dmath.zeros((B, F), dtype="float64")
    with dmath.record() as plan:
        dmath.nn.take_rows(src, order, pos, out)
        total = out.sum(axis=0)
        pos += float(B)
    np.testing.assert_allclose(total.to_numpy(), x[perm[:B]].sum(axis=0, keepdims=True), rtol=1e-12)
    dmath.reset_stats()
    for step in (1, 2):
        plan.replay()
        np.testing.assert_array_equal(out.to_numpy(), x[perm[step * B:(step + 1) * B]])
    # the replays moved no payload from the master (the to_numpy gathers only receive)
    assert dmath.stats()[0]["data_bytes_sent"] == 0
    # a new epoch: a new order into the same matrix, the same plan
    dmath.random.permutation(N, key=(5,), out=order)
    pos.set((0, 0), 0)
    plan.replay()
    np.testing.assert_array_equal(out.to_numpy(), x[order.to_numpy().ravel().astype(int)[:B]])


def test_take_rows_from_a_mapped_file(tmp_path):
    x = values((N, F), 3)
    path = str(tmp_path / "samples.npy")
    np.save(path, x)
    src = dmath.from_file(path, layout=REP, mapped=True)
    assert src.memory == "host"
    order = dmath.random.permutation(N, key=(6,))
    perm = order.to_numpy().ravel().astype(int)
    out = dmath.zeros((B, F), dtype="float32")
    pos = _counter(0)
    for step in range(3):
        dmath.nn.take_rows(src, order, pos, out)
        np.testing.assert_array_equal(out.to_numpy(), x[perm[step * B:(step + 1) * B]].astype(np.float32))
        pos += float(B)


@pytest.mark.parametrize("kind", ["mapped", "host"])
def test_take_rows_read_ahead_follows_the_source_and_its_writes(tmp_path, kind):
    """A host-held source is read one batch ahead. The guess is used only for the same source with the
    same contents: two sources of one shape walked with one order each get their own rows, and a
    write of the source between steps is seen (the write waits for the read-ahead; on the CPU only a
    mapped file is held on the host, on a GPU the 'host' kind too)."""
    n, f, b = 40, 3, 4
    xa = np.arange(n * f, dtype=np.float32).reshape(n, f)
    if kind == "mapped":
        np.save(tmp_path / "x.npy", xa)
        np.save(tmp_path / "y.npy", -xa)
        x = dmath.from_file(str(tmp_path / "x.npy"), layout=REP, mapped=True)
        y = dmath.from_file(str(tmp_path / "y.npy"), layout=REP, mapped=True)
    else:
        x = dmath.from_numpy(xa, layout=REP, memory="host")
        y = dmath.from_numpy(-xa, layout=REP, memory="host")
    order = dmath.random.permutation(n, key=(9,))
    perm = order.to_numpy().ravel().astype(int)
    pos = _counter(0)
    ox, oy = dmath.zeros((b, f)), dmath.zeros((b, f))
    for step in range(4):
        dmath.nn.take_rows(x, order, pos, ox)
        dmath.nn.take_rows(y, order, pos, oy)
        rows = perm[step * b:(step + 1) * b]
        np.testing.assert_array_equal(ox.to_numpy(), xa[rows], err_msg=f"x, step {step}")
        np.testing.assert_array_equal(oy.to_numpy(), -xa[rows], err_msg=f"y, step {step}")
        pos += float(b)
    # writes of the source between steps, after the read-ahead is done and while it may still run
    for k, pause in enumerate((0.2, 0.0)):
        time.sleep(pause)
        xa = xa + 1000.0
        x.assign(xa)
        dmath.nn.take_rows(x, order, pos, ox)
        at = 4 + k
        np.testing.assert_array_equal(ox.to_numpy(), xa[perm[at * b:(at + 1) * b]], err_msg=f"write {k}")
        pos += float(b)
    assert x.to_numpy().min() == 2000.0


def test_take_rows_read_ahead_guesses_the_next_batch_at_every_worker_count(tmp_path):
    """The read-ahead gathers the rows of the next step: the position moves by the whole batch, not by
    a worker's share of it (the guess never came true at several workers), or by the stride of the
    last two steps (a feed shared by groups). Counted on every worker."""
    n, f, b, steps = 128, 3, 8, 4
    xa = np.arange(n * f, dtype=np.float32).reshape(n, f)
    np.save(tmp_path / "x.npy", xa)
    x = dmath.from_file(str(tmp_path / "x.npy"), layout=REP, mapped=True)
    order = dmath.random.permutation(n, key=(2,))
    perm = order.to_numpy().ravel().astype(int)
    out = dmath.zeros((b, f), dtype="float32")          # RowBlock: rows on every worker (P <= 4)
    # (stride, hits): the first step of a series is not guessed; at three batches a step (a feed of
    # three groups) the second is guessed one batch on, and misses too
    for stride, hits in ((b, steps - 1), (3 * b, steps - 2)):
        pos = _counter(0)
        dmath.reset_stats()
        for step in range(steps):
            dmath.nn.take_rows(x, order, pos, out)
            at = step * stride
            np.testing.assert_array_equal(out.to_numpy(), xa[perm[at:at + b]])
            pos += float(stride)
        for rank, st in enumerate(dmath.stats()):
            assert (st["read_ahead_hits"], st["read_ahead_misses"]) == (hits, steps - hits), (stride, rank, st)


def test_take_rows_errors():
    x, src = _source()
    order = dmath.random.permutation(N, key=(1,))
    out = dmath.zeros((B, F), dtype="float64")
    pos = _counter(0)
    with pytest.raises(dmath.LayoutError, match="Replicated"):
        dmath.nn.take_rows(dmath.from_numpy(x), order, pos, out)            # a RowBlock source
    with pytest.raises(dmath.ShapeError, match="values"):
        dmath.nn.take_rows(src, order, pos, dmath.zeros((B, F + 1)))
    with pytest.raises(dmath.DTypeError, match="float64"):
        dmath.nn.take_rows(src, dmath.zeros((1, N), dtype="float32", layout=REP), pos, out)
    with pytest.raises(dmath.ShapeError, match="batch of"):
        dmath.nn.take_rows(src, dmath.zeros((1, 3), dtype="float64", layout=REP), pos, out)
    with pytest.raises(dmath.LayoutError, match="row layout"):
        dmath.nn.take_rows(src, order, pos, dmath.zeros((B, F), layout=dmath.ColBlock()))
    with pytest.raises(dmath.ShapeError, match="one_hot"):
        dmath.nn.take_rows(src, order, pos, dmath.zeros((B, 3)), one_hot=True)
    with pytest.raises(dmath.DTypeError, match="float16"):
        dmath.nn.take_rows(src, order, dmath.zeros((1, 1), dtype="float16", layout=REP), out)
    dmath.nn.take_rows(src, order, pos, out)       # still usable


# ---- transform_images ----------------------------------------------------------------------------
IMG = (2, 5, 6)


def _draws(seed, q, shift, flip):
    q = np.asarray(q, dtype=np.uint64)
    with np.errstate(over="ignore"):
        dy = (np.floor(_uniform(np, q, np.uint64(stream_key(seed, 0, SHIFT_Y_LANE))) * (2 * shift + 1))
              .astype(int) - shift) if shift else np.zeros(len(q), int)
        dx = (np.floor(_uniform(np, q, np.uint64(stream_key(seed, 0, SHIFT_X_LANE))) * (2 * shift + 1))
              .astype(int) - shift) if shift else np.zeros(len(q), int)
        fl = (_uniform(np, q, np.uint64(stream_key(seed, 0, FLIP_LANE))) < 0.5) if flip else np.zeros(len(q), bool)
    return dy, dx, fl


def _reference(x, counter, seed, shift, flip, scale, mean, std):
    """Each image moved, mirrored and normalised by loops over its pixels."""
    c, h, w = IMG
    n = x.shape[0]
    dy, dx, fl = _draws(seed, counter + np.arange(n), shift, flip)
    x4 = x.reshape(n, c, h, w)
    out = np.zeros_like(x4)
    for s in range(n):
        for yy in range(h):
            for xx in range(w):
                sy, sx = yy - dy[s], (w - 1 - xx if fl[s] else xx) - dx[s]
                v = x4[s, :, sy, sx] * scale if 0 <= sy < h and 0 <= sx < w else np.zeros(c)
                out[s, :, yy, xx] = (v - np.asarray(mean)) / np.asarray(std)
    return out.reshape(n, -1)


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_transform_images_against_loops(name):
    n = 9
    x = values((n, int(np.prod(IMG))), 5)
    lay = LAYOUTS[name](n)
    y = dmath.nn.transform_images(make(x, lay, "float64"), IMG, shift=2, flip=True, scale=0.5,
                                  mean=(0.1, -0.2), std=(2.0, 0.5), counter=_counter(100), seed=7)
    want = _reference(x, 100, 7, 2, True, 0.5, (0.1, -0.2), (2.0, 0.5))
    np.testing.assert_allclose(y.to_numpy(), want, rtol=1e-12, atol=1e-12)
    assert type(y.layout) is dmath.RowBlock or y.layout.replicated


def test_transform_draws_follow_the_stream_position():
    """The draws of a sample depend on counter + its row: a batch split in two gives the same images."""
    n = 8
    x = values((n, int(np.prod(IMG))), 6)
    whole = dmath.nn.transform_images(dmath.from_numpy(x), IMG, shift=1, flip=True, counter=_counter(40), seed=3)
    first = dmath.nn.transform_images(dmath.from_numpy(x[:3]), IMG, shift=1, flip=True, counter=_counter(40),
                                      seed=3)
    rest = dmath.nn.transform_images(dmath.from_numpy(x[3:]), IMG, shift=1, flip=True, counter=_counter(43),
                                     seed=3)
    np.testing.assert_array_equal(whole.to_numpy(), np.concatenate([first.to_numpy(), rest.to_numpy()]))
    other = dmath.nn.transform_images(dmath.from_numpy(x), IMG, shift=1, flip=True, counter=_counter(41), seed=3)
    assert not np.array_equal(whole.to_numpy(), other.to_numpy())


def test_transform_normalisation_only_and_float16():
    x = values((4, int(np.prod(IMG))), 8, 0, 255)
    y = dmath.nn.transform_images(dmath.from_numpy(x, dtype="float16"), IMG, scale=1 / 255, mean=0.5, std=0.25)
    assert y.dtype == "float16"
    want = (x.astype(np.float16).astype(np.float64) / 255 - 0.5) / 0.25
    np.testing.assert_allclose(y.to_numpy().astype(np.float64), want, rtol=2e-3, atol=4e-3)


def test_transform_errors():
    x = dmath.from_numpy(values((4, int(np.prod(IMG))), 9))
    with pytest.raises(dmath.DMathError, match="counter"):
        dmath.nn.transform_images(x, IMG, shift=1)
    with pytest.raises(dmath.ShapeError, match="shift"):
        dmath.nn.transform_images(x, IMG, shift=5, counter=_counter(0))
    with pytest.raises(dmath.ShapeError, match="one value per channel"):
        dmath.nn.transform_images(x, IMG, mean=(1, 2, 3))
    with pytest.raises(dmath.DMathError, match="positive"):
        dmath.nn.transform_images(x, IMG, std=0)
    with pytest.raises(dmath.ShapeError, match="image_shape"):
        dmath.nn.transform_images(x, (2, 5, 5))


# ---- from_file ------------------------------------------------------------------------------------
@pytest.mark.parametrize("layout", ["row", "rep", "b2d"])
def test_from_file_reads_every_workers_pieces(tmp_path, layout):
    a = values((11, 7), 2).astype(np.float32)
    path = str(tmp_path / "a.npy")
    np.save(path, a)
    lay = {"row": dmath.RowBlock(), "rep": REP, "b2d": dmath.Block2D()}[layout]
    m = dmath.from_file(path, layout=lay)
    assert m.shape == (11, 7) and m.dtype == "float32" and m.layout == lay.resolved(P)
    np.testing.assert_array_equal(m.to_numpy(), a)
    np.testing.assert_array_equal(dmath.from_file(path, dtype="float64", shape=(7, 11)).to_numpy(),
                                  a.reshape(7, 11).astype(np.float64))


def test_from_file_raw_bytes_and_images(tmp_path):
    pixels = (np.arange(6 * 12) * 37 % 256).astype(np.uint8)
    path = tmp_path / "raw.bin"
    path.write_bytes(b"HEADER--" + pixels.tobytes())
    m = dmath.from_file(str(path), shape=(6, 12), file_dtype="uint8", offset=8, layout=REP)
    assert m.dtype == "float32"
    np.testing.assert_array_equal(m.to_numpy(), pixels.reshape(6, 12))
    cube = values((4, 2, 3, 5), 4)
    np.save(tmp_path / "cube.npy", cube)
    np.testing.assert_array_equal(dmath.from_file(str(tmp_path / "cube.npy")).to_numpy(), cube.reshape(4, 30))


def test_from_file_mapped_is_outside_the_limit(tmp_path):
    a = values((40, 25), 5)
    path = str(tmp_path / "big.npy")
    np.save(path, a)
    dmath.memory.set_limit(a.nbytes // 2)
    try:
        with pytest.raises(dmath.OutOfMemoryError):
            dmath.from_file(path, layout=REP)
        m = dmath.from_file(path, layout=REP, mapped=True)
        np.testing.assert_array_equal(m.to_numpy(), a)       # read from the host copy
    finally:
        dmath.memory.set_limit(None)
    # a kernel that reads it whole brings it to the device (on a GPU): that needs the room
    assert m.sum() == pytest.approx(a.sum())
    with open(path, "rb") as f:
        assert np.load(f).tobytes() == a.tobytes()        # mapped copy-on-write: the file is unchanged


def test_from_file_refuses_bad_files(tmp_path):
    a = values((5, 4), 6)
    good = str(tmp_path / "a.npy")
    np.save(good, a)
    raw = open(good, "rb").read()
    (tmp_path / "short.npy").write_bytes(raw[:-8])
    (tmp_path / "junk.npy").write_bytes(b"not an array at all" * 4)
    np.save(str(tmp_path / "fortran.npy"), np.asfortranarray(a))
    np.save(str(tmp_path / "strings.npy"), np.array(["a", "b"]))
    cases = {"short.npy": "truncated", "junk.npy": "not a readable .npy", "fortran.npy": "Fortran",
             "strings.npy": "integers or floats", "missing.npy": "no such file"}
    for name, message in cases.items():
        with pytest.raises(dmath.DMathError, match=message):
            dmath.from_file(str(tmp_path / name))
    with pytest.raises(dmath.DMathError, match="raw file needs"):
        dmath.from_file(str(tmp_path / "raw.bin"), shape=(2, 2))
    with pytest.raises(dmath.DMathError, match="mapped=True reads"):
        dmath.from_file(good, dtype="float32", mapped=True)
    with pytest.raises(dmath.LayoutError, match="whole rows"):
        dmath.from_file(good, layout=dmath.ColBlock(), mapped=True)
    np.testing.assert_array_equal(dmath.from_file(good).to_numpy(), a)    # still usable


# ---- 8. in-place writers refuse a derived copy --------------------------------------------------
def test_take_rows_and_permutation_refuse_a_derived_out():
    X = dmath.zeros((4, 3), layout=dmath.Replicated())
    S = dmath.from_numpy(np.arange(21.0).reshape(7, 3), layout=dmath.Replicated())
    O = dmath.from_numpy(np.arange(7.0)[None], layout=dmath.Replicated())
    pos = dmath.zeros((1, 1), dtype="float64", layout=dmath.Replicated())
    with pytest.raises(dmath.NotSupportedError, match="take_rows on A\\[0:2"):
        take_rows(S, O, pos, X[0:2])
    Y = dmath.zeros((2, 4), dtype="float64", layout=dmath.Replicated())
    state = dmath.random.get_state()
    with pytest.raises(dmath.NotSupportedError, match="permutation on A\\[0:1"):
        dmath.random.permutation(4, key=(1,), out=Y[0:1])
    with pytest.raises(dmath.NotSupportedError, match="permutation"):
        dmath.random.permutation(4, out=Y[0:1])
    assert dmath.random.get_state() == state
    # into the matrices themselves they write
    take_rows(S, O, pos, X)
    np.testing.assert_array_equal(X.to_numpy(), np.arange(12.0).reshape(4, 3))
    Z = dmath.zeros((1, 4), dtype="float64", layout=dmath.Replicated())
    dmath.random.permutation(4, key=(1,), out=Z)
    np.testing.assert_array_equal(np.sort(Z.to_numpy()[0]), np.arange(4.0))


# ---- 9. an invalid permutation call leaves the random stream where it was -----------------------
def test_invalid_permutation_does_not_advance_the_stream():
    dmath.random.seed(5)
    state = dmath.random.get_state()
    bad_calls = [lambda: dmath.random.permutation(-1),
                 lambda: dmath.random.permutation(2.5),
                 lambda: dmath.random.permutation(3, out=dmath.zeros((1, 4), dtype="float64")),
                 lambda: dmath.random.permutation(3, layout="x"),
                 lambda: dmath.random.permutation(3, key="ab")]
    for bad in bad_calls:
        with pytest.raises(dmath.DMathError):
            bad()
        assert dmath.random.get_state() == state
    after_errors = dmath.random.permutation(9).to_numpy()
    dmath.random.seed(5)
    np.testing.assert_array_equal(after_errors, dmath.random.permutation(9).to_numpy())
