"""Where quota state lives: the ``QuotaStore`` protocol, what a store answers (``QuotaCheck``,
``Hold``, ``Settled``), the in-process ``MemoryQuotaStore`` (the pure rule of
``sluice.policy.capacity.quota``) and ``ScaledStore``, a memory store enforcing one replica's share
of each limit."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Protocol

from sluice.policy.capacity.quota import QuotaLimits, QuotaState, TenantQuota

CONCURRENCY_RETRY_S = 1.0
"""Retry-After for a full concurrency cap: a slot frees when a request ends, which no bucket
predicts, so the smallest whole second."""


class QuotaBackendError(Exception):
    """The shared store could not be reached or answered an error."""


@dataclass(frozen=True, slots=True)
class Hold:
    """What a granted reservation holds, for its release."""

    tenant_id: str
    limits: QuotaLimits
    """The limits it was charged under (a replica's share when local)."""
    member: str
    """The reservation's id (its concurrency slot)."""
    charged_tokens: float
    shared: bool
    """Charged in the shared store (Redis) rather than this replica's buckets."""


@dataclass(frozen=True, slots=True)
class QuotaCheck:
    """A store's answer to a reservation."""

    ok: bool
    limit: str | None
    """``None`` when ``ok``; else ``requests``, ``tokens``, ``concurrent`` or ``too_large``."""
    retry_after_s: float
    remaining_requests: float | None
    remaining_tokens: float | None
    in_flight: int | None
    hold: Hold | None
    """Set when ``ok``: pass it to ``release``."""
    limits: QuotaLimits
    """The limits it was decided under."""

    @property
    def shared(self) -> bool:
        return self.hold.shared if self.hold is not None else False


@dataclass(frozen=True, slots=True)
class Settled:
    """A store's answer to a settlement."""

    hold: Hold
    """The hold as it stands (pass it to ``release``)."""
    remaining_tokens: float | None
    """The token bucket's level after the refund (``None``: unlimited, or nothing given
    back)."""


class QuotaStore(Protocol):
    """Where quota state lives. ``reserve`` is all or nothing; ``settle`` lowers a granted
    reservation's tokens to an exact count (an upper bound was reserved), giving the
    difference back at once and keeping its request and slot, and never takes more;
    ``release`` undoes one granted reservation's slot and gives back what it is told to
    (never above capacity)."""

    async def reserve(self, tenant_id: str, limits: QuotaLimits, tokens: float, member: str,
                      lease_s: float) -> QuotaCheck: ...

    async def settle(self, hold: Hold, tokens: float) -> Settled:
        """Charge ``hold`` ``tokens`` at most; the hold unchanged when it held no more, or
        when the store cannot settle now (its release then refunds the rest)."""
        ...

    async def release(self, hold: Hold, *, refund_request: bool, refund_tokens: float) -> None:
        ...

    async def aclose(self) -> None: ...


class MemoryQuotaStore:
    """Quota state in this process, decided by ``TenantQuota``; owned by one event loop.

    ``clamp_to_capacity``: charge at most the bucket's capacity (a replica's share of a token
    budget may be smaller than one request; the request then empties the local bucket).
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic, *,
                 clamp_to_capacity: bool = False) -> None:
        self._clock = clock
        self._clamp = clamp_to_capacity
        self._states: dict[str, tuple[QuotaLimits, QuotaState]] = {}
        self._rules: dict[QuotaLimits, TenantQuota] = {}

    def _rule(self, limits: QuotaLimits) -> TenantQuota:
        rule = self._rules.get(limits)
        if rule is None:
            rule = self._rules[limits] = TenantQuota(limits,
                                                     concurrency_retry_s=CONCURRENCY_RETRY_S)
        return rule

    def _state(self, tenant_id: str, rule: TenantQuota, now: float) -> QuotaState:
        held = self._states.get(tenant_id)
        if held is None:
            return rule.initial(now)
        limits, state = held
        if limits != rule.limits:  # limits changed: keep levels and slots, clamp by refill
            state = QuotaState(state.requests if rule.requests else None,
                               state.tokens if rule.tokens else None, state.in_flight)
        return state

    async def reserve(self, tenant_id: str, limits: QuotaLimits, tokens: float, member: str,
                      lease_s: float) -> QuotaCheck:
        now = self._clock()
        rule = self._rule(limits)
        if self._clamp and rule.tokens is not None:
            tokens = min(tokens, rule.tokens.capacity)
        decision = rule.reserve(self._state(tenant_id, rule, now), tokens, now)
        self._states[tenant_id] = (limits, decision.state)
        hold = Hold(tenant_id, limits, member, tokens if rule.tokens else 0.0, shared=False)
        return QuotaCheck(decision.ok, decision.limit, decision.retry_after_s,
                          decision.remaining_requests, decision.remaining_tokens,
                          decision.state.in_flight, hold if decision.ok else None, limits)

    async def settle(self, hold: Hold, tokens: float) -> Settled:
        refund_tokens = hold.charged_tokens - max(0.0, tokens)
        if refund_tokens <= 0:
            return Settled(hold, None)
        now = self._clock()
        rule = self._rule(hold.limits)
        state = rule.settle(self._state(hold.tenant_id, rule, now), refund_tokens, now)
        self._states[hold.tenant_id] = (hold.limits, state)
        return Settled(replace(hold, charged_tokens=hold.charged_tokens - refund_tokens),
                       None if state.tokens is None else state.tokens.tokens)

    async def release(self, hold: Hold, *, refund_request: bool, refund_tokens: float) -> None:
        now = self._clock()
        rule = self._rule(hold.limits)
        state = rule.release(self._state(hold.tenant_id, rule, now),
                             refund_request=refund_request, refund_tokens=refund_tokens, now=now)
        self._states[hold.tenant_id] = (hold.limits, state)

    def state(self, tenant_id: str) -> QuotaState | None:
        """The stored state (tests and metrics)."""
        held = self._states.get(tenant_id)
        return None if held is None else held[1]

    async def aclose(self) -> None:
        return None


class ScaledStore:
    """A memory store that enforces ``share`` of each limit (``quota.replicas`` > 1 without
    Redis: each replica keeps its part)."""

    def __init__(self, inner: MemoryQuotaStore, share: float) -> None:
        self.inner = inner
        self.share = share

    async def reserve(self, tenant_id: str, limits: QuotaLimits, tokens: float, member: str,
                      lease_s: float) -> QuotaCheck:
        if self.share < 1:
            limits = limits.scaled(self.share)
        return await self.inner.reserve(tenant_id, limits, tokens, member, lease_s)

    async def settle(self, hold: Hold, tokens: float) -> Settled:
        return await self.inner.settle(hold, tokens)

    async def release(self, hold: Hold, *, refund_request: bool, refund_tokens: float) -> None:
        await self.inner.release(hold, refund_request=refund_request,
                                 refund_tokens=refund_tokens)

    async def aclose(self) -> None:
        await self.inner.aclose()
