"""``WorkerConfig``: one worker's limits, as plain frozen data.

``Config.runtime_config()`` makes one per worker from the file's ``[workers]``,
``[batching]`` and ``[engine]``; the runtime (``RuntimeConfig.workers``) runs a worker on
each, and the simulator (``SimConfig.worker``) runs every simulated worker on the first,
so neither declares or copies these fields.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sluice.policy.step.step_data import EngineConfig


@dataclass(frozen=True)
class WorkerConfig:
    """One worker's limits."""

    worker_id: int
    budget_bytes: int
    """Model memory budget (estimated bytes)."""
    inbox_capacity: int = 8
    """Requests routed here and not yet running, at most."""
    eviction: str = "lru"
    """``lru`` or ``cost_aware``."""
    max_batch_size: int = 8
    """One-shot dynamic batches: members at most."""
    max_wait_s: float = 0.005
    """One-shot dynamic batches: how long the head waits for company."""
    engine: EngineConfig = field(default_factory=EngineConfig)
    watchdog_s: float = 30.0
    """A worker holding work that shows no progress for this long (one step, one batch)
    is declared dead and replaced."""
    load_watchdog_s: float = 600.0
    """The same allowance while it loads a model, runs a freshly loaded model's first
    step, or runs an admin call."""

    def __post_init__(self) -> None:
        for name in ("inbox_capacity", "max_batch_size"):
            value = getattr(self, name)
            if value < 1:
                raise ValueError(f"{name} must be >= 1, got {value}")
        for name in ("watchdog_s", "load_watchdog_s"):
            value = getattr(self, name)
            if not value > 0:
                raise ValueError(f"{name} must be > 0, got {value}")
