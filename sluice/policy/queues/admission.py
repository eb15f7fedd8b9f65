"""Admission: reject at once what cannot be served in time, with a computed Retry-After.

A rejection is a return value (``Rejection``); ``None`` means admitted. The suggestions for
when to retry come from the numbers (backlog over completion rate, predicted wait), clamped
to the configured range, never from a constant.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

REJECT_REASONS = (
    "queue_full",
    "deadline_infeasible",
    "quota",
    "draining",
    "no_feasible_worker",
    "too_large",
)


@dataclass(frozen=True, slots=True)
class Rejection:
    """Why a request was refused, and when to try again."""

    reason: str
    """One of ``REJECT_REASONS``."""
    retry_after_s: float
    """>= 0: a suggestion computed from the numbers."""
    message: str
    """Human-readable; names the numbers."""

    def __post_init__(self) -> None:
        if self.reason not in REJECT_REASONS:
            raise ValueError(f"reason must be one of {REJECT_REASONS}, got {self.reason!r}")
        if not self.retry_after_s >= 0:
            raise ValueError(f"retry_after_s must be >= 0, got {self.retry_after_s!r}")


@dataclass(frozen=True, slots=True)
class AdmissionConfig:
    """Bounds on what is admitted, and the range of Retry-After suggestions."""

    queue_capacity: int
    """Global queue bound (>= 1)."""
    min_retry_after_s: float = 1.0
    """Smallest Retry-After suggested (>= 0)."""
    max_retry_after_s: float = 60.0
    """Largest Retry-After suggested (>= min_retry_after_s)."""

    def __post_init__(self) -> None:
        value = self.queue_capacity
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"queue_capacity must be an int >= 1, got {value!r}")
        if not math.isfinite(self.min_retry_after_s) or self.min_retry_after_s < 0:
            raise ValueError(
                f"min_retry_after_s must be a finite number >= 0, got {self.min_retry_after_s!r}"
            )
        if not math.isfinite(self.max_retry_after_s) or (
            self.max_retry_after_s < self.min_retry_after_s
        ):
            raise ValueError(
                f"max_retry_after_s must be finite and >= min_retry_after_s "
                f"({self.min_retry_after_s}), got {self.max_retry_after_s!r}"
            )


def clamp_retry_after(seconds: float, lo: float, hi: float) -> float:
    """``seconds`` clamped to [lo, hi]; ``hi`` when it is not a number."""
    if math.isnan(seconds):
        return hi
    return min(hi, max(lo, seconds))


def retry_after_for_backlog(excess: int, completions_per_s: float, lo: float, hi: float) -> float:
    """Time for ``excess`` completions at ``completions_per_s``, clamped to [lo, hi].

    With no measured completion rate yet (``<= 0``, e.g. a server that has just started)
    one completion per ``ASSUMED_SECONDS_PER_COMPLETION`` is assumed, so a first burst is
    told to come back soon rather than after the maximum.
    """
    if not completions_per_s > 0:
        completions_per_s = 1.0 / ASSUMED_SECONDS_PER_COMPLETION
    return clamp_retry_after(max(0, excess) / completions_per_s, lo, hi)


ASSUMED_SECONDS_PER_COMPLETION = 1.0
"""Retry-After's guess for the drain rate before any completion has been measured."""


class AdmissionPolicy:
    """Decides whether a request enters the global queue.

    Checks, in order: draining; ``queue_depth >= queue_capacity`` (queue_full); a deadline that
    ``now + predicted_wait_s + predicted_service_s`` would miss (deadline_infeasible). Returns
    ``None`` to admit. Every rejection's ``retry_after_s`` lies in
    [min_retry_after_s, max_retry_after_s].
    """

    def __init__(self, config: AdmissionConfig) -> None:
        self.config = config

    def retry_after(self, excess: int, completions_per_s: float) -> float:
        """``retry_after_for_backlog`` with this policy's clamp range."""
        return retry_after_for_backlog(
            excess, completions_per_s, self.config.min_retry_after_s, self.config.max_retry_after_s
        )

    def decide(
        self,
        *,
        queue_depth: int,
        completions_per_s: float,
        now: float,
        deadline_s: float | None = None,
        predicted_wait_s: float = 0.0,
        predicted_service_s: float = 0.0,
        draining: bool = False,
    ) -> Rejection | None:
        """A ``Rejection``, or ``None`` to admit. ``ValueError`` on negative inputs."""
        for field, value in (
            ("queue_depth", queue_depth),
            ("predicted_wait_s", predicted_wait_s),
            ("predicted_service_s", predicted_service_s),
        ):
            if not value >= 0:
                raise ValueError(f"{field} must be >= 0, got {value!r}")
        config = self.config
        rate = f"{completions_per_s:.3g}/s" if completions_per_s > 0 else "no measured rate"
        if draining:
            # A drained replica goes away once its queue is served: until then, try elsewhere.
            retry_s = self.retry_after(queue_depth, completions_per_s)
            return Rejection(
                "draining",
                retry_s,
                f"server is draining: {queue_depth} queued at {rate}; retry in {retry_s:.3g} s",
            )
        if queue_depth >= config.queue_capacity:
            excess = queue_depth - config.queue_capacity + 1
            retry_s = self.retry_after(excess, completions_per_s)
            return Rejection(
                "queue_full",
                retry_s,
                f"queue full: {queue_depth} queued, capacity {config.queue_capacity}, "
                f"completing {rate}; retry in {retry_s:.3g} s",
            )
        if deadline_s is not None:
            finish_s = now + predicted_wait_s + predicted_service_s
            if finish_s > deadline_s:
                retry_s = clamp_retry_after(
                    predicted_wait_s, config.min_retry_after_s, config.max_retry_after_s
                )
                return Rejection(
                    "deadline_infeasible",
                    retry_s,
                    f"deadline infeasible: predicted wait {predicted_wait_s:.3g} s + service "
                    f"{predicted_service_s:.3g} s finishes {finish_s - deadline_s:.3g} s after "
                    f"the deadline; retry in {retry_s:.3g} s",
                )
        return None
