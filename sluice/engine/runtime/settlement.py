"""What happens when a request ends: it leaves the live set, its tenant's fair-share
charge is corrected to the tokens it was really served, and the completion rate, the
variant planner and the observer hear of it."""

from __future__ import annotations

from collections.abc import Callable

from sluice.engine.request import Event, Final, Request, RequestStatus, TokenEvent
from sluice.engine.runtime.deadlines import Deadlines
from sluice.policy.queues.control_core import served_tokens


class Settlement(Deadlines):
    """The listener every admitted request gets (``_on_event``): a final settles the
    request in the control core (``ControlCore.settle``: its tenant's fair-share charge
    corrected to the tokens it was served, none if it never ran)."""

    def _on_event(self, req: Request) -> Callable[[Event], None]:
        last_token_s: dict[int, float] = {}  # per choice

        def on_event(event: Event) -> None:
            if not isinstance(event, Final):
                # token_id < 0: the text a retiring sequence flushes
                if isinstance(event, TokenEvent) and event.token_id >= 0:
                    previous = last_token_s.get(event.choice)
                    last_token_s[event.choice] = event.time_s
                    if previous is not None:
                        self.observer.token_gap(req.model_id, event.time_s - previous)
                return
            now = self.clock()
            self.variants.finished(req)
            with self._cv:
                self._live.pop(req.request_id, None)
                self._moving.discard(req.request_id)  # a worker that died never answers
                self._purge_deadlines()
                self._core.settle(
                    req.request_id, req.tenant_id,
                    served_tokens(req.kind == "generative", req.times.started_s is not None,
                                  event.prompt_tokens, event.completion_tokens),
                    event.status == RequestStatus.COMPLETED, now)
                self._cv.notify_all()
            self.observer.finished(req)

        return on_event
