"""The workload-aware scheduler: serve the biggest same-model group, with a starvation bound.

Serving requests for the same model back to back keeps that model resident and its batches
full. Left alone, that starves a lone request for an unpopular model, so a request that has
been skipped more than ``bypass_threshold`` times is served next.

Skip counting. A queued request r is *skipped* once by every decision that picks a request
newer than r (higher request id) while r is queued.

Claim: the oldest queued request o has the largest skip count of all queued requests, and its
count is the number of decisions, made since o was pushed, that picked an id > o's id.
Proof (ids pushed in increasing order): take any queued q newer than o. o was pushed before q
(ids increase in push order) and is still queued, so o was queued at every decision made
while q was queued; a decision that skipped q picked an id > q's id > o's id, so it skipped o
too. Hence skips(q) <= skips(o). And every pick with an id > o's id happened after o was
pushed, since such a request was pushed after o.

So only the oldest needs checking, and its count can be kept exactly in O(log n): remember, in
a min-heap, the ids of picks newer than the oldest queued request at the time of the pick; the
oldest's skip count is the number of remembered ids greater than its id. When the oldest
leaves, remembered ids at or below the new oldest's id stop counting and are dropped. Because
the oldest is promoted as soon as its count exceeds the threshold, the heap never holds more
than ``bypass_threshold + 1`` ids for long.

Pushed back out of order (an older id pushed again after a failed route), a request may be
charged with picks made before its push: the count can only be too high, which promotes the
oldest earlier, never later. The bound below holds for any push order, because every pick
that skips a queued q is remembered and counted for whichever request is then oldest.

Bound (checked by the property tests): while queued, no request is skipped more than
``bypass_threshold + 1`` times, counting from its latest push.
"""

from __future__ import annotations

import heapq

from sluice.policy.queues._queues import OldestFirst
from sluice.policy.types import QueueItem


class WorkloadAwareScheduler:
    """Largest same-model group first; a request skipped > ``bypass_threshold`` times goes next.

    Group order: most queued requests, then the group whose oldest request is oldest, then the
    lexically smallest model id; within a group, the oldest request. Invariants: no queued
    request is skipped more than ``bypass_threshold + 1`` times; one decision costs
    O(number of queued models + log n) amortized.
    """

    name: str = "workload_aware"

    def __init__(self, bypass_threshold: int = 8) -> None:
        if bypass_threshold < 0:
            raise ValueError(f"bypass_threshold must be >= 0, got {bypass_threshold}")
        self._bypass_threshold = bypass_threshold
        self._all = OldestFirst()
        self._groups: dict[str, OldestFirst] = {}
        self._newer_picks: list[int] = []
        """Min-heap of ids of picks newer than the oldest queued request when they were made."""

    @property
    def bypass_threshold(self) -> int:
        """Skips a request tolerates before it is promoted."""
        return self._bypass_threshold

    def oldest_skip_count(self) -> int:
        """How many times the oldest queued request has been skipped (0 when empty)."""
        oldest = self._all.oldest()
        if oldest is None:
            self._newer_picks.clear()
            return 0
        heap = self._newer_picks
        while heap and heap[0] <= oldest.request_id:
            heapq.heappop(heap)
        return len(heap)

    def push(self, item: QueueItem) -> None:
        """Queue ``item``; ``ValueError`` if its id is already queued."""
        self._all.push(item)
        group = self._groups.get(item.model_id)
        if group is None:
            group = self._groups[item.model_id] = OldestFirst()
        group.push(item)

    def pop(self, now: float) -> QueueItem | None:
        """Remove and return the next request (``now`` is not used)."""
        oldest = self._all.oldest()
        if oldest is None:
            return None
        if self.oldest_skip_count() > self._bypass_threshold:
            chosen = oldest
        else:
            chosen = self._head_of_largest_group()
        self._take(chosen)
        if chosen.request_id > oldest.request_id:
            heapq.heappush(self._newer_picks, chosen.request_id)
        return chosen

    def _head_of_largest_group(self) -> QueueItem:
        best: tuple[int, int, str] | None = None
        best_head: QueueItem | None = None
        for model_id, group in self._groups.items():
            head = group.oldest()
            assert head is not None  # empty groups are deleted by _take
            key = (-len(group), head.request_id, model_id)
            if best is None or key < best:
                best, best_head = key, head
        assert best_head is not None  # called only when something is queued
        return best_head

    def _take(self, item: QueueItem) -> None:
        self._all.remove(item.request_id)
        group = self._groups[item.model_id]
        group.remove(item.request_id)
        if not group:
            del self._groups[item.model_id]
        if not self._all:
            self._newer_picks.clear()

    def remove(self, request_id: int) -> QueueItem | None:
        """Remove a queued request; ``None`` if it is not queued."""
        item = self._all.get(request_id)
        if item is None:
            return None
        self._take(item)
        return item

    def __len__(self) -> int:
        return len(self._all)

    def __contains__(self, request_id: object) -> bool:
        return request_id in self._all

    def on_served(self, tenant_id: str, tokens: int) -> None:
        """No-op: workload_aware does not account for service."""
