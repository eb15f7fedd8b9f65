"""One Ray Serve replica = one sluice runtime behind sluice's own HTTP app.

The replica builds ``create_app(config)`` (runtime, workers, engines, quota gate, routes)
and enters its lifespan, so the default model is loaded before Serve counts the replica as
running. Each request from the front end runs through that app (``call_asgi``); the
response gets ``x-sluice-replica`` (this replica's id) and ``x-sluice-replica-route`` (why
the cross-replica router put it here).

Serve calls, besides ``handle``:

- ``record_routing_stats`` (every ``cluster.stats_period_s``): residency and free memory
  for the residency-aware router, draining, load;
- ``record_autoscaling_stats``: sluice's load signal (requests admitted and unfinished, KV
  use) for ``SluiceAutoscalePolicy``;
- ``check_health``: ``sluice.server.health.readiness`` — a replica whose default model
  failed is replaced; one that is draining is not;
- ``__del__`` on scale-down, after Serve has drained it (no request in flight): stops the
  runtime.

The live replica count (from Serve's status, every ``QUOTA_REPLICAS_PERIOD_S``) sets the
quota gate's fallback share.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Any

from sluice.cluster.app import running_replicas
from sluice.cluster.asgi import HttpCall, ResponseStart, call_asgi
from sluice.cluster.autoscale import KV_METRIC, LOAD_METRIC
from sluice.cluster.hints import RouteHint
from sluice.config import Config
from sluice.engine.runtime import RuntimeSnapshot
from sluice.server.app import create_app
from sluice.server.context import AppContext
from sluice.server.health import readiness

log = logging.getLogger("sluice.cluster")

QUOTA_REPLICAS_PERIOD_S = 5.0
"""How often a replica reads the live replica count for its quota share."""


def kv_use(snap: RuntimeSnapshot) -> float:
    """The highest KV-block use among the generative models resident on any worker."""
    uses = [1.0 - (m.kv_free_blocks or 0) / m.kv_total_blocks
            for w in snap.workers for m in w.models if m.kv_total_blocks]
    return max(uses, default=0.0)


def routing_stats(replica_id: str, ctx: AppContext) -> dict[str, Any]:
    """What the cross-replica router reads about this replica (JSON-able)."""
    snap = ctx.runtime.snapshot()
    resident = sorted({m for w in snap.workers for m in w.resident})
    free = max((w.budget_bytes - w.resident_bytes for w in snap.workers), default=0)
    return {"replica_id": replica_id, "resident": resident, "free_bytes": max(0, free),
            "draining": snap.draining, "load": snap.live_requests,
            "quota_replicas": ctx.quota.replicas}


def serve_context() -> Any:
    """This replica's Serve context (app, deployment, replica id)."""
    from ray import serve

    return serve.get_replica_context()


class SluiceReplica:
    """The body of the replica deployment (``sluice.cluster.app`` wraps it for Serve)."""

    async def __init__(self, config_data: dict[str, Any]) -> None:  # type: ignore[misc]
        self.config = Config.model_validate(config_data)
        self.replica_id = str(serve_context().replica_id.unique_id)
        self.app = create_app(self.config)
        self.ctx: AppContext = self.app.state.ctx
        self._lifespan = self.app.router.lifespan_context(self.app)
        await self._lifespan.__aenter__()
        self._follow = asyncio.get_running_loop().create_task(self._follow_replica_count())
        log.info("replica %s ready", self.replica_id)

    async def handle(self, hint: RouteHint, call: HttpCall
                     ) -> AsyncIterator[ResponseStart | bytes]:
        """Serve ``call`` with sluice's app; streamed (``ResponseStart``, then chunks)."""
        reason = hint.reasons.get(self.replica_id, "not ranked")
        extra = ((b"x-sluice-replica", self.replica_id.encode()),
                 (b"x-sluice-replica-route", reason.encode("ascii", "replace")[:200]))
        async for part in call_asgi(self.app, call, extra):
            yield part

    def record_routing_stats(self) -> dict[str, Any]:
        return routing_stats(self.replica_id, self.ctx)

    def record_autoscaling_stats(self) -> dict[str, float]:
        snap = self.ctx.runtime.snapshot()
        return {LOAD_METRIC: float(snap.live_requests), KV_METRIC: kv_use(snap)}

    async def check_health(self) -> None:
        state = readiness(self.ctx)
        if not state.ok and state.body.get("status") != "draining":
            raise RuntimeError(f"replica {self.replica_id} not ready: {dict(state.body)}")

    async def _follow_replica_count(self) -> None:
        while True:
            try:
                rc = serve_context()
                n = await asyncio.to_thread(running_replicas, rc.app_name, rc.deployment)
                if n and n != self.ctx.quota.replicas:
                    self.ctx.quota.set_replicas(n)
                    log.info("replica %s: %d replicas share the quotas", self.replica_id, n)
            except Exception as exc:  # a status hiccup must not stop the replica
                log.warning("replica %s: replica count unavailable: %s", self.replica_id, exc)
            await asyncio.sleep(QUOTA_REPLICAS_PERIOD_S)

    async def __del__(self) -> None:
        """Serve has drained this replica (no request in flight): stop the runtime."""
        self._follow.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._follow
        await self._lifespan.__aexit__(None, None, None)
        log.info("replica %s stopped", self.replica_id)
