"""Token-bucket arithmetic for tenant quotas, on explicit state (so Redis can hold the state).

The bucket is a frozen rule; ``BucketState`` is the value stored between calls. Every method
returns a new state and reads no clock.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

# Float rounding can leave a refill one ulp short of the computed instant; this many nudges of
# the retry time are far more than ever needed.
_MAX_NUDGES = 256


@dataclass(frozen=True, slots=True)
class BucketState:
    """Tokens in the bucket as of ``updated_s``."""

    tokens: float
    updated_s: float


@dataclass(frozen=True, slots=True)
class TakeResult:
    """The outcome of a take."""

    ok: bool
    state: BucketState
    """The state to store: tokens taken when ``ok``, only refilled otherwise."""
    retry_after_s: float
    """0 when ``ok``; else the wait after which the same take from ``state`` succeeds
    (``inf`` if the amount exceeds the capacity)."""


@dataclass(frozen=True, slots=True)
class TokenBucket:
    """Refills at ``rate_per_s`` up to ``capacity``.

    Invariants: tokens stay within [0, capacity]; a clock going backwards adds nothing; a
    failed take's ``retry_after_s`` is exact in floating point: taking the same amount from
    the returned state at ``now + retry_after_s`` succeeds.
    """

    rate_per_s: float
    """Tokens added per second (> 0)."""
    capacity: float
    """Most tokens the bucket holds (> 0): the largest burst."""

    def __post_init__(self) -> None:
        for field, value in (("rate_per_s", self.rate_per_s), ("capacity", self.capacity)):
            if not math.isfinite(value) or value <= 0:
                raise ValueError(f"{field} must be a finite number > 0, got {value!r}")

    def initial(self, now: float) -> BucketState:
        """A full bucket at ``now``."""
        return BucketState(self.capacity, now)

    def refill(self, state: BucketState, now: float) -> BucketState:
        """``state`` brought forward to ``now``: min(capacity, tokens + rate * elapsed).

        If ``now`` is not after ``state.updated_s`` nothing is added and the time stays.
        """
        elapsed_s = now - state.updated_s
        if elapsed_s <= 0:
            if state.tokens <= self.capacity:
                return state
            return BucketState(self.capacity, state.updated_s)
        tokens = min(self.capacity, state.tokens + self.rate_per_s * elapsed_s)
        return BucketState(tokens, now)

    def take(self, state: BucketState, amount: float, now: float) -> TakeResult:
        """Take ``amount`` tokens at ``now`` if there are enough; else say how long to wait."""
        _check_amount(amount)
        current = self.refill(state, now)
        if current.tokens >= amount:
            return TakeResult(True, BucketState(current.tokens - amount, current.updated_s), 0.0)
        if amount > self.capacity:
            return TakeResult(False, current, math.inf)
        return TakeResult(False, current, self._retry_after(state, current, amount, now))

    def give_back(self, state: BucketState, amount: float, now: float) -> BucketState:
        """Refund ``amount`` tokens (e.g. an over-estimate), capped at the capacity."""
        _check_amount(amount)
        current = self.refill(state, now)
        return BucketState(min(self.capacity, current.tokens + amount), current.updated_s)

    def _retry_after(
        self, state: BucketState, current: BucketState, amount: float, now: float
    ) -> float:
        start_s = max(now, current.updated_s)
        retry_s = max(0.0, start_s + (amount - current.tokens) / self.rate_per_s - now)
        for _ in range(_MAX_NUDGES):
            at_s = now + retry_s
            # Both the stored state and the one it came from must have refilled enough.
            if (
                self.refill(current, at_s).tokens >= amount
                and self.refill(state, at_s).tokens >= amount
            ):
                return retry_s
            retry_s = max(math.nextafter(retry_s, math.inf), math.nextafter(at_s, math.inf) - now)
        # Unreachable for finite inputs; a safe over-estimate rather than an exact one.
        return retry_s * 2.0 + 1e-9


def _check_amount(amount: float) -> None:
    if not amount >= 0 or math.isinf(amount):
        raise ValueError(f"amount must be a finite number >= 0, got {amount!r}")
