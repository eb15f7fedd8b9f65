"""``FailoverQuotaStore``: the Redis store in front of this replica's local buckets, so an
outage of Redis degrades quotas to each replica's share instead of failing requests."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from dataclasses import replace

from sluice.policy.capacity.quota import QuotaLimits
from sluice.server.quota.redis_store import RedisQuotaStore, redact_url
from sluice.server.quota.stores import (
    Hold,
    MemoryQuotaStore,
    QuotaBackendError,
    QuotaCheck,
    Settled,
)

log = logging.getLogger("sluice.quota")

MAX_BACKOFF_S = 30.0
"""The longest wait between two probes of a store that keeps failing (the interval doubles
from ``reconnect_interval_s`` up to this, or to ``reconnect_interval_s`` if longer)."""
PENDING_RELEASES_MAX = 100_000
"""Releases owed to Redis while it is unreachable, replayed when it returns (oldest dropped
past this many; their slots then wait for their lease)."""


class FailoverQuotaStore:
    """A shared store in front of this replica's local buckets.

    Invariants: while ``in_fallback`` no request waits on the shared store (a background task
    probes it, first after ``reconnect_interval_s``, then backing off to ``MAX_BACKOFF_S``);
    the probe runs a script that writes, so a Redis that answers PING but refuses scripts
    (READONLY replica, OOM) stays down instead of flapping; an outage is logged once when it
    starts and once when it ends; a release of a shared reservation made while the store is
    down is kept and replayed on reconnection; a reservation whose call failed is cancelled
    there on reconnection too (the call may have run on a slow Redis although its reply was
    lost), so it is neither charged twice nor holds a slot for its lease; local reservations
    are released locally. Releases refund at most once (``release.lua``), so replaying is
    safe.
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
        self.cancelled_reservations = 0
        """Reservations whose call failed, cancelled in the shared store on reconnection."""
        self._pending: deque[tuple[Hold, bool, float]] = deque(maxlen=PENDING_RELEASES_MAX)
        self._probe: asyncio.Task[None] | None = None

    async def reserve(self, tenant_id: str, limits: QuotaLimits, tokens: float, member: str,
                      lease_s: float) -> QuotaCheck:
        if not self.in_fallback:
            try:
                return await self.shared.reserve(tenant_id, limits, tokens, member, lease_s)
            except QuotaBackendError as exc:
                self._fail(exc)
                # The script may still run (a slow Redis): cancel it there once it answers.
                lost = Hold(tenant_id, limits, member, tokens if limits.tokens_per_s else 0.0,
                            shared=True)
                self._pending.append((lost, True, tokens))
                self.cancelled_reservations += 1
        return await self.local.reserve(tenant_id, limits.scaled(self.share), tokens, member,
                                        lease_s)

    async def settle(self, hold: Hold, tokens: float) -> Settled:
        """A local hold settles locally; a shared one in Redis, or, while Redis is down,
        not at all: the hold keeps its charge and its release refunds the rest. A settle
        whose call failed may have run (a slow Redis): the hold is taken as settled, so its
        release never gives back more than Redis holds for it (at worst the tenant pays
        the estimate's excess for that one request)."""
        if not hold.shared:
            return await self.local.settle(hold, tokens)
        if self.in_fallback:
            return Settled(hold, None)
        try:
            return await self.shared.settle(hold, tokens)
        except QuotaBackendError as exc:
            self._fail(exc)
            return Settled(replace(hold, charged_tokens=min(hold.charged_tokens,
                                                            max(0.0, tokens))), None)

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
        wait_s = self.reconnect_interval_s
        while self.in_fallback:
            await asyncio.sleep(wait_s)
            try:
                await self.shared.probe()
                while self._pending:
                    hold, refund_request, refund_tokens = self._pending[0]
                    await self.shared.release(hold, refund_request=refund_request,
                                              refund_tokens=refund_tokens)
                    self._pending.popleft()
            except QuotaBackendError:
                self.backend_errors += 1
                wait_s = min(2 * wait_s, max(MAX_BACKOFF_S, self.reconnect_interval_s))
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
