"""Replica autoscaling on sluice's load signal: load and KV targets, clamping, no report."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sluice.policy.capacity.autoscale import AutoscaleConfig, ReplicaLoad, desired_replicas

CONFIG = AutoscaleConfig(target_load_per_replica=4.0, target_kv_use=0.8)


def decide(loads: list[tuple[float, float]], current: int = 1, lo: int = 1, hi: int = 4,
           front: float = 0.0) -> int:
    reports = [ReplicaLoad(load, kv) for load, kv in loads]
    return desired_replicas(CONFIG, reports, current=current, min_replicas=lo,
                            max_replicas=hi, queued_in_front=front).replicas


def test_load_over_target_asks_for_more_replicas() -> None:
    assert decide([(9.0, 0.1)]) == 3  # ceil(9 / 4)
    assert decide([(3.0, 0.0), (2.0, 0.0)], current=2) == 2
    assert decide([(1.0, 0.0), (0.5, 0.0)], current=2) == 1  # a lull: back to one


def test_requests_waiting_in_front_count_as_load() -> None:
    assert decide([(4.0, 0.0)], front=4.0) == 2


def test_kv_use_can_ask_for_more_than_load_does() -> None:
    # Two long generations fill 95 % of the KV: the load (2) alone would keep one replica.
    assert decide([(2.0, 0.95)]) == 2


def test_clamped_to_min_and_max() -> None:
    assert decide([(100.0, 1.0)], hi=3) == 3
    assert decide([(0.0, 0.0)], lo=2, current=2) == 2


def test_no_report_keeps_the_count() -> None:
    decision = desired_replicas(CONFIG, [], current=3, min_replicas=1, max_replicas=4)
    assert decision.replicas == 3 and "no load" in decision.reason


def test_reason_names_the_numbers() -> None:
    decision = desired_replicas(CONFIG, [ReplicaLoad(6.0, 0.5)], current=1, min_replicas=1,
                                max_replicas=4, queued_in_front=2.0)
    assert decision.replicas == 2
    assert "load 8 (front 2) / target 4 → 2" in decision.reason


def test_bad_inputs_name_the_field() -> None:
    with pytest.raises(ValueError, match="target_load_per_replica"):
        AutoscaleConfig(target_load_per_replica=0)
    with pytest.raises(ValueError, match="target_kv_use"):
        AutoscaleConfig(target_kv_use=1.5)
    with pytest.raises(ValueError, match="kv_use"):
        ReplicaLoad(1.0, -0.1)
    with pytest.raises(ValueError, match="min_replicas"):
        desired_replicas(CONFIG, [], current=1, min_replicas=3, max_replicas=2)


@given(loads=st.lists(st.tuples(st.floats(0, 100), st.floats(0, 1)), max_size=8),
       lo=st.integers(0, 4), extra=st.integers(0, 6), current=st.integers(0, 12),
       front=st.floats(0, 50))
def test_always_within_bounds_and_enough_for_the_load(
    loads: list[tuple[float, float]], lo: int, extra: int, current: int, front: float,
) -> None:
    hi = max(1, lo + extra)
    reports = [ReplicaLoad(load, kv) for load, kv in loads]
    n = desired_replicas(CONFIG, reports, current=current, min_replicas=lo, max_replicas=hi,
                         queued_in_front=front).replicas
    assert lo <= n <= hi
    total = sum(load for load, _ in loads) + front
    if n < hi and (reports or front):
        assert total <= n * CONFIG.target_load_per_replica + 1e-9
