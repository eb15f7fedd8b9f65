"""Online service-time estimation: a profiled batch-time curve × an EWMA drift factor,
corrected for the batch's longest input (``ServiceEstimator``), and its parts — the
moving average (``Ewma``), the length fit (``LengthSlope``) and the profile's measured
start for it (``LengthPrior``). The variant planner predicts service with these."""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


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


__all__ = ["Ewma", "LengthPrior", "LengthSlope", "ServiceEstimator"]
