"""A simulated replica: the server runtime's control plane on the virtual clock.

``submit`` does what ``Runtime.try_submit`` does: the variant planner for a group request
(``VariantTracker``, rejecting ``deadline_infeasible``), then the control core's admission
check (queue capacity, a deadline already passed), then its scheduler queue. ``dispatch``
is the dispatcher thread: ``Dispatcher.next`` over the workers' views while some inbox
has room; queued requests whose deadline passes expire. A worker reports every terminal
state back through ``ended`` and frees capacity through ``capacity``. Admission, the
queue, dispatch, the re-planning of queued requests and fair-share settlement are the
server's own ``ControlCore`` (``sluice.policy.queues.control_core``), driven on the virtual
clock.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from sluice.policy.queues.control_core import ControlCore, queue_cost, served_tokens
from sluice.policy.types import QueueItem
from sluice.policy.variants.variant_tracker import VariantInfo, VariantTracker
from sluice.sim.clock import EventLoop
from sluice.sim.request import SimRequest
from sluice.sim.setup import SimConfig
from sluice.sim.worker import SimWorker


def make_tracker(config: SimConfig) -> VariantTracker | None:
    """The variant planner's measurements for the config's groups (``None`` without),
    each variant's service estimator starting from a live server's ``estimate`` where
    its cost has one."""
    if not config.groups:
        return None
    variants = {}
    for g in config.groups:
        for v in g.variants:
            m = config.models[v]
            cost = m.cost
            variants[v] = VariantInfo(
                accuracy=m.accuracy,
                servers=config.workers if m.memory_bytes <= config.worker.budget_bytes else 1,
                profile_s=dict(zip(cost.batch_sizes, cost.batch_times_s, strict=True)),
                length_prior=cost.length_prior,
            )
    tracker = VariantTracker(
        list(config.groups), variants,
        workers=config.workers)
    for v, estimator in tracker.service.items():  # a live server's: its planner's start
        if (estimate := config.models[v].cost.estimate) is not None:
            estimator.restore(estimate)
    tracker.restore_arrivals({g.group_id: g.arrivals for g in config.groups
                              if g.arrivals is not None}, now=0.0)
    return tracker


class SimReplica:
    """One replica's queue, dispatcher and workers."""

    def __init__(self, replica_id: int, config: SimConfig, loop: EventLoop,
                 on_end: Callable[[SimRequest], None]) -> None:
        self.replica_id = replica_id
        self.config = config
        self.loop = loop
        self.on_end = on_end
        self.core = ControlCore(config.queue)
        """The server runtime's control core (admission, queue, dispatch, re-planning,
        fair-share settlement), on the virtual clock."""
        self.scheduler = self.core.scheduler
        self.dispatcher = self.core.dispatcher
        self.completions = self.core.completions
        self.tracker = make_tracker(config)
        self.groups = {g.group_id: g for g in config.groups}
        self.live: dict[int, SimRequest] = {}
        self.workers = [SimWorker(i, config, loop, self, seed=replica_id * 100_003 + i)
                        for i in range(config.workers)]
        self.ongoing = 0
        """Requests admitted here and not ended (the front end's load signal)."""
        self.loads: list[tuple[int, str]] = []
        self.residency_version = 0
        """Counts loads (and the evictions they make): the front end's residency view of
        this replica is stale when it changed."""
        """(worker id, model id) of every model load, in order."""
        self._dispatching = False
        self._model_bytes = {m.model_id: m.memory_bytes for m in config.models.values()}
        for model_id in config.preload:
            self.workers[0].preload(config.models[model_id])

    # -- admission -------------------------------------------------------------------------

    def submit(self, req: SimRequest, now: float) -> bool:
        """Admit ``req`` or end it ``rejected`` at once; True when admitted."""
        req.replica = self.replica_id
        self.ongoing += 1
        reason = self._plan(req, now)
        if reason is None:
            rejection = self.core.admission_check(now, req.deadline_s)
            reason = None if rejection is None else rejection.reason
        if reason is not None:
            if self.tracker is not None:
                self.tracker.finished(req.request_id, req.model, now, ran=False)
            self.ended(req, "rejected", now, reason)
            return False
        self.live[req.request_id] = req
        req.waiting_ahead = len(self.scheduler) + sum(w.view().queue_depth for w in self.workers)
        req.status = "queued"
        if self.tracker is not None:
            self.tracker.admitted(req.request_id, req.model, req.deadline_s, req.group,
                                  length=req.input_chars)
        generative = self.config.models[req.model].kind == "generative"
        self.core.enqueue(QueueItem(
            request_id=req.request_id, model_id=req.model, arrival_s=req.arrival_s,
            tenant_id=req.tenant, priority=req.priority, deadline_s=req.deadline_s,
            cost_tokens=queue_cost(generative, req.n_prompt, req.max_tokens)))
        if req.deadline_s is not None:
            self.loop.at(req.deadline_s, self._expire_queued, req)
        self.dispatch(now)
        return True

    def _plan(self, req: SimRequest, now: float) -> str | None:
        """A group request gets its variant (``req.model`` rewritten); the rejection
        reason when no variant meets its deadline."""
        if self.tracker is None:
            return None
        choice, req.deadline_s = self.tracker.plan_arrival(
            req.request_id, req.model, req.deadline_s, req.arrival_s, now, req.input_chars)
        if choice is None or req.model not in self.groups:
            return None
        req.group = req.model
        if choice.variant is None:
            return "deadline_infeasible"
        req.model = choice.variant
        req.plan_reason = choice.reason
        req.plan_arrival = (choice.arrival_per_s, choice.arrival_stderr_per_s,
                            choice.low_load_line_per_s)
        return None

    # -- dispatch ----------------------------------------------------------------------------

    def dispatch(self, now: float) -> None:
        """Route queued requests while some inbox has room (re-entry is a no-op: offers
        wake workers through events, never synchronously)."""
        if self._dispatching:
            return
        self._dispatching = True
        try:
            self._replan_queued(now)  # as the server's dispatcher: every pass, queue or not
            if not len(self.scheduler):
                return
            workers = self.workers
            while True:
                d = self.dispatcher.next(now, [w.view() for w in workers],
                                         self._model_bytes.__getitem__, self._is_live)
                if d is None or d.put_back:
                    break
                req = self.live[d.item.request_id]
                if d.rejected:
                    self.ended(req, "rejected", now, "no_feasible_worker")
                    continue
                if d.worker_id is None or not workers[d.worker_id].offer(req, now):
                    self.dispatcher.put_back(d.item)
                    break
                self.core.dispatched(d)
        finally:
            self._dispatching = False

    def _replan_queued(self, now: float) -> None:
        """As the server's dispatcher does: queued group requests predicted to miss their
        deadline move to a faster variant (keeping their place) or are rejected
        ``deadline_infeasible`` now. Queued means in the scheduler *or waiting in a
        worker's inbox* (``Runtime._movable``): a move there changes the request's model
        in place, which splits the inbox's same-variant run, so it caps the batch the
        worker forms next as the server's worker does between batches."""
        if self.tracker is None:
            return
        moves = [(rid, v) for rid, v in self.tracker.replan(now, self._movable)
                 if rid in self.live]
        for step in self.core.replan(moves, lambda rid: self._in_inbox(self.live[rid])):
            req = self.live[step.request_id]
            if step.variant is None:
                if step.in_inbox:
                    self.workers[req.worker].withdraw(req)
                self.ended(req, "rejected", now, "deadline_infeasible")
                continue
            self.tracker.moved(req.request_id, step.variant)
            req.model = step.variant
            req.plan_reason = "replanned"

    def _movable(self, request_id: int) -> bool:
        """Queued: in the scheduler, or waiting in a worker's inbox (the server's rule)."""
        if request_id in self.scheduler:
            return True
        req = self.live.get(request_id)
        return req is not None and self._in_inbox(req)

    @staticmethod
    def _in_inbox(req: SimRequest) -> bool:
        """Offered to a worker and not yet in a batch (one-shot: group variants are)."""
        return req.worker >= 0 and req.status == "queued"

    def _is_live(self, request_id: int) -> bool:
        return request_id in self.live

    def _expire_queued(self, now: float, req: SimRequest) -> None:
        if not req.is_terminal and self.scheduler.remove(req.request_id) is not None:
            self.ended(req, "expired", now, "deadline")

    # -- what workers report ---------------------------------------------------------------

    def capacity(self, now: float) -> None:
        self.dispatch(now)

    def loaded(self, worker_id: int, model_id: str) -> None:
        self.loads.append((worker_id, model_id))
        self.residency_version += 1

    def unloaded(self, worker_id: int, model_id: str) -> None:
        """A keep-alive ran out: the front end's residency view is stale."""
        self.residency_version += 1

    def batch_started(self, worker_id: int, model_id: str, batch: list[SimRequest],
                      now: float) -> None:
        if self.tracker is not None:
            for r in batch:
                self.tracker.started(r.request_id)
            self.tracker.batch_started(worker_id, model_id, len(batch), now,
                                       max(r.input_chars for r in batch))

    def batch_done(self, worker_id: int, model_id: str, size: int, seconds: float) -> None:
        if self.tracker is not None:
            self.tracker.batch_done(model_id, size, seconds, worker_id)

    def ended(self, req: SimRequest, status: str, now: float, reason: str | None) -> None:
        req.finish(status, now, reason)
        self.ongoing -= 1
        if self.live.pop(req.request_id, None) is not None and self.tracker is not None:
            self.tracker.finished(req.request_id, req.model, now,
                                  ran=status in ("completed", "expired"))
        started = req.started_s is not None  # (a refused group request names no model)
        generative = started and self.config.models[req.model].kind == "generative"
        self.core.settle(req.request_id, req.tenant,
                         served_tokens(generative, started, req.n_prompt, req.generated),
                         status == "completed", now)
        self.on_end(req)

    # -- reporting -------------------------------------------------------------------------

    def busy_s(self) -> float:
        return sum(w.busy_s for w in self.workers)

    def summary(self) -> dict[str, Any]:
        return {"replica": self.replica_id, "busy_s": round(self.busy_s(), 6),
                "loads": sum(w.loads for w in self.workers),
                "queue_left": len(self.scheduler), "live_left": len(self.live),
                "completions_per_s": round(self.completions.rate_per_s(self.loop.now), 3)
                if math.isfinite(self.loop.now) else None}
