"""Weighted fair queueing across tenants by tokens served (virtual token counters).

After Sheng et al., "Fairness in Serving Large Language Models" (OSDI '24): each tenant has
a counter of weighted tokens served; the next request comes from the backlogged tenant with
the lowest counter. A tenant that returns from idle is lifted to the lowest counter among the
backlogged tenants (or, when none is backlogged, to the counter of the tenant that left the
backlog last), so idle time does not bank credit.

Fairness bound. Let a set of tenants stay backlogged with counters that start within a band
of width U = max(cost / w) (true when they become backlogged together). A pop adds at most U
to a counter at the minimum, so the counters stay within U of the minimum. Over a window of N
decisions, each counter then moves by the minimum's movement +- U, and with equal costs c and
total weight W, tenant i's share of served tokens differs from w_i / W by at most
2 * w_i * (W - w_i) / (W * w_min * N): for weights 3:1 and N = 200 that is 0.75 %.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from sluice.policy.queues._queues import UrgentFirst
from sluice.policy.types import QueueItem

IDLE_SLACK = 64
"""Idle tenants' counters tolerated (beyond the backlogged ones) before a purge."""
MAX_IDLE_TENANTS = 4096
"""Idle tenants' counters kept at most; past it the lowest go first (see ``WfqScheduler``)."""


def validate_tenant_weights(weights: Mapping[str, float] | None) -> dict[str, float]:
    """A copy of ``weights`` (``{}`` for ``None``); ``ValueError`` naming a tenant whose
    weight is not a finite number > 0."""
    checked: dict[str, float] = {}
    for tenant_id, weight in (weights or {}).items():
        if not isinstance(weight, int | float) or not math.isfinite(weight) or weight <= 0:
            raise ValueError(f"tenant_weights[{tenant_id!r}] must be a finite number > 0, "
                             f"got {weight!r}")
        checked[tenant_id] = float(weight)
    return checked


class WfqScheduler:
    """Virtual-token-counter fair queueing; within a tenant, priority, deadline, then oldest.

    Invariants: the pick comes from the backlogged tenant with the lowest counter (ties: the
    lexically smallest tenant id); a pop adds ``cost_tokens / weight`` to that tenant's
    counter and ``on_served`` adds ``tokens / weight`` (negative to settle an over-estimate);
    a tenant becoming backlogged never starts below the lowest backlogged counter. Unknown
    tenants weigh 1.0. A decision costs O(backlogged tenants + log n).

    State is bounded by the backlogged tenants, not by every tenant ever seen (an open
    server takes any ``X-Tenant-ID``): an idle tenant's counter at or below the lift floor
    (the lowest backlogged counter, else the last tenant to leave) says nothing the lift
    would not, so it is dropped; and past ``MAX_IDLE_TENANTS`` idle counters the lowest are
    dropped too (such a tenant returns at the floor: a credit of at most its lead).
    """

    name: str = "wfq"

    def __init__(self, tenant_weights: Mapping[str, float] | None = None) -> None:
        self._weights = validate_tenant_weights(tenant_weights)
        self._counters: dict[str, float] = {}
        self._queues: dict[str, UrgentFirst] = {}
        """Backlogged tenants only: a tenant whose queue empties is removed."""
        self._tenant_of: dict[int, str] = {}
        self._last_left: str | None = None
        """The tenant that most recently stopped being backlogged."""
        self._purge_at = IDLE_SLACK
        """Idle counters that trigger the next purge (doubles with what a purge keeps)."""

    def weight(self, tenant_id: str) -> float:
        """The tenant's weight (1.0 if not configured)."""
        return self._weights.get(tenant_id, 1.0)

    def counter(self, tenant_id: str) -> float:
        """The tenant's virtual token counter (0.0 if never seen)."""
        return self._counters.get(tenant_id, 0.0)

    def backlogged(self) -> list[str]:
        """Tenants with queued requests, sorted."""
        return sorted(self._queues)

    def push(self, item: QueueItem) -> None:
        """Queue ``item``; ``ValueError`` if its id is already queued."""
        if item.request_id in self._tenant_of:
            raise ValueError(f"request_id {item.request_id} is already queued")
        tenant_id = item.tenant_id
        queue = self._queues.get(tenant_id)
        if queue is None:
            self._lift(tenant_id)
            queue = self._queues[tenant_id] = UrgentFirst()
        queue.push(item)
        self._tenant_of[item.request_id] = tenant_id

    def _lift(self, tenant_id: str) -> None:
        counter = self._counters.get(tenant_id, 0.0)
        if self._queues:
            counter = max(counter, min(self._counters[t] for t in self._queues))
        elif self._last_left is not None:
            counter = max(counter, self._counters[self._last_left])
        self._counters[tenant_id] = counter

    def pop(self, now: float) -> QueueItem | None:
        """Remove and return the next request (``now`` is not used)."""
        if not self._queues:
            return None
        tenant_id = min(self._queues, key=lambda t: (self._counters[t], t))
        item = self._queues[tenant_id].pop()
        assert item is not None  # a backlogged tenant's queue is never empty
        self._forget(item)
        self._counters[tenant_id] += item.cost_tokens / self.weight(tenant_id)
        return item

    def remove(self, request_id: int) -> QueueItem | None:
        """Remove a queued request (no tokens are charged); ``None`` if it is not queued."""
        tenant_id = self._tenant_of.get(request_id)
        if tenant_id is None:
            return None
        item = self._queues[tenant_id].remove(request_id)
        assert item is not None  # _tenant_of and the queues agree
        self._forget(item)
        return item

    def _forget(self, item: QueueItem) -> None:
        del self._tenant_of[item.request_id]
        if not self._queues[item.tenant_id]:
            del self._queues[item.tenant_id]
            self._last_left = item.tenant_id
            self._purge_idle()

    def _purge_idle(self) -> None:
        """Drop idle counters the lift makes redundant, then the lowest past the cap;
        amortised O(1) per call (the next purge waits for twice what this one kept)."""
        if len(self._counters) - len(self._queues) <= self._purge_at:
            return
        if self._queues:
            floor = min(self._counters[t] for t in self._queues)
        else:
            floor = self._counters[self._last_left] if self._last_left is not None else 0.0
        kept = {t: c for t, c in self._counters.items()
                if c > floor or t in self._queues or t == self._last_left}
        idle = sorted((c, t) for t, c in kept.items()
                      if t not in self._queues and t != self._last_left)
        for _, tenant_id in idle[: max(0, len(idle) - MAX_IDLE_TENANTS)]:
            del kept[tenant_id]
        self._counters = kept
        self._purge_at = max(IDLE_SLACK, 2 * (len(kept) - len(self._queues)))

    def tenants_tracked(self) -> int:
        """Tenants with state here (backlogged or idle with a counter)."""
        return len(self._counters)

    def __len__(self) -> int:
        return len(self._tenant_of)

    def __contains__(self, request_id: object) -> bool:
        return request_id in self._tenant_of

    def on_served(self, tenant_id: str, tokens: int) -> None:
        """Charge ``tokens`` (may be negative) more to ``tenant_id``'s counter."""
        self._counters[tenant_id] = self.counter(tenant_id) + tokens / self.weight(tenant_id)
        if tenant_id not in self._queues:
            self._purge_idle()
