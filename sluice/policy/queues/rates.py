"""Throughput over a sliding window: the completion rate that Retry-After and wait
predictions divide by. Pure: every call takes ``now``."""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping
from typing import Any


class RateMeter:
    """Events per second over the last ``window_s`` seconds.

    Invariant: holds only event times within ``window_s`` of the latest ``now`` seen, so
    memory is bounded by the peak rate times the window. The rate is never divided by
    less than ``min_span_s``, so a first burst does not read as a huge rate.
    """

    def __init__(self, window_s: float = 10.0, min_span_s: float = 1e-3) -> None:
        if window_s <= 0:
            raise ValueError(f"window_s must be > 0, got {window_s}")
        if not 0 < min_span_s <= window_s:
            raise ValueError(f"min_span_s must be in (0, window_s], got {min_span_s}")
        self.window_s = window_s
        self.min_span_s = min_span_s
        self._times: deque[float] = deque()
        self._first_s: float | None = None

    def record(self, now: float, count: int = 1) -> None:
        """Count ``count`` events at ``now``."""
        if self._first_s is None:
            self._first_s = now
        self._times.extend([now] * count)
        self._prune(now)

    def rate_per_s(self, now: float) -> float:
        """Events per second over the window (or since the first event, if sooner)."""
        return self.rate_and_stderr(now)[0]

    def rate_and_stderr(self, now: float) -> tuple[float, float]:
        """The rate and its standard error as a Poisson count: ``n / T`` and ``√n / T``.

        For deciding on a rate with known confidence (a burst of a few events over a short
        span reads as a high rate with a large error)."""
        self._prune(now)
        if self._first_s is None or not self._times:
            return 0.0, 0.0
        span = min(self.window_s, max(now - self._first_s, self.min_span_s))
        n = len(self._times)
        return n / span, math.sqrt(n) / span

    def state(self, now: float) -> dict[str, Any]:
        """What the meter holds at ``now``, as ages (seconds before ``now``): the events
        in the window (oldest first) and the first event ever (``None``: none yet). A
        meter ``restore``d from it reads the same rate and error at the same age."""
        self._prune(now)
        return {"ages_s": [round(now - t, 6) for t in self._times],
                "first_age_s": None if self._first_s is None else round(now - self._first_s, 6)}

    def restore(self, state: Mapping[str, Any], now: float) -> None:
        """Take ``state`` (from ``state``, perhaps another process's) as of ``now``: a
        meter that carries a live one's recent events into another clock."""
        first = state.get("first_age_s")
        self._first_s = None if first is None else now - float(first)
        self._times = deque(sorted(now - float(a) for a in state.get("ages_s", ())))
        self._prune(now)

    def _prune(self, now: float) -> None:
        horizon = now - self.window_s
        while self._times and self._times[0] < horizon:
            self._times.popleft()
