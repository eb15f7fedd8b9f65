"""What happens when a request ends: it leaves the live set, its tenant's fair-share
charge is corrected to the tokens it was really served, and the completion rate, the
variant planner and the observer hear of it."""

from __future__ import annotations

from collections.abc import Callable

from sluice.engine.request import Event, Final, Request, RequestStatus
from sluice.engine.runtime.deadlines import Deadlines


class Settlement(Deadlines):
    """The listener every admitted request gets (``_on_event``) and fair-share
    settlement."""

    def _on_event(self, req: Request) -> Callable[[Event], None]:
        last_token_s: dict[int, float] = {}  # per choice

        def on_event(event: Event) -> None:
            if not isinstance(event, Final):
                if event.token_id >= 0:  # not the text a retiring sequence flushes
                    previous = last_token_s.get(event.choice)
                    last_token_s[event.choice] = event.time_s
                    if previous is not None:
                        self.observer.token_gap(req.model_id, event.time_s - previous)
                return
            now = self.clock()
            self.variants.finished(req)
            with self._cv:
                self._live.pop(req.request_id, None)
                self._purge_deadlines()
                self._settle_share(req, event)
                if event.status == RequestStatus.COMPLETED:
                    self._completions.record(now)
                self._cv.notify_all()
            self.observer.finished(req)

        return on_event

    def _settle_share(self, req: Request, final: Final) -> None:
        """Correct the fair-share charge of a dispatched request to the tokens it was really
        served (none if it never ran). Under ``self._cv``."""
        charged = self._charged.pop(req.request_id, None)
        if charged is None:
            return
        served = 0
        if req.times.started_s is not None:
            served = (final.prompt_tokens + final.completion_tokens
                      if req.kind == "generative" else 1)
        if served != charged:
            self._scheduler.on_served(req.tenant_id, served - charged)
