"""The status page's decision log: the last requests' decision records (``Request``'s
worker, route, variant and plan, and how each ended: a refusal's reason), kept by an
``Observer`` as each request reaches its terminal state."""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from sluice.engine.observer import Observer
from sluice.engine.request import Request

DECISIONS_KEPT = 50
"""How many of the last requests the log holds."""
TEXT_CHARS = 200
"""The longest route reason or tenant id kept (the rest is cut)."""


@dataclass(frozen=True, slots=True)
class Decision:
    """How the runtime decided one request, as its record stood when it ended."""

    at_s: float
    """When it ended (the runtime's clock)."""
    request_id: int
    tenant_id: str
    model_id: str
    """The model it ran on or was refused for (a group request's variant once planned)."""
    state: str
    """Its terminal state: ``completed``, ``rejected``, ``failed``, ``cancelled``,
    ``expired``."""
    reason: str
    """Why it ended so: the error code of one that did not complete (``queue_full``,
    ``quota``, ``deadline_infeasible`` ...), else its finish reason (``stop``, ``length``)."""
    worker_id: int | None
    route: str
    """The router's reason for its worker (empty when it never reached one)."""
    variant: str | None
    plan_reason: str | None
    """The variant planner's reason, for a request that named a model group."""
    predicted_wait_s: float | None
    queue_wait_s: float | None
    ttft_s: float | None


def decision_of(req: Request) -> Decision:
    """``req``'s decision record (``req`` is terminal)."""
    t = req.times
    final = req.final
    reason = ""
    if final is not None:
        reason = final.error_code or final.finish_reason
    return Decision(
        at_s=t.finished_s if t.finished_s is not None else t.arrival_s,
        request_id=req.request_id,
        tenant_id=req.tenant_id[:TEXT_CHARS],
        model_id=req.model_id,
        state=req.status.name.lower(),
        reason=reason,
        worker_id=req.worker_id,
        route=req.route_reason.replace("\n", " ")[:TEXT_CHARS],
        variant=req.variant,
        plan_reason=req.plan.reason if req.plan is not None else None,
        predicted_wait_s=req.predicted_wait_s,
        queue_wait_s=(t.started_s - t.queued_s
                      if t.started_s is not None and t.queued_s is not None else None),
        ttft_s=t.first_token_s - t.arrival_s if t.first_token_s is not None else None,
    )


class DecisionLog(Observer):
    """The last ``kept`` decisions. Called from worker and control threads (locked);
    holds at most ``kept`` entries."""

    def __init__(self, kept: int = DECISIONS_KEPT) -> None:
        if kept < 1:
            raise ValueError(f"kept must be >= 1, got {kept!r}")
        self._lock = threading.Lock()
        self._entries: deque[Decision] = deque(maxlen=kept)

    def finished(self, req: Request) -> None:
        entry = decision_of(req)
        with self._lock:
            self._entries.append(entry)

    def latest(self) -> Sequence[Decision]:
        """The decisions held, newest first."""
        with self._lock:
            return tuple(reversed(self._entries))
