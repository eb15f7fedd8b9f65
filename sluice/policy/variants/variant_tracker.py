"""What the variant planner needs to know, measured as requests come and go: each group's
arrival rate, the requests in the system per variant, the queue (requests admitted and
not started, in start order) and each worker's batch in flight, and batch service times
as batches complete. ``plan`` turns those measurements into ``choose_variant``'s inputs and returns
its choice. Pure (time is an argument, no locks): the engine wraps it in a lock and
applies the choice to a ``Request``; the simulator calls it directly, so both plan alike.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from sluice.policy.queues.rates import RateMeter
from sluice.policy.variants.backlog import NO_MARGIN, Backlog, PredictionError, Queued, replan
from sluice.policy.variants.planner import (
    PlannerConfig,
    VariantChoice,
    VariantState,
    choose_variant,
)
from sluice.policy.variants.service_estimator import LengthPrior, ServiceEstimator

ARRIVAL_WINDOW_S = 3.0
"""The group's arrival rate is counted over this window (short, so the steady-state
bound follows a load step within seconds; the queue itself is read at every decision)."""
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
    length_prior: LengthPrior | None = None
    """How the profile's batch times grew with their longest input (None: not measured;
    the slope is then learned from the first batches served)."""


@dataclass(frozen=True)
class GroupPlan:
    """A group as the tracker plans it."""

    group_id: str
    variants: tuple[str, ...]
    planner: PlannerConfig = field(default_factory=PlannerConfig)
    default_deadline_s: float | None = None
    """Relative deadline for the group's requests that bring none (``plan_arrival``)."""


