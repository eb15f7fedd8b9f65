"""A tenant's quota: a request-rate bucket, a token bucket and a cap on requests in flight,
decided together on explicit state (all or nothing), so the same rule can run in memory on
one replica and, as a Lua script, inside Redis for a fleet.

A reservation takes one request and an estimate of tokens (prompt + ``max_tokens``) at
admission; a settlement gives back what the estimate held above the exact count once it is
known (the slot kept); a release gives back what was not used (the whole reservation when
the request never ran) and frees its slot. Time comes in as ``now``; nothing here reads a clock.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from sluice.policy.capacity.token_bucket import BucketState, TokenBucket

#: The limit a refusal names. ``too_large``: the token estimate exceeds the token bucket's
#: capacity, so no amount of waiting admits it.
QUOTA_LIMITS = ("requests", "tokens", "concurrent", "too_large")


@dataclass(frozen=True, slots=True)
class QuotaLimits:
    """One tenant's limits; ``None`` leaves a dimension unlimited."""

    requests_per_s: float | None = None
    """Sustained request rate (> 0)."""
    request_burst: float = 1.0
    """Requests the bucket holds (>= 1): the largest burst admitted at once."""
    tokens_per_s: float | None = None
    """Sustained prompt + generated tokens per second (> 0)."""
    token_capacity: float = 1.0
    """Tokens the bucket holds (> 0): the largest single reservation."""
    max_concurrent: int | None = None
    """Requests admitted and not yet finished (>= 1)."""

    def __post_init__(self) -> None:
        for name, value in (("requests_per_s", self.requests_per_s),
                            ("tokens_per_s", self.tokens_per_s)):
            if value is not None and (not math.isfinite(value) or value <= 0):
                raise ValueError(f"{name} must be a finite number > 0 or None, got {value!r}")
        if not math.isfinite(self.request_burst) or self.request_burst < 1:
            raise ValueError(f"request_burst must be a finite number >= 1, "
                             f"got {self.request_burst!r}")
        if not math.isfinite(self.token_capacity) or self.token_capacity <= 0:
            raise ValueError(f"token_capacity must be a finite number > 0, "
                             f"got {self.token_capacity!r}")
        if self.max_concurrent is not None and (
            isinstance(self.max_concurrent, bool) or self.max_concurrent < 1
        ):
            raise ValueError(f"max_concurrent must be an int >= 1 or None, "
                             f"got {self.max_concurrent!r}")

    @property
    def unlimited(self) -> bool:
        """No dimension is limited."""
        return (self.requests_per_s is None and self.tokens_per_s is None
                and self.max_concurrent is None)

    def scaled(self, share: float) -> QuotaLimits:
        """This replica's part of the limits when it must enforce them alone (``0 < share
        <= 1``): rates, capacities and the concurrency cap times ``share``, but never a
        request burst below 1 nor a cap below 1, so a replica can always admit something."""
        if not 0 < share <= 1:
            raise ValueError(f"share must be in (0, 1], got {share!r}")
        return QuotaLimits(
            requests_per_s=None if self.requests_per_s is None else self.requests_per_s * share,
            request_burst=max(1.0, self.request_burst * share),
            tokens_per_s=None if self.tokens_per_s is None else self.tokens_per_s * share,
            token_capacity=self.token_capacity * share,
            max_concurrent=None if self.max_concurrent is None
            else max(1, math.ceil(self.max_concurrent * share)),
        )


@dataclass(frozen=True, slots=True)
class QuotaState:
    """What is stored between decisions; a bucket is ``None`` when its dimension is
    unlimited."""

    requests: BucketState | None
    tokens: BucketState | None
    in_flight: int = 0


@dataclass(frozen=True, slots=True)
class QuotaDecision:
    """The outcome of a reservation."""

    ok: bool
    state: QuotaState
    """The state to store: taken from when ``ok``, only refilled otherwise."""
    limit: str | None
    """``None`` when ``ok``; else the refusing limit with the longest wait (one of
    ``QUOTA_LIMITS``)."""
    retry_after_s: float
    """0 when ``ok``; else the wait after which every refusing limit would admit
    (``inf`` for ``too_large``)."""
    remaining_requests: float | None
    remaining_tokens: float | None


