"""wfq: virtual token counters, idle lifting, weights, and the fairness bound."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sluice.policy.queues.wfq import IDLE_SLACK, MAX_IDLE_TENANTS, WfqScheduler
from sluice.policy.types import QueueItem

_ids = itertools.count()


def item(tenant: str, *, cost: int = 10, priority: int = 5,
         deadline_s: float | None = None) -> QueueItem:
    return QueueItem(next(_ids), "m", 0.0, tenant, priority, deadline_s, cost)


def test_lowest_counter_first_ties_lexical() -> None:
    s = WfqScheduler()
    s.push(item("b"))
    s.push(item("a"))
    s.push(item("a"))
    got = [s.pop(0.0) for _ in range(3)]
    assert [g.tenant_id for g in got if g] == ["a", "b", "a"]
    assert s.counter("a") == 20.0 and s.counter("b") == 10.0


def test_priority_then_deadline_within_tenant() -> None:
    s = WfqScheduler()
    low = item("a", priority=7)
    late = item("a", priority=1, deadline_s=9.0)
    early = item("a", priority=1, deadline_s=3.0)
    for i in (low, late, early):
        s.push(i)
    assert [s.pop(0.0) for _ in range(3)] == [early, late, low]


def test_weights_scale_the_charge() -> None:
    s = WfqScheduler({"gold": 4.0})
    s.push(item("gold", cost=100))
    s.push(item("free", cost=100))
    s.pop(0.0)
    s.pop(0.0)
    assert s.counter("gold") == 25.0 and s.counter("free") == 100.0


def test_on_served_settles_actual_tokens() -> None:
    s = WfqScheduler({"a": 2.0})
    s.push(item("a", cost=100))
    s.pop(0.0)
    s.on_served("a", -40)  # generated less than estimated
    assert s.counter("a") == 30.0
    s.on_served("new", 5)
    assert s.counter("new") == 5.0


def test_idle_tenant_is_lifted_and_banks_no_credit() -> None:
    s = WfqScheduler()
    for _ in range(50):
        s.push(item("busy"))
    for _ in range(10):
        s.pop(0.0)
    assert s.counter("busy") == 100.0
    s.push(item("idle"))
    assert s.counter("idle") == 100.0  # lifted to the backlogged minimum, not 0
    # It does not get 10 requests in a row to catch up: tenants alternate (ties: lexical).
    for _ in range(3):
        s.push(item("idle"))
    order = [s.pop(0.0) for _ in range(6)]
    assert [o.tenant_id for o in order if o] == ["busy", "idle"] * 3


def test_lift_when_nothing_is_backlogged_uses_last_tenant_to_leave() -> None:
    s = WfqScheduler()
    s.push(item("a", cost=50))
    s.pop(0.0)
    assert s.backlogged() == []
    s.push(item("b"))
    assert s.counter("b") == 50.0


def test_a_tenant_above_the_minimum_keeps_its_counter() -> None:
    s = WfqScheduler()
    s.push(item("a", cost=500))
    s.pop(0.0)
    s.push(item("b"))
    s.push(item("a"))
    assert s.counter("a") == 500.0 and s.counter("b") == 500.0
    s.push(item("c"))
    assert s.counter("c") == 500.0


def test_remove_charges_nothing() -> None:
    s = WfqScheduler()
    i = item("a")
    s.push(i)
    assert s.remove(i.request_id) == i
    assert s.remove(i.request_id) is None
    assert s.counter("a") == 0.0 and len(s) == 0


@pytest.mark.parametrize("weights", [{"t": 0.0}, {"t": -1.0}, {"t": float("nan")},
                                     {"t": float("inf")}])
def test_weights_must_be_positive(weights: dict[str, float]) -> None:
    with pytest.raises(ValueError, match="'t'"):
        WfqScheduler(weights)


def share_bound(w_i: float, total: float, w_min: float, n: int) -> float:
    """The bound proved in sluice.policy.queues.wfq for equal costs over a window of n decisions."""
    return 2 * w_i * (total - w_i) / (total * w_min * n)


def check_windows(weights: dict[str, float], decisions: int, windows: list[int]) -> float:
    s = WfqScheduler(weights)
    for _ in range(decisions):  # every tenant stays backlogged throughout
        for tenant in weights:
            s.push(item(tenant, cost=7))
    served = []
    for _ in range(decisions):
        got = s.pop(0.0)
        assert got is not None
        served.append(got.tenant_id)
    total = sum(weights.values())
    w_min = min(weights.values())
    worst = 0.0
    for tenant, w in weights.items():
        prefix = [0]
        for t in served:
            prefix.append(prefix[-1] + (t == tenant))
        for n in windows:
            bound = share_bound(w, total, w_min, n)
            assert bound <= 0.02
            for start in range(decisions - n + 1):
                share = (prefix[start + n] - prefix[start]) / n
                error = abs(share - w / total)
                assert error <= bound + 1e-12, (tenant, start, n, share)
                worst = max(worst, error)
    return worst


@pytest.mark.parametrize(
    "weights",
    [{"a": 1.0, "b": 1.0}, {"a": 3.0, "b": 1.0}, {"a": 1.0, "b": 1.0, "c": 1.0},
     {"a": 3.0, "b": 1.0, "c": 1.0}],
)
def test_fairness_over_every_window_of_200_or_more(weights: dict[str, float]) -> None:
    """Equal costs, tenants always backlogged: over every window of N in {200, 317, 600}
    decisions, each tenant's share of served tokens is within
    2 w_i (W - w_i) / (W w_min N) of w_i / W (<= 1.2 % at N = 200 for these weights)."""
    check_windows(weights, 1200, [200, 317, 600])


@settings(max_examples=25, deadline=None)
@given(weights=st.lists(st.integers(1, 4), min_size=2, max_size=3))
def test_fairness_bound_for_other_weights(weights: list[int]) -> None:
    named = {f"t{i}": float(w) for i, w in enumerate(weights)}
    total, w_min = sum(weights), min(weights)
    n = max(200, min(1000, int(100 * max(weights) * total / w_min)))  # bound <= 2 %
    decisions = n + 150
    s = WfqScheduler(named)
    for _ in range(decisions):
        for tenant in named:
            s.push(item(tenant, cost=3))
    served = [s.pop(0.0) for _ in range(decisions)]
    for tenant, w in named.items():
        for start in (0, 75, 150):
            window = served[start:start + n]
            share = sum(1 for g in window if g and g.tenant_id == tenant) / n
            assert abs(share - w / total) <= share_bound(w, total, w_min, n) + 1e-12


def test_state_is_bounded_by_the_backlog_not_by_tenants_ever_seen() -> None:
    """Tenants that come once and leave (any X-Tenant-ID on an open server) leave no
    counter behind once the lift floor passes them; a backlogged tenant keeps its own."""
    s = WfqScheduler()
    for _ in range(3):
        s.push(item("steady"))
    for i in range(20 * IDLE_SLACK):
        s.push(item(f"once-{i}"))
        s.push(item("steady"))
        s.pop(0.0)
        s.pop(0.0)
        assert s.tenants_tracked() <= 2 * IDLE_SLACK + 2, i
    assert "steady" in s.backlogged() and s.counter("steady") > 0


def test_idle_counters_above_the_floor_are_capped_lowest_first() -> None:
    s = WfqScheduler()
    # Each tenant is served alone at a rising counter, then leaves: all stay above the
    # floor of a tenant that was served least and now waits.
    s.push(item("waiting", cost=1))
    for i in range(MAX_IDLE_TENANTS + 3 * IDLE_SLACK):
        s.on_served(f"ahead-{i}", 10 + i)
    assert s.tenants_tracked() <= 2 * MAX_IDLE_TENANTS + 1
    # the highest counters (the largest leads) are the ones kept
    assert s.counter(f"ahead-{MAX_IDLE_TENANTS + 3 * IDLE_SLACK - 1}") > 0


def test_dropping_idle_state_changes_no_decision() -> None:
    """The same arrivals with and without purging (a huge slack) pop in the same order."""
    import sluice.policy.queues.wfq as wfq

    def run(slack: int) -> list[tuple[str, int]]:
        old = wfq.IDLE_SLACK
        wfq.IDLE_SLACK = slack
        try:
            s = WfqScheduler({"heavy": 3.0})
            order: list[tuple[str, int]] = []
            rng = __import__("random").Random(7)
            for step in range(3000):
                tenant = rng.choice(["heavy", "light", f"guest-{rng.randrange(400)}"])
                s.push(item(tenant, cost=rng.randrange(1, 50)))
                if step % 3 != 0:
                    popped = s.pop(0.0)
                    if popped is not None:
                        order.append((popped.tenant_id, popped.cost_tokens))
                        s.on_served(popped.tenant_id, rng.randrange(-10, 10))
            return order
        finally:
            wfq.IDLE_SLACK = old

    assert run(2) == run(10**9)
