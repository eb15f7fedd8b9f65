"""Brute-force reference schedulers: a plain list scanned on every decision."""

from __future__ import annotations

import math
from collections.abc import Mapping

from sluice.policy.types import QueueItem


def urgency(item: QueueItem) -> tuple[int, float, int]:
    return (item.priority, math.inf if item.deadline_s is None else item.deadline_s,
            item.request_id)


class ReferenceScheduler:
    """The rules of DESIGN.md written as directly as possible, with explicit skip counts."""

    def __init__(self, name: str, bypass_threshold: int = 8,
                 weights: Mapping[str, float] | None = None) -> None:
        self.name = name
        self.bypass_threshold = bypass_threshold
        self.weights = dict(weights or {})
        self.queued: list[QueueItem] = []
        self.skips: dict[int, int] = {}
        self.counters: dict[str, float] = {}
        self.last_left: str | None = None

    def ids(self) -> set[int]:
        return {i.request_id for i in self.queued}

    def backlogged(self) -> set[str]:
        return {i.tenant_id for i in self.queued}

    def push(self, item: QueueItem) -> None:
        assert item.request_id not in self.ids()
        if self.name == "wfq" and item.tenant_id not in self.backlogged():
            counter = self.counters.get(item.tenant_id, 0.0)
            if self.queued:
                counter = max(counter, min(self.counters[t] for t in self.backlogged()))
            elif self.last_left is not None:
                counter = max(counter, self.counters[self.last_left])
            self.counters[item.tenant_id] = counter
        self.queued.append(item)
        self.skips[item.request_id] = 0

    def _choose(self) -> QueueItem:
        if self.name == "fifo":
            return min(self.queued, key=lambda i: i.request_id)
        if self.name == "priority_edf":
            return min(self.queued, key=urgency)
        if self.name == "wfq":
            tenant = min(self.backlogged(), key=lambda t: (self.counters[t], t))
            return min((i for i in self.queued if i.tenant_id == tenant), key=urgency)
        assert self.name == "workload_aware"
        oldest = min(self.queued, key=lambda i: i.request_id)
        if self.skips[oldest.request_id] > self.bypass_threshold:
            return oldest
        groups: dict[str, list[QueueItem]] = {}
        for item in self.queued:
            groups.setdefault(item.model_id, []).append(item)
        model = min(groups, key=lambda m: (-len(groups[m]),
                                           min(i.request_id for i in groups[m]), m))
        return min(groups[model], key=lambda i: i.request_id)

    def pop(self) -> QueueItem | None:
        if not self.queued:
            return None
        chosen = self._choose()
        self._drop(chosen)
        for item in self.queued:
            if item.request_id < chosen.request_id:
                self.skips[item.request_id] += 1
        if self.name == "wfq":
            self.counters[chosen.tenant_id] += chosen.cost_tokens / self.weights.get(
                chosen.tenant_id, 1.0)
        return chosen

    def _drop(self, item: QueueItem) -> None:
        self.queued.remove(item)
        del self.skips[item.request_id]
        if item.tenant_id not in self.backlogged():
            self.last_left = item.tenant_id

    def remove(self, request_id: int) -> QueueItem | None:
        for item in self.queued:
            if item.request_id == request_id:
                self._drop(item)
                return item
        return None

    def on_served(self, tenant: str, tokens: int) -> None:
        if self.name == "wfq":
            self.counters[tenant] = self.counters.get(tenant, 0.0) + tokens / self.weights.get(
                tenant, 1.0)
