"""The control plane's queue core: admission, the scheduler, dispatch, the re-planning of
queued requests and fair-share settlement, decided and applied in one place. Both the
server's runtime (``sluice.engine.runtime``: real threads, real clock, under its lock)
and the simulator's replica (``sluice.sim.replica``: the virtual clock) drive one
``ControlCore``; each keeps only what is its own: its request objects, its workers and
how a terminal state reaches a client.

Pure: no clock (time is an argument), no threads, no locks.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from sluice.policy.queues.admission import AdmissionConfig, AdmissionPolicy, Rejection
from sluice.policy.queues.dispatch import Dispatch, Dispatcher
from sluice.policy.queues.rates import RateMeter
from sluice.policy.queues.router import make_router
from sluice.policy.queues.scheduler import make_scheduler
from sluice.policy.types import QueueItem

COMPLETIONS_WINDOW_S = 10.0
"""The completion rate that admission weighs a deadline against is counted over this."""


@dataclass(frozen=True)
class QueueConfig:
    """What the core is built from: the queue's settings. ``Config.runtime_config()`` makes
    one from the file's ``[scheduling]`` and tenants' weights; the runtime
    (``RuntimeConfig.queue``) and the simulator (``SimConfig.queue``) hold that one object,
    so neither declares or copies these fields."""

    scheduler: str = "fifo"
    """``fifo``, ``workload_aware``, ``priority_edf`` or ``wfq``."""
    bypass_threshold: int = 8
    router: str = "residency_aware"
    """``round_robin``, ``least_loaded`` or ``residency_aware``."""
    queue_capacity: int = 64
    """Requests queued at once (admitted, not yet in a worker's inbox)."""
    tenant_weights: Mapping[str, float] = field(default_factory=dict)
    """Fair-share weight by tenant (``wfq``)."""

    def __post_init__(self) -> None:
        if self.queue_capacity < 1:
            raise ValueError(f"queue_capacity must be >= 1, got {self.queue_capacity}")


def queue_cost(generative: bool, prompt_tokens: int, max_tokens: int) -> int:
    """What a request's pop charges its tenant's fair share: a generative request's prompt
    plus its token budget, a one-shot request 1."""
    return prompt_tokens + max_tokens if generative else 1


def served_tokens(generative: bool, started: bool, prompt_tokens: int,
                  completion_tokens: int) -> int:
    """What a finished request was really served: none if it never ran; else its prompt
    and generated tokens (generative) or 1 (one-shot)."""
    if not started:
        return 0
    return prompt_tokens + completion_tokens if generative else 1


@dataclass(frozen=True, slots=True)
class Replan:
    """One applied re-plan of a queued group request."""

    request_id: int
    variant: str | None
    """The faster variant it moved to; ``None``: none meets its deadline (reject it
    ``deadline_infeasible``)."""
    in_inbox: bool
    """It waits in a worker's inbox, not the scheduler: the caller moves (or withdraws)
    it there. A move in the scheduler is already made (keeping its place)."""


class ControlCore:
    """Admission, the scheduler, the dispatcher, the completion rate and the fair-share
    charges of dispatched requests."""

    def __init__(self, config: QueueConfig) -> None:
        self.admission = AdmissionPolicy(AdmissionConfig(queue_capacity=config.queue_capacity))
        self.scheduler = make_scheduler(config.scheduler,
                                        bypass_threshold=config.bypass_threshold,
                                        tenant_weights=config.tenant_weights)
        self.dispatcher = Dispatcher(self.scheduler, make_router(config.router))
        self.completions = RateMeter(window_s=COMPLETIONS_WINDOW_S)
        self.charged: dict[int, int] = {}
        """Dispatched requests → the tokens their pop charged to their tenant's share."""
        self.settlements: list[tuple[int, str, int, int]] | None = None
        """When a list: every settlement of a dispatched request, as ``(request_id,
        tenant, charged, served)``, so a simulator run and a server run can be compared."""

    def admission_check(self, now: float, deadline_s: float | None,
                        draining: bool = False) -> Rejection | None:
        """The queue's bound, draining and a deadline against the completion rate."""
        return self.admission.decide(
            queue_depth=len(self.scheduler),
            completions_per_s=self.completions.rate_per_s(now),
            now=now, deadline_s=deadline_s, draining=draining)

    def enqueue(self, item: QueueItem) -> None:
        self.scheduler.push(item)

    def dispatched(self, d: Dispatch) -> None:
        """``d``'s request was offered to its worker: its pop's charge stands until it is
        settled."""
        self.charged[d.item.request_id] = d.item.cost_tokens

    def settle(self, request_id: int, tenant_id: str, served: int, completed: bool,
               now: float) -> int:
        """A request ended: correct its tenant's fair-share charge to the ``served`` tokens
        (if it was dispatched) and count a completion. Returns the correction made."""
        if completed:
            self.completions.record(now)
        charged = self.charged.pop(request_id, None)
        if charged is None:
            return 0
        if self.settlements is not None:
            self.settlements.append((request_id, tenant_id, charged, served))
        if served == charged:
            return 0
        self.scheduler.on_served(tenant_id, served - charged)
        return served - charged

    def replan(self, moves: Iterable[tuple[int, str | None]],
               in_inbox: Callable[[int], bool]) -> list[Replan]:
        """Apply the variant tracker's re-plan (``VariantTracker.replan``) to the queue: a
        request still in the scheduler moves there (keeping its place) or leaves it; one
        in a worker's inbox (``in_inbox``) is returned for the caller to move there; one
        in neither (started, or ended meanwhile) is left alone. The caller tells its
        tracker of every move (``VariantTracker.moved``) and rejects every ``None``."""
        out = []
        for request_id, variant in moves:
            item = self.scheduler.remove(request_id)
            if item is None and not in_inbox(request_id):
                continue
            if item is not None and variant is not None:
                self.scheduler.push(dataclasses.replace(item, model_id=variant))
            out.append(Replan(request_id, variant, item is None))
        return out
