"""What a worker publishes of itself: its ``Heartbeat``, the
``WorkerFault`` its thread died of, and ``WorkerState`` snapshots (one ``ModelState`` per
resident model) that go to the control plane in ``State`` messages."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from sluice.backends.base import ModelSpec
from sluice.engine.continuous import SlotState
from sluice.engine.speculation import SpeculationState
from sluice.engine.step_times import StepBucket
from sluice.policy.capacity.keep_alive import KeepAlive, configured_keep_alive
from sluice.policy.step.prompt_cache import PromptCacheState
from sluice.policy.step.step_cost import StepCost
from sluice.policy.step.tpot_margin import MarginState
from sluice.policy.step.width import WidthPlan

IDLE_POLL_S = 0.5
"""Longest sleep of an idle worker (it is woken at once by new work)."""


@dataclass(frozen=True, slots=True)
class Heartbeat:
    """The worker thread's last sign of progress: at ``stamp_s`` it began ``activity``,
    which may take ``allowance_s`` before the next stamp is due."""

    stamp_s: float
    allowance_s: float
    activity: str

    def overdue_s(self, now: float) -> float:
        """Seconds past the allowance (negative while it is still due)."""
        return now - self.stamp_s - self.allowance_s


@dataclass(frozen=True, slots=True)
class WorkerFault:
    """Why a worker's thread ended unexpectedly: ``cause`` for clients and metrics (no
    exception text: it may name files), ``detail`` (the traceback) for the log."""

    cause: str
    detail: str
    time_s: float


@dataclass(frozen=True)
class ModelState:
    """A resident model as the status page shows it."""

    model_id: str
    memory_bytes: int
    in_use: int
    use_count: int
    kv_free_blocks: int | None = None
    kv_total_blocks: int | None = None
    running: int = 0
    waiting: int = 0
    prefix_hit_tokens: int = 0
    """Prompt tokens whose KV was copied from a running sequence instead of computed
    (cumulative for this load of the model)."""
    step_cost: StepCost | None = None
    """Generative: the step-time model its engine learned from the steps it ran (what
    ``sluice simulate`` needs as the model's cost under this load), or its prior."""
    step_samples: int = 0
    """Generative: the recent steps its engine keeps to fit ``step_cost`` on (until there
    are enough, ``step_cost`` is the prior)."""
    tpot_margin: MarginState | None = None
    """Generative: the share of its TPOT target a planned step may take, learned from the
    measured cycles against ``step_cost``'s predictions (``sluice.policy.step.tpot_margin``)."""
    width: WidthPlan | None = None
    """Generative: its engine's last decision of how many sequences decode at once with
    requests waiting, and why (``sluice.policy.step.width``: the TPOT target's width, or
    widened for the line's first-token targets)."""
    step_times: Mapping[str, StepBucket] = field(default_factory=dict)
    """Generative: every step its engine ran since the model loaded, by decodes and
    whether it fed a prompt (``sluice.engine.step_times``): the measured table beside the
    learned line, which a simulator's cost file takes as two snapshots' difference."""
    speculation: SpeculationState | None = None
    """Generative: its engine's drafted and accepted tokens since the model loaded, and
    its last verifying step's (``sluice.engine.speculation``)."""
    prompt_cache: PromptCacheState | None = None
    """Generative: its engine's prompt cache in host memory (``sluice.policy.step.
    prompt_cache``); None when it keeps none."""
    loaded_at_s: float = 0.0
    """When it finished loading (the runtime's clock)."""
    keep_alive: str = "until evicted"
    """``pinned``, ``until evicted`` or its idle time (``300s``): ``KeepAlive.describe``."""
    keep_alive_idle_s: float | None = None
    """Its keep-alive's idle time (``None``: pinned or until evicted)."""
    expires_at_s: float | None = None
    """When it unloads if no request comes first (the runtime's clock); ``None`` while in
    use, pinned, or kept until evicted."""
    slots: tuple[SlotState, ...] = ()
    """Generative: its engine's sequence slots (llama-server's ``/slots``)."""


@dataclass(frozen=True)
class WorkerState:
    """An immutable snapshot published by the worker thread after every loop."""

    worker_id: int
    budget_bytes: int
    resident_bytes: int = 0
    evictable_bytes: int = 0
    active_count: int = 0
    engine_waiting: int = 0
    models: tuple[ModelState, ...] = ()
    failed_models: Mapping[str, str] = field(default_factory=dict)
    last_batch_size: int = 0

    @property
    def resident(self) -> frozenset[str]:
        return frozenset(m.model_id for m in self.models)


Readiness = Literal["ready", "wait", "failed"]


def spec_keep_alive(spec: ModelSpec) -> KeepAlive:
    """A model's keep-alive from its configuration."""
    return configured_keep_alive(spec.keep_alive_s, spec.pinned)
