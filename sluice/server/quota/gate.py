"""``QuotaGate``: the quota check of the HTTP layer. It reserves before the runtime sees a
request (or refuses with 429 and a computed ``Retry-After``) — for a prompt not yet tokenized,
an upper bound of its tokens, settled to the exact estimate once it is tokenized — and
releases when every request of the reservation has ended; plus the token estimates it
reserves and settles by."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from sluice.backends.base import EmbedInput
from sluice.config import QuotaConfig, TenantConfig
from sluice.engine.observer import Observer
from sluice.engine.request import Event, Final, RequestStatus
from sluice.engine.request import Request as RtRequest
from sluice.policy.capacity.quota import QuotaLimits
from sluice.policy.queues.admission import Rejection
from sluice.server import access
from sluice.server.errors import APIError, rejection_error
from sluice.server.quota.failover import FailoverQuotaStore
from sluice.server.quota.redis_store import RedisQuotaStore
from sluice.server.quota.stores import Hold, MemoryQuotaStore, QuotaCheck, QuotaStore, ScaledStore

log = logging.getLogger("sluice.quota")

MAX_RETRY_AFTER_S = 3600.0
"""The longest Retry-After a quota refusal suggests."""


@dataclass(frozen=True, slots=True)
class TokenBounds:
    """What a request's token estimate can be before its prompt is tokenized:
    ``least_tokens <= estimate_tokens <= most_tokens``."""

    least_tokens: int
    most_tokens: int


def estimate_tokens(req: RtRequest) -> int:
    """Tokens reserved at admission: prompt (once) + ``max_tokens`` for each of the ``n``
    choices (generative), or the input's whitespace-separated words and token ids
    (one-shot; at least 1)."""
    if req.kind == "generative":
        return len(req.prompt_tokens) + req.params.max_tokens * req.params.n
    if isinstance(req.input, EmbedInput):
        return max(1, sum(len(p.split()) if isinstance(p, str) else 1
                          for p in req.input.pieces))
    return max(1, len(str(req.input).split()))


def used_tokens(req: RtRequest, final: Final) -> int:
    """Tokens a finished request really used: 0 if it never ran; prompt + generated
    (generative); its estimate (one-shot)."""
    if req.times.started_s is None:
        return 0
    if req.kind == "generative":
        return final.prompt_tokens + final.completion_tokens
    return estimate_tokens(req)


class Reservation:
    """One granted reservation: ``QuotaGate.settle`` charges it the exact estimate, and it
    releases itself once every request it covers has a ``Final``.

    ``settled``: its charge is final (reserved as the exact estimate, or settled to it);
    until then it holds an upper bound. Its charge counts as ``reserved`` in the gate's
    bookkeeping once final, or at its release if it never was (all of it then refunded)."""

    def __init__(self, gate: QuotaGate, hold: Hold, reqs: Sequence[RtRequest],
                 loop: asyncio.AbstractEventLoop, *, settled: bool) -> None:
        self._gate = gate
        self.hold = hold
        self.settled = settled
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
            hold, counted = self.hold, self.settled
            refund_tokens = max(0.0, hold.charged_tokens - self._used)
            # A closed loop (server gone) has nobody left to settle with.
            with contextlib.suppress(RuntimeError):
                self._loop.call_soon_threadsafe(self._gate._release, hold, not self._ran,
                                                refund_tokens, counted)

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
        self._replicas = config.replicas
        self.store: QuotaStore = store if store is not None else self._make_store(config)
        self._tasks: set[asyncio.Task[None]] = set()
        # /metrics bookkeeping, touched on the event loop only.
        self.remaining: dict[tuple[str, str], float] = {}
        self.in_flight: dict[str, int] = {}
        self.rejections: dict[tuple[str, str], int] = {}
        self.charged_tokens: dict[str, float] = {}
        self.refunded_tokens: dict[str, float] = {}
        # Each tenant's request bucket as the store last answered: (left, when, limits,
        # whether that store was the local fallback).
        self._request_level: dict[str, tuple[float, float, QuotaLimits, bool]] = {}

    def _make_store(self, config: QuotaConfig) -> QuotaStore:
        share = 1.0 / config.replicas
        if config.backend == "memory":
            # Clamping changes nothing at share 1 (a request over the whole budget is refused
            # as too_large first), and the share may drop later (``set_replicas``).
            return ScaledStore(MemoryQuotaStore(self._clock, clamp_to_capacity=True), share)
        assert config.redis_url is not None  # QuotaConfig checks it
        shared = RedisQuotaStore(config.redis_url, key_prefix=config.key_prefix,
                                 timeout_s=config.timeout_ms / 1000.0)
        return FailoverQuotaStore(shared, MemoryQuotaStore(self._clock, clamp_to_capacity=True),
                                  share=share, reconnect_interval_s=config.reconnect_interval_s)

    @property
    def replicas(self) -> int:
        """Replicas assumed to share the quotas: each enforces 1/replicas of every limit from
        its own buckets (always without Redis; while Redis is unreachable with it)."""
        return self._replicas

    def set_replicas(self, replicas: int) -> None:
        """Follow the live replica count (``quota.replicas`` is only the starting value): a
        fleet that grows shrinks each replica's fallback share, one that shrinks widens it."""
        if replicas < 1:
            raise ValueError(f"replicas must be >= 1, got {replicas}")
        self._replicas = replicas
        if isinstance(self.store, FailoverQuotaStore | ScaledStore):
            self.store.share = 1.0 / replicas

    @property
    def in_fallback(self) -> bool:
        return isinstance(self.store, FailoverQuotaStore) and self.store.in_fallback

    def limits(self, tenant_id: str) -> QuotaLimits | None:
        return self._limits.get(tenant_id)

    async def admit(self, reqs: Sequence[RtRequest], *,
                    bounds: TokenBounds | None = None) -> Reservation | None:
        """Reserve for ``reqs`` (one HTTP request of one tenant) or raise the ``APIError``
        (429 ``quota``, 400 ``too_large``); the requests are then finished ``REJECTED``.
        ``bounds``: what their tokens can be while their prompt is not tokenized yet: the
        most is reserved (at most the whole budget) and ``settle`` charges the exact
        estimate later; ``too_large`` is then judged on the least. On success each request
        carries a listener that releases the reservation; ``None``: the tenant has no
        limits."""
        if not reqs:
            return None
        tenant_id = reqs[0].tenant_id
        limits = self._limits.get(tenant_id)
        if limits is None:
            return None
        least = tokens = (sum(estimate_tokens(r) for r in reqs) if bounds is None
                          else bounds.most_tokens)
        if bounds is not None:
            least = bounds.least_tokens
            if limits.tokens_per_s is not None:
                tokens = min(tokens, math.floor(limits.token_capacity))
        self._check_fits(reqs, limits, least, exact=bounds is None)
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
        if bounds is None:
            self._count_reserved(check.hold)
        self.in_flight[tenant_id] = self.in_flight.get(tenant_id, 0) + 1
        return Reservation(self, check.hold, reqs, asyncio.get_running_loop(),
                           settled=bounds is None)

    async def settle(self, reservation: Reservation | None,
                     reqs: Sequence[RtRequest]) -> None:
        """Charge ``reservation`` (made with ``bounds`` for ``reqs``, now tokenized) their
        exact estimate, giving back what the bound held above it; 400 ``too_large`` (the
        requests finished ``REJECTED``, so the reservation is given back) when the estimate
        exceeds the tenant's whole budget. A settled reservation, or none, is left as it
        is."""
        if reservation is None or reservation.settled:
            return
        hold = reservation.hold
        tokens = sum(estimate_tokens(r) for r in reqs)
        self._check_fits(reqs, self._limits.get(hold.tenant_id, hold.limits), tokens,
                         exact=True)
        settled = await self.store.settle(hold, float(tokens))
        reservation.hold, reservation.settled = settled.hold, True
        self._count_reserved(settled.hold)
        if settled.remaining_tokens is not None:
            self.remaining[(hold.tenant_id, "tokens")] = settled.remaining_tokens

    def _check_fits(self, reqs: Sequence[RtRequest], limits: QuotaLimits, tokens: int, *,
                    exact: bool) -> None:
        """400 ``too_large`` when ``tokens`` (the estimate, or the least it can be) exceed
        the tenant's whole token budget: no wait admits it."""
        tenant_id = reqs[0].tenant_id
        if limits.tokens_per_s is None or tokens <= limits.token_capacity:
            return
        what = f"{tokens} tokens" if exact else f"at least {tokens} tokens"
        raise self._refuse(reqs, Rejection(
            "too_large", 0.0,
            f"this request reserves {what} (prompt + max tokens), more than tenant "
            f"{tenant_id!r}'s whole budget of {limits.token_capacity:g} tokens per minute; "
            f"ask for fewer tokens"), "too_large")

    def _count_reserved(self, hold: Hold) -> None:
        tenant = hold.tenant_id
        self.charged_tokens[tenant] = self.charged_tokens.get(tenant, 0.0) + hold.charged_tokens

    async def charge_call(self, tenant_id: str, name: str) -> None:
        """A call that runs no model (``/tokenize``, ``/detokenize``): one request against
        the tenant's request rate, no tokens; past a limit the ``APIError`` (429)."""
        limits = self._limits.get(tenant_id)
        if limits is None:
            return
        member = f"{self.replica_id}:{name}:{uuid.uuid4().hex[:12]}"
        check = await self.store.reserve(tenant_id, limits, 0.0, member, self.config.lease_s)
        self._record(tenant_id, check)
        if not check.ok:
            key = (tenant_id, check.limit or "quota")
            self.rejections[key] = self.rejections.get(key, 0) + 1
            err = rejection_error(Rejection(
                "quota", min(MAX_RETRY_AFTER_S, check.retry_after_s),
                _refusal_message(tenant_id, check, 0, self.in_fallback)))
            if check.limit is not None:
                err.headers["x-sluice-quota-limit"] = check.limit
            raise err
        assert check.hold is not None
        await self._release_now(check.hold, refund_request=False, refund_tokens=0.0)

    def refusal_before_body(self, tenant_id: str,
                            new_id: Callable[[], int]) -> APIError | None:
        """The 429 for a request of ``tenant_id`` decided before its body is read, from
        the store's last answer on this replica: the request bucket then held ``left`` and
        has refilled at its rate since (as if nothing else took from it), so if that is
        under one request now the store would refuse it too, and its body (up to
        ``max_body_bytes`` of JSON, a structured-output schema included) is never parsed;
        the refusal is counted as a request (its id from ``new_id``) of no model.
        None: the store decides. The level is dropped when this replica gives a request
        back, and not used once the store has changed (shared store lost or regained);
        what the estimate cannot see — another replica's refund, a shared store that lost
        its state — can refuse a request the store would admit, for at most the time one
        request takes to refill."""
        level = self._request_level.get(tenant_id)
        if level is None:
            return None
        left, at_s, limits, local = level
        if limits.requests_per_s is None or local != self.in_fallback:
            return None
        now_left = min(limits.request_burst,
                       left + (self._clock() - at_s) * limits.requests_per_s)
        if now_left >= 1.0:
            return None
        retry_s = (1.0 - now_left) / limits.requests_per_s
        check = QuotaCheck(False, "requests", retry_s, now_left, None, None, None, limits)
        # Counted as every refusal is (one request, rejected), under no model: none is
        # named until the body is read.
        unread = RtRequest(request_id=new_id(), model_id="", kind="unread",
                           arrival_s=self._clock(), tenant_id=tenant_id)
        access.note_admitted([unread])  # its access line names the tenant and the refusal
        return self._refuse([unread], Rejection(
            "quota", min(MAX_RETRY_AFTER_S, retry_s),
            _refusal_message(tenant_id, check, 0, self.in_fallback)), "requests")

    def _record(self, tenant_id: str, check: QuotaCheck) -> None:
        if check.remaining_requests is not None:
            self.remaining[(tenant_id, "requests")] = check.remaining_requests
            self._request_level[tenant_id] = (check.remaining_requests, self._clock(),
                                              check.limits, self.in_fallback)
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

    def _release(self, hold: Hold, refund_request: bool, refund_tokens: float,
                 counted: bool) -> None:
        """On the loop: start the release (a task, kept until it ends); ``counted``: the
        hold's charge is in ``charged_tokens`` already."""
        tenant = hold.tenant_id
        if refund_request:
            self._request_level.pop(tenant, None)
        if not counted:
            self._count_reserved(hold)
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


def tenant_limits(tenants: Sequence[TenantConfig]) -> Mapping[str, QuotaLimits]:
    """The configured limits by tenant id (tenants with none left out)."""
    return {t.id: t.limits.quota_limits() for t in tenants
            if not t.limits.quota_limits().unlimited}
