"""``RuntimeConfig``: what the runtime is built from (``sluice.config`` makes it from the
TOML file)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from sluice.backends.base import ModelSpec
from sluice.backends.faults import FaultPlan
from sluice.engine.variants import GroupSpec
from sluice.policy.queues.control_core import QueueConfig
from sluice.policy.worker_config import WorkerConfig


@dataclass(frozen=True)
class RuntimeConfig:
    """Everything the runtime needs; built from the TOML config (see ``sluice.config``)."""

    models: tuple[ModelSpec, ...]
    workers: tuple[WorkerConfig, ...]
    queue: QueueConfig = field(default_factory=QueueConfig)
    """The queue's settings (the one object the simulator reads too)."""
    groups: tuple[GroupSpec, ...] = ()
    """Model groups whose requests the variant planner routes to a variant."""
    faults: Mapping[str, FaultPlan] = field(default_factory=dict)
    """Injected faults by model id (tests and the chaos bench only)."""
    trace_path: str | None = None
    """Record every submitted request's arrival here as JSONL (``sluice.engine.trace``,
    the simulator's trace format); ``None`` (default): no recording."""
    isolation: Literal["thread", "process"] = "thread"
    """Where each worker runs: a thread of this process (default) or a child process of
    its own (``sluice.engine.worker.process``)."""

    def __post_init__(self) -> None:
        if not self.workers:
            raise ValueError("workers: at least one worker is required")
        ids = [m.model_id for m in self.models]
        if len(set(ids)) != len(ids):
            raise ValueError(f"models: duplicate model ids in {ids}")
        if self.isolation not in ("thread", "process"):
            raise ValueError(f"workers.isolation must be thread or process, got "
                             f"{self.isolation!r}")
        for model_id, plan in self.faults.items():
            if plan.kill_mode != "raise" and self.isolation != "process":
                raise ValueError(f"faults of {model_id}: kill_mode {plan.kill_mode!r} ends a "
                                 f"process and needs isolation = 'process'")
        biggest = max(w.budget_bytes for w in self.workers)
        for m in self.models:
            if m.memory_bytes > biggest:
                raise ValueError(
                    f"models[{m.model_id!r}].memory_bytes ({m.memory_bytes}) exceeds every "
                    f"worker's budget (largest {biggest}): it could never be served"
                )
