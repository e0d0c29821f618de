"""The runtime's limits, at any worker count: a command's operand count (a byte of the frame's header)
and the handle numbers (int32 on the wire, handed out again after 2**31 matrices)."""
import gc

import numpy as np
import pytest

import dmath
from dmath.ops.base import dispatch, new_meta
from dmath.ops.nn.update import FINITE_CHUNK
from dmath.runtime import protocol, runtime
from dmath.runtime.handles import _runs_outside

MANY = 300          # more matrices than one command may name


def _unpinned(rt):
    """The master's signatures that no defined plan replays (those the bound may drop)."""
    pinned = {step.sig_id for replayer in rt.programs.values() for step in replayer.program.steps}
    return [e for e in rt.signatures.values() if e.sig_id not in pinned]


def _many(bad_at=None, bad=np.nan):
    """MANY small matrices of mixed layouts and dtypes; the one at `bad_at` holds `bad`."""
    layouts = [dmath.Replicated, dmath.RowBlock, dmath.ColBlock]
    out = []
    for k in range(MANY):
        a = np.full((3, 2), float(k))
        if k == bad_at:
            a[2, 1] = bad               # the last element: on the last worker of a split layout
        out.append(dmath.from_numpy(a, dtype=("float32", "float16")[k % 2], layout=layouts[k % 3]()))
    return out


@pytest.mark.parametrize("bad_at", [None, 0, 1, FINITE_CHUNK - 1, FINITE_CHUNK, MANY - 1])
def test_all_finite_over_more_matrices_than_a_command_names(bad_at):
    mats = _many(bad_at)
    ok = dmath.nn.all_finite(mats)
    assert ok.shape == (1, 1) and ok.dtype == "float32" and ok.layout.replicated
    assert ok.to_numpy()[0, 0] == (1.0 if bad_at is None else 0.0)


def test_a_recorded_all_finite_over_many_matrices_follows_their_values():
    """Chunked, it is still decided on the workers: a replay reads the current values."""
    mats = _many()
    with dmath.record() as plan:
        ok = dmath.nn.all_finite(mats)
    assert ok.to_numpy()[0, 0] == 1.0
    for k, bad in ((MANY - 1, np.inf), (3, np.nan), (None, None)):
        for j, m in enumerate(mats):
            a = np.full((3, 2), float(j))
            if j == k:
                a[0, 0] = bad
            m.assign(dmath.from_numpy(a, dtype=m.dtype, layout=m.layout))
        plan.replay()
        assert ok.to_numpy()[0, 0] == (1.0 if k is None else 0.0), k


def test_a_command_over_too_many_operands_is_refused_and_leaves_no_trace():
    """Refused on the master with a DMathError before anything is sent or charged: the ledger, the
    pending frees and the signatures are as before, and the runtime goes on."""
    rt = runtime()
    mats = _many()
    before = dmath.memory.stats()       # (a command: before the garbage below, whose frees it would send)
    garbage = [dmath.ones((2, 2)) for _ in range(3)]
    del garbage
    gc.collect()
    live, held = dict(rt.ledger.live), list(rt.ledger.held)
    pending, signatures = list(rt.pending_frees), len(rt.signatures)
    assert pending
    out = new_meta(dmath.Replicated(), (1, 1), "float32")
    for _ in range(3):
        with pytest.raises(dmath.DMathError, match=f"{MANY + 1} matrices .* at most {protocol.MAX_OPERANDS}"):
            dispatch("nn_all_finite", mats, [out])
    assert rt.ledger.live == live and rt.ledger.held == held
    assert rt.pending_frees == pending and len(rt.signatures) == signatures
    assert [s["matrices"] for s in dmath.memory.stats()] == [s["matrices"] for s in before]
    # the frees go with the next command, which works
    assert dmath.nn.all_finite(mats[:5]).to_numpy()[0, 0] == 1.0
    assert not set(pending) & set(rt.pending_frees)


@pytest.fixture
def numbering():
    """The runtime; afterwards new handle numbers go on above every number in use (as after any wrap)."""
    rt = runtime()
    yield rt
    gc.collect()
    dmath.zeros((1, 1)).sum()        # the test's frees reach the workers
    rt.next_handle = max(rt._handles_in_use()) + 1
    rt.handle_end, rt._free_runs = protocol.HANDLE_MAX + 1, None


