"""The variant planner: per request, the most accurate variant of a model group whose
predicted sojourn time meets the request's deadline. Pure: numbers in, a plain
``VariantChoice`` out; time, rates and backlog are arguments. The M/M/c formulas are
``sluice.policy.variants.queueing``'s; the service times it is given come from
``sluice.policy.variants.service_estimator``.

The queueing model, and the assumptions it rests on:

* The variants of a group share one pool of ``c`` workers (every worker can hold every
  variant), served first come first served. Arrivals are Poisson and service times
  exponential (M/M/c): the closed-form Erlang-C waiting time is exact only then. Real
  traffic is burstier and batch service times are nearly deterministic, so the two
  errors pull in opposite directions; ``pessimism`` (>= 1 is safer) multiplies every
  predicted wait and service time to cover what the model leaves out.
* A request that names the group is predicted twice and the larger wait kept:
  (1) the steady state: Erlang-C M/M/c waiting time if the group's measured arrival rate
  ran at this variant's per-item service time; (2) the present: the work already in
  the pool (each request in the system at its variant's per-item time) drained by
  ``c`` workers. (1) sees overload before a queue has formed; (2) sees a burst the
  rate has not caught up with.
* Dynamic batching makes per-item service time depend on the batch size. The batch a
  request will run in is the larger of the backlog ahead of it per worker (+1) and the
  smallest batch size at which the workers keep up with the arrival rate (under steady
  load the queue grows until batches are that big); ``max_batch_size`` at most. Its
  service time is the whole batch's time: every member finishes when the batch does.
* Below ``low_load_utilization`` (0.5 by default) of the most accurate variant's
  capacity (at its most efficient batch size, as a saturated pool runs), the planner
  picks the most accurate variant without further prediction, so at light load it
  behaves exactly like the accurate-only baseline. The measured arrival rate is a
  Poisson count over a short window, so it is noisy (±10 % at 10/s over 10 s, far more
  in the first seconds): the planner leaves the accurate-only choice only when the rate
  is above that line by ``low_load_confidence_z`` standard errors, so noise alone does
  not send a light-load request to a cheaper variant.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from sluice.policy.variants.backlog import (
    NO_MARGIN,
    Backlog,
    BatchCurves,
    LengthScale,
    Margin,
    placement,
)
from sluice.policy.variants.queueing import mmc_wait_s

PlannerPolicy = Literal["adaptive", "accurate", "fastest"]
POLICIES: tuple[PlannerPolicy, ...] = ("adaptive", "accurate", "fastest")


@dataclass(frozen=True, slots=True)
class VariantState:
    """What the planner knows about one variant at the moment of a decision."""

    name: str
    accuracy: float
    """Measured accuracy on held-out data (0..1); higher is preferred."""
    servers: int
    """``c``: workers that can serve it."""
    in_system: int
    """Requests for this variant admitted and not finished (queued or running)."""
    batch_s: Mapping[int, float]
    """Predicted batch service time by batch size, for the sizes 1..max_batch_size."""


@dataclass(frozen=True, slots=True)
class PlannerConfig:
    """Knobs of one group's planner."""

    policy: PlannerPolicy = "adaptive"
    """``adaptive`` (this planner), or the baselines ``accurate`` / ``fastest``."""
    pessimism: float = 1.0
    """Multiplies every predicted wait and service time (>= 1 is safer)."""
    low_load_utilization: float = 0.5
    """Below this utilization of the most accurate variant, pick it without prediction."""
    low_load_confidence_z: float = 2.0
    """Standard errors of the measured arrival rate by which it must exceed the low-load
    line before the planner predicts (0: the point estimate alone decides)."""
    max_batch_size: int = 8
    """The dynamic batcher's limit."""

    def __post_init__(self) -> None:
        if self.policy not in POLICIES:
            raise ValueError(f"policy must be one of {POLICIES}, got {self.policy!r}")
        if not self.pessimism > 0 or not math.isfinite(self.pessimism):
            raise ValueError(f"pessimism must be a finite number > 0, got {self.pessimism!r}")
        if not 0 <= self.low_load_utilization <= 1:
            raise ValueError(
                f"low_load_utilization must be in [0, 1], got {self.low_load_utilization!r}"
            )
        if not 0 <= self.low_load_confidence_z < math.inf:
            raise ValueError(f"low_load_confidence_z must be a finite number >= 0, got "
                             f"{self.low_load_confidence_z!r}")
        if self.max_batch_size < 1:
            raise ValueError(f"max_batch_size must be >= 1, got {self.max_batch_size}")


