"""The variant planner: per request, the most accurate variant of a model group whose
predicted sojourn time meets the request's deadline. Pure: numbers in, a plain
``VariantChoice`` out; time, rates and backlog are arguments.

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

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from sluice.policy.backlog import (
    NO_MARGIN,
    Backlog,
    BatchCurves,
    LengthScale,
    Margin,
    placement,
)

PlannerPolicy = Literal["adaptive", "accurate", "fastest"]
POLICIES: tuple[PlannerPolicy, ...] = ("adaptive", "accurate", "fastest")


# -- queueing math --------------------------------------------------------------------------


def erlang_c(servers: int, offered_load: float) -> float:
    """Probability that an arrival waits in an M/M/c queue (Erlang's C formula).

    ``offered_load`` is ``a = λ/μ`` in Erlangs. Computed through the Erlang-B recursion,
    which stays finite for large ``c``. Returns 1.0 when ``a >= c`` (no steady state:
    every arrival waits).
    """
    if servers < 1:
        raise ValueError(f"servers must be >= 1, got {servers}")
    if not offered_load >= 0 or math.isnan(offered_load):
        raise ValueError(f"offered_load must be >= 0, got {offered_load!r}")
    if offered_load == 0:
        return 0.0
    if offered_load >= servers:
        return 1.0
    blocking = 1.0
    for k in range(1, servers + 1):
        blocking = offered_load * blocking / (k + offered_load * blocking)
    return servers * blocking / (servers - offered_load * (1.0 - blocking))


def mmc_wait_s(arrival_per_s: float, service_s: float, servers: int) -> float:
    """Mean time in queue (before service) of an M/M/c queue: ``C(c, a) / (cμ - λ)``.

    ``math.inf`` when the queue is unstable (``λ >= cμ``); 0 with no arrivals.
    """
    if not arrival_per_s >= 0:
        raise ValueError(f"arrival_per_s must be >= 0, got {arrival_per_s!r}")
    if not service_s > 0:
        raise ValueError(f"service_s must be > 0, got {service_s!r}")
    if arrival_per_s == 0:
        return 0.0
    offered = arrival_per_s * service_s
    if offered >= servers:
        return math.inf
    return erlang_c(servers, offered) * service_s / (servers - offered)


# -- online service-time estimation -----------------------------------------------------------


class Ewma:
    """An exponentially weighted moving average: ``v ← (1 - α) v + α x``.

    Invariant: ``value`` is ``None`` until the first sample, then the first sample, then
    the weighted average; after a step change the error shrinks by ``(1 - α)`` per sample.
    """

    def __init__(self, alpha: float, initial: float | None = None) -> None:
        if not 0 < alpha <= 1:
            raise ValueError(f"alpha must be in (0, 1], got {alpha!r}")
        self.alpha = alpha
        self.value = initial
        self.samples = 0

    def update(self, sample: float) -> float:
        """Fold in one sample; returns the new value."""
        if not math.isfinite(sample):
            raise ValueError(f"sample must be finite, got {sample!r}")
        self.samples += 1
        if self.value is None:
            self.value = sample
        else:
            self.value += self.alpha * (sample - self.value)
        return self.value


@dataclass(frozen=True, slots=True)
class LengthPrior:
    """A measured start for ``LengthSlope``: from ``sluice profile``, which times batches of
    real texts of differing lengths (``sluice.prep.profile.length_fit``).

    A batch's length is its longest input in units of ``typical_longest_chars`` at its
    size (the profile's mean longest input for batches of that size), so every profiled
    size is centred at 1 where its profiled time is (batches of 8 have longer longest
    inputs than batches of 1, at no extra cost over their own curve); with
    ``typical_longest_chars`` empty (profiles from before) it is in characters."""

    slope: float
    """``d(observed / profiled) / d(length)`` over the profile's batches (>= 0)."""
    mean: float
    """The profile batches' mean length: where the ratio is 1."""
    var: float
    """Their variance: how much the prior's spread of lengths weighs."""
    typical_longest_chars: tuple[tuple[int, float], ...] = ()
    """``(batch size, mean longest input in characters)`` of the profile's batches."""

    def __post_init__(self) -> None:
        for name in ("slope", "mean", "var"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
        for b, chars in self.typical_longest_chars:
            if b < 1 or not (math.isfinite(chars) and chars > 0):
                raise ValueError(f"typical_longest_chars needs batch sizes >= 1 with "
                                 f"characters > 0, got {(b, chars)!r}")

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> LengthPrior:
        """``sluice profile``'s length fit (a model's ``options.length_prior``, a profile's
        ``variants.*.length``): ``{slope, mean, var, typical_longest_chars = {batch size:
        chars}}``, or the older ``{slope_per_char, mean_chars, var_chars}`` (lengths in
        characters)."""
        d = dict(raw)
        if "slope_per_char" in d:
            return cls(float(d["slope_per_char"]), float(d["mean_chars"]),
                       float(d["var_chars"]))
        typical = tuple(sorted((int(b), float(c))
                               for b, c in dict(d.get("typical_longest_chars") or {}).items()))
        return cls(float(d["slope"]), float(d["mean"]), float(d["var"]), typical)


class LengthSlope:
    """How a batch's time grows with its longest input: an exponentially weighted
    least-squares slope of ``y`` (observed / profiled time) on ``x`` (the longest
    member's length, characters), and the weighted mean ``x``.

    A batch is padded to its longest member, and a transformer's time grows with the
    tokens it runs, so one long text can take three times the profile's mean (mpnet
    FP32 at batch 1 on one thread: 35 ms for 3 words, 145 ms for 47). Invariant: the
    slope is 0 until ``min_samples`` batches with differing lengths were seen, and
    never negative (a longer input is never predicted faster). With a ``prior`` (measured
    by the profile) it starts as if ``min_samples`` batches with the prior's mean,
    variance and slope had been seen, so a cold server sizes batches by length from its
    first request, and its own batches take over at the same weights as without one.
    """

    def __init__(self, alpha: float = 0.02, min_samples: int = 20,
                 prior: LengthPrior | None = None) -> None:
        if not 0 < alpha <= 1 or min_samples < 2:
            raise ValueError(f"need alpha in (0, 1], min_samples >= 2; got {alpha}, "
                             f"{min_samples}")
        self.alpha = alpha
        self.min_samples = min_samples
        self.samples = 0
        self.mean_x = 0.0
        self._mean_y = 0.0
        self._var_x = 0.0
        self._cov_xy = 0.0
        if prior is not None and prior.mean > 0 and prior.var > 0:
            self.samples = min_samples
            self.mean_x, self._mean_y = prior.mean, 1.0
            self._var_x = prior.var
            self._cov_xy = prior.slope * prior.var

    def add(self, x: float, y: float) -> None:
        """One batch: its length (``ServiceEstimator.length_of``) and its observed /
        profiled time."""
        if not (x > 0 and math.isfinite(x) and math.isfinite(y)):
            return
        self.samples += 1
        if self.samples == 1:
            self.mean_x, self._mean_y = x, y
            return
        a = max(self.alpha, 1.0 / self.samples)  # a plain mean while samples are few
        dx, dy = x - self.mean_x, y - self._mean_y
        self.mean_x += a * dx
        self._mean_y += a * dy
        self._var_x = (1 - a) * (self._var_x + a * dx * dx)
        self._cov_xy = (1 - a) * (self._cov_xy + a * dx * dy)

    def state(self) -> dict[str, float]:
        """What it has fitted (plain JSON; ``restore`` takes it back)."""
        return {"samples": self.samples, "mean_x": self.mean_x, "mean_y": self._mean_y,
                "var_x": self._var_x, "cov_xy": self._cov_xy}

    def restore(self, state: Mapping[str, Any]) -> None:
        """Continue from another fit's ``state`` (a live server's, for a simulation)."""
        self.samples = int(state["samples"])
        self.mean_x, self._mean_y = float(state["mean_x"]), float(state["mean_y"])
        self._var_x, self._cov_xy = float(state["var_x"]), float(state["cov_xy"])

    @property
    def slope(self) -> float:
        """``d(observed / profiled) / d(length)`` (>= 0)."""
        if self.samples < self.min_samples or self._var_x <= 0:
            return 0.0
        return max(0.0, self._cov_xy / self._var_x)


class ServiceEstimator:
    """Batch service time as a function of batch size and the longest input: a profiled
    curve × an online drift factor, corrected for the input's length.

    The profile (``{batch_size: seconds}``, from ``sluice profile``) gives the shape; each
    completed batch updates an EWMA of ``observed / profiled`` so the whole curve follows
    drift (a slower machine, a noisy neighbour) while keeping the batching shape. Batches
    whose longest input is known also fit how that ratio grows with the batch's length
    (``length_of``: its longest input over the typical longest at its size, or characters
    without a profiled ``LengthPrior``; ``LengthSlope``), so a batch of length ``x`` is
    predicted at ``drift + slope × (x - x_drift)`` (at least a quarter of the drift), where
    ``x_drift`` is the mean length of the batches the drift averaged (an EWMA at the
    drift's own rate): the drift is the ratio observed at that length, so the correction
    starts there — not at the profile's mean, which a server's own traffic need not share.
    With the length unknown (0) it is the drift alone.
    Between profiled sizes the curve is interpolated linearly; past the largest size it
    grows by the last per-item slope.
    """

    MIN_LENGTH_FACTOR = 0.25
    """The length correction never predicts a batch below this share of the drift."""

    def __init__(self, profile_s: Mapping[int, float], alpha: float = 0.1,
                 length_prior: LengthPrior | None = None) -> None:
        points = sorted((int(b), float(s)) for b, s in profile_s.items())
        if not points:
            raise ValueError("profile_s must have at least one batch size")
        for b, s in points:
            if b < 1 or not s > 0 or not math.isfinite(s):
                raise ValueError(f"profile_s[{b}] must be a batch size >= 1 with seconds > 0")
        self._points = points
        self.drift = Ewma(alpha, initial=1.0)
        self.length = LengthSlope(prior=length_prior)
        prior_x = length_prior.mean if length_prior is not None and length_prior.mean > 0 \
            else None
        self.drift_length = Ewma(alpha, initial=prior_x)
        """The mean length of the batches behind ``drift`` (``None``: none known)."""
        self._typical = sorted(length_prior.typical_longest_chars) if length_prior else []

    def length_of(self, longest: int, batch_size: int) -> float:
        """A batch's length as the length model measures it: ``longest`` characters over
        the profile's typical longest input at ``batch_size`` (interpolated between
        profiled sizes, the nearest beyond them), or ``longest`` itself without one."""
        pts = self._typical
        if not pts:
            return float(longest)
        if batch_size <= pts[0][0]:
            return longest / pts[0][1]
        for (b0, c0), (b1, c1) in itertools.pairwise(pts):
            if batch_size <= b1:
                return longest / (c0 + (c1 - c0) * (batch_size - b0) / (b1 - b0))
        return longest / pts[-1][1]

    def profiled_batch_s(self, batch_size: int) -> float:
        """The profile's batch time at ``batch_size`` (no drift)."""
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        pts = self._points
        if len(pts) == 1:
            b0, s0 = pts[0]
            return s0 * batch_size / b0 if batch_size > b0 else s0
        if batch_size <= pts[0][0]:
            return pts[0][1]
        for (b0, s0), (b1, s1) in itertools.pairwise(pts):
            if batch_size <= b1:
                return s0 + (s1 - s0) * (batch_size - b0) / (b1 - b0)
        (b0, s0), (b1, s1) = pts[-2], pts[-1]
        slope = max((s1 - s0) / (b1 - b0), 0.0)
        return s1 + slope * (batch_size - b1)

    def factor(self, longest: int = 0, batch_size: int = 1) -> float:
        """Observed over profiled time predicted for a batch of ``batch_size`` whose
        longest input has ``longest`` characters (0: unknown, the drift alone)."""
        drift = self.drift.value if self.drift.value is not None else 1.0
        if longest <= 0:
            return drift
        centre = self.drift_length.value
        if centre is None:
            centre = self.length.mean_x
        x = self.length_of(longest, batch_size)
        return max(self.MIN_LENGTH_FACTOR * drift, drift + self.length.slope * (x - centre))

    def batch_s(self, batch_size: int, longest: int = 0) -> float:
        """Predicted time of one batch of ``batch_size`` whose longest input has
        ``longest`` characters (0: unknown)."""
        return self.profiled_batch_s(batch_size) * self.factor(longest, batch_size)

    def per_item_s(self, batch_size: int) -> float:
        """Predicted time per request when batches hold ``batch_size``."""
        return self.batch_s(batch_size) / batch_size

    def state(self) -> dict[str, Any]:
        """What it has learned, as plain JSON (``/status.json`` publishes it per variant; a
        simulator's cost file takes it as ``estimate``): the drift, the batches behind
        it, the mean length they had, and the length fit."""
        return {"drift": self.drift.value, "drift_samples": self.drift.samples,
                "drift_length": self.drift_length.value, "length": self.length.state()}

    def restore(self, state: Mapping[str, Any]) -> None:
        """Continue from another estimator's ``state`` (same profile and prior): predicts
        what that one predicts, and keeps learning from there."""
        drift, length = state.get("drift"), state.get("drift_length")
        self.drift.value = None if drift is None else float(drift)
        self.drift.samples = int(state.get("drift_samples", 0))
        self.drift_length.value = None if length is None else float(length)
        if state.get("length"):
            self.length.restore(state["length"])

    def observe(self, batch_size: int, seconds: float, longest: int = 0) -> None:
        """Fold in one completed batch (``longest``: its longest input, 0 unknown)."""
        if batch_size < 1 or not seconds > 0:
            return
        ratio = seconds / self.profiled_batch_s(batch_size)
        self.drift.update(ratio)
        if longest > 0:
            x = self.length_of(longest, batch_size)
            self.drift_length.update(x)
            self.length.add(x, ratio)


# -- the choice ---------------------------------------------------------------------------------


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
    wait is when the batch the request would join starts (``sluice.policy.backlog``),
    and its service that batch's time. ``steady_state=False`` leaves the Erlang-C term
    out (the planner does so below the low-load line, where the queue is the state).
    ``queued_curves``: batch curves of the variants queued in ``backlog`` that are not
    among ``variants`` (a request naming one variant queues behind the others).
    A variant that is not the fastest must leave room after it for one more request on
    the fastest (``pessimism × S_fastest(1)``): a queue filled to the deadline with slow
    work would leave the next arrival no variant at all. ``margin``: the planner's measured
    error, kept free after each variant's predicted sojourn (``meets_deadline`` only).
    ``length``: the request's input in characters and ``scale`` how a batch's time grows
    with its longest member (``sluice.policy.backlog.LengthScale``; with a backlog only).
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

    With ``backlog`` (the pool's queued and running work, ``sluice.policy.backlog``) the
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
    "Ewma",
    "LengthPrior",
    "LengthSlope",
    "PlannerConfig",
    "PlannerPolicy",
    "Prediction",
    "ServiceEstimator",
    "VariantChoice",
    "VariantState",
    "capacity_per_s",
    "choose_variant",
    "erlang_c",
    "mmc_wait_s",
    "predict",
    "settled_batch_size",
]
