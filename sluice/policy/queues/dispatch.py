"""Dispatch: which queued request goes to which worker next. One decision at a time,
shared by the server's dispatcher thread and the simulator.

``Dispatcher.next(now, views, model_bytes)`` pops ONE request from the scheduler and asks
the router for a worker among ``views``. The answer is a ``Dispatch``:

- ``worker_id`` set: offer the request to that worker;
- ``rejected`` set: no worker can ever hold the model (the request ends ``REJECTED``);
- ``put_back``: every feasible inbox is full; the request went back into the scheduler
  (keeping its place, its fair-share charge refunded) and dispatching stops until some
  capacity frees up.

``None`` means nothing to do: the queue is empty or no inbox has room (nothing is
popped then). Pure: no clock, no threads; the caller owns the scheduler and router and
applies the decision. ``decisions`` (when a list) records every dispatch as
``(request_id, worker_id or -1)`` so a simulator run and a server run can be compared.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from sluice.policy.queues.router import NoRoute, Router
from sluice.policy.queues.scheduler import Scheduler
from sluice.policy.types import QueueItem, WorkerView


@dataclass(frozen=True, slots=True)
class Dispatch:
    """One dispatch decision (exactly one of ``worker_id`` / ``rejected`` / ``put_back``)."""

    item: QueueItem
    worker_id: int | None = None
    reason: str = ""
    """The router's reason (``"resident, load 3"``), or why nothing was chosen."""
    rejected: bool = False
    """No worker can ever hold the model: reject (``no_feasible_worker``)."""
    put_back: bool = False
    """Every feasible worker is busy: the item is back in the queue; stop dispatching."""


class Dispatcher:
    """Pops one request and routes it. Owned by one thread (or by the simulator)."""

    def __init__(self, scheduler: Scheduler, router: Router) -> None:
        self.scheduler = scheduler
        self.router = router
        self.decisions: list[tuple[int, int]] | None = None

    def next(self, now: float, views: Sequence[WorkerView],
             model_bytes: Callable[[str], int],
             is_live: Callable[[int], bool] = lambda _id: True) -> Dispatch | None:
        """The next dispatch, or ``None`` when the queue is empty or every inbox is full.
        Popped requests that are no longer live (``is_live(request_id)`` false: ended
        meanwhile) are dropped without routing."""
        if not any(v.inbox_free for v in views):
            return None
        while True:
            if not len(self.scheduler):
                return None
            item = self.scheduler.pop(now)
            if item is None:
                return None
            if is_live(item.request_id):
                break
        decision = self.router.route(item.model_id, model_bytes(item.model_id), views)
        if isinstance(decision, NoRoute):
            self._record(item, -1)
            if decision.reason != "all_busy":
                return Dispatch(item, reason=decision.reason, rejected=True)
            self.put_back(item)
            return Dispatch(item, reason=decision.reason, put_back=True)
        self._record(item, decision.worker_id)
        return Dispatch(item, worker_id=decision.worker_id, reason=decision.reason)

    def put_back(self, item: QueueItem) -> None:
        """Undo a pop: the request keeps its place; its fair-share charge is refunded."""
        self.scheduler.push(item)
        self.scheduler.on_served(item.tenant_id, -item.cost_tokens)

    def _record(self, item: QueueItem, worker_id: int) -> None:
        if self.decisions is not None:
            self.decisions.append((item.request_id, worker_id))