def test_handle_numbers_are_handed_out_again_after_the_last(numbering):
    rt = numbering
    rt.next_handle = protocol.HANDLE_MAX - 2       # as the review's repro: the last numbers
    base = np.arange(12.0).reshape(4, 3)
    a = dmath.from_numpy(base, layout=dmath.RowBlock())
    kept = {}                          # handle -> (Matrix, expected value)
    for k in range(40):
        m = a + float(k)               # a cached command: its frames carry the frees of the last round
        assert m._handle not in kept, "a live matrix's number was handed out again"
        kept[m._handle] = (m, base + k)
        if k % 3:
            del kept[m._handle]        # collected: its number may come back after its free is sent
        del m
    assert min(kept) < protocol.HANDLE_MAX - 2, "no number was handed out again"
    assert all(0 < h <= protocol.HANDLE_MAX for h in kept)
    for h, (m, want) in kept.items():
        np.testing.assert_array_equal(m.to_numpy(), want)
    # reductions, remaps and products keep working on recycled numbers
    b = dmath.from_numpy(base.T.copy(), layout=dmath.ColBlock())
    np.testing.assert_allclose((a @ b).to_numpy(), base @ base.T)
    assert (a + 1.0).remap(dmath.Block2D()).sum() == (base + 1.0).sum()


def test_recycling_spares_plans_and_waits_for_the_frees(numbering):
    """Numbers a plan names (its temporaries and outputs, also dropped ones) never go to new
    matrices, nor numbers whose free has not been sent."""
    rt = numbering
    x = dmath.from_numpy(np.arange(6.0).reshape(3, 2), layout=dmath.RowBlock())
    with dmath.record() as plan:
        t = x * 2.0                    # a temporary: made and freed again by every replay
        y = t + 1.0
        z = y * 3.0
        del t
    named = {h for s in rt.programs[plan.id].program.steps for h in s.handles}
    del z                              # a dropped output: every replay writes it, then frees it again
    spacers = [dmath.ones((2, 2)) for _ in range(4)]     # freed, and the free sent: numbers to reuse
    del spacers
    gc.collect()
    assert x.sum() == 15.0
    waiting = [dmath.ones((2, 2)) for _ in range(4)]
    freed = {m._handle for m in waiting}
    del waiting
    gc.collect()
    assert freed <= set(rt.pending_frees)
    spared = named | freed
    assert spared <= rt._handles_in_use()
    # the wrap, as if every number below these were in use: the new matrices take the free numbers
    # among and after them
    rt.next_handle = protocol.HANDLE_MAX + 1
    rt._free_runs = _runs_outside(rt._handles_in_use() | set(range(1, min(spared))), protocol.HANDLE_MAX)
    made = [x - float(k) for k in range(30)]
    got = {m._handle for m in made}
    assert len(got) == len(made) and not got & spared
    assert min(got) < max(spared)       # they went past the plan's numbers
    for _ in range(2):
        plan.replay()
    np.testing.assert_array_equal(y.to_numpy(), np.arange(6.0).reshape(3, 2) * 2.0 + 1.0)
    for k, m in enumerate(made):
        np.testing.assert_array_equal(m.to_numpy(), np.arange(6.0).reshape(3, 2) - k)
    plan.close()


def test_runs_outside():
    assert list(_runs_outside({2, 3, 7, 0, -4, 99}, 10)) == [(1, 2), (4, 7), (8, 11)]
    assert list(_runs_outside(set(range(1, 11)), 10)) == []
    assert list(_runs_outside(set(), 3)) == [(1, 4)]


@pytest.mark.skipif(dmath.num_workers() == 1, reason="alone, the master queues nothing")
def test_a_free_in_a_queued_command_keeps_its_number_until_sent(monkeypatch):
    from dmath.runtime import dispatch
    monkeypatch.setattr(dispatch, "BATCH_AGE_S", 1e9)
    monkeypatch.setattr(dispatch, "BATCH_SHARE_S", 1e9)
    rt = runtime()
    x = dmath.ones((4, 3), layout=dmath.RowBlock())
    x + 1.0                              # timed once: its next run may be queued
    m = dmath.ones((2, 2))
    h = m._handle
    del m
    gc.collect()
    y = x + 2.0                          # queued, with m's free
    assert rt.queue and h not in rt.pending_frees and h not in rt.table
    assert h in rt._handles_in_use()
    assert y.sum() == 36.0               # sends the queue
    assert not rt.queue and h not in rt._handles_in_use()


def test_a_wrap_inside_a_record_block(numbering):
    """The block's temporaries, freed inside it, keep their numbers: the replay makes them again."""
    rt = numbering
    x = dmath.from_numpy(np.arange(6.0).reshape(3, 2), layout=dmath.RowBlock())
    with dmath.record() as plan:
        rt.next_handle = protocol.HANDLE_MAX - 1
        t = x + 1.0
        u = t * 2.0
        del t
        gc.collect()
        outs = [u - float(k) for k in range(6)]      # past the wrap: recycled numbers
    named = [h for s in rt.programs[plan.id].program.steps for h in s.handles[1:]]
    assert len(named) == len(set(named)), "two matrices of the plan share a number"
    assert min(named) < protocol.HANDLE_MAX - 1
    x.assign(dmath.from_numpy(np.ones((3, 2)), layout=dmath.RowBlock()))
    plan.replay()
    for k, m in enumerate(outs):
        np.testing.assert_array_equal(m.to_numpy(), np.full((3, 2), 4.0 - k))


