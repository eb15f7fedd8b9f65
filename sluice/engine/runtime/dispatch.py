"""The dispatcher thread: on every pass, under the runtime's lock, expire queued requests
whose deadline passed, move queued group requests whose predicted finish now misses their
deadline to a faster variant, and route queued requests to workers while an inbox has
room; then wait for a change or the next deadline."""

from __future__ import annotations

import logging

from sluice.engine.request import RequestStatus
from sluice.engine.runtime.deadlines import Deadlines
from sluice.engine.runtime.state import IDLE_POLL_S

log = logging.getLogger("sluice.runtime")


class Dispatch(Deadlines):
    """The dispatch loop (``_dispatch_loop`` is the thread's target) and the replanning
    of queued requests. A failure of the loop refuses new work and ends the queued
    requests; ``dispatcher_fault`` then names it."""

    def _dispatch_loop(self) -> None:
        try:
            self._dispatch_forever()
        except BaseException as exc:
            # Nothing dispatches any more: refuse new work (``/health`` fails, so the
            # process gets restarted) and end the queued requests rather than leave them.
            self.dispatcher_fault = type(exc).__name__
            log.exception("the dispatcher thread failed; no request is dispatched any more")
            with self._cv:
                self._draining = True
                queued = [r for r in self._live.values() if r.worker_id is None]
                for req in queued:
                    self._scheduler.remove(req.request_id)
            now = self.clock()
            for req in queued:
                req.finish(RequestStatus.FAILED, now, error="the dispatcher failed; the "
                           "server must be restarted", error_code="internal_error")

    def _dispatch_forever(self) -> None:
        while True:
            with self._cv:
                if self._stopped:
                    return
                now = self.clock()
                self._expire_queued(now)
                self._replan_queued(now)
                moved = self._dispatch(now)
                if not moved:
                    wait = IDLE_POLL_S
                    if self._deadlines:
                        wait = min(wait, max(0.0, self._deadlines[0][0] - now))
                    self._cv.wait(wait)

    def _replan_queued(self, now: float) -> None:
        """Queued group requests whose predicted finish now misses their deadline move to
        a faster variant (keeping their place), or fail now with ``deadline_infeasible``
        instead of expiring in the queue. In the scheduler the move is made here; in a
        worker's inbox the worker makes it on its thread, between batches (``Retarget``;
        its ``Moved`` answer, through the pump, completes it). Which requests move where is
        the control core's (``ControlCore.replan``). Under ``self._cv``."""
        if not self.variants.groups or not self._live:
            return
        moves = self.variants.replan(now, self._movable)
        requests = {req.request_id: req for req, _ in moves}
        for step in self._core.replan(((r.request_id, v) for r, v in moves),
                                      lambda rid: requests[rid].worker_id is not None):
            req, variant = requests[step.request_id], step.variant
            group_id = self.variants.group_of(req.model_id)
            if variant is None:
                self.observer.planned(group_id, None, "deadline_infeasible")
                req.finish(RequestStatus.REJECTED, now, error_code="deadline_infeasible",
                           error=f"deadline infeasible for group {group_id}: queued on "
                                 f"{req.model_id}, no variant can finish it in time now")
                if req.worker_id is not None:  # its worker drops its item
                    self.workers[req.worker_id].cancel(req.request_id)
                continue
            if not step.in_inbox:
                self.variants.moved(req, variant)
            else:
                assert req.worker_id is not None
                self._moving.add(req.request_id)
                self.variants.moved(req, variant, apply=False)
                self.workers[req.worker_id].retarget(req.request_id, variant)
            self.observer.planned(group_id, variant, "replanned")

    def _movable(self, request_id: int) -> bool:
        """Queued (in the scheduler, or waiting in an inbox with no move pending)."""
        if request_id in self._scheduler:
            return True
        req = self._live.get(request_id)
        return (req is not None and req.worker_id is not None
                and req.status == RequestStatus.QUEUED and request_id not in self._moving)

    def _dispatch(self, now: float) -> bool:
        """Route queued requests while the queue is non-empty and some inbox has room (the
        decisions are ``sluice.policy.queues.dispatch``'s; this applies them)."""
        moved = False
        while True:
            views = [w.view() for w in self.workers]
            d = self._dispatcher.next(now, views, self._model_bytes, self._is_live)
            if d is None or d.put_back:
                break
            req = self._live[d.item.request_id]
            if d.rejected:
                req.finish(RequestStatus.REJECTED, now, error=d.reason,
                           error_code="no_feasible_worker")
                continue
            if d.worker_id is None or not self.workers[d.worker_id].offer(req):
                self._dispatcher.put_back(d.item)
                break
            req.route_reason = d.reason
            self._core.dispatched(d)
            moved = True
        if moved:
            self._cv.notify_all()  # submitters waiting for room
        return moved
