"""``RedisQuotaStore``: quota state in Redis, shared by every replica pointed at it.

One atomic Lua script per reservation, per settlement and per release (``reserve.lua``,
``settle.lua``, ``release.lua``, each after ``_prelude.lua``; package resources beside this
module) apply the same rule as ``TenantQuota``, on Redis's clock. A granted reservation leaves
a hold key recording what it charged; a settlement lowers it (refunding the difference) and a
release refunds from it once, so neither gives back what was not charged, releases are safe
to replay and a reservation whose reply was lost (a timeout) can be cancelled.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import Callable
from dataclasses import replace
from importlib.resources import files
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from sluice.policy.capacity.quota import QuotaLimits
from sluice.server.quota.stores import (
    CONCURRENCY_RETRY_S,
    Hold,
    QuotaBackendError,
    QuotaCheck,
    Settled,
)


def _lua(name: str) -> str:
    return files(__package__).joinpath(name).read_text(encoding="utf-8")


RESERVE_LUA = _lua("_prelude.lua") + _lua("reserve.lua")
SETTLE_LUA = _lua("_prelude.lua") + _lua("settle.lua")
RELEASE_LUA = _lua("_prelude.lua") + _lua("release.lua")
PROBE_LUA = "return redis.call('SET', KEYS[1], ARGV[1], 'PX', 60000)"
"""A write from a script: what reservations need, so a Redis that answers PING but refuses
scripts or writes (a read-only replica, out of memory) fails the probe too."""


def redact_url(url: str) -> str:
    """``url`` without its password, for logs."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.hostname or ""
    netloc = f"{parts.username or ''}:***@{host}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit(parts._replace(netloc=netloc))


def _num(value: float | None) -> str:
    return "0" if value is None else repr(float(value))


REFUSING_LIMITS = frozenset({"requests", "tokens", "too_large", "concurrent"})
"""The limits ``reserve.lua`` may name in a refusal."""


def parse_reserve_reply(reply: Any) -> tuple[bool, str, float, float, float, int]:
    """``reserve.lua``'s reply as (ok, refusing limit, retry after s, request tokens left,
    token tokens left, in flight); ``QuotaBackendError`` for anything else: another shape,
    a value that is not a number, a refusal naming no known limit, a negative or infinite
    wait (only ``too_large`` waits forever), a level that is not finite (a tampered or
    corrupt bucket)."""
    try:
        ok_raw, limit, retry_raw, rt_raw, tt_raw, in_flight_raw = reply
        ok, retry = int(ok_raw), float(retry_raw)
        rt, tt, in_flight = float(rt_raw), float(tt_raw), int(in_flight_raw)
    except (TypeError, ValueError) as exc:
        raise QuotaBackendError(f"unexpected reply from the reserve script: {exc}") from None
    refused_ok = ok == 0 and limit in REFUSING_LIMITS and (
        math.isfinite(retry) or limit == "too_large")
    granted_ok = ok == 1 and limit == "" and retry == 0
    if not (refused_ok or granted_ok) or retry < 0 or in_flight < 0 \
            or not (math.isfinite(rt) and math.isfinite(tt)):
        raise QuotaBackendError(f"unexpected reply from the reserve script: {reply!r:.200}")
    return bool(ok), str(limit), retry, rt, tt, in_flight


