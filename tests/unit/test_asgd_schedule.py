"""dnn.training.asgd.Schedule: the bookkeeping of asynchronous SGD, checked without workers.

Every batch is computed once, by group t mod G; every gradient is applied
once, in the order computed; no gradient is applied more than k versions
after the weights it was computed on; the bound is reached where the groups
can use it; k = 0 is sequential SGD.
"""
import itertools

import pytest

from dnn.training.asgd import Schedule, worker_groups


def replay(schedule, nbatches):
    """Run an epoch's events, tracking what they mean independently of the schedule's own counters:
    the version each replica holds and the version each gradient in flight was computed on."""
    store = 0
    replica = dict(enumerate(schedule.replica))
    inflight, computed, applied, stale = [], [], [], []
    for event in schedule.epoch(nbatches):
        kind, g = event[:2]
        if kind == "refresh":
            replica[g] = store
        elif kind == "compute":
            assert replica[g] is not None, "a group computed before its first refresh"
            assert all(h != g for h, _ in inflight), "a group computed with its last gradient still in flight"
            inflight.append((g, replica[g]))
            computed.append((event[2], g))
        else:
            h, v = inflight.pop(0)
            assert h == g
            stale.append(store - v)
            assert event[2] == store - v
            applied.append(g)
            store += 1
    assert not inflight
    return computed, applied, stale


@pytest.mark.parametrize("groups,k", list(itertools.product([1, 2, 3, 4], [0, 1, 2, 3, 5, 8])))
def test_every_batch_once_and_the_bound_holds(groups, k):
    s = Schedule(groups, k)
    for nbatches in (0, 1, 7, 40):
        s.invalidate()
        computed, applied, stale = replay(s, nbatches)
        assert computed == [(t, t % groups) for t in range(nbatches)]
        assert applied == [g for _, g in computed]
        assert all(0 <= v <= k for v in stale), stale
    # the schedule uses the staleness it is allowed: min(k, G - 1) with a refresh at every step, and
    # refreshes are skipped until one more round of G updates would pass k
    assert max(stale) >= min(k, groups - 1)
    assert max(stale) > k - groups


def test_k0_is_sequential_sgd():
    s = Schedule(3, 0)
    events = list(s.epoch(4))
    assert [e[0] for e in events] == ["refresh", "compute", "apply"] * 4
    assert s.staleness == [0] * 4


def test_k_g_minus_1_refreshes_every_step_and_overlaps_all_groups():
    s = Schedule(4, 3)
    assert s.depth == 4
    list(s.epoch(20))
    assert s.refreshes == 20
    assert s.staleness == [0, 1, 2, 3] + [3] * 16      # the pipeline fills, then every gradient is 3 late


def test_larger_k_skips_refreshes():
    few, many = Schedule(2, 1), Schedule(2, 7)
    list(few.epoch(40))
    list(many.epoch(40))
    assert few.refreshes == 40
    assert many.refreshes < 40 and max(many.staleness) <= 7


def test_versions_carry_over_epochs_until_invalidated():
    s = Schedule(2, 20)
    list(s.epoch(10))
    assert s.replica == [0, 0] and s.version == 10
    assert next(s.epoch(10))[0] == "compute"          # 10 versions old is within k = 20: no refresh
    s.invalidate()
    assert next(s.epoch(10)) == ("refresh", 0, 10)


def test_worker_groups():
    assert worker_groups(4, 2) == [(0, 1), (2, 3)]
    assert worker_groups(3, 3) == [(0,), (1,), (2,)]
    assert worker_groups(1, 1) == [(0,)]


# ---- the staleness rule (issue 35, item 9) ------------------------------------------------------------
def test_the_staleness_rule_lowers_momentum_by_the_implicit_one_and_divides_the_rate():
    from dnn.training.asgd import StalenessRule, mean_staleness
    from dnn.errors import ConfigError
    assert mean_staleness(1, 0, 50) == 0.0
    assert mean_staleness(3, 0, 50) == 0.0                       # k = 0: sequential
    assert mean_staleness(3, 2, 60) == pytest.approx((0 + 1 + 2 * 58) / 60)   # the first two are fresher
    both = StalenessRule("both", 2.0, momentum=0.9)
    # (1 - mu') (1 - s / (s + 1)) = 1 - mu: the heavy ball's step multiplier is the synchronous one
    assert both.momentum(0.9) == pytest.approx(0.7)
    assert (1 - both.momentum(0.9)) * (1 - 2 / 3) == pytest.approx(1 - 0.9)
    assert both.momentum(0.5) == 0.0                             # implicit momentum alone is more
    assert both.momentum(0.0) == 0.0
    assert [both.lr_scale(s) for s in (0, 1, 2, 4)] == [pytest.approx(2 ** -0.5)] * 4   # by sqrt(mean staleness)
    assert StalenessRule("both", 0.5, 0.9).lr_scale(1) == 1.0
    assert StalenessRule("both", 2.0, 0.0).lr_scale(2) == 1.0                # plain SGD: left alone
    assert [StalenessRule("lr", 2.0).lr_scale(s) for s in (0, 1, 2, 4)] == [1.0, 1.0, 0.5, 0.25]
    assert StalenessRule("momentum", 2.0).lr_scale(4) == 1.0
    assert StalenessRule("lr", 2.0).momentum(0.9) == 0.9
    assert StalenessRule("none", 3.0).momentum(0.9) == 0.9 and StalenessRule("none", 3.0).lr_scale(3) == 1.0
    assert StalenessRule("both", 0.0).momentum(0.9) == pytest.approx(0.9)   # fresh: nothing changes
    with pytest.raises(ConfigError, match="STALENESS_RULE"):
        StalenessRule("zhang", 1.0)
