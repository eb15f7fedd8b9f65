"""Admission: a request (or the inputs of one API request, as one unit) gets its variant
when it names a group, then the queue's bound, draining and its deadline decide; admitted
requests enter the scheduler and the deadline heap, refused ones end ``REJECTED`` at once.
Also ``cancel``."""

from __future__ import annotations

import heapq
from collections.abc import Sequence

from sluice.engine.request import Request, RequestStatus
from sluice.engine.runtime.settlement import Settlement
from sluice.engine.runtime.state import IDLE_POLL_S
from sluice.policy.queues.admission import Rejection, clamp_retry_after
from sluice.policy.queues.control_core import queue_cost
from sluice.policy.types import QueueItem


class Admission(Settlement):
    """Submission, early refusal and cancellation; admission decisions are taken under
    ``_cv`` (so one unit is decided against one queue depth)."""

    def try_submit(self, req: Request) -> Rejection | None:
        """Admit ``req`` into the queue, or reject it at once (it then ends ``REJECTED``)."""
        return self.try_submit_unit([req])

    def try_submit_unit(self, reqs: Sequence[Request]) -> Rejection | None:
        """Admit ``reqs`` (the inputs of one API request) as one unit: one admission
        decision, taken as for a single request, so a request with more inputs than the
        queue holds is still served, never refused for good. All are queued (each a
        scheduling item of cost 1, so their cost is their number) or all end ``REJECTED``.
        The queue may hence hold up to ``queue_capacity - 1 + len(reqs)`` items."""
        now = self.clock()
        for req in reqs:
            req.listeners.append(self._on_event(req))
        named = [req.model_id for req in reqs]
        if self._trace is not None:
            for req, name in zip(reqs, named, strict=True):
                self._trace.record(req, name)
        with self._cv:
            rejection: Rejection | None = None
            for req in reqs:  # a group's requests each get a variant, or the unit is refused
                rejection = rejection or self._plan(req, now)
            if rejection is None and reqs:
                rejection = self._admission_check(reqs[0], now)
            if rejection is None:
                for req, name in zip(reqs, named, strict=True):
                    self._enqueue(req, now)
                    self.variants.admitted(req, name if name in self.variants.groups else None)
        if rejection is not None:
            self._reject(reqs, rejection, now)
        else:
            for req in reqs:
                self.observer.admitted(req)
        return rejection

    def refuse_early(self, reqs: Sequence[Request]) -> Rejection | None:
        """The queue's admission check alone (capacity, draining, deadline against the
        completion rate), for a caller about to do costly work for ``reqs`` (tokenize a
        prompt, compile a grammar): a refusal ends them ``REJECTED`` exactly as
        ``try_submit_unit`` would; ``None`` leaves them untouched, and ``try_submit_unit``
        decides again when they are submitted."""
        if not reqs:
            return None
        now = self.clock()
        with self._cv:
            rejection = self._admission_check(reqs[0], now)
        if rejection is not None:
            for req in reqs:
                req.listeners.append(self._on_event(req))
            self._reject(reqs, rejection, now)
        return rejection

    def _reject(self, reqs: Sequence[Request], rejection: Rejection, now: float) -> None:
        for req in reqs:
            self.observer.rejected(req.model_id, req.tenant_id, rejection.reason)
            req.finish(RequestStatus.REJECTED, now, error=rejection.message,
                       error_code=rejection.reason)

    def submit(self, req: Request, timeout_s: float | None = None) -> Rejection | None:
        """Like ``try_submit`` but waits (up to ``timeout_s``) for room in the queue."""
        deadline = None if timeout_s is None else self.clock() + timeout_s
        with self._cv:
            while self._queue_depth() >= self.config.queue.queue_capacity and not self._draining:
                remaining = None if deadline is None else deadline - self.clock()
                if remaining is not None and remaining <= 0:
                    break
                self._cv.wait(IDLE_POLL_S if remaining is None else min(remaining, IDLE_POLL_S))
        return self.try_submit(req)

    def cancel(self, request_id: int) -> bool:
        """Cancel a live request: removed at once if queued, stopped at the next step if
        running. False if it is unknown or already ended."""
        with self._cv:
            req = self._live.get(request_id)
            if req is None:
                return False
            if self._scheduler.remove(request_id) is not None:
                req.cancel_requested = True
                req.finish(RequestStatus.CANCELLED, self.clock(), error="cancelled by client")
                return True
            worker_id = req.worker_id
        if worker_id is not None:  # its worker ends it, and tells the pump
            self.workers[worker_id].cancel(request_id)
        return True

    def _plan(self, req: Request, now: float) -> Rejection | None:
        """Choose the variant of a group request (rewrites ``req.model_id``), or reject
        it now when no variant is predicted to meet its deadline."""
        group_id = req.model_id
        choice = self.variants.plan(req, now)
        if choice is None:
            return None
        if group_id in self.variants.groups:
            self.observer.planned(group_id, choice.variant, choice.reason)
        if choice.variant is not None:
            return None
        best = min(choice.predictions, key=lambda p: p.sojourn_s)
        limits = self._core.admission.config
        return Rejection(
            "deadline_infeasible",
            clamp_retry_after(choice.retry_after_s, limits.min_retry_after_s,
                              limits.max_retry_after_s),
            f"deadline infeasible for group {group_id}: the soonest prediction is "
            f"{best.variant} finishing in {best.sojourn_s:.3g} s (wait {best.wait_s:.3g} s + "
            f"service {best.service_s:.3g} s), {(req.deadline_s or now) - now:.3g} s left",
        )

    def _admission_check(self, req: Request, now: float) -> Rejection | None:
        return self._core.admission_check(now, req.deadline_s, self._draining)

    def _enqueue(self, req: Request, now: float) -> None:
        self._live[req.request_id] = req
        req.mark_queued(now)
        self._core.enqueue(QueueItem(
            request_id=req.request_id, model_id=req.model_id, arrival_s=req.arrival_s,
            tenant_id=req.tenant_id, priority=req.priority, deadline_s=req.deadline_s,
            cost_tokens=queue_cost(req.kind == "generative", len(req.prompt_tokens),
                                   req.params.max_tokens)))
        start_by = req.start_by_s
        if start_by is not None:
            heapq.heappush(self._deadlines, (start_by, req.request_id))
        self._cv.notify_all()
