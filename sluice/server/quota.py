"""Tenant quotas at admission: reserve before the runtime sees a request, settle when it ends.

``QuotaGate.admit`` runs for every HTTP request of a tenant with ``limits``: it reserves one
request, an estimate of tokens (prompt + ``max_tokens``; one-shot inputs count their words)
and a concurrency slot, or refuses with 429 ``quota`` and a ``Retry-After`` computed from the
bucket. When every runtime request of the reservation has ended, it settles: tokens not used
are given back, and a reservation whose requests never ran (rejected by the runtime,
cancelled or expired while queued) gives back its request as well.

Stores (``QuotaStore``): ``MemoryQuotaStore`` keeps the state in this process and applies the
pure rule of ``sluice.policy.quota``; ``RedisQuotaStore`` keeps it in Redis and applies the
same rule in ONE atomic Lua script per reservation (and one per release), on Redis's clock, so
every replica pointed at that Redis enforces one quota together. ``FailoverQuotaStore`` puts
a Redis store in front of a local one holding 1/replicas of each limit: when Redis fails it
logs once, serves from the local buckets, probes Redis in the background, and resumes (and
replays the releases it owes) when Redis answers again.

Keys, per tenant, with the tenant in a hash tag so both live in one Redis Cluster slot:
``<prefix>:quota:{<tenant>}:bucket`` — a hash ``rt``/``ru`` (request tokens, updated at) and
``tt``/``tu`` (token tokens, updated at), expiring once the buckets would be full again — and
``<prefix>:quota:{<tenant>}:inflight`` — a sorted set of reservation ids scored by lease
expiry, so slots held by a replica that died are freed after ``quota.lease_s``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import urlsplit, urlunsplit

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from sluice.config import QuotaConfig, TenantConfig
from sluice.engine.observer import Observer
from sluice.engine.request import Event, Final, RequestStatus
from sluice.engine.request import Request as RtRequest
from sluice.policy.admission import Rejection
from sluice.policy.quota import QuotaLimits, QuotaState, TenantQuota
from sluice.server.errors import APIError, rejection_error

log = logging.getLogger("sluice.quota")

CONCURRENCY_RETRY_S = 1.0
"""Retry-After for a full concurrency cap: a slot frees when a request ends, which no bucket
predicts, so the smallest whole second."""
MAX_RETRY_AFTER_S = 3600.0
PENDING_RELEASES_MAX = 100_000
"""Releases owed to Redis while it is unreachable, replayed when it returns (oldest dropped
past this many; their slots then wait for their lease)."""


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


class QuotaStore(Protocol):
    """Where quota state lives. ``reserve`` is all or nothing; ``release`` undoes one granted
    reservation's slot and gives back what it is told to (never above capacity)."""

    async def reserve(self, tenant_id: str, limits: QuotaLimits, tokens: float, member: str,
                      lease_s: float) -> QuotaCheck: ...

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


# The same rule as ``TenantQuota`` (and ``TokenBucket``) in Lua: refill each bucket to now,
# take one request, ``need`` tokens and a slot, or nothing; a refusal names the limit with
# the longest wait. A limit of 0 means "not limited". Numbers cross as %.17g strings, since
# Redis truncates Lua numbers in replies to integers.
_LUA_PRELUDE = """
local now
if ARGV[1] ~= '' then
  now = tonumber(ARGV[1])
else
  local t = redis.call('TIME')
  now = tonumber(t[1]) + tonumber(t[2]) / 1000000
end
local req_rate, req_cap = tonumber(ARGV[2]), tonumber(ARGV[3])
local function fmt(x) return string.format('%.17g', x) end
local function refill(tokens, updated, rate, cap)
  if not tokens then return cap, now end
  tokens, updated = tonumber(tokens), tonumber(updated)
  if now - updated <= 0 then return math.min(tokens, cap), updated end
  return math.min(cap, tokens + rate * (now - updated)), now
end
local fields, full_in = {}, 0
local function keep(tokens_key, updated_key, tokens, updated, cap, rate)
  fields[#fields + 1] = tokens_key; fields[#fields + 1] = fmt(tokens)
  fields[#fields + 1] = updated_key; fields[#fields + 1] = fmt(updated)
  full_in = math.max(full_in, (cap - tokens) / rate)
end
"""
"""Shared by both scripts: the clock (an injected ``now`` for tests, else Redis's own
``TIME``), the request-bucket limits, number formatting, the refill rule, and ``keep``,
which stages a bucket's new level for HSET and tracks when every bucket is full again."""

