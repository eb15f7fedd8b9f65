"""Plain data shared by the policies: what a queued request and a worker look like to them."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class QueueItem:
    """A queued request as the schedulers see it.

    Invariant: ``request_id`` values are unique and increase in submission order, so
    they double as the arrival tie-breaker.
    """

    request_id: int
    """Unique, monotonically increasing in submission order."""
    model_id: str
    """The model (or model group) the request names."""
    arrival_s: float
    """When the request was admitted (seconds, same clock as ``now``)."""
    tenant_id: str = "default"
    """Who sent it (for fair queueing)."""
    priority: int = 5
    """Priority class: 0 is the most urgent, 9 the least."""
    deadline_s: float | None = None
    """Absolute deadline on the same clock, or ``None`` for none."""
    cost_tokens: int = 1
    """Estimated tokens the request will consume (prompt + generated), for fairness."""


@dataclass(frozen=True, slots=True)
class WorkerView:
    """A snapshot of one worker as the router sees it."""

    worker_id: int
    queue_depth: int
    """Requests routed to the worker and not yet running (its inbox)."""
    active_count: int
    """Requests the worker is running now (batch members, decoding sequences)."""
    inbox_free: int
    """How many more requests its inbox can take now (0 = full)."""
    budget_bytes: int
    """The worker's model-memory budget."""
    free_bytes: int
    """Budget not used by resident models."""
    resident: frozenset[str]
    """Model ids resident (loaded) on the worker."""
    evictable_bytes: int
    """Bytes of resident models that are not in use and could be evicted now."""

    @property
    def load(self) -> int:
        """The load the routers compare: ``queue_depth + active_count``."""
        return self.queue_depth + self.active_count
