"""Schedulers: which queued request runs next. Each decision returns one request, not a batch.

``fifo`` and ``priority_edf`` live here; ``workload_aware`` and ``wfq`` have their own modules.
``make_scheduler`` builds any of them by name.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from sluice.policy.queues._queues import OldestFirst, UrgentFirst
from sluice.policy.queues.wfq import WfqScheduler, validate_tenant_weights
from sluice.policy.queues.workload_aware import WorkloadAwareScheduler
from sluice.policy.types import QueueItem

SCHEDULER_NAMES = ("fifo", "workload_aware", "priority_edf", "wfq")


class Scheduler(Protocol):
    """A queue of admitted requests and the rule that picks the next one.

    Invariants: every pushed request is returned by exactly one ``pop`` or ``remove`` (nothing
    lost, nothing duplicated); pushing a request id that is already queued raises
    ``ValueError``; ``pop`` returns ``None`` only when the queue is empty.
    """

    name: str

    def push(self, item: QueueItem) -> None:
        """Queue ``item``."""
        ...

    def pop(self, now: float) -> QueueItem | None:
        """Choose the next request, remove it and return it; ``None`` when empty."""
        ...

    def remove(self, request_id: int) -> QueueItem | None:
        """Take a queued request out (cancelled or expired); ``None`` if it is not queued."""
        ...

    def __len__(self) -> int: ...

    def __contains__(self, request_id: object) -> bool: ...

    def on_served(self, tenant_id: str, tokens: int) -> None:
        """Settle tokens actually served to ``tenant_id`` (a correction to the estimate)."""
        ...


class FifoScheduler:
    """Oldest request (lowest ``request_id``) first; O(1) per operation for in-order pushes."""

    name: str = "fifo"

    def __init__(self) -> None:
        self._queue = OldestFirst()

    def push(self, item: QueueItem) -> None:
        """Queue ``item``; ``ValueError`` if its id is already queued."""
        self._queue.push(item)

    def pop(self, now: float) -> QueueItem | None:
        """Remove and return the oldest request (``now`` is not used)."""
        return self._queue.pop_oldest()

    def remove(self, request_id: int) -> QueueItem | None:
        """Remove a queued request; ``None`` if it is not queued."""
        return self._queue.remove(request_id)

    def __len__(self) -> int:
        return len(self._queue)

    def __contains__(self, request_id: object) -> bool:
        return request_id in self._queue

    def on_served(self, tenant_id: str, tokens: int) -> None:
        """No-op: fifo does not account for service."""


class PriorityEdfScheduler:
    """Priority class first (0 most urgent), then earliest deadline (none = +inf), then oldest.

    O(log n) push and pop; removal is O(1) with the heap entry deleted lazily.
    """

    name: str = "priority_edf"

    def __init__(self) -> None:
        self._queue = UrgentFirst()

    def push(self, item: QueueItem) -> None:
        """Queue ``item``; ``ValueError`` if its id is already queued."""
        self._queue.push(item)

    def pop(self, now: float) -> QueueItem | None:
        """Remove and return the most urgent request (``now`` is not used: expiry is the
        caller's, through ``remove``)."""
        return self._queue.pop()

    def remove(self, request_id: int) -> QueueItem | None:
        """Remove a queued request; ``None`` if it is not queued."""
        return self._queue.remove(request_id)

    def __len__(self) -> int:
        return len(self._queue)

    def __contains__(self, request_id: object) -> bool:
        return request_id in self._queue

    def on_served(self, tenant_id: str, tokens: int) -> None:
        """No-op: priority_edf does not account for service."""


def make_scheduler(
    name: str,
    *,
    bypass_threshold: int = 8,
    tenant_weights: Mapping[str, float] | None = None,
) -> Scheduler:
    """Build the scheduler called ``name`` (one of ``SCHEDULER_NAMES``).

    ``bypass_threshold`` (workload_aware) must be >= 0 and ``tenant_weights`` (wfq) > 0; both
    are validated whatever the name, so a bad configuration fails however it is used.
    Raises ``ValueError`` naming the bad field and value.
    """
    if isinstance(bypass_threshold, bool) or not isinstance(bypass_threshold, int):
        raise ValueError(f"bypass_threshold must be an int, got {bypass_threshold!r}")
    if bypass_threshold < 0:
        raise ValueError(f"bypass_threshold must be >= 0, got {bypass_threshold}")
    weights = validate_tenant_weights(tenant_weights)
    if name == "fifo":
        return FifoScheduler()
    if name == "workload_aware":
        return WorkloadAwareScheduler(bypass_threshold=bypass_threshold)
    if name == "priority_edf":
        return PriorityEdfScheduler()
    if name == "wfq":
        return WfqScheduler(tenant_weights=weights)
    raise ValueError(f"scheduler name must be one of {SCHEDULER_NAMES}, got {name!r}")