@dataclass(frozen=True, slots=True)
class Prediction:
    """The numbers behind one variant's predicted sojourn time (seconds)."""

    variant: str
    accuracy: float
    batch_size: int
    """The batch it is expected to run in."""
    service_s: float
    erlang_wait_s: float
    """Steady-state M/M/c wait at the group's arrival rate."""
    backlog_wait_s: float
    """Time for the pool to drain the work already in it (with a ``Backlog``: until the
    batch this request would run in starts)."""
    wait_s: float
    """``pessimism × max(erlang_wait_s, backlog_wait_s)``."""
    sojourn_s: float
    """``wait_s + pessimism × service_s``."""
    meets_deadline: bool
    delays_others: bool = False
    """It would join a queued batch and push one of its members past its deadline."""


@dataclass(frozen=True, slots=True)
class VariantChoice:
    """The planner's decision: a variant, or ``None`` to reject the request now."""

    variant: str | None
    reason: str
    """``low_load``, ``backlog``, ``no_deadline``, ``meets_deadline``, ``policy_accurate``,
    ``policy_fastest`` or ``deadline_infeasible``."""
    predicted_wait_s: float
    predicted_sojourn_s: float
    utilization: float
    """The group's arrival rate over the most accurate variant's capacity."""
    arrival_per_s: float
    predictions: tuple[Prediction, ...]
    retry_after_s: float = 0.0
    """For a rejection: when the best variant's backlog should have drained."""
    pool_idle: bool | None = None
    """Nothing was queued or running at the decision (``None``: planned without the
    pool's state)."""
    accurate_fits_alone: bool | None = None
    """The most accurate variant, alone on an idle pool, would meet the deadline (with
    the margin and the room for the next request, as the planner judges any variant);
    ``None`` without a deadline or the pool's state. Below the low-load line a request
    that finds the pool idle and fits alone goes to the most accurate variant."""
    arrival_stderr_per_s: float = 0.0
    """The arrival rate's standard error as the planner took it."""
    low_load_line_per_s: float = 0.0
    """The low-load line at the decision (``low_load_utilization`` × the most accurate
    variant's capacity as its estimate stood): below it by ``low_load_confidence_z``
    standard errors, the request was planned as at low load. With ``arrival_per_s`` and
    ``arrival_stderr_per_s`` this is every input of that test, so two planners that
    decided differently can be compared input by input."""


def settled_batch_size(v: VariantState, arrival_per_s: float, max_batch_size: int) -> int:
    """The smallest batch size at which ``v``'s workers keep up with ``arrival_per_s``
    (``λ · S(b) / b < c``): under steady load the queue grows until batches are this big.
    ``max_batch_size`` when none keeps up."""
    for b in range(1, max_batch_size + 1):
        if arrival_per_s * v.batch_s[b] / b < v.servers:
            return b
    return max_batch_size


def capacity_per_s(v: VariantState, max_batch_size: int) -> float:
    """Requests per second ``v``'s workers complete at their most efficient batch size
    (what a saturated pool approaches, and how the accurate-only capacity is measured)."""
    return v.servers * max(b / v.batch_s[b] for b in range(1, max_batch_size + 1))


def _by_accuracy(variants: Sequence[VariantState]) -> list[VariantState]:
    """Most accurate first; ties → faster at batch 1 first, then name."""
    return sorted(variants, key=lambda v: (-v.accuracy, v.batch_s[1], v.name))