RESERVE_LUA = _LUA_PRELUDE + """
local tok_rate, tok_cap, need = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
local conc_cap, member, lease = tonumber(ARGV[7]), ARGV[8], tonumber(ARGV[9])
local conc_retry = tonumber(ARGV[10])
local function wait(tokens, updated, rate, amount)
  return math.max(0, math.max(now, updated) + (amount - tokens) / rate - now)
end
local s = redis.call('HMGET', KEYS[1], 'rt', 'ru', 'tt', 'tu')
local rt, ru, tt, tu
if req_rate > 0 then rt, ru = refill(s[1], s[2], req_rate, req_cap) end
if tok_rate > 0 then tt, tu = refill(s[3], s[4], tok_rate, tok_cap) end
local in_flight = 0
if conc_cap > 0 then
  redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
  in_flight = redis.call('ZCARD', KEYS[2])
end
local limit, retry = '', 0
local function refuse(w, name)
  if limit == '' or w >= retry then limit, retry = name, w end
end
if req_rate > 0 and rt < 1 then refuse(wait(rt, ru, req_rate, 1), 'requests') end
if tok_rate > 0 and tt < need then
  if need > tok_cap then refuse(math.huge, 'too_large')
  else refuse(wait(tt, tu, tok_rate, need), 'tokens') end
end
if conc_cap > 0 and in_flight >= conc_cap then refuse(conc_retry, 'concurrent') end
if limit == '' then
  if req_rate > 0 then rt = rt - 1 end
  if tok_rate > 0 then tt = tt - need end
  if conc_cap > 0 then
    redis.call('ZADD', KEYS[2], now + lease, member)
    redis.call('PEXPIRE', KEYS[2], math.ceil(lease * 1000) + 1000)
    in_flight = in_flight + 1
  end
end
if req_rate > 0 then keep('rt', 'ru', rt, ru, req_cap, req_rate) end
if tok_rate > 0 then keep('tt', 'tu', tt, tu, tok_cap, tok_rate) end
if #fields > 0 then
  redis.call('HSET', KEYS[1], unpack(fields))
  if ARGV[1] == '' then
    -- once full again the state says nothing a missing key does not
    redis.call('PEXPIRE', KEYS[1], math.ceil(full_in * 1000) + 1000)
  end
end
return {limit == '' and 1 or 0, limit, fmt(retry), fmt(rt or -1), fmt(tt or -1), in_flight}
"""

RELEASE_LUA = _LUA_PRELUDE + """
local tok_rate, tok_cap = tonumber(ARGV[4]), tonumber(ARGV[5])
local refund_req, refund_tok = tonumber(ARGV[6]), tonumber(ARGV[7])
redis.call('ZREM', KEYS[2], ARGV[8])
local s = redis.call('HMGET', KEYS[1], 'rt', 'ru', 'tt', 'tu')
if req_rate > 0 and refund_req > 0 and s[1] then
  local rt, ru = refill(s[1], s[2], req_rate, req_cap)
  keep('rt', 'ru', math.min(req_cap, rt + refund_req), ru, req_cap, req_rate)
end
if tok_rate > 0 and refund_tok > 0 and s[3] then
  local tt, tu = refill(s[3], s[4], tok_rate, tok_cap)
  keep('tt', 'tu', math.min(tok_cap, tt + refund_tok), tu, tok_cap, tok_rate)
end
if #fields > 0 then
  redis.call('HSET', KEYS[1], unpack(fields))
  if ARGV[1] == '' and redis.call('PTTL', KEYS[1]) >= 0 then
    redis.call('PEXPIRE', KEYS[1], math.ceil(full_in * 1000) + 1000)
  end
end
return 1
"""


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


