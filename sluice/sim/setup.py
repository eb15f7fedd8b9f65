"""What a simulation runs: the fleet's shape and every model's cost, as plain frozen data.

``SimConfig.from_config`` reads the same TOML configuration ``sluice serve`` does (the
parsed ``sluice.config.Config``, taken by its attributes so this layer imports nothing
above ``policy/``), plus cost files (``sluice.sim.costs``); overrides for replicas,
workers, scheduler and batch size are ``dataclasses.replace`` on the result (the
scheduler, router and queue capacity on its ``queue``, the runtime's own ``QueueConfig``;
a worker's limits on its ``worker``, the runtime's own ``WorkerConfig``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from sluice.policy.capacity.keep_alive import STAY, KeepAlive, configured_keep_alive
from sluice.policy.capacity.quota import QuotaLimits
from sluice.policy.queues.control_core import QueueConfig
from sluice.policy.variants.variant_tracker import GroupPlan
from sluice.policy.worker_config import WorkerConfig
from sluice.sim.costs import ModelCost, model_cost
from sluice.sim.engine import SimDrafting


@dataclass(frozen=True)
class SimModel:
    """One servable model and its cost."""

    model_id: str
    kind: str
    """``oneshot`` or ``generative``."""
    memory_bytes: int
    load_cost_s: float
    """The residency policy's idea of the load cost (cost-aware eviction)."""
    cost: ModelCost
    accuracy: float = 0.0
    n_seq_max: int = 8
    """Generative: sequence slots of one loaded model."""
    n_ctx_total: int = 4096
    """Generative: KV positions of one loaded model (split evenly among the slots)."""
    tpot_target_s: float | None = None
    """Generative: the TPOT target its engine's step budget keeps to (``TpotBudget``)."""
    ttft_deadline_s: float | None = None
    """Generative: the default first-token deadline, seconds after arrival."""
    ttft_target_s: float | None = None
    """Generative: the default first-token target (soft), seconds after arrival."""
    keep_alive: KeepAlive = STAY
    """How long it stays loaded once idle (the server's ``keep_alive`` / ``pinned``)."""
    drafting: SimDrafting | None = None
    """Generative: n-gram speculation at the acceptance the served engine measured (a cost
    entry's ``draft_acceptance``, for a model whose ``speculation`` is ``auto``); None:
    its engine does not draft."""


@dataclass(frozen=True)
class SimGroup(GroupPlan):
    """A model group whose requests the variant planner routes to a variant (the server's
    ``GroupPlan``, with the arrivals a simulation starts from)."""

    arrivals: Mapping[str, Any] | None = None
    """A live server's arrival meter for the group (``/status.json``:
    ``groups.<id>.arrivals``, ``RateMeter.state``), taken at the simulation's time 0:
    the planner then reads the traffic that went before (a previous load, its tail), as
    the server's does, instead of starting from none."""


