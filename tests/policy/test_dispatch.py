"""The dispatcher: one pop, one route; put back when every feasible inbox is full."""

from __future__ import annotations

from sluice.policy.queues.dispatch import Dispatcher
from sluice.policy.queues.router import make_router
from sluice.policy.queues.scheduler import make_scheduler
from sluice.policy.types import QueueItem, WorkerView


def view(worker_id: int, inbox_free: int = 2, budget: int = 100, load: int = 0) -> WorkerView:
    return WorkerView(worker_id=worker_id, queue_depth=load, active_count=0,
                      inbox_free=inbox_free, budget_bytes=budget, free_bytes=budget,
                      resident=frozenset(), evictable_bytes=0)


def item(request_id: int, model: str = "m", tenant: str = "t", cost: int = 5) -> QueueItem:
    return QueueItem(request_id, model, float(request_id), tenant_id=tenant, cost_tokens=cost)


def dispatcher(scheduler: str = "fifo") -> Dispatcher:
    return Dispatcher(make_scheduler(scheduler), make_router("least_loaded"))


def test_routes_the_scheduler_choice_to_the_router_choice() -> None:
    d = dispatcher()
    d.decisions = []
    d.scheduler.push(item(1))
    d.scheduler.push(item(2))
    out = d.next(0.0, [view(0, load=3), view(1, load=1)], lambda _m: 10)
    assert out is not None and out.item.request_id == 1 and out.worker_id == 1
    assert d.decisions == [(1, 1)] and len(d.scheduler) == 1


def test_nothing_popped_when_no_inbox_has_room() -> None:
    d = dispatcher()
    d.scheduler.push(item(1))
    assert d.next(0.0, [view(0, inbox_free=0)], lambda _m: 10) is None
    assert len(d.scheduler) == 1


def test_infeasible_model_is_rejected_and_busy_workers_put_it_back() -> None:
    d = dispatcher()
    d.scheduler.push(item(1, model="big"))
    out = d.next(0.0, [view(0, budget=5)], lambda _m: 10)
    assert out is not None and out.rejected and out.worker_id is None
    assert len(d.scheduler) == 0
    d.scheduler.push(item(2))
    out = d.next(0.0, [view(0, budget=5), view(1, budget=50, inbox_free=0)], lambda _m: 10)
    assert out is not None and out.put_back and 2 in d.scheduler


def test_put_back_refunds_the_fair_share_charge() -> None:
    d = dispatcher("wfq")
    d.scheduler.push(item(1, tenant="a", cost=100))
    d.scheduler.push(item(2, tenant="b", cost=1))
    first = d.scheduler.pop(0.0)
    assert first is not None
    d.put_back(first)
    # Refunded: the same request is still first (its tenant was not charged for the pop).
    again = d.scheduler.pop(0.0)
    assert again is not None and again.request_id == first.request_id


def test_requests_that_ended_meanwhile_are_skipped() -> None:
    d = dispatcher()
    for i in (1, 2):
        d.scheduler.push(item(i))
    out = d.next(0.0, [view(0)], lambda _m: 10, is_live=lambda rid: rid != 1)
    assert out is not None and out.item.request_id == 2 and len(d.scheduler) == 0