class RedisQuotaStore:
    """Quota state in Redis, one Lua script per reservation and per release.

    ``clock``: ``None`` decides on Redis's own clock (``TIME``), which every replica shares;
    tests pass an explicit clock to compare the script with ``TenantQuota`` step by step (the
    keys then get no expiry). Raises ``QuotaBackendError`` on any Redis failure.
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
        self._release = self._client.register_script(RELEASE_LUA)

    def keys(self, tenant_id: str) -> tuple[str, str]:
        """The tenant's bucket hash and in-flight sorted set."""
        base = f"{self._prefix}:quota:{{{tenant_id}}}"
        return f"{base}:bucket", f"{base}:inflight"

    def _now_arg(self) -> str:
        return "" if self._clock is None else repr(self._clock())

    async def _call(self, awaitable: Any) -> Any:
        from redis.exceptions import RedisError

        try:
            return await asyncio.wait_for(awaitable, self._timeout_s * 2)
        except (TimeoutError, RedisError, OSError) as exc:
            raise QuotaBackendError(f"{type(exc).__name__}: {exc}") from exc

    async def reserve(self, tenant_id: str, limits: QuotaLimits, tokens: float, member: str,
                      lease_s: float) -> QuotaCheck:
        args = [
            self._now_arg(),
            _num(limits.requests_per_s), _num(limits.request_burst),
            _num(limits.tokens_per_s), _num(limits.token_capacity), _num(tokens),
            str(limits.max_concurrent or 0), member, _num(lease_s), _num(CONCURRENCY_RETRY_S),
        ]
        reply = await self._call(self._reserve(keys=self.keys(tenant_id), args=args))
        ok, limit, retry, rt, tt, in_flight = reply
        ok = bool(int(ok))
        hold = Hold(tenant_id, limits, member, tokens if limits.tokens_per_s else 0.0,
                    shared=True)
        return QuotaCheck(
            ok=ok, limit=None if ok else str(limit), retry_after_s=0.0 if ok else float(retry),
            remaining_requests=float(rt) if limits.requests_per_s else None,
            remaining_tokens=float(tt) if limits.tokens_per_s else None,
            in_flight=int(in_flight) if limits.max_concurrent else None,
            hold=hold if ok else None, limits=limits,
        )

    async def release(self, hold: Hold, *, refund_request: bool, refund_tokens: float) -> None:
        limits = hold.limits
        args = [
            self._now_arg(),
            _num(limits.requests_per_s), _num(limits.request_burst),
            _num(limits.tokens_per_s), _num(limits.token_capacity),
            "1" if refund_request else "0", _num(max(0.0, refund_tokens)), hold.member,
        ]
        await self._call(self._release(keys=self.keys(hold.tenant_id), args=args))

    async def ping(self) -> None:
        await self._call(self._client.ping())

    async def aclose(self) -> None:
        with contextlib.suppress(Exception):
            await self._client.aclose()


class FailoverQuotaStore:
    """A shared store in front of this replica's local buckets.

    Invariants: while ``in_fallback`` no request waits on the shared store (a background task
    probes it every ``reconnect_interval_s``); an outage is logged once when it starts and
    once when it ends; a release of a shared reservation made while the store is down is
    kept and replayed on reconnection; local reservations are released locally.
    """

    def __init__(self, shared: RedisQuotaStore, local: MemoryQuotaStore, *, share: float,
                 reconnect_interval_s: float = 1.0) -> None:
        self.shared = shared
        self.local = local
        self.share = share
        self.reconnect_interval_s = reconnect_interval_s
        self.in_fallback = False
        self.outages = 0
        self.backend_errors = 0
        self._pending: deque[tuple[Hold, bool, float]] = deque(maxlen=PENDING_RELEASES_MAX)
        self._probe: asyncio.Task[None] | None = None

    async def reserve(self, tenant_id: str, limits: QuotaLimits, tokens: float, member: str,
                      lease_s: float) -> QuotaCheck:
        if not self.in_fallback:
            try:
                return await self.shared.reserve(tenant_id, limits, tokens, member, lease_s)
            except QuotaBackendError as exc:
                self._fail(exc)
        return await self.local.reserve(tenant_id, limits.scaled(self.share), tokens, member,
                                        lease_s)

    async def release(self, hold: Hold, *, refund_request: bool, refund_tokens: float) -> None:
        if not hold.shared:
            await self.local.release(hold, refund_request=refund_request,
                                     refund_tokens=refund_tokens)
            return
        if not self.in_fallback:
            try:
                await self.shared.release(hold, refund_request=refund_request,
                                          refund_tokens=refund_tokens)
                return
            except QuotaBackendError as exc:
                self._fail(exc)
        self._pending.append((hold, refund_request, refund_tokens))

    def _fail(self, exc: QuotaBackendError) -> None:
        self.backend_errors += 1
        if self.in_fallback:
            return
        self.in_fallback = True
        self.outages += 1
        log.warning(
            "quota store %s unreachable (%s): enforcing local buckets at 1/%g of each tenant "
            "limit until it answers again", redact_url(self.shared.url), exc,
            round(1 / self.share, 6),
        )
        if self._probe is None or self._probe.done():
            self._probe = asyncio.get_running_loop().create_task(self._reconnect())

    async def _reconnect(self) -> None:
        while self.in_fallback:
            await asyncio.sleep(self.reconnect_interval_s)
            try:
                await self.shared.ping()
                while self._pending:
                    hold, refund_request, refund_tokens = self._pending[0]
                    await self.shared.release(hold, refund_request=refund_request,
                                              refund_tokens=refund_tokens)
                    self._pending.popleft()
            except QuotaBackendError:
                self.backend_errors += 1
                continue
            self.in_fallback = False
            log.warning("quota store %s reachable again: shared quotas resumed",
                        redact_url(self.shared.url))

    async def aclose(self) -> None:
        if self._probe is not None:
            self._probe.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._probe
        await self.shared.aclose()