@dataclass(frozen=True)
class SimConfig:
    """A fleet: ``replicas`` identical replicas of ``workers`` workers each."""

    models: Mapping[str, SimModel]
    groups: tuple[SimGroup, ...] = ()
    replicas: int = 1
    workers: int = 1
    """Workers per replica."""
    worker: WorkerConfig = field(
        default_factory=lambda: WorkerConfig(worker_id=0, budget_bytes=2_000_000_000))
    """What every simulated worker runs (its memory budget, inbox, eviction, one-shot
    batching and engine settings): ``from_config`` takes the runtime's own object
    (``RuntimeConfig.workers[0]``); its ``worker_id`` and watchdogs are the runtime's
    alone (simulated workers are numbered by their replica, and never stall)."""
    queue: QueueConfig = field(default_factory=QueueConfig)
    """The queue's settings: ``from_config`` takes the runtime's own object
    (``RuntimeConfig.queue``), so the replica's ``ControlCore`` is built from what the
    server's is."""
    tenant_limits: Mapping[str, QuotaLimits] = field(default_factory=dict)
    """Tenant quotas, shared by every replica (one store: Redis modelled as exact)."""
    replica_router: str = "least_loaded"
    """Across replicas: ``round_robin``, ``least_loaded`` or ``affinity``."""
    replica_capacity: int | None = None
    """Requests one replica holds at once; ``None``: queue capacity + inboxes."""
    preload: tuple[str, ...] = ()
    """Models resident on every replica's first worker before the first arrival (the
    server loads its default model at start-up, before it is ready)."""

    def __post_init__(self) -> None:
        for name in ("replicas", "workers"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        for m in self.preload:
            if m not in self.models:
                raise ValueError(f"preload: unknown model {m!r}")
        for g in self.groups:
            missing = [v for v in g.variants if v not in self.models]
            if missing:
                raise ValueError(f"groups[{g.group_id!r}]: unknown variants {missing}")

    def with_arrivals(self, groups: Mapping[str, Any]) -> SimConfig:
        """This config with each group's arrival meter taken from a live server's
        ``/status.json`` ``groups`` (``SimGroup.arrivals``); groups it lacks keep theirs."""
        return replace(self, groups=tuple(
            replace(g, arrivals=groups[g.group_id]["arrivals"])
            if "arrivals" in groups.get(g.group_id, {}) else g for g in self.groups))

    @property
    def capacity_per_replica(self) -> int:
        if self.replica_capacity is not None:
            return self.replica_capacity
        return self.queue.queue_capacity + self.workers * self.worker.inbox_capacity

    @classmethod
    def from_config(cls, config: Any, costs: Mapping[str, Mapping[str, Any]] | None = None,
                    base_dir: Path | None = None) -> SimConfig:
        """From a parsed ``sluice.config.Config`` and optional cost entries."""
        rc = config.runtime_config()
        models = {}
        for spec in rc.models:
            opts = dict(spec.options)
            n_seq = int(opts.get("n_seq_max", 8))
            if spec.backend == "synthetic":
                n_ctx = int(opts.get("n_ctx_per_seq", 512)) * n_seq
            else:
                n_ctx = int(opts.get("n_ctx", 4096))
            models[spec.model_id] = SimModel(
                model_id=spec.model_id, kind=spec.kind, memory_bytes=spec.memory_bytes,
                load_cost_s=spec.load_cost_s,
                cost=model_cost(spec.model_id, spec.kind, spec.backend, opts, spec.load_cost_s,
                                costs, base_dir),
                accuracy=float(opts.get("accuracy", 0.0)), n_seq_max=n_seq, n_ctx_total=n_ctx,
                tpot_target_s=spec.tpot_target_s, ttft_deadline_s=spec.ttft_deadline_s,
                ttft_target_s=spec.ttft_target_s,
                keep_alive=configured_keep_alive(spec.keep_alive_s, spec.pinned),
                drafting=_drafting(spec, (costs or {}).get(spec.model_id, {})))
        return cls(
            models=models,
            groups=tuple(SimGroup(g.group_id, tuple(g.variants), g.planner,
                                  g.default_deadline_s) for g in rc.groups),
            replicas=1,
            workers=len(rc.workers),
            worker=rc.workers[0],
            queue=rc.queue,
            tenant_limits={t.id: t.limits.quota_limits() for t in config.tenants
                           if not t.limits.quota_limits().unlimited},
            replica_router="affinity" if config.cluster.router == "affinity"
            else config.cluster.router,
            replica_capacity=config.cluster.max_ongoing_requests,
            preload=(config.default_model,),
        )


def _drafting(spec: Any, entry: Mapping[str, Any]) -> SimDrafting | None:
    """A generative model's speculation in the simulator: its ``speculation`` setting and
    the acceptance its cost entry measured (``draft_acceptance``), else none."""
    acceptance = entry.get("draft_acceptance")
    if spec.kind != "generative" or spec.speculation != "auto" or acceptance is None:
        return None
    return SimDrafting(float(acceptance), spec.draft_max_tokens)
