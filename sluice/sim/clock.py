"""The virtual clock: a heap of timed callbacks, run in time order (ties in the order
they were scheduled). No threads, no sleeps: time jumps from one event to the next."""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable
from typing import Any


class EventLoop:
    """``at(t, fn, arg)`` schedules ``fn(t, arg)``; ``run()`` runs events in order.

    Invariant: ``now`` never decreases; an event scheduled in the past runs at ``now``."""

    def __init__(self) -> None:
        self.now = 0.0
        self.events_run = 0
        self._heap: list[tuple[float, int, Callable[[float, Any], None], Any]] = []
        self._seq = itertools.count()

    def at(self, t: float, fn: Callable[[float, Any], None], arg: Any = None) -> None:
        heapq.heappush(self._heap, (max(t, self.now), next(self._seq), fn, arg))

    def run(self, until_s: float = float("inf")) -> None:
        """Run events up to ``until_s`` (all of them by default)."""
        heap, pop = self._heap, heapq.heappop
        while heap and heap[0][0] <= until_s:
            t, _, fn, arg = pop(heap)
            self.now = t
            self.events_run += 1
            fn(t, arg)

    def __len__(self) -> int:
        return len(self._heap)