def estimate_tokens(req: RtRequest) -> int:
    """Tokens reserved at admission: prompt + ``max_tokens`` (generative), or the input's
    whitespace-separated words (one-shot; at least 1)."""
    if req.kind == "generative":
        return len(req.prompt_tokens) + req.params.max_tokens
    return max(1, len(str(req.input).split()))


def used_tokens(req: RtRequest, final: Final) -> int:
    """Tokens a finished request really used: 0 if it never ran; prompt + generated
    (generative); its estimate (one-shot)."""
    if req.times.started_s is None:
        return 0
    if req.kind == "generative":
        return final.prompt_tokens + final.completion_tokens
    return estimate_tokens(req)


class _Settlement:
    """Settles one reservation once every request it covers has a ``Final``."""

    def __init__(self, gate: QuotaGate, hold: Hold, reqs: Sequence[RtRequest],
                 loop: asyncio.AbstractEventLoop) -> None:
        self._gate = gate
        self._hold = hold
        self._loop = loop
        self._lock = threading.Lock()
        self._open = {r.request_id for r in reqs}
        self._used = 0
        self._ran = False
        for r in reqs:
            r.listeners.append(self._listener(r))

    def _listener(self, req: RtRequest) -> Callable[[Event], None]:
        def on_event(event: Event) -> None:
            if not isinstance(event, Final):
                return
            with self._lock:
                self._used += used_tokens(req, event)
                self._ran = self._ran or req.times.started_s is not None
                self._open.discard(req.request_id)
                if self._open:
                    return
            refund_tokens = max(0.0, self._hold.charged_tokens - self._used)
            # A closed loop (server gone) has nobody left to settle with.
            with contextlib.suppress(RuntimeError):
                self._loop.call_soon_threadsafe(self._gate._release, self._hold,
                                                not self._ran, refund_tokens)

        return on_event


