"""Runtime behaviour seen from the master: stats, the control frames of cached commands."""
import numpy as np
import pytest

import dmath
from dmath.comm.control import FRAME
from dmath.runtime import dispatch, protocol

from _cases import make, values

P = dmath.num_workers()

KEYS = {"data_bytes_sent", "data_bytes_recv", "data_msgs_sent", "data_msgs_recv",
        "control_msgs", "control_bytes", "commands", "cache_hits", "cache_misses", "pool"}
POOL_KEYS = {"in_use", "cached", "high_water", "new_allocs", "reused_allocs"}


def test_stats_shape_and_reset():
    x = values((8, 6), 70)
    a = make(x, dmath.RowBlock(), "float64")
    a.remap(dmath.ColBlock())
    st = dmath.stats()
    assert isinstance(st, list) and len(st) == P
    for s in st:
        assert KEYS <= set(s), KEYS - set(s)
        assert POOL_KEYS <= set(s["pool"])
    dmath.reset_stats()
    st = dmath.stats()
    for s in st:
        for k in ("data_bytes_sent", "data_bytes_recv", "data_msgs_sent", "data_msgs_recv"):
            assert s[k] == 0, (k, s[k])
    np.testing.assert_array_equal(a.to_numpy(), x)


def test_scatter_and_gather_bytes():
    x = values((9, 4), 71)
    dmath.reset_stats()
    a = dmath.from_numpy(x, dmath.RowBlock(), dtype="float64")
    st = dmath.stats()
    # the master sends every other worker its block, and nothing else moves
    rows = [len(range(*sl)) for sl in _blocks(9, P)]
    assert [s["data_bytes_recv"] for s in st] == [0] + [r * 4 * 8 for r in rows[1:]]
    dmath.reset_stats()
    np.testing.assert_array_equal(a.to_numpy(), x)
    st = dmath.stats()
    assert st[0]["data_bytes_recv"] == sum(rows[1:]) * 4 * 8


def _blocks(n, p):
    base, extra = divmod(n, p)
    out, start = [], 0
    for k in range(p):
        size = base + (1 if k < extra else 0)
        out.append((start, start + size))
        start += size
    return out


def test_cached_binary_op_is_one_frame(monkeypatch):
    """After its first call, a binary op is sent as its signature ID in one 64-byte frame (commands
    not queued here: queued ones travel the same way, several in a message, test_queue_dist.py)."""
    monkeypatch.setattr(dispatch, "BATCH_MAX", 0)
    rt = dmath._runtime()
    a = make(values((6, 6), 72), dmath.RowBlock(), "float32")
    b = make(values((6, 6), 73), dmath.RowBlock(), "float32")
    sent = []
    original = rt.ctl.send

    def spy(message, total):
        sent.append((bytes(message), total))
        return original(message, total)

    rt.ctl.send = spy
    try:
        c = a + b           # may register the signature
        for _ in range(3):
            c = a + b       # cached: EXEC, with the previous result's handle to free
    finally:
        rt.ctl.send = original
    assert len(sent) == 4
    for message, total in sent[1:]:
        kind, sig_id, handles, scalars, frees, signature = protocol.decode(message)
        assert kind == protocol.EXEC and signature is None
        assert total == len(message) <= FRAME
        assert len(handles) == 3 and scalars == []
    np.testing.assert_allclose(c.to_numpy(), values((6, 6), 72).astype("f4") + values((6, 6), 73).astype("f4"),
                               rtol=1e-6)


def test_control_traffic_of_cached_ops(monkeypatch):
    monkeypatch.setattr(dispatch, "BATCH_MAX", 0)       # one message per command (queued: test_queue_dist.py)
    a = make(values((5, 5), 74), dmath.ColBlock(), "float64")
    c = a * 2.0
    dmath.reset_stats()
    s0 = dmath.stats()
    for _ in range(10):
        c = a * 2.0
    s1 = dmath.stats()
    for r in range(P):
        assert s1[r]["control_msgs"] - s0[r]["control_msgs"] == 11      # 10 ops and the stats call
        assert s1[r]["control_bytes"] - s0[r]["control_bytes"] == 11 * FRAME
        assert s1[r]["data_bytes_recv"] == s0[r]["data_bytes_recv"]     # elementwise moves no data
    np.testing.assert_allclose(c.to_numpy(), 2 * values((5, 5), 74))


def test_many_matrices_freed():
    """Creating and dropping many matrices frees them on the workers (handles do not pile up)."""
    x = values((4, 4), 75)
    a = make(x, dmath.Block2D(), "float64")
    for _ in range(600):
        b = a + 1.0
    np.testing.assert_allclose(b.to_numpy(), x + 1)
    del b
    handles = [s["handles"] for s in dmath.stats() if "handles" in s]
    if handles:
        assert max(handles) < 300, handles


def test_init_again_keeps_its_device():
    """A second dmath.init() returns the running runtime; naming another device is an error, not a
    silent no-op, and a name that is no device at all says so."""
    running = dmath.device()
    assert dmath.init() is dmath.init(device=running)
    other = "gpu" if running == "cpu" else "cpu"
    with pytest.raises(dmath.RuntimeStateError, match=f"already running on device {running!r}"):
        dmath.init(device=other)
    with pytest.raises(dmath.DMathError, match="device must be 'cpu', 'gpu' or None"):
        dmath.init(device="tpu")
    assert dmath.device() == running and dmath.ones((2, 2)).sum() == 4.0