class VariantTracker:
    """Measurements and choices for every group. Invariant: ``in_system[v]`` counts the
    requests ``admitted`` for ``v`` and not yet ``finished`` (each counted once)."""

    def __init__(self, groups: Sequence[GroupPlan], variants: Mapping[str, VariantInfo],
                 workers: int = 1) -> None:
        if workers < 1:
            raise ValueError(f"workers must be >= 1, got {workers}")
        self.workers = workers
        self.groups = {g.group_id: g for g in groups}
        self.group_of = {v: g.group_id for g in groups for v in g.variants}
        self.info = {v: variants[v] for v in self.group_of}
        self.arrivals = {g: RateMeter(ARRIVAL_WINDOW_S, MIN_RATE_SPAN_S) for g in self.groups}
        self.in_system = dict.fromkeys(self.group_of, 0)
        self._counted: dict[int, str] = {}
        """Request → the variant it is counted under in ``in_system``."""
        self.service = {v: ServiceEstimator(info.profile_s, length_prior=info.length_prior)
                        for v, info in self.info.items()}
        self.last_choice: dict[str, VariantChoice] = {}
        self.pending: dict[int, tuple[str, float | None]] = {}
        """Admitted variant requests not started: id → (variant, absolute deadline), in
        admission order (the FIFO start order)."""
        self.named_group: dict[int, str] = {}
        """Pending requests that named a group (only these may be re-planned)."""
        self.errors = {g: PredictionError() for g in self.groups}
        """Per group: how late requests finish against the planner's prediction; its
        margin is kept free before every deadline."""
        self._predicted: dict[int, tuple[str, float, float]] = {}
        """Group requests in the system → (group, predicted absolute finish, predicted
        sojourn)."""
        self.running: dict[int, tuple[str, int, float, int]] = {}
        """Per worker: the variant batch it runs now (variant, size, start time, its
        longest input in characters; 0: unknown)."""
        self.length_of: dict[int, int] = {}
        """Pending requests → their input's length in characters (when known)."""
        self._planned: dict[int, tuple[float, float]] = {}
        """Group requests planned (``plan_arrival``) and not yet admitted → their predicted
        finish (absolute) and sojourn."""
        self.decisions: list[tuple[int, str, str | None, float | None]] | None = None
        """When a list: every ``plan_arrival`` of a group request as ``(request_id, group,
        variant or None, deadline)`` and every ``moved`` as ``(request_id, "moved",
        variant, None)``, so a simulator run and a server run can be compared."""

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

    def scale(self, variant: str, longest: int, batch_size: int = 1) -> float:
        """How many times its curve a batch of ``variant`` and ``batch_size`` whose longest
        input has ``longest`` characters takes (``sluice.policy.variants.backlog.LengthScale``)."""
        est = self.service[variant]
        return est.factor(longest, batch_size) / est.factor(0)

    def plan(self, name: str, deadline_s: float | None, now: float,
             length: int = 0) -> VariantChoice | None:
        """For ``name`` a group: the choice among its variants. For ``name`` a variant: the
        prediction for it alone. ``None`` for other models. ``deadline_s`` is absolute;
        ``length``: the request's input in characters (0: unknown)."""
        group_id = name if name in self.groups else self.group_of.get(name)
        if group_id is None:
            return None
        group = self.groups[group_id]
        self.arrivals[group_id].record(now)
        rate, rate_stderr = self.arrivals[group_id].rate_and_stderr(now)
        states = self.states(group)
        curves = {s.name: s.batch_s for s in states}
        config = group.planner
        if name != group_id:  # a variant named directly: predict it alone
            states = [s for s in states if s.name == name]
            config = PlannerConfig(policy="accurate", max_batch_size=config.max_batch_size,
                                   pessimism=config.pessimism)
        measured = self.errors[group_id].margin(now)
        backlog = self.backlog(group, now)
        time_left = None if deadline_s is None else deadline_s - now
        choice = None
        # First with the measured error's margin kept free; if nothing fits then, the
        # most accurate variant predicted to fit at all still has a fair chance, which
        # a rejection (a certain miss) does not.
        for margin in dict.fromkeys((measured, NO_MARGIN)):
            choice = choose_variant(states, arrival_per_s=rate,
                                    arrival_stderr_per_s=rate_stderr, time_left_s=time_left,
                                    config=config, backlog=backlog, queued_curves=curves,
                                    margin=margin, length=length,
                                    scale=None if config.policy == "fastest" else self.scale)
            if choice.variant is not None:
                break
        assert choice is not None
        self.last_choice[group_id] = choice
        return choice

    def plan_arrival(self, request_id: int, name: str, deadline_s: float | None,
                     arrival_s: float, now: float, length: int = 0
                     ) -> tuple[VariantChoice | None, float | None]:
        """``plan`` for an arriving request: its deadline is its group's default
        (``GroupPlan.default_deadline_s`` after ``arrival_s``) when it brings none, and a
        group request given a variant has its predicted finish kept for ``admitted``.
        Returns the choice (``None``: not a group's model; ``variant=None``: reject it
        ``deadline_infeasible``) and the request's deadline."""
        group_id = name if name in self.groups else self.group_of.get(name)
        if group_id is None:
            return None, deadline_s
        default = self.groups[group_id].default_deadline_s
        if deadline_s is None and default is not None:
            deadline_s = arrival_s + default
        choice = self.plan(name, deadline_s, now, length)
        if choice is not None and choice.variant is not None and name == group_id:
            sojourn = choice.predicted_sojourn_s
            self._planned[request_id] = (now + sojourn, sojourn)
        if choice is not None and name == group_id and self.decisions is not None:
            self.decisions.append((request_id, group_id, choice.variant, deadline_s))
        return choice, deadline_s

    def arrival_state(self, now: float) -> dict[str, dict[str, object]]:
        """Per group, its arrival meter at ``now`` (``RateMeter.state``: what the low-load
        test reads next). A live server publishes it (``/status.json``: ``groups``) so
        a simulation of the next minutes starts from the same recent arrivals
        (``restore_arrivals``) instead of none."""
        return {g: meter.state(now) for g, meter in self.arrivals.items()}

    def restore_arrivals(self, states: Mapping[str, Mapping[str, object]], now: float
                         ) -> None:
        """Continue each named group's arrival meter from ``arrival_state``'s (another
        clock's) as of ``now``; groups not named keep theirs."""
        for g, state in states.items():
            if g in self.arrivals:
                self.arrivals[g].restore(state, now)

    def backlog(self, group: GroupPlan, now: float) -> Backlog:
        """The group's queued requests (in start order, with their time left) and every
        worker's predicted time to the end of the variant batch it runs."""
        mine = set(group.variants)
        queued = tuple(Queued(v, None if d is None else d - now, self.length_of.get(rid, 0))
                       for rid, (v, d) in self.pending.items() if v in mine)
        busy = [0.0] * self.workers
        for worker, (variant, size, start_s, longest) in self.running.items():
            if 0 <= worker < self.workers:
                end_s = start_s + self.service[variant].batch_s(size, longest)
                busy[worker] = max(0.0, end_s - now)
        return Backlog(tuple(busy), queued)

    def admitted(self, request_id: int, model_id: str, deadline_s: float | None = None,
                 group_id: str | None = None, predicted_finish_s: float | None = None,
                 predicted_sojourn_s: float = 0.0, length: int = 0) -> None:
        """A request for ``model_id`` entered the queue; ``group_id``: the group it named
        (then it may be re-planned); ``predicted_finish_s``: when the planner predicted
        it would finish (absolute) and ``predicted_sojourn_s`` after how long, to measure
        the prediction's error at ``finished`` (by default what ``plan_arrival`` predicted);
        ``length``: its input in characters."""
        planned = self._planned.pop(request_id, None)
        if predicted_finish_s is None and planned is not None:
            predicted_finish_s, predicted_sojourn_s = planned
        if model_id in self.in_system:
            self.in_system[model_id] += 1
            self._counted[request_id] = model_id
            self.pending[request_id] = (model_id, deadline_s)
            if length > 0:
                self.length_of[request_id] = length
            if group_id is not None:
                self.named_group[request_id] = group_id
                if predicted_finish_s is not None and math.isfinite(predicted_finish_s):
                    self._predicted[request_id] = (group_id, predicted_finish_s,
                                                   predicted_sojourn_s)

    def started(self, request_id: int) -> None:
        """The request left the queue for a batch (or ended before running)."""
        self.pending.pop(request_id, None)
        self.named_group.pop(request_id, None)
        self.length_of.pop(request_id, None)

    def finished(self, request_id: int, model_id: str, now: float | None = None,
                 ran: bool = True) -> None:
        """The request ended at ``now``; ``ran``: it completed or expired (its end time
        then bounds its finish, and the prediction's error is measured). Also for a
        request planned and refused before admission."""
        self.started(request_id)
        self._planned.pop(request_id, None)
        predicted = self._predicted.pop(request_id, None)
        if predicted is not None and now is not None and ran:
            group_id, finish_s, sojourn_s = predicted
            self.errors[group_id].observe(now - finish_s, sojourn_s, now)
        counted = self._counted.pop(request_id, None)
        if counted is not None:  # under the variant it was counted (``model_id`` may lag a move)
            self.in_system[counted] -= 1

    def replan(self, now: float, movable: Callable[[int], bool]) -> list[tuple[int, str | None]]:
        """Queued requests of adaptive groups predicted to miss their deadlines now, each
        with the faster variant it should move to (``None``: none meets it; fail it).
        Only requests that named a group and for which ``movable(request_id)`` holds are
        moved; the caller applies each move (``moved``)."""
        out: list[tuple[int, str | None]] = []
        for group in self.groups.values():
            if group.planner.policy != "adaptive":
                continue
            backlog = self.backlog(group, now)
            if not backlog.queued:
                continue
            ids = [rid for rid, (v, _) in self.pending.items() if v in group.variants]
            states = {s.name: s for s in self.states(group)}
            by_accuracy = sorted(states.values(), key=lambda s: -s.accuracy)
            options: dict[int, list[str]] = {}
            for i, rid in enumerate(ids):
                if self.named_group.get(rid) == group.group_id and movable(rid):
                    own_s = states[self.pending[rid][0]].batch_s[1]
                    options[i] = [s.name for s in by_accuracy if s.batch_s[1] < own_s]
            curves = {name: s.batch_s for name, s in states.items()}
            for move in replan(backlog, curves, group.planner.max_batch_size, options,
                               group.planner.pessimism, self.errors[group.group_id].margin(now),
                               scale=self.scale):
                out.append((ids[move.index], move.variant))
        return out

    def moved(self, request_id: int, variant: str) -> None:
        """A queued request will run on ``variant`` (planned from now on; a no-op once it
        has started)."""
        entry = self.pending.get(request_id)
        if entry is None or entry[0] == variant:
            return
        if self.decisions is not None:
            self.decisions.append((request_id, "moved", variant, None))
        if request_id in self._counted:
            self.in_system[entry[0]] -= 1
            self.in_system[variant] += 1
            self._counted[request_id] = variant
        self.pending[request_id] = (variant, entry[1])

    def batch_started(self, worker_id: int, model_id: str, size: int, now: float,
                      longest: int = 0) -> None:
        """``longest``: the batch's longest input in characters (0: unknown)."""
        if model_id in self.service:
            self.running[worker_id] = (model_id, size, now, longest)

    def batch_done(self, model_id: str, size: int, seconds: float,
                   worker_id: int | None = None) -> None:
        est = self.service.get(model_id)
        if est is not None:
            running = None if worker_id is None else self.running.pop(worker_id, None)
            longest = running[3] if running is not None and running[0] == model_id else 0
            est.observe(size, seconds, longest)
