"""What the variant planner needs to know, measured as requests come and go: each group's
arrival rate, the requests in the system per variant, and batch service times as batches
complete. ``plan`` turns those measurements into ``choose_variant``'s inputs and returns
its choice. Pure (time is an argument, no locks): the engine wraps it in a lock and
applies the choice to a ``Request``; the simulator calls it directly, so both plan alike.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from sluice.policy.planner import (
    PlannerConfig,
    ServiceEstimator,
    VariantChoice,
    VariantState,
    choose_variant,
)
from sluice.policy.rates import RateMeter

ARRIVAL_WINDOW_S = 10.0
"""The group's arrival rate is counted over this window."""
MIN_RATE_SPAN_S = 2.0
"""A rate is never computed over less than this (a first request is not 1000/s)."""


@dataclass(frozen=True)
class VariantInfo:
    """A variant's fixed facts."""

    accuracy: float
    servers: int
    """Workers that can hold it (``c`` of M/M/c)."""
    profile_s: Mapping[int, float]
    """Profiled batch service seconds by batch size."""


@dataclass(frozen=True)
class GroupPlan:
    """A group as the tracker plans it."""

    group_id: str
    variants: tuple[str, ...]
    planner: PlannerConfig = field(default_factory=PlannerConfig)


class VariantTracker:
    """Measurements and choices for every group. Invariant: ``in_system[v]`` counts the
    requests ``admitted`` for ``v`` and not yet ``finished`` (each counted once)."""

    def __init__(self, groups: Sequence[GroupPlan], variants: Mapping[str, VariantInfo]) -> None:
        self.groups = {g.group_id: g for g in groups}
        self.group_of = {v: g.group_id for g in groups for v in g.variants}
        self.info = {v: variants[v] for v in self.group_of}
        self.arrivals = {g: RateMeter(ARRIVAL_WINDOW_S, MIN_RATE_SPAN_S) for g in self.groups}
        self.in_system = dict.fromkeys(self.group_of, 0)
        self._counted: set[int] = set()
        self.service = {v: ServiceEstimator(info.profile_s) for v, info in self.info.items()}
        self.last_choice: dict[str, VariantChoice] = {}

    def states(self, group: GroupPlan) -> list[VariantState]:
        top = group.planner.max_batch_size
        # The fastest-only baseline ranks by the profile alone: online estimates of tiny
        # service times are mostly scheduling noise and would make the baseline wander.
        static = group.planner.policy == "fastest"
        out = []
        for v in group.variants:
            est = self.service[v]
            time_of = est.profiled_batch_s if static else est.batch_s
            out.append(VariantState(
                name=v, accuracy=self.info[v].accuracy, servers=self.info[v].servers,
                in_system=self.in_system[v], batch_s={b: time_of(b) for b in range(1, top + 1)},
            ))
        return out

    def plan(self, name: str, deadline_s: float | None, now: float) -> VariantChoice | None:
        """For ``name`` a group: the choice among its variants. For ``name`` a variant: the
        prediction for it alone. ``None`` for other models. ``deadline_s`` is absolute."""
        group_id = name if name in self.groups else self.group_of.get(name)
        if group_id is None:
            return None
        group = self.groups[group_id]
        self.arrivals[group_id].record(now)
        rate, rate_stderr = self.arrivals[group_id].rate_and_stderr(now)
        states = self.states(group)
        config = group.planner
        if name != group_id:  # a variant named directly: predict it alone
            states = [s for s in states if s.name == name]
            config = PlannerConfig(policy="accurate", max_batch_size=config.max_batch_size,
                                   pessimism=config.pessimism)
        time_left = None if deadline_s is None else deadline_s - now
        choice = choose_variant(states, arrival_per_s=rate, arrival_stderr_per_s=rate_stderr,
                                time_left_s=time_left, config=config)
        self.last_choice[group_id] = choice
        return choice

    def admitted(self, request_id: int, model_id: str) -> None:
        if model_id in self.in_system:
            self.in_system[model_id] += 1
            self._counted.add(request_id)

    def finished(self, request_id: int, model_id: str) -> None:
        if request_id in self._counted:
            self._counted.discard(request_id)
            self.in_system[model_id] -= 1

    def batch_done(self, model_id: str, size: int, seconds: float) -> None:
        est = self.service.get(model_id)
        if est is not None:
            est.observe(size, seconds)
