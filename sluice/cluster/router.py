"""Ray Serve's request router for the replica deployment, driving a sluice replica policy.

Serve calls ``choose_replicas`` for each request the front end sends to the replicas, and
tries the ranks it returns in order, skipping a replica its fresh queue-length check finds
full (``max_ongoing_requests``); when all are full the request waits, with backoff, in the
handle's queue, which ``max_queued_requests`` bounds (past it: ``BackPressureError``, a 503
at the front end). This adapter only translates: Serve's replicas become ``ReplicaView``s
(load from Serve's queue-length cache, residency from the replicas' routing stats), the
``RouteHint`` in the request becomes a ``ReplicaRequest``, and the policy's ranking comes
back as one replica per rank. Its reasons are written into the hint, which travels on to the
replica that serves it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from typing import Any

from ray.serve.request_router import PendingRequest, ReplicaID, RequestRouter, RunningReplica

from sluice.cluster.hints import RouteHint
from sluice.policy.queues.replica_router import (
    ReplicaRequest,
    ReplicaRouter,
    ReplicaView,
    make_replica_router,
)

REASONS_KEPT = 8
"""Reasons written into a hint: the top of the ranking (where the request will land)."""


def hint_of(pending: PendingRequest | None) -> RouteHint | None:
    if pending is None:
        return None
    for arg in (*pending.args, *pending.kwargs.values()):
        if isinstance(arg, RouteHint):
            return arg
    return None


def replica_view(replica_id: str, ongoing: int, capacity: int,
                 stats: Mapping[str, Any] | None) -> ReplicaView:
    """A ``ReplicaView`` from Serve's numbers and the replica's own routing stats (which
    are empty until its first report)."""
    stats = stats or {}
    return ReplicaView(
        replica_id=replica_id,
        ongoing=max(0, ongoing),
        capacity=max(1, capacity),
        resident=frozenset(str(m) for m in stats.get("resident", ())),
        free_bytes=max(0, int(stats.get("free_bytes", 0))),
        draining=bool(stats.get("draining", False)),
    )


class SluiceRequestRouter(RequestRouter):
    """Ranks replicas with ``sluice.policy.queues.replica_router`` (kwargs from ``[cluster]``)."""

    def initialize_state(self, **kwargs: Any) -> None:
        self._policy: ReplicaRouter = make_replica_router(
            str(kwargs.get("policy", "affinity")),
            load_factor=float(kwargs.get("load_factor", 1.25)),
            vnodes=int(kwargs.get("vnodes", 64)),
        )
        self._model_bytes: dict[str, int] = {
            str(k): int(v) for k, v in dict(kwargs.get("model_bytes", {})).items()}
        self._sent: Counter[ReplicaID] = Counter()
        """Requests this router sent and Serve has not reported finished, per replica: the
        load when Serve's queue-length cache has no fresh entry."""

    def _ongoing(self, replica: RunningReplica) -> int:
        cached = self._replica_queue_len_cache.get(replica.replica_id)
        return int(cached) if cached is not None else self._sent[replica.replica_id]

    async def choose_replicas(
        self,
        candidate_replicas: list[RunningReplica],
        pending_request: PendingRequest | None = None,
    ) -> list[list[RunningReplica]]:
        if not candidate_replicas:
            return []
        if pending_request is not None:
            # Back off between passes when every replica is full, instead of spinning.
            pending_request.routing_context.should_backoff = True
        hint = hint_of(pending_request)
        by_id = {r.replica_id.unique_id: r for r in candidate_replicas}
        views = [replica_view(rid, self._ongoing(r), r.max_ongoing_requests, r.routing_stats)
                 for rid, r in by_id.items()]
        request = (hint.request(self._model_bytes.get(hint.model_id, 0)) if hint is not None
                   else ReplicaRequest(""))
        ranking = self._policy.rank(request, views)
        if hint is not None:
            hint.reasons = {rid: ranking.reasons[rid] for rid in ranking.ranked[:REASONS_KEPT]}
        return [[by_id[rid]] for rid in ranking.ranked]

    def on_request_routed(self, pending_request: PendingRequest, replica_id: ReplicaID,
                          result: Any) -> None:
        self._sent[replica_id] += 1

    def on_request_completed(self, replica_id: ReplicaID, internal_request_id: str) -> None:
        if self._sent[replica_id] > 0:
            self._sent[replica_id] -= 1

    def on_replica_actor_died(self, replica_id: ReplicaID) -> None:
        super().on_replica_actor_died(replica_id)
        self._sent.pop(replica_id, None)