class QuotaGate:
    """The quota check of the HTTP layer, with its bookkeeping for ``/metrics``.

    Lives on the server's event loop: ``admit`` and the releases it schedules run there.
    Tenants without limits (and unknown tenants) pass untouched.
    """

    def __init__(self, config: QuotaConfig, tenants: Sequence[TenantConfig],
                 observer: Observer, *, clock: Callable[[], float] = time.monotonic,
                 store: QuotaStore | None = None) -> None:
        self.config = config
        self.replica_id = uuid.uuid4().hex[:12]
        self._observer = observer
        self._clock = clock
        self._limits = dict(tenant_limits(tenants))
        self.store: QuotaStore = store if store is not None else self._make_store(config)
        self._tasks: set[asyncio.Task[None]] = set()
        # /metrics bookkeeping, touched on the event loop only.
        self.remaining: dict[tuple[str, str], float] = {}
        self.in_flight: dict[str, int] = {}
        self.rejections: dict[tuple[str, str], int] = {}
        self.charged_tokens: dict[str, float] = {}
        self.refunded_tokens: dict[str, float] = {}

    def _make_store(self, config: QuotaConfig) -> QuotaStore:
        share = 1.0 / config.replicas
        if config.backend == "memory":
            return _ScaledStore(MemoryQuotaStore(self._clock, clamp_to_capacity=share < 1),
                                share)
        assert config.redis_url is not None  # QuotaConfig checks it
        shared = RedisQuotaStore(config.redis_url, key_prefix=config.key_prefix,
                                 timeout_s=config.timeout_ms / 1000.0)
        return FailoverQuotaStore(shared, MemoryQuotaStore(self._clock, clamp_to_capacity=True),
                                  share=share, reconnect_interval_s=config.reconnect_interval_s)

    @property
    def in_fallback(self) -> bool:
        return isinstance(self.store, FailoverQuotaStore) and self.store.in_fallback

    def limits(self, tenant_id: str) -> QuotaLimits | None:
        return self._limits.get(tenant_id)

    async def admit(self, reqs: Sequence[RtRequest]) -> None:
        """Reserve for ``reqs`` (one HTTP request of one tenant) or raise the ``APIError``
        (429 ``quota``, 400 ``too_large``); the requests are then finished ``REJECTED``.
        On success each request carries a listener that settles the reservation."""
        if not reqs:
            return
        tenant_id = reqs[0].tenant_id
        limits = self._limits.get(tenant_id)
        if limits is None:
            return
        tokens = sum(estimate_tokens(r) for r in reqs)
        if limits.tokens_per_s is not None and tokens > limits.token_capacity:
            raise self._refuse(reqs, Rejection(
                "too_large", 0.0,
                f"this request reserves {tokens} tokens (prompt + max tokens), more than "
                f"tenant {tenant_id!r}'s whole budget of {limits.token_capacity:g} tokens per "
                f"minute; ask for fewer tokens"), "too_large")
        now = self._clock()
        deadlines = [r.deadline_s - now for r in reqs if r.deadline_s is not None]
        lease_s = self.config.lease_s
        if deadlines and len(deadlines) == len(reqs):
            lease_s = min(lease_s, max(deadlines) + 30.0)
        member = f"{self.replica_id}:{reqs[0].request_id}"
        check = await self.store.reserve(tenant_id, limits, float(tokens), member, lease_s)
        self._record(tenant_id, check)
        if not check.ok:
            raise self._refuse(reqs, Rejection(
                "quota", min(MAX_RETRY_AFTER_S, check.retry_after_s),
                _refusal_message(tenant_id, check, tokens, self.in_fallback)), check.limit)
        assert check.hold is not None
        self.charged_tokens[tenant_id] = (self.charged_tokens.get(tenant_id, 0.0)
                                          + check.hold.charged_tokens)
        self.in_flight[tenant_id] = self.in_flight.get(tenant_id, 0) + 1
        _Settlement(self, check.hold, reqs, asyncio.get_running_loop())

    def _record(self, tenant_id: str, check: QuotaCheck) -> None:
        if check.remaining_requests is not None:
            self.remaining[(tenant_id, "requests")] = check.remaining_requests
        if check.remaining_tokens is not None:
            self.remaining[(tenant_id, "tokens")] = check.remaining_tokens

    def _refuse(self, reqs: Sequence[RtRequest], rejection: Rejection,
                limit: str | None) -> APIError:
        tenant_id = reqs[0].tenant_id
        key = (tenant_id, limit or rejection.reason)
        self.rejections[key] = self.rejections.get(key, 0) + 1
        now = self._clock()
        for r in reqs:
            self._observer.rejected(r.model_id, r.tenant_id, rejection.reason)
            if r.finish(RequestStatus.REJECTED, now, error=rejection.message,
                        error_code=rejection.reason):
                self._observer.finished(r)
        err = rejection_error(rejection)
        if limit is not None and rejection.reason == "quota":
            err.headers["x-sluice-quota-limit"] = limit
        return err

    def _release(self, hold: Hold, refund_request: bool, refund_tokens: float) -> None:
        """On the loop: start the release (a task, kept until it ends)."""
        tenant = hold.tenant_id
        self.refunded_tokens[tenant] = self.refunded_tokens.get(tenant, 0.0) + refund_tokens
        if tenant in self.in_flight:
            self.in_flight[tenant] = max(0, self.in_flight[tenant] - 1)
        task = asyncio.get_running_loop().create_task(self._release_now(hold, refund_request,
                                                                        refund_tokens))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _release_now(self, hold: Hold, refund_request: bool, refund_tokens: float) -> None:
        try:
            await self.store.release(hold, refund_request=refund_request,
                                     refund_tokens=refund_tokens)
        except Exception:  # a release must never take the server down
            log.exception("quota release for tenant %s failed", hold.tenant_id)

    async def drain(self, timeout_s: float = 5.0) -> None:
        """Wait for the releases in progress (and those just scheduled)."""
        await asyncio.sleep(0)
        if self._tasks:
            await asyncio.wait(set(self._tasks), timeout=timeout_s)

    async def aclose(self) -> None:
        await self.drain()
        await self.store.aclose()