def test_a_matrix_collected_in_another_thread_is_released_by_the_owner():
    """The cyclic collector may finalize a Matrix in any thread (a data loader's): the number is
    handed over and released, ledger and frees included, by the thread that issues commands."""
    import threading
    rt = runtime()
    held = [dmath.full((3, 4), 2.0)]
    h = held[0]._handle
    t = threading.Thread(target=held.clear)      # the last reference dies in that thread
    t.start()
    t.join()
    assert h in rt.released_elsewhere and h in rt.ledger.live and h not in rt.pending_frees
    x = dmath.full((3, 4), 5.0)                  # the owner's next command takes the release over
    assert not rt.released_elsewhere and h not in rt.ledger.live
    np.testing.assert_array_equal((x + 1.0).to_numpy(), np.full((3, 4), 6.0))


def test_signatures_past_the_bound_are_dropped_everywhere_and_registered_again(monkeypatch):
    """Signatures that carry data (each row's window write in a loop, each take_rows permutation) are
    used once each; past dispatch.MAX_SIGNATURES the master drops the least recently used quarter on
    every rank, except those a defined plan replays. Values stay right throughout: a plan recorded
    before replays after the drops, a GEMM and an elementwise product whose master halves keep their
    Entry (`Known`) register it again, and the workers' tables stay bounded."""
    from dmath.runtime import dispatch as dispatch_module
    bound = 48
    monkeypatch.setattr(dispatch_module, "MAX_SIGNATURES", bound)
    rt = runtime()
    n = 23
    a, b = np.arange(n * 4.0).reshape(n, 4), np.linspace(-1.0, 1.0, 16).reshape(4, 4)
    A, B = dmath.from_numpy(a), dmath.from_numpy(b, layout=dmath.Replicated())
    with dmath.record() as plan:
        C = (A @ B) * 3.0
    m = dmath.zeros((n, 4))
    want = np.zeros((n, 4))
    for i in range(6 * bound):
        r = (7 * i) % n
        m[r:r + 1, i % 4] = float(i)                    # a new signature for most (r, column) corners
        want[r, i % 4] = float(i)
        if i % 37 == 0:
            D = A @ B                                   # the GEMM's and the product's cached Entries
            np.testing.assert_allclose((D * 2.0).to_numpy(), 2.0 * (a @ b), rtol=1e-12)
        if i % 53 == 0:
            perm = np.random.default_rng(i).permutation(n)
            np.testing.assert_array_equal(dmath.take_rows(A, perm).to_numpy(), a[perm])
        assert len(_unpinned(rt)) <= bound              # (plans of earlier tests still alive keep theirs)
    np.testing.assert_array_equal(m.to_numpy(), want)
    A.assign(a + 1.0)
    plan.replay()
    np.testing.assert_allclose(C.to_numpy(), 3.0 * ((a + 1.0) @ b), rtol=1e-12)
    pinned = len(rt.signatures) - len(_unpinned(rt))
    counts = [s["signatures"] for s in dmath.stats()]
    assert max(counts) <= bound + 1 + pinned, counts    # (+1: the stats command's own, if new)
    assert rt.next_sig_id - 1 > 4 * bound               # (many more were registered and dropped)


def test_large_signatures_are_bounded_by_their_bytes(monkeypatch):
    """A take_rows signature holds its row list (8 bytes a row): past dispatch.MAX_SIGNATURE_BYTES of
    registration messages the least recently used go, whatever their count."""
    from dmath.runtime import dispatch as dispatch_module
    budget = 400_000
    monkeypatch.setattr(dispatch_module, "MAX_SIGNATURE_BYTES", budget)
    rt = runtime()
    n = 6000                                            # 48 kB of rows a permutation
    a = np.arange(n * 3.0).reshape(n, 3)
    A = dmath.from_numpy(a)
    rng = np.random.default_rng(8)
    for _ in range(25):
        perm = rng.permutation(n)
        np.testing.assert_array_equal(dmath.take_rows(A, perm).to_numpy(), a[perm])
        # (one registration may pass the budget before the next drops; live plans keep theirs)
        assert sum(e.nbytes for e in _unpinned(rt)) <= budget + 60_000
    assert rt.signature_bytes == sum(e.nbytes for e in rt.signatures.values())
