"""Two ordered containers of queued items that the schedulers compose.

``OldestFirst`` orders by ``request_id``; ``UrgentFirst`` by (priority, deadline, request_id).
Both give O(1) membership and O(1) removal by request id (heap entries are deleted lazily).
"""

from __future__ import annotations

import heapq
import math
from collections import OrderedDict

from sluice.policy.types import QueueItem

# A heap holding more than this many stale entries per live one is rebuilt, so lazily deleted
# entries cost O(live) memory, not O(everything ever pushed).
_STALE_FACTOR = 2
_STALE_SLACK = 32


class OldestFirst:
    """Queued items, oldest (lowest ``request_id``) first.

    Invariants: a request id is held at most once; ``oldest()`` is the held item with the lowest
    request id. Pushing ids in increasing order (the normal case) costs O(1). An item pushed
    out of order (an older id pushed back, e.g. after a failed route) goes to a side heap and
    costs O(log n); it is still ordered correctly.
    """

    __slots__ = ("_high_id", "_in_order", "_late", "_late_heap")

    def __init__(self) -> None:
        self._in_order: OrderedDict[int, QueueItem] = OrderedDict()
        """Items whose ids increased in push order, so the first key is their minimum."""
        self._late: dict[int, QueueItem] = {}
        """Items pushed with an id below one already pushed."""
        self._late_heap: list[int] = []
        self._high_id: int | None = None
        """The highest id ever placed in ``_in_order``."""

    def __len__(self) -> int:
        return len(self._in_order) + len(self._late)

    def __contains__(self, request_id: object) -> bool:
        return request_id in self._in_order or request_id in self._late

    def get(self, request_id: int) -> QueueItem | None:
        """The held item with ``request_id``, or ``None``."""
        item = self._in_order.get(request_id)
        return item if item is not None else self._late.get(request_id)

    def push(self, item: QueueItem) -> None:
        """Add ``item``; ``ValueError`` if its request id is already held."""
        request_id = item.request_id
        if request_id in self:
            raise ValueError(f"request_id {request_id} is already queued")
        if self._high_id is None or request_id > self._high_id:
            self._in_order[request_id] = item
            self._high_id = request_id
        else:
            self._late[request_id] = item
            heapq.heappush(self._late_heap, request_id)

    def _late_min(self) -> int | None:
        heap = self._late_heap
        while heap and heap[0] not in self._late:
            heapq.heappop(heap)
        return heap[0] if heap else None

    def oldest(self) -> QueueItem | None:
        """The held item with the lowest request id, or ``None`` when empty."""
        first = next(iter(self._in_order), None)
        late = self._late_min()
        if late is not None and (first is None or late < first):
            return self._late[late]
        return None if first is None else self._in_order[first]

    def pop_oldest(self) -> QueueItem | None:
        """Remove and return ``oldest()``."""
        item = self.oldest()
        if item is not None:
            self.remove(item.request_id)
        return item

    def remove(self, request_id: int) -> QueueItem | None:
        """Remove and return the item with ``request_id``; ``None`` if not held."""
        item = self._in_order.pop(request_id, None)
        if item is not None:
            return item
        item = self._late.pop(request_id, None)
        if item is not None and len(self._late_heap) > (
            _STALE_FACTOR * len(self._late) + _STALE_SLACK
        ):
            self._late_heap = sorted(self._late)
        return item


def urgency_key(item: QueueItem) -> tuple[int, float, int]:
    """(priority, deadline with ``None`` as +inf, request_id): smaller is more urgent."""
    deadline_s = math.inf if item.deadline_s is None else item.deadline_s
    return (item.priority, deadline_s, item.request_id)


class UrgentFirst:
    """Queued items ordered by ``urgency_key``: priority, then deadline, then request id.

    Invariants: a request id is held at most once; ``pop()`` returns the held item with the
    smallest key. Push and pop cost O(log n) amortized; removal is O(1) (the heap entry is
    left behind and skipped later).
    """

    __slots__ = ("_heap", "_live", "_serial")

    def __init__(self) -> None:
        self._live: dict[int, tuple[int, QueueItem]] = {}
        """request id → (push serial, item); the serial tells a stale heap entry from a live one."""
        self._heap: list[tuple[int, float, int, int]] = []
        """(priority, deadline_s, request_id, push serial)."""
        self._serial = 0

    def __len__(self) -> int:
        return len(self._live)

    def __contains__(self, request_id: object) -> bool:
        return request_id in self._live

    def push(self, item: QueueItem) -> None:
        """Add ``item``; ``ValueError`` if its request id is already held."""
        if item.request_id in self._live:
            raise ValueError(f"request_id {item.request_id} is already queued")
        self._serial += 1
        self._live[item.request_id] = (self._serial, item)
        heapq.heappush(self._heap, (*urgency_key(item), self._serial))

    def _drop_stale(self) -> None:
        heap = self._heap
        while heap:
            _, _, request_id, serial = heap[0]
            live = self._live.get(request_id)
            if live is not None and live[0] == serial:
                return
            heapq.heappop(heap)

    def peek(self) -> QueueItem | None:
        """The most urgent held item, or ``None`` when empty."""
        self._drop_stale()
        return self._live[self._heap[0][2]][1] if self._heap else None

    def pop(self) -> QueueItem | None:
        """Remove and return ``peek()``."""
        self._drop_stale()
        if not self._heap:
            return None
        request_id = heapq.heappop(self._heap)[2]
        return self._live.pop(request_id)[1]

    def remove(self, request_id: int) -> QueueItem | None:
        """Remove and return the item with ``request_id``; ``None`` if not held."""
        live = self._live.pop(request_id, None)
        if live is None:
            return None
        if len(self._heap) > _STALE_FACTOR * len(self._live) + _STALE_SLACK:
            self._heap = [(*urgency_key(item), serial) for serial, item in self._live.values()]
            heapq.heapify(self._heap)
        return live[1]
