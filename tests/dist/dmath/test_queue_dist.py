"""Queued commands (runtime/dispatch.py, "Queued commands"): local commands travel several to a message.

The limits are made deterministic here (no age or share limit); at one
worker nothing is ever queued (nothing is sent), and the values must be the
same either way.
"""
import gc

import numpy as np
import pytest

import dmath
from dmath.runtime import dispatch, protocol

from _cases import make, values

P = dmath.num_workers()


@pytest.fixture
def queued(monkeypatch):
    """16 commands a message at most, whatever their age or cost; the messages sent, decoded."""
    monkeypatch.setattr(dispatch, "BATCH_MAX", 16)
    monkeypatch.setattr(dispatch, "BATCH_AGE_S", 1e9)
    monkeypatch.setattr(dispatch, "BATCH_SHARE_S", 1e9)
    rt = dmath._runtime()
    sent = []
    original = rt.ctl.send

    def spy(message, total):
        sent.append(protocol.decode(bytes(message)))
        return original(message, total)
    dmath.synchronize()         # nothing queued before the test
    monkeypatch.setattr(rt.ctl, "send", spy)
    return sent


def _chain(x, w, groups):
    v = x
    for _ in range(groups):
        v = dmath.tanh((v @ w) * 0.5 + x)
    return v


def _chain_np(x, w, groups):
    v = x
    for _ in range(groups):
        v = np.tanh((v @ w) * 0.5 + x)
    return v


def _operands():
    xv, wv = values((8, 6), 80), values((6, 6), 81) * 0.3
    return xv, wv, make(xv, dmath.RowBlock(), "float64"), make(wv, dmath.Replicated(), "float64")


def test_a_chain_of_local_commands_goes_with_the_read_after_it(queued):
    xv, wv, x, w = _operands()
    _chain(x, w, 1)             # registers each signature and times the master's share
    dmath.synchronize()
    del queued[:]
    total = _chain(x, w, 2).sum()
    np.testing.assert_allclose(total, _chain_np(xv, wv, 2).sum(), rtol=1e-12)
    if P == 1:
        assert all(m[0] != protocol.BATCH for m in queued)     # nothing queued: nothing is sent alone
        return
    kind, count, _, _, _, inner = queued[0]
    # the 8 operations of the chain, then the reduction's command that sent them
    assert kind == protocol.BATCH and count == 9, queued[0][:2]
    assert all(m[0] == protocol.EXEC for m in inner[:8])
    ops = [dmath._runtime().entries[m[1]].op for m in inner]
    assert ops[:8] == ["gemm", "ewise", "ewise", "ewise"] * 2 and ops[8] not in ("gemm", "ewise")


def test_a_full_queue_is_sent_with_the_command_that_fills_it(queued):
    xv, wv, x, w = _operands()
    _chain(x, w, 1)
    dmath.synchronize()
    del queued[:]
    y = _chain(x, w, 10)        # 40 local commands: two messages of 16, then 8 wait
    if P > 1:
        assert [(m[0], m[1]) for m in queued] == [(protocol.BATCH, 16)] * 2
    stats = dmath.stats()       # the last 8 go with the stats command
    if P > 1:
        assert (queued[2][0], queued[2][1]) == (protocol.BATCH, 9)
    # every rank ran every command, and freed what the master freed
    assert len({s["commands"] for s in stats}) == 1
    assert len({s["handles"] for s in stats}) == 1
    np.testing.assert_allclose(y.to_numpy(), _chain_np(xv, wv, 10), rtol=1e-12)


def test_costly_or_communicating_commands_are_not_queued(queued, monkeypatch):
    xv, wv, x, w = _operands()
    y = x.remap(dmath.ColBlock()) * 2.0           # a remap: an exchange among the workers
    monkeypatch.setattr(dispatch, "BATCH_SHARE_S", 0.0)
    z = (x + 1.0) * 3.0                           # local, but each share took longer than 0 s
    dmath.synchronize()
    assert all(m[0] != protocol.BATCH for m in queued)
    np.testing.assert_allclose(y.to_numpy(), 2 * xv, rtol=1e-12)
    np.testing.assert_allclose(z.to_numpy(), (xv + 1) * 3, rtol=1e-12)


def test_frees_in_place_writes_and_plans_after_queued_commands(queued):
    xv, wv, x, w = _operands()
    acc = make(np.zeros((8, 6)), dmath.RowBlock(), "float64")
    for _ in range(3):
        t = x * 2.0
        acc += t                  # in place, queued
        del t
        gc.collect()              # freed with the next command (queued too)
    with dmath.record() as plan:  # the first recorded command sends the queue
        y = _chain(acc, w, 1)
    ref = _chain_np(6 * xv, wv, 1)
    np.testing.assert_allclose(y.to_numpy(), ref, rtol=1e-12)
    acc += 1.0                    # queued again, then the replay sends it
    plan.replay()
    np.testing.assert_allclose(y.to_numpy(), _chain_np(6 * xv + 1, wv, 1), rtol=1e-12)
    stats = dmath.stats()
    assert len({s["handles"] for s in stats}) == 1


def test_the_master_runs_ahead_and_the_workers_catch_up(queued):
    """A GEMM and elementwise operations on a group of workers other than the master's own work:
    queued, then sent by the read, with the right values on every layout the chain allows."""
    ranks = tuple(range(1, P)) or (0,)
    xv, wv = values((7, 5), 82), values((5, 5), 83) * 0.3
    with dmath.on_group(ranks):
        x = make(xv, dmath.RowBlock(), "float64")
        w = make(wv, dmath.Replicated(), "float64")
        y = _chain(x, w, 3)
    np.testing.assert_allclose(y.to_numpy(), _chain_np(xv, wv, 3), rtol=1e-12)