class RedisQuotaStore:
    """Quota state in Redis, one Lua script per reservation, per settlement and per release.

    ``clock``: ``None`` decides on Redis's own clock (``TIME``), which every replica shares;
    tests pass an explicit clock to compare the script with ``TenantQuota`` step by step (the
    keys then get no expiry). Raises ``QuotaBackendError`` on any failure: unreachable, an
    error reply, a timeout, or a reply of an unexpected shape or value.
    """

    def __init__(self, url: str, *, key_prefix: str = "sluice", timeout_s: float = 0.25,
                 clock: Callable[[], float] | None = None) -> None:
        import redis.asyncio as aioredis
        from redis.asyncio.retry import Retry
        from redis.backoff import NoBackoff

        self.url = url
        self._prefix = key_prefix
        self._timeout_s = timeout_s
        self._clock = clock
        self._client: Any = aioredis.Redis.from_url(
            url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s,
            retry=Retry(NoBackoff(), 0), decode_responses=True,
        )
        self._reserve = self._client.register_script(RESERVE_LUA)
        self._settle = self._client.register_script(SETTLE_LUA)
        self._release = self._client.register_script(RELEASE_LUA)
        self._probe = self._client.register_script(PROBE_LUA)

    def keys(self, tenant_id: str) -> tuple[str, str]:
        """The tenant's bucket hash and in-flight sorted set."""
        base = f"{self._prefix}:quota:{{{tenant_id}}}"
        return f"{base}:bucket", f"{base}:inflight"

    def hold_key(self, tenant_id: str, member: str) -> str:
        """A granted reservation's hold (the tokens it charged), until released or leased
        out; in the tenant's hash slot."""
        return f"{self._prefix}:quota:{{{tenant_id}}}:hold:{member}"

    def _now_arg(self) -> str:
        return "" if self._clock is None else repr(self._clock())

    async def _call(self, awaitable: Any) -> Any:
        try:
            return await asyncio.wait_for(awaitable, self._timeout_s * 2)
        except Exception as exc:  # RedisError, OSError, a timeout, a reply it cannot parse
            raise QuotaBackendError(f"{type(exc).__name__}: {exc}") from exc

    async def reserve(self, tenant_id: str, limits: QuotaLimits, tokens: float, member: str,
                      lease_s: float) -> QuotaCheck:
        args = [
            self._now_arg(),
            _num(limits.requests_per_s), _num(limits.request_burst),
            _num(limits.tokens_per_s), _num(limits.token_capacity), _num(tokens),
            str(limits.max_concurrent or 0), member, _num(lease_s), _num(CONCURRENCY_RETRY_S),
        ]
        keys = [*self.keys(tenant_id), self.hold_key(tenant_id, member)]
        reply = await self._call(self._reserve(keys=keys, args=args))
        ok, limit, retry, rt, tt, in_flight = parse_reserve_reply(reply)
        hold = Hold(tenant_id, limits, member, tokens if limits.tokens_per_s else 0.0,
                    shared=True)
        return QuotaCheck(
            ok=ok, limit=None if ok else limit, retry_after_s=0.0 if ok else retry,
            remaining_requests=rt if limits.requests_per_s else None,
            remaining_tokens=tt if limits.tokens_per_s else None,
            in_flight=in_flight if limits.max_concurrent else None,
            hold=hold if ok else None, limits=limits,
        )

    async def settle(self, hold: Hold, tokens: float) -> Settled:
        target = max(0.0, tokens)
        if hold.charged_tokens <= target:
            return Settled(hold, None)
        limits = hold.limits
        args = [
            self._now_arg(),
            _num(limits.requests_per_s), _num(limits.request_burst),
            _num(limits.tokens_per_s), _num(limits.token_capacity), _num(target),
        ]
        keys = [*self.keys(hold.tenant_id), self.hold_key(hold.tenant_id, hold.member)]
        reply = await self._call(self._settle(keys=keys, args=args))
        try:
            held_raw, left_raw = reply
            held, left = float(held_raw), float(left_raw)
        except (TypeError, ValueError):
            raise QuotaBackendError(f"unexpected reply from the settle script: "
                                    f"{reply!r:.200}") from None
        if not (math.isfinite(held) and math.isfinite(left)):
            raise QuotaBackendError(f"unexpected reply from the settle script: "
                                    f"{reply!r:.200}")
        if held < 0:  # no hold left (released, or past its lease): nothing given back
            return Settled(hold, None)
        return Settled(replace(hold, charged_tokens=min(hold.charged_tokens, held)),
                       left if left >= 0 else None)

    async def release(self, hold: Hold, *, refund_request: bool, refund_tokens: float) -> None:
        limits = hold.limits
        args = [
            self._now_arg(),
            _num(limits.requests_per_s), _num(limits.request_burst),
            _num(limits.tokens_per_s), _num(limits.token_capacity),
            "1" if refund_request else "0", _num(max(0.0, refund_tokens)), hold.member,
        ]
        keys = [*self.keys(hold.tenant_id), self.hold_key(hold.tenant_id, hold.member)]
        await self._call(self._release(keys=keys, args=args))

    async def ping(self) -> None:
        await self._call(self._client.ping())

    async def probe(self) -> None:
        """Run a script that writes, as reservations do (``QuotaBackendError`` if Redis is
        unreachable or refuses it: READONLY, OOM, NOSCRIPT loops, ...)."""
        await self._call(self._probe(keys=[f"{self._prefix}:quota:probe"], args=["1"]))

    async def aclose(self) -> None:
        with contextlib.suppress(Exception):
            await self._client.aclose()
