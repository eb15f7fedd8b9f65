"""The deadline heap of queued requests: each admitted request with a start-by time has an
entry; the dispatcher expires those whose time passed while still in the scheduler."""

from __future__ import annotations

import heapq

from sluice.engine.request import RequestStatus, expired_what
from sluice.engine.runtime.state import RuntimeState

DEADLINE_SLACK = 64
"""Deadline-heap entries of finished requests tolerated before a purge (see
``Runtime._purge_deadlines``)."""


class Deadlines(RuntimeState):
    """Purging and expiring ``_deadlines``; every method runs under ``_cv``, except
    ``deadline_entries``, which takes it."""

    def _purge_deadlines(self) -> None:
        """Drop the deadline entries of finished requests once they outnumber the live ones,
        so the heap holds at most ``2 * live + DEADLINE_SLACK`` entries however far off the
        deadlines are (amortised O(1) per request). Under ``self._cv``."""
        if len(self._deadlines) <= 2 * len(self._live) + DEADLINE_SLACK:
            return
        self._deadlines = [e for e in self._deadlines if e[1] in self._live]
        heapq.heapify(self._deadlines)

    @property
    def deadline_entries(self) -> int:
        """Entries in the deadline heap (at most ``2 * live + DEADLINE_SLACK``)."""
        with self._cv:
            return len(self._deadlines)

    def _expire_queued(self, now: float) -> None:
        while self._deadlines and self._deadlines[0][0] <= now:
            _, request_id = heapq.heappop(self._deadlines)
            req = self._live.get(request_id)
            if req is not None and self._scheduler.remove(request_id) is not None:
                req.finish(RequestStatus.EXPIRED, now,
                           error=f"{expired_what(req, now)} passed while queued",
                           error_code="deadline")