class _ScaledStore:
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

    async def release(self, hold: Hold, *, refund_request: bool, refund_tokens: float) -> None:
        await self.inner.release(hold, refund_request=refund_request,
                                 refund_tokens=refund_tokens)

    async def aclose(self) -> None:
        await self.inner.aclose()


def _refusal_message(tenant_id: str, check: QuotaCheck, tokens: int, local: bool) -> str:
    limits, retry = check.limits, check.retry_after_s
    if check.limit == "requests":
        what = (f"request rate ({limits.requests_per_s:.4g}/s, burst "
                f"{limits.request_burst:.4g})")
    elif check.limit == "tokens":
        left = check.remaining_tokens or 0.0
        what = (f"token rate ({(limits.tokens_per_s or 0) * 60:.6g} tokens/min): this request "
                f"reserves {tokens}, {left:.0f} left")
    elif check.limit == "concurrent":
        what = f"concurrency cap ({limits.max_concurrent} requests in flight)"
    else:
        what = f"token budget ({limits.token_capacity:.6g} tokens): this request needs {tokens}"
    where = " (this replica's share: the shared quota store is unreachable)" if local else ""
    return f"tenant {tenant_id!r} is over its {what}{where}; retry in {retry:.3g} s"


class QuotaCollector(Collector):
    """Quota gauges and counters, read from the gate at scrape time."""

    def __init__(self, gate: QuotaGate) -> None:
        self._gate = gate

    def collect(self) -> Iterator[Metric]:
        gate = self._gate
        yield GaugeMetricFamily(
            "sluice_quota_fallback",
            "1 while this replica enforces local buckets because the shared quota store "
            "is unreachable", value=int(gate.in_fallback))
        store = gate.store
        if isinstance(store, FailoverQuotaStore):
            yield CounterMetricFamily("sluice_quota_backend_errors",
                                      "Failed calls to the shared quota store",
                                      value=store.backend_errors)
            yield CounterMetricFamily("sluice_quota_fallbacks",
                                      "Times the shared quota store became unreachable",
                                      value=store.outages)
        remaining = GaugeMetricFamily(
            "sluice_quota_remaining",
            "Quota left in a tenant's bucket as of its last check (requests or tokens)",
            labels=["tenant", "limit"])
        for (tenant, limit), value in sorted(dict(gate.remaining).items()):
            remaining.add_metric([tenant, limit], value)
        in_flight = GaugeMetricFamily(
            "sluice_quota_in_flight",
            "A tenant's reservations held by this replica (admitted, not yet settled)",
            labels=["tenant"])
        for tenant, n in sorted(dict(gate.in_flight).items()):
            in_flight.add_metric([tenant], n)
        rejections = CounterMetricFamily("sluice_quota_rejections",
                                         "Requests refused by a tenant quota, by limit",
                                         labels=["tenant", "limit"])
        for (tenant, limit), n in sorted(dict(gate.rejections).items()):
            rejections.add_metric([tenant, limit], n)
        tokens = CounterMetricFamily(
            "sluice_quota_tokens",
            "Quota tokens reserved at admission and given back at settlement",
            labels=["tenant", "kind"])
        for kind, table in (("reserved", gate.charged_tokens),
                            ("refunded", gate.refunded_tokens)):
            for tenant, value in sorted(dict(table).items()):
                tokens.add_metric([tenant, kind], value)
        yield from (remaining, in_flight, rejections, tokens)


def tenant_limits(tenants: Sequence[TenantConfig]) -> Mapping[str, QuotaLimits]:
    """The configured limits by tenant id (tenants with none left out)."""
    return {t.id: t.limits.quota_limits() for t in tenants
            if not t.limits.quota_limits().unlimited}


__all__ = [
    "CONCURRENCY_RETRY_S",
    "FailoverQuotaStore",
    "Hold",
    "MemoryQuotaStore",
    "QuotaBackendError",
    "QuotaCheck",
    "QuotaCollector",
    "QuotaGate",
    "QuotaStore",
    "RedisQuotaStore",
    "estimate_tokens",
    "redact_url",
    "tenant_limits",
    "used_tokens",
]
