"""Model groups on the engine side: measure what the variant planner needs (the group's
arrival rate, requests in the system per variant, batch service times as batches
complete) and apply its choice to a request before admission.

The decision itself is ``sluice.policy.planner.choose_variant`` (pure); this module owns
the measurements and is called by the runtime under its lock, and by the workers (batch
completions) through ``PlannerObserver``.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from sluice.backends.base import ModelSpec
from sluice.engine.observer import Observer
from sluice.engine.request import Request
from sluice.policy.planner import (
    PlannerConfig,
    ServiceEstimator,
    VariantChoice,
    VariantState,
    choose_variant,
)
from sluice.policy.rates import RateMeter

DEFAULT_SERVICE_S = 0.02
"""Batch-1 service time assumed for a variant with no profile, until batches are seen."""
ARRIVAL_WINDOW_S = 10.0
"""The group's arrival rate is counted over this window."""
MIN_RATE_SPAN_S = 2.0
"""A rate is never computed over less than this (a first request is not 1000/s)."""


@dataclass(frozen=True)
class GroupSpec:
    """A model group: variants of one task that a request may be served by."""

    group_id: str
    variants: tuple[str, ...]
    """Model ids of the variants (their accuracy comes from ``options.accuracy``)."""
    planner: PlannerConfig = field(default_factory=PlannerConfig)
    default_deadline_s: float | None = None
    """Relative deadline for requests that bring none."""


def service_profile(spec: ModelSpec) -> dict[int, float]:
    """``options.service_ms`` (``{batch_size: ms}``, from ``sluice profile``) in seconds;
    otherwise the synthetic cost model; otherwise a guess the online estimate corrects."""
    opts = spec.options
    if opts.get("service_ms"):
        return {int(b): float(ms) / 1000.0 for b, ms in dict(opts["service_ms"]).items()}
    if spec.backend == "synthetic":
        scale = float(opts.get("speed_scale", 1.0))
        fixed = float(opts.get("batch_fixed_s", 0.002)) * scale
        item = float(opts.get("per_item_s", 0.001)) * scale
        return {1: fixed + item, 8: fixed + 8 * item}
    return {1: DEFAULT_SERVICE_S}


class VariantPlanner:
    """Measurements and choices for every configured group. Thread-safe."""

    def __init__(self, groups: Sequence[GroupSpec], specs: Mapping[str, ModelSpec],
                 worker_budgets: Sequence[int]) -> None:
        self.groups = {g.group_id: g for g in groups}
        self._specs = specs
        self._lock = threading.Lock()
        self._group_of: dict[str, str] = {}
        for g in groups:
            for v in g.variants:
                self._group_of[v] = g.group_id
        self._arrivals = {g: RateMeter(ARRIVAL_WINDOW_S, MIN_RATE_SPAN_S) for g in self.groups}
        self._in_system = dict.fromkeys(self._group_of, 0)
        self._counted: set[int] = set()
        self.service = {v: ServiceEstimator(service_profile(specs[v])) for v in self._group_of}
        self._servers = {
            v: max(1, sum(1 for b in worker_budgets if b >= specs[v].memory_bytes))
            for v in self._group_of
        }
        self.last_choice: dict[str, VariantChoice] = {}

    def lead_spec(self, group_id: str) -> ModelSpec:
        """The spec a group stands for in validation (kind, task): its first variant."""
        return self._specs[self.groups[group_id].variants[0]]

    def _states(self, group: GroupSpec) -> list[VariantState]:
        top = group.planner.max_batch_size
        # The fastest-only baseline ranks by the profile alone: online estimates of tiny
        # service times are mostly scheduling noise and would make the baseline wander.
        static = group.planner.policy == "fastest"
        out = []
        for v in group.variants:
            est = self.service[v]
            time_of = est.profiled_batch_s if static else est.batch_s
            out.append(VariantState(
                name=v, accuracy=float(self._specs[v].options.get("accuracy", 0.0)),
                servers=self._servers[v], in_system=self._in_system[v],
                batch_s={b: time_of(b) for b in range(1, top + 1)},
            ))
        return out

    def plan(self, req: Request, now: float) -> VariantChoice | None:
        """For a request naming a group: choose a variant and rewrite ``req.model_id`` to
        it (or return a choice with ``variant=None``: reject). For a request naming a
        variant directly: record the prediction for it. ``None`` for other models."""
        name = req.model_id
        group_id = name if name in self.groups else self._group_of.get(name)
        if group_id is None:
            return None
        group = self.groups[group_id]
        if req.deadline_s is None and group.default_deadline_s is not None:
            req.deadline_s = req.arrival_s + group.default_deadline_s
        with self._lock:
            self._arrivals[group_id].record(now)
            rate, rate_stderr = self._arrivals[group_id].rate_and_stderr(now)
            states = self._states(group)
            if name != group_id:  # a variant named directly: predict it alone
                states = [s for s in states if s.name == name]
                config = PlannerConfig(policy="accurate",
                                       max_batch_size=group.planner.max_batch_size,
                                       pessimism=group.planner.pessimism)
            else:
                config = group.planner
        time_left = None if req.deadline_s is None else req.deadline_s - now
        choice = choose_variant(states, arrival_per_s=rate, arrival_stderr_per_s=rate_stderr,
                                time_left_s=time_left, config=config)
        self.last_choice[group_id] = choice
        if choice.variant is not None:
            req.model_id = choice.variant
            req.variant = choice.variant
            wait = choice.predicted_wait_s
            req.predicted_wait_s = wait if math.isfinite(wait) else None
        return choice

    def admitted(self, req: Request) -> None:
        if req.model_id in self._in_system:
            with self._lock:
                self._in_system[req.model_id] += 1
                self._counted.add(req.request_id)

    def finished(self, req: Request) -> None:
        with self._lock:
            if req.request_id in self._counted:
                self._counted.discard(req.request_id)
                self._in_system[req.model_id] -= 1

    def batch_done(self, model_id: str, size: int, seconds: float) -> None:
        est = self.service.get(model_id)
        if est is not None:
            with self._lock:
                est.observe(size, seconds)

    def snapshot(self) -> dict[str, Any]:
        """Per variant: in system, estimated batch-1 time, drift factor."""
        with self._lock:
            return {
                v: {"in_system": self._in_system[v],
                    "batch1_ms": round(self.service[v].batch_s(1) * 1000, 3),
                    "drift": round(self.service[v].drift.value or 1.0, 4)}
                for v in self._group_of
            }


class PlannerObserver:
    """Forwards every observer call to ``inner``; batch completions also reach the planner
    (workers are given this, so the service-time estimates follow what really ran)."""

    def __init__(self, inner: Observer, planner: VariantPlanner) -> None:
        self._inner = inner
        self._planner = planner

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def batch_done(self, worker_id: int, model_id: str, size: int, seconds: float) -> None:
        self._planner.batch_done(model_id, size, seconds)
        self._inner.batch_done(worker_id, model_id, size, seconds)
