"""The master's replica ledger and the copies a GEMM strategy keeps (pure: no workers)."""
from dmath.layout import ColBlock, Replicated, RowBlock
from dmath.planning import gemm as gp
from dmath.runtime import Meta
from dmath.runtime.replica_ledger import ReplicaLedger, budget


def test_ledger_follows_writes_frees_and_the_budget():
    led = ReplicaLedger(lambda: 100)
    rep = (Replicated((0, 1)), "float32")
    led.store(1, rep, 40)
    led.store(2, rep, 40)
    assert led.holds(1, rep) and led.holds_any(2) and led.bytes == 80
    led.store(1, rep, 40)                # used again: the most recent
    led.store(3, rep, 40)                # over budget: the least recently used (2) goes
    assert led.holds(1, rep) and not led.holds_any(2) and led.holds(3, rep)
    led.written(1)
    assert not led.holds_any(1) and led.bytes == 40
    led.store(4, rep, 101)               # larger than the whole budget: never kept
    assert not led.holds_any(4)
    led.clear()
    assert led.bytes == 0 and not led.holds_any(3)


def test_budget_is_at_most_half_the_limit():
    assert budget(1000) == 500
    assert budget(None) >= budget(1000)


def test_kept_copies_name_the_forms_the_kernel_keys():
    P = 2
    a = Meta(RowBlock().resolved(P), (8, 6), "float32")
    b = Meta(ColBlock().resolved(P), (6, 4), "float32")
    local = next(s for s in gp.candidates(a.layout, b.layout, None, P, ((8, 6), (6, 4)))
                 if s.name == "local" and s.a == a.layout)
    kept = gp.kept_copies(local, (a, b), (False, False), "float32", P)
    # A is already in place; B is remapped to the strategy's layout and kept (global bytes)
    assert kept == ((1, (gp.operand_form(local.b, False, P), "float32"), 6 * 4 * 4),)
    # a dtype change keeps a converted copy of A as well
    kept64 = gp.kept_copies(local, (a, b), (False, False), "float64", P)
    assert [k for k, _, _ in kept64] == [0, 1]
    assert gp.operand_form(RowBlock().resolved(P), True, P) == RowBlock().resolved(P).transposed(P)
    assert gp.panel_kind("summa", "A") == "A-panels" and gp.panel_kind("astat", "A") is None
