"""Model groups on the engine side: measure what the variant planner needs (the group's
arrival rate, requests in the system per variant, batch service times as batches
complete) and apply its choice to a request before admission.

The decision is ``sluice.policy.variants.planner.choose_variant`` and the measurements are
``sluice.policy.variants.variant_tracker.VariantTracker`` (both pure, shared with the simulator);
this module holds them behind a lock, applies a choice to a request, and is called by the
runtime (its pump turns the workers' ``Batch`` and ``BatchDone`` messages into
``batch_started`` and ``batch_done``).
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from sluice.backends.base import EmbedInput, ModelSpec
from sluice.engine.request import Request, RequestStatus
from sluice.policy.variants.planner import VariantChoice
from sluice.policy.variants.service_estimator import LengthPrior
from sluice.policy.variants.variant_tracker import GroupPlan, VariantInfo, VariantTracker

DEFAULT_SERVICE_S = 0.02
"""Batch-1 service time assumed for a variant with no profile, until batches are seen."""


GroupSpec = GroupPlan
"""A model group: variants of one task that a request may be served by (each variant's
accuracy comes from ``options.accuracy``); the simulator's ``SimGroup`` is one too."""


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
    """Measurements and choices for every configured group (``VariantTracker``, pure)
    behind a lock, applied to requests. Thread-safe."""

    def __init__(self, groups: Sequence[GroupSpec], specs: Mapping[str, ModelSpec],
                 worker_budgets: Sequence[int],
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.groups = {g.group_id: g for g in groups}
        self._specs = specs
        self._clock = clock
        self._lock = threading.Lock()
        names = {v for g in groups for v in g.variants}
        self.tracker = VariantTracker(
            list(groups),
            {v: variant_info(specs[v], worker_budgets) for v in names},
            workers=max(1, len(worker_budgets)),
        )
        self._queued: dict[int, Request] = {}
        """The tracker's pending requests, to notice when they start (lazily, at the next
        decision: the worker marks them running)."""
        self.service = self.tracker.service
        self.last_choice = self.tracker.last_choice

    def lead_spec(self, group_id: str) -> ModelSpec:
        """The spec a group stands for in validation (kind, task): its first variant."""
        return self._specs[self.groups[group_id].variants[0]]

    def plan(self, req: Request, now: float) -> VariantChoice | None:
        """For a request naming a group: choose a variant and rewrite ``req.model_id`` to
        it (or return a choice with ``variant=None``: reject). For a request naming a
        variant directly: record the prediction for it. ``None`` for other models."""
        name = req.model_id
        if name not in self.groups and name not in self.tracker.group_of:
            return None
        with self._lock:
            self._prune()
            choice, req.deadline_s = self.tracker.plan_arrival(
                req.request_id, name, req.deadline_s, req.arrival_s, now, input_length(req))
        if choice is None:
            return None
        if name in self.groups:
            req.plan = choice
        if choice.variant is not None:
            req.model_id = choice.variant
            req.variant = choice.variant
            wait = choice.predicted_wait_s
            req.predicted_wait_s = wait if math.isfinite(wait) else None
        return choice

    def group_of(self, variant: str) -> str:
        """The group ``variant`` belongs to."""
        return self.tracker.group_of[variant]

    def _prune(self) -> None:
        """Tell the tracker which pending requests started or ended. Under the lock.
        A request that started counts as queued until its worker's batch is reported
        (``batch_started``; the worker marks its members running first): in between it
        would be in neither the queue nor a batch, and the pool would look idle (one with
        no worker recorded counts as started at once)."""
        running = self.tracker.running
        for rid in [rid for rid, r in self._queued.items() if r.is_terminal or (
                    r.times.started_s is not None
                    and (r.worker_id is None or r.worker_id in running))]:
            del self._queued[rid]
            self.tracker.started(rid)

    def admitted(self, req: Request, group_id: str | None = None) -> None:
        """``req`` entered the queue; ``group_id``: the group it named (re-plannable)."""
        with self._lock:
            self.tracker.admitted(req.request_id, req.model_id, req.deadline_s, group_id,
                                  length=input_length(req))
            if req.request_id in self.tracker.pending:
                self._queued[req.request_id] = req

    def finished(self, req: Request) -> None:
        ran = req.status in (RequestStatus.COMPLETED, RequestStatus.EXPIRED)
        with self._lock:
            self._queued.pop(req.request_id, None)
            self.tracker.finished(req.request_id, req.model_id, req.times.finished_s, ran)

    def replan(self, now: float, movable: Callable[[int], bool]
               ) -> list[tuple[Request, str | None]]:
        """Queued group requests predicted to miss their deadlines now, each with the
        faster variant to move to (``None``: fail it); see ``VariantTracker.replan``.
        The caller applies the moves (``moved``)."""
        with self._lock:
            self._prune()
            return [(self._queued[rid], v) for rid, v in self.tracker.replan(now, movable)]

    def moved(self, req: Request, variant: str, apply: bool = True) -> None:
        """``req`` (queued) will run on ``variant``: the tracker plans with it from now
        on; ``apply``: also rewrite the request (else ``apply_move`` does, once the worker
        that holds it has made the move)."""
        with self._lock:
            self.tracker.moved(req.request_id, variant)
        if apply:
            self.apply_move(req, variant)

    @staticmethod
    def apply_move(req: Request, variant: str) -> None:
        req.model_id = variant
        req.variant = variant

    def batch_started(self, worker_id: int, model_id: str, size: int) -> None:
        with self._lock:
            # The batch's members are the tracked requests of this model marked running
            # since the last look (the worker marks them before it reports the batch).
            longest = max((input_length(r) for r in self._queued.values()
                           if r.model_id == model_id and r.times.started_s is not None),
                          default=0)
            self.tracker.batch_started(worker_id, model_id, size, self._clock(), longest)
            self._prune()

    def batch_done(self, model_id: str, size: int, seconds: float,
                   worker_id: int | None = None) -> None:
        with self._lock:
            self.tracker.batch_done(model_id, size, seconds, worker_id)

    def groups_snapshot(self) -> dict[str, Any]:
        """Per group: its arrival meter as of now (``arrivals``: the recent arrivals'
        ages and the first one's; ``VariantTracker.arrival_state``), which a simulation
        of the next minutes starts from (``SimGroup.arrivals``)."""
        with self._lock:
            return {g: {"arrivals": state}
                    for g, state in self.tracker.arrival_state(self._clock()).items()}

    def snapshot(self) -> dict[str, Any]:
        """Per variant: in system, estimated batch-1 time, drift factor, and everything
        its service estimator learned (``estimate``: ``ServiceEstimator.state``, what a
        simulation of the next minutes charges; ``sluice costs``)."""
        with self._lock:
            return {
                v: {"in_system": self.tracker.in_system[v],
                    "batch1_ms": round(self.service[v].batch_s(1) * 1000, 3),
                    "drift": round(self.service[v].drift.value or 1.0, 4),
                    "estimate": self.service[v].state()}
                for v in self.tracker.group_of
            }


CHARS_PER_TOKEN = 4
"""Characters a token id stands for in ``input_length`` (about one English token's)."""


def input_length(req: Request) -> int:
    """A one-shot request's input size in characters (its longest text; an
    ``EmbedInput``'s texts, a token id counted as ``CHARS_PER_TOKEN``; 0: not text): what
    its batch's time grows with, as the batch is padded to its longest member."""
    data = req.input
    if isinstance(data, str):
        return len(data)
    if isinstance(data, EmbedInput):
        return sum(len(p) if isinstance(p, str) else CHARS_PER_TOKEN for p in data.pieces)
    if isinstance(data, (list, tuple)):
        return max((len(x) for x in data if isinstance(x, str)), default=0)
    return 0


def variant_info(spec: ModelSpec, worker_budgets: Sequence[int]) -> VariantInfo:
    """A variant's accuracy, servers (workers whose budget holds it) and profile."""
    return VariantInfo(
        accuracy=float(spec.options.get("accuracy", 0.0)),
        servers=max(1, sum(1 for b in worker_budgets if b >= spec.memory_bytes)),
        profile_s=service_profile(spec),
        length_prior=length_prior(spec),
    )


def length_prior(spec: ModelSpec) -> LengthPrior | None:
    """``options.length_prior`` (from ``sluice profile``): ``{slope, mean, var,
    typical_longest_chars = {batch size: chars}}``, or the older ``{slope_per_char,
    mean_chars, var_chars}`` (lengths in characters); None without one."""
    raw = spec.options.get("length_prior")
    return LengthPrior.from_json(raw) if raw else None