class TenantQuota:
    """The decision rule for one tenant's ``QuotaLimits``.

    Invariants: a reservation takes one request, ``tokens`` tokens and one slot from every
    limited dimension, or nothing at all; bucket levels stay within [0, capacity]; a
    release never lifts a bucket above its capacity nor ``in_flight`` below 0; a refusal's
    ``retry_after_s`` is the largest wait among the refusing limits, where a full
    concurrency cap waits ``concurrency_retry_s`` (a slot frees when some request ends,
    which no bucket predicts).
    """

    def __init__(self, limits: QuotaLimits, *, concurrency_retry_s: float = 1.0) -> None:
        if not math.isfinite(concurrency_retry_s) or concurrency_retry_s < 0:
            raise ValueError(f"concurrency_retry_s must be a finite number >= 0, "
                             f"got {concurrency_retry_s!r}")
        self.limits = limits
        self.concurrency_retry_s = concurrency_retry_s
        self.requests = (None if limits.requests_per_s is None
                         else TokenBucket(limits.requests_per_s, limits.request_burst))
        self.tokens = (None if limits.tokens_per_s is None
                       else TokenBucket(limits.tokens_per_s, limits.token_capacity))

    def initial(self, now: float) -> QuotaState:
        """Full buckets, nothing in flight."""
        return QuotaState(
            requests=None if self.requests is None else self.requests.initial(now),
            tokens=None if self.tokens is None else self.tokens.initial(now),
        )

    def fits(self, tokens: float) -> bool:
        """Whether a reservation of ``tokens`` can ever be admitted."""
        return self.tokens is None or tokens <= self.tokens.capacity

    def reserve(self, state: QuotaState, tokens: float, now: float) -> QuotaDecision:
        """Take one request, ``tokens`` tokens and a slot at ``now``, or say why not and
        how long to wait."""
        waits: list[tuple[float, str]] = []
        requests, tokens_state = state.requests, state.tokens
        if self.requests is not None:
            taken = self.requests.take(self._state(self.requests, requests, now), 1.0, now)
            requests = taken.state
            if not taken.ok:
                waits.append((taken.retry_after_s, "requests"))
        if self.tokens is not None:
            taken = self.tokens.take(self._state(self.tokens, tokens_state, now), tokens, now)
            tokens_state = taken.state
            if not taken.ok:
                waits.append((taken.retry_after_s,
                              "too_large" if tokens > self.tokens.capacity else "tokens"))
        cap = self.limits.max_concurrent
        if cap is not None and state.in_flight >= cap:
            waits.append((self.concurrency_retry_s, "concurrent"))
        if waits:
            # Nothing is taken: keep the refilled levels, not the taken ones.
            refilled = QuotaState(
                requests=None if self.requests is None
                else self.requests.refill(self._state(self.requests, state.requests, now), now),
                tokens=None if self.tokens is None
                else self.tokens.refill(self._state(self.tokens, state.tokens, now), now),
                in_flight=state.in_flight,
            )
            retry_s, limit = max(waits, key=lambda w: (w[0], QUOTA_LIMITS.index(w[1])))
            return QuotaDecision(False, refilled, limit, retry_s, _level(refilled.requests),
                                 _level(refilled.tokens))
        new = QuotaState(requests, tokens_state, state.in_flight + 1)
        return QuotaDecision(True, new, None, 0.0, _level(requests), _level(tokens_state))

    def release(
        self, state: QuotaState, *, refund_request: bool, refund_tokens: float, now: float
    ) -> QuotaState:
        """Free one slot and give back ``refund_tokens`` (and the request itself when
        ``refund_request``: it never ran)."""
        requests, tokens_state = state.requests, state.tokens
        if self.requests is not None and refund_request:
            requests = self.requests.give_back(self._state(self.requests, requests, now),
                                               1.0, now)
        if self.tokens is not None and refund_tokens > 0:
            tokens_state = self.tokens.give_back(self._state(self.tokens, tokens_state, now),
                                                 refund_tokens, now)
        return replace(state, requests=requests, tokens=tokens_state,
                       in_flight=max(0, state.in_flight - 1))

    def settle(self, state: QuotaState, refund_tokens: float, now: float) -> QuotaState:
        """Give back ``refund_tokens`` of a reservation still held (its estimate was an
        upper bound, settled to the exact count); its request and its slot stay taken."""
        if self.tokens is None or refund_tokens <= 0:
            return state
        tokens_state = self.tokens.give_back(self._state(self.tokens, state.tokens, now),
                                             refund_tokens, now)
        return replace(state, tokens=tokens_state)

    @staticmethod
    def _state(bucket: TokenBucket, state: BucketState | None, now: float) -> BucketState:
        # A dimension that was unlimited when the state was stored starts full.
        return bucket.initial(now) if state is None else state


def _level(state: BucketState | None) -> float | None:
    return None if state is None else state.tokens
