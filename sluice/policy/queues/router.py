"""Routers: which worker gets a request that the scheduler picked.

A worker is *feasible* for a model when the model is resident there or its memory budget could
ever hold the model; it is *available* when it is feasible and its inbox has room. Routers
choose among available workers and say why nothing fits otherwise.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from sluice.policy.types import WorkerView

ROUTER_NAMES = ("round_robin", "least_loaded", "residency_aware")

TIER_RESIDENT = 0
TIER_FITS_FREE = 1
TIER_NEEDS_EVICTION = 2
TIER_WORDS = {
    TIER_RESIDENT: "resident",
    TIER_FITS_FREE: "fits free memory",
    TIER_NEEDS_EVICTION: "needs eviction",
}
"""How a reason names each residency tier."""


class HoldsModels(Protocol):
    """What residency tiers read: a worker, or a whole replica (its workers pooled)."""

    @property
    def resident(self) -> frozenset[str]: ...

    @property
    def free_bytes(self) -> int: ...


@dataclass(frozen=True, slots=True)
class RouteDecision:
    """The worker chosen for a request, and why."""

    worker_id: int
    tier: int | None
    """Residency tier for ``residency_aware`` (0 resident, 1 fits free, 2 needs eviction);
    ``None`` for the other routers."""
    reason: str
    """Human-readable, e.g. ``"resident, load 3"``."""


@dataclass(frozen=True, slots=True)
class NoRoute:
    """Why no worker was chosen."""

    reason: str
    """``"no_feasible_worker"``: no worker can ever hold the model; ``"all_busy"``: feasible
    workers exist but every inbox is full (retry later)."""


class Router(Protocol):
    """Chooses a worker for one request.

    Invariants: a ``RouteDecision`` names an available worker (feasible, ``inbox_free > 0``);
    ``NoRoute("no_feasible_worker")`` only when no worker is feasible, ``NoRoute("all_busy")``
    only when some are but none is available.
    """

    name: str

    def route(
        self, model_id: str, model_bytes: int, workers: Sequence[WorkerView]
    ) -> RouteDecision | NoRoute:
        """Choose a worker for a request for ``model_id`` (``model_bytes`` to hold)."""
        ...


def is_feasible(worker: WorkerView, model_id: str, model_bytes: int) -> bool:
    """Whether ``worker`` could ever serve the model: resident, or within its budget."""
    return model_id in worker.resident or worker.budget_bytes >= model_bytes


def residency_tier(worker: HoldsModels, model_id: str, model_bytes: int) -> int:
    """0 if the model is resident, 1 if it fits the worker's free bytes, 2 if loading it needs
    eviction (also when evictable bytes do not suffice yet: models in use will be released)."""
    if model_id in worker.resident:
        return TIER_RESIDENT
    if worker.free_bytes >= model_bytes:
        return TIER_FITS_FREE
    return TIER_NEEDS_EVICTION


def available_workers(
    model_id: str, model_bytes: int, workers: Sequence[WorkerView]
) -> list[WorkerView] | NoRoute:
    """The available workers, or the ``NoRoute`` that explains why there are none."""
    if model_bytes < 0:
        raise ValueError(f"model_bytes must be >= 0, got {model_bytes}")
    feasible = [w for w in workers if is_feasible(w, model_id, model_bytes)]
    if not feasible:
        return NoRoute("no_feasible_worker")
    available = [w for w in feasible if w.inbox_free > 0]
    return available if available else NoRoute("all_busy")


class RoundRobinRouter:
    """Cycles through available workers in worker-id order, starting after the last chosen.

    Deterministic: the cursor is the last chosen worker id, so a worker joining or leaving the
    list does not reset the rotation.
    """

    name: str = "round_robin"

    def __init__(self) -> None:
        self._last_worker_id: int | None = None

    def route(
        self, model_id: str, model_bytes: int, workers: Sequence[WorkerView]
    ) -> RouteDecision | NoRoute:
        """The first available worker with an id above the cursor, wrapping around."""
        available = available_workers(model_id, model_bytes, workers)
        if isinstance(available, NoRoute):
            return available
        ordered = sorted(available, key=lambda w: w.worker_id)
        last = self._last_worker_id
        chosen = next((w for w in ordered if last is None or w.worker_id > last), ordered[0])
        self._last_worker_id = chosen.worker_id
        return RouteDecision(chosen.worker_id, None, f"round robin, load {chosen.load}")


class LeastLoadedRouter:
    """The available worker with the lowest (load, worker id)."""

    name: str = "least_loaded"

    def route(
        self, model_id: str, model_bytes: int, workers: Sequence[WorkerView]
    ) -> RouteDecision | NoRoute:
        """Minimise ``queue_depth + active_count``; ties go to the lower worker id."""
        available = available_workers(model_id, model_bytes, workers)
        if isinstance(available, NoRoute):
            return available
        chosen = min(available, key=lambda w: (w.load, w.worker_id))
        return RouteDecision(chosen.worker_id, None, f"least loaded, load {chosen.load}")


class ResidencyAwareRouter:
    """The available worker with the lowest (residency tier, load, worker id).

    Sending a request where its model is already resident avoids a load; where it fits free
    memory, a load without evicting anyone else's model.
    """

    name: str = "residency_aware"

    def route(
        self, model_id: str, model_bytes: int, workers: Sequence[WorkerView]
    ) -> RouteDecision | NoRoute:
        """Minimise (tier, load, worker id); the decision carries the tier."""
        available = available_workers(model_id, model_bytes, workers)
        if isinstance(available, NoRoute):
            return available
        tier, load, worker_id = min(
            (residency_tier(w, model_id, model_bytes), w.load, w.worker_id) for w in available
        )
        return RouteDecision(worker_id, tier, f"{TIER_WORDS[tier]}, load {load}")


def make_router(name: str) -> Router:
    """Build the router called ``name`` (one of ``ROUTER_NAMES``); ``ValueError`` otherwise."""
    if name == "round_robin":
        return RoundRobinRouter()
    if name == "least_loaded":
        return LeastLoadedRouter()
    if name == "residency_aware":
        return ResidencyAwareRouter()
    raise ValueError(f"router name must be one of {ROUTER_NAMES}, got {name!r}")
