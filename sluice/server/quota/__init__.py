"""Tenant quotas at admission: reserve before the runtime sees a request, settle when it ends.

``QuotaGate.admit`` runs for every HTTP request of a tenant with ``limits``: it reserves one
request, an estimate of tokens (prompt + ``max_tokens``; one-shot inputs count their words)
and a concurrency slot, or refuses with 429 ``quota`` and a ``Retry-After`` computed from the
bucket. A generative request is admitted before its prompt is tokenized, so a tenant over
quota costs no tokenizing: it reserves an upper bound of its prompt's tokens from the
prompt's bytes, and ``QuotaGate.settle`` lowers the charge to the exact estimate once the
prompt is tokenized. When every runtime request of the reservation has ended, it is
released: tokens not used are given back, and a reservation whose requests never ran
(rejected by the runtime, cancelled or expired while queued) gives back its request as well.

Stores (``QuotaStore``): ``MemoryQuotaStore`` keeps the state in this process and applies the
pure rule of ``sluice.policy.capacity.quota``; ``RedisQuotaStore`` keeps it in Redis and applies the
same rule in ONE atomic Lua script per reservation (and one per settlement and per
release), on Redis's clock, so
every replica pointed at that Redis enforces one quota together. ``FailoverQuotaStore`` puts
a Redis store in front of a local one holding 1/replicas of each limit: when Redis fails it
logs once, serves from the local buckets, probes Redis in the background, and resumes (and
replays the releases it owes) when Redis answers again.

Keys, per tenant, with the tenant in a hash tag so both live in one Redis Cluster slot:
``<prefix>:quota:{<tenant>}:bucket`` — a hash ``rt``/``ru`` (request tokens, updated at) and
``tt``/``tu`` (token tokens, updated at), expiring once the buckets would be full again — and
``<prefix>:quota:{<tenant>}:inflight`` — a sorted set of reservation ids scored by lease
expiry, so slots held by a replica that died are freed after ``quota.lease_s``.

Modules: ``stores`` (the protocol, the memory store, the scaled store), ``redis_store`` (with
its Lua as package resources), ``failover``, ``gate`` (``QuotaGate``, its reservations, token
estimates) and ``collector`` (Prometheus). Import from this package.
"""

from __future__ import annotations

from sluice.server.quota.collector import QuotaCollector
from sluice.server.quota.failover import FailoverQuotaStore
from sluice.server.quota.gate import (
    QuotaGate,
    Reservation,
    TokenBounds,
    estimate_tokens,
    tenant_limits,
    used_tokens,
)
from sluice.server.quota.redis_store import RedisQuotaStore, redact_url
from sluice.server.quota.stores import (
    CONCURRENCY_RETRY_S,
    Hold,
    MemoryQuotaStore,
    QuotaBackendError,
    QuotaCheck,
    QuotaStore,
    Settled,
)

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
    "Reservation",
    "Settled",
    "TokenBounds",
    "estimate_tokens",
    "redact_url",
    "tenant_limits",
    "used_tokens",
]