def predict(
    variants: Sequence[VariantState],
    *,
    arrival_per_s: float,
    time_left_s: float | None,
    config: PlannerConfig,
    backlog: Backlog | None = None,
    steady_state: bool = True,
    queued_curves: BatchCurves | None = None,
    margin: Margin = NO_MARGIN,
    length: int = 0,
    scale: LengthScale | None = None,
) -> list[Prediction]:
    """Predicted sojourn of a new request on each variant (most accurate first).

    Without ``backlog`` the present is approximated from ``in_system`` counts (each
    request at its variant's per-item time, drained by ``c`` workers). With it, the
    wait is when the batch the request would join starts (``sluice.policy.variants.backlog``),
    and its service that batch's time. ``steady_state=False`` leaves the Erlang-C term
    out (the planner does so below the low-load line, where the queue is the state).
    ``queued_curves``: batch curves of the variants queued in ``backlog`` that are not
    among ``variants`` (a request naming one variant queues behind the others).
    A variant that is not the fastest must leave room after it for one more request on
    the fastest (``pessimism × S_fastest(1)``): a queue filled to the deadline with slow
    work would leave the next arrival no variant at all. ``margin``: the planner's measured
    error, kept free after each variant's predicted sojourn (``meets_deadline`` only).
    ``length``: the request's input in characters and ``scale`` how a batch's time grows
    with its longest member (``sluice.policy.variants.backlog.LengthScale``; with a backlog only).
    """
    k = config.pessimism
    ordered = _by_accuracy(variants)
    servers = max((v.servers for v in ordered), default=1)
    max_b = config.max_batch_size
    curves = {**(queued_curves or {}), **{v.name: v.batch_s for v in ordered}}
    fastest = min(ordered, key=lambda v: (v.batch_s[1], -v.accuracy))
    # Work already in the pool, each request at its own variant's per-item time.
    in_pool = sum(v.in_system for v in ordered)
    backlog_work_s = 0.0
    for v in ordered:
        b = min(max_b, max(1, math.ceil(v.in_system / v.servers)))
        backlog_work_s += v.in_system * v.batch_s[b] / b
    out = []
    for v in ordered:
        delays = False
        if backlog is None:
            batch = max(min(max_b, 1 + in_pool // max(1, servers)),
                        settled_batch_size(v, arrival_per_s, max_b))
            backlog_s = backlog_work_s / servers
            service_s = v.batch_s[batch]
        else:
            place = placement(backlog, v.name, curves, max_b, k, length, scale)
            batch, backlog_s, delays = place.batch_size, place.start_s, place.delays_others
            service_s = place.finish_s - place.start_s
        # The steady state runs at the batch size the queue settles at (without a
        # backlog, the larger of that and the present's batch, as before).
        steady_b = batch if backlog is None else settled_batch_size(v, arrival_per_s, max_b)
        erlang_s = 0.0
        if steady_state:
            erlang_s = mmc_wait_s(arrival_per_s, v.batch_s[steady_b] / steady_b, v.servers)
        wait_s = k * max(erlang_s, backlog_s)
        sojourn_s = wait_s + k * service_s
        room_s = 0.0 if backlog is None or v is fastest else k * fastest.batch_s[1]
        meets = time_left_s is None or (
            sojourn_s + room_s + margin.of(sojourn_s) <= time_left_s and not delays)
        out.append(Prediction(v.name, v.accuracy, batch, service_s, erlang_s, backlog_s,
                              wait_s, sojourn_s, meets, delays))
    return out


def choose_variant(
    variants: Sequence[VariantState],
    *,
    arrival_per_s: float,
    time_left_s: float | None,
    config: PlannerConfig,
    arrival_stderr_per_s: float = 0.0,
    backlog: Backlog | None = None,
    queued_curves: BatchCurves | None = None,
    margin: Margin = NO_MARGIN,
    length: int = 0,
    scale: LengthScale | None = None,
) -> VariantChoice:
    """Pick a variant for one request of a group.

    ``arrival_per_s`` is the group's measured arrival rate and ``arrival_stderr_per_s``
    its standard error; ``time_left_s`` the time to the request's deadline (``None``: no
    deadline). The baselines ignore the prediction: ``accurate`` always takes the most
    accurate variant, ``fastest`` the fastest at batch size 1. ``adaptive`` takes the most
    accurate variant unless the arrival rate is above ``low_load_utilization`` of its
    capacity by ``low_load_confidence_z`` standard errors; otherwise the most accurate
    whose predicted sojourn fits ``time_left_s``; if none fits, ``variant`` is ``None``
    (reject now) with a Retry-After from the best prediction.

    With ``backlog`` (the pool's queued and running work, ``sluice.policy.variants.backlog``) the
    prediction starts from the state: below the low-load line the accurate variant is
    kept only while its predicted finish behind the queue meets the deadline (reason
    ``low_load``), else the most accurate variant that does is taken at once (reason
    ``backlog``); above it, the state and the Erlang-C steady state must both agree,
    except on an idle pool (nothing queued or running): there the request's own service
    time is the whole prediction, so accuracy comes back the moment a backlog clears.
    ``margin`` is kept free after every predicted sojourn; ``length`` and ``scale``
    size the request's own batch by its input (see ``predict``).
    """
    if not variants:
        raise ValueError("a group needs at least one variant")
    if not arrival_per_s >= 0:
        raise ValueError(f"arrival_per_s must be >= 0, got {arrival_per_s!r}")
    if not arrival_stderr_per_s >= 0:
        raise ValueError(f"arrival_stderr_per_s must be >= 0, got {arrival_stderr_per_s!r}")
    best = _by_accuracy(variants)[0]
    best_capacity_per_s = capacity_per_s(best, config.max_batch_size)
    utilization = arrival_per_s / best_capacity_per_s
    surely_above_per_s = max(0.0, arrival_per_s
                             - config.low_load_confidence_z * arrival_stderr_per_s)
    low_load_line_per_s = config.low_load_utilization * best_capacity_per_s
    below_line = surely_above_per_s < low_load_line_per_s  # never when the line is at 0
    preds = predict(variants, arrival_per_s=arrival_per_s, time_left_s=time_left_s,
                    config=config, backlog=backlog,
                    steady_state=backlog is None or not (below_line or backlog.is_empty),
                    queued_curves=queued_curves, margin=margin, length=length, scale=scale)

    pool_idle = None if backlog is None else backlog.is_empty
    fits_alone = None
    if backlog is not None and time_left_s is not None:
        alone = preds[0] if backlog.is_empty else predict(
            variants, arrival_per_s=arrival_per_s, time_left_s=time_left_s, config=config,
            backlog=Backlog(tuple(0.0 for _ in backlog.busy_s), ()), steady_state=False,
            queued_curves=queued_curves, margin=margin, length=length, scale=scale)[0]
        fits_alone = alone.meets_deadline

    def pick(p: Prediction, reason: str) -> VariantChoice:
        return VariantChoice(p.variant, reason, p.wait_s, p.sojourn_s, utilization,
                             arrival_per_s, tuple(preds), pool_idle=pool_idle,
                             accurate_fits_alone=fits_alone,
                             arrival_stderr_per_s=arrival_stderr_per_s,
                             low_load_line_per_s=low_load_line_per_s)

    if config.policy == "accurate":
        return pick(preds[0], "policy_accurate")
    if config.policy == "fastest":
        fastest = min(preds, key=lambda p: (p.service_s / p.batch_size, -p.accuracy))
        return pick(fastest, "policy_fastest")
    if below_line:
        # Below the line the queue alone decides: empty (the usual case) → the accurate
        # variant, as accurate-only; a queue it would miss behind → a faster variant now.
        if backlog is None or time_left_s is None or preds[0].meets_deadline:
            return pick(preds[0], "low_load")
        for p in preds:
            if p.meets_deadline:
                return pick(p, "backlog")
    if time_left_s is None:
        return pick(preds[0], "no_deadline")
    for p in preds:
        if p.meets_deadline:
            return pick(p, "meets_deadline")
    soonest = min(preds, key=lambda p: p.sojourn_s)
    retry_s = soonest.backlog_wait_s if math.isfinite(soonest.backlog_wait_s) else 0.0
    return VariantChoice(None, "deadline_infeasible", soonest.wait_s, soonest.sojourn_s,
                         utilization, arrival_per_s, tuple(preds), retry_after_s=retry_s,
                         pool_idle=pool_idle, accurate_fits_alone=fits_alone,
                         arrival_stderr_per_s=arrival_stderr_per_s,
                         low_load_line_per_s=low_load_line_per_s)


__all__ = [
    "POLICIES",
    "PlannerConfig",
    "PlannerPolicy",
    "Prediction",
    "VariantChoice",
    "VariantState",
    "capacity_per_s",
    "choose_variant",
    "predict",
    "settled_batch_size",
]
