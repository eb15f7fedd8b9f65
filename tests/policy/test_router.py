"""Routers: feasibility, tiers, tie-breaks, rotation."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sluice.policy.queues.router import (
    ROUTER_NAMES,
    NoRoute,
    RouteDecision,
    is_feasible,
    make_router,
    residency_tier,
)
from sluice.policy.types import WorkerView

GB = 1 << 30


def worker(wid: int, *, load: int = 0, inbox_free: int = 4, budget: int = 8 * GB,
           free: int = 8 * GB, resident: frozenset[str] = frozenset(),
           evictable: int = 0) -> WorkerView:
    return WorkerView(wid, load, 0, inbox_free, budget, free, resident, evictable)


def test_seed_example_resident_worker_wins_despite_load() -> None:
    workers = [
        worker(0, load=3, free=2 * GB, resident=frozenset({"m"})),
        worker(1, load=0, free=8 * GB),
        worker(2, load=0, free=1 * GB, resident=frozenset({"other"}), evictable=7 * GB),
    ]
    decision = make_router("residency_aware").route("m", 4 * GB, workers)
    assert decision == RouteDecision(0, 0, "resident, load 3")
    assert [residency_tier(w, "m", 4 * GB) for w in workers] == [0, 1, 2]
    assert make_router("least_loaded").route("m", 4 * GB, workers) == RouteDecision(
        1, None, "least loaded, load 0")


def test_residency_aware_prefers_fitting_free_memory_over_eviction() -> None:
    workers = [worker(0, load=0, free=GB, evictable=7 * GB), worker(1, load=5, free=8 * GB)]
    decision = make_router("residency_aware").route("m", 4 * GB, workers)
    assert isinstance(decision, RouteDecision)
    assert (decision.worker_id, decision.tier) == (1, 1)


def test_worker_that_cannot_evict_enough_yet_is_still_tier_2() -> None:
    w = worker(0, free=0, evictable=0)
    assert is_feasible(w, "m", 4 * GB)
    assert residency_tier(w, "m", 4 * GB) == 2
    decision = make_router("residency_aware").route("m", 4 * GB, [w])
    assert isinstance(decision, RouteDecision) and decision.tier == 2


def test_ties_go_to_lower_load_then_lower_id() -> None:
    workers = [worker(2, load=1), worker(1, load=1), worker(0, load=2)]
    for name in ("least_loaded", "residency_aware"):
        decision = make_router(name).route("m", GB, workers)
        assert isinstance(decision, RouteDecision) and decision.worker_id == 1


@pytest.mark.parametrize("name", ROUTER_NAMES)
def test_no_feasible_worker(name: str) -> None:
    workers = [worker(0, budget=GB, free=GB), worker(1, budget=2 * GB, free=0)]
    assert make_router(name).route("big", 3 * GB, workers) == NoRoute("no_feasible_worker")
    assert make_router(name).route("big", GB, []) == NoRoute("no_feasible_worker")


@pytest.mark.parametrize("name", ROUTER_NAMES)
def test_all_busy(name: str) -> None:
    workers = [worker(0, inbox_free=0), worker(1, budget=GB, free=GB)]
    assert make_router(name).route("m", 2 * GB, workers) == NoRoute("all_busy")


@pytest.mark.parametrize("name", ROUTER_NAMES)
def test_resident_model_is_feasible_even_over_budget(name: str) -> None:
    # A model already resident is servable even if its estimate exceeds the budget.
    workers = [worker(0, budget=GB, free=0, resident=frozenset({"m"}))]
    decision = make_router(name).route("m", 2 * GB, workers)
    assert isinstance(decision, RouteDecision) and decision.worker_id == 0


def test_round_robin_cycles_over_available_workers() -> None:
    router = make_router("round_robin")
    workers = [worker(2), worker(0), worker(1, inbox_free=0), worker(3, budget=1, free=1)]
    picks = []
    for _ in range(5):
        decision = router.route("m", GB, workers)
        assert isinstance(decision, RouteDecision)
        picks.append(decision.worker_id)
    assert picks == [0, 2, 0, 2, 0]
    # Worker 1 frees up: the rotation continues from the last pick (0).
    workers[2] = worker(1)
    decision = router.route("m", GB, workers)
    assert isinstance(decision, RouteDecision) and decision.worker_id == 1


def test_make_router_rejects_unknown_name_and_negative_bytes() -> None:
    with pytest.raises(ValueError, match="'random'"):
        make_router("random")
    with pytest.raises(ValueError, match="model_bytes"):
        make_router("least_loaded").route("m", -1, [worker(0)])


WORKERS = st.lists(
    st.builds(
        lambda wid, load, inbox, budget, used, res: WorkerView(
            wid, load, 0, inbox, budget, max(0, budget - used),
            frozenset({"m"} if res else set()), used),
        st.integers(0, 3), st.integers(0, 5), st.integers(0, 2), st.integers(0, 10),
        st.integers(0, 10), st.booleans(),
    ),
    max_size=6,
    unique_by=lambda w: w.worker_id,
)


@given(workers=WORKERS, model_bytes=st.integers(0, 12), name=st.sampled_from(ROUTER_NAMES))
def test_decision_is_available_and_optimal(
    workers: list[WorkerView], model_bytes: int, name: str
) -> None:
    decision = make_router(name).route("m", model_bytes, workers)
    feasible = [w for w in workers if "m" in w.resident or w.budget_bytes >= model_bytes]
    available = [w for w in feasible if w.inbox_free > 0]
    if not feasible:
        assert decision == NoRoute("no_feasible_worker")
    elif not available:
        assert decision == NoRoute("all_busy")
    else:
        assert isinstance(decision, RouteDecision)
        chosen = next(w for w in available if w.worker_id == decision.worker_id)
        if name == "least_loaded":
            assert (chosen.load, chosen.worker_id) == min((w.load, w.worker_id)
                                                          for w in available)
        if name == "residency_aware":
            def key(w: WorkerView) -> tuple[int, int, int]:
                return (residency_tier(w, "m", model_bytes), w.load, w.worker_id)
            assert key(chosen) == min(key(w) for w in available)
            assert decision.tier == residency_tier(chosen, "m", model_bytes)
