"""A simulated fleet: tenant quotas, a front end routing across replicas, the replicas, on
one virtual clock; ``simulate`` runs a workload through it and returns the report.

Per arrival, in the server's order: the tenant's quota (``TenantQuota.reserve`` on one
state shared by every replica: a Redis store modelled as exact and instant), then, with
more than one replica, the cross-replica router (``make_replica_router``: the same ranking
the cluster front end uses; the request goes to the best-ranked replica with room, and is
rejected ``queue_full`` when none has any), then the replica's admission. When a request
ends, its quota slot is released (the request refunded if it never ran, unused tokens
given back).

Arrivals are pulled from the workload one at a time, so memory stays bounded by the
requests in flight plus the report's latency arrays. ``simulate_closed_loop`` drives the
same fleet by clients instead of arrival times: each sends its next request when its
previous one ended. Conservation is checked at the end:
every submitted request ended exactly once (``SimRequest.finish`` refuses a second end),
and no replica holds anything.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import replace
from typing import Any

from sluice.policy.capacity.quota import QuotaState, TenantQuota
from sluice.policy.queues.replica_router import ReplicaRequest, ReplicaView, make_replica_router
from sluice.sim.clock import EventLoop
from sluice.sim.replica import SimReplica
from sluice.sim.report import Recorder
from sluice.sim.request import SimRequest
from sluice.sim.setup import SimConfig
from sluice.sim.workload import Arrival


class ConservationError(AssertionError):
    """A simulated request was lost or ended twice (a simulator bug, never a result)."""


class Fleet:
    """Replicas, front router and quotas on one ``EventLoop``."""

    def __init__(self, config: SimConfig, *, ttft_slo_s: float | None = None,
                 keep_requests: bool = False,
                 on_end: Callable[[SimRequest], None] | None = None) -> None:
        self.config = config
        self.on_end = on_end
        """Called with each request once it has ended (after the report recorded it)."""
        self.loop = EventLoop()
        self.recorder = Recorder(ttft_slo_s)
        self.replicas = [SimReplica(i, config, self.loop, self._ended)
                         for i in range(config.replicas)]
        self.front = (make_replica_router(config.replica_router) if config.replicas > 1
                      else None)
        self._ids = [str(r.replica_id) for r in self.replicas]
        self._capacity = config.capacity_per_replica
        self._views: list[ReplicaView | None] = [None] * config.replicas
        self._seen = [-1] * config.replicas
        self.quotas = {t: TenantQuota(limits) for t, limits in config.tenant_limits.items()}
        self.quota_state: dict[str, QuotaState] = {}
        self.submitted = 0
        self.ended = 0
        self._last_id = 0
        """The last request id given (ids stay unique across ``forget_history``)."""
        self._busy_before_s = 0.0
        """Busy seconds the workers had run before ``forget_history``."""
        self.requests: list[SimRequest] | None = [] if keep_requests else None
        self._model_bytes = {m.model_id: m.memory_bytes for m in config.models.values()}

    # -- arrivals --------------------------------------------------------------------------

    def arrive(self, arrival: Arrival, now: float) -> None:
        """An arrival reaches the front end; it enters the fleet after its model's
        ``overhead_s`` (the time outside the workers), counted from now."""
        model = self.config.models.get(arrival.model)
        overhead_s = model.cost.overhead_s if model is not None else 0.0
        if overhead_s > 0:
            self.loop.at(now + overhead_s, self._submit_late, (arrival, now))
        else:
            self.submit(arrival, now)

    def _submit_late(self, now: float, arg: tuple[Arrival, float]) -> None:
        arrival, arrived_s = arg
        self.submit(arrival, now, arrived_s)

    def submit(self, arrival: Arrival, now: float, arrived_s: float | None = None
               ) -> SimRequest:
        """Quota, front router, replica admission at ``now``; latencies and the deadline
        count from ``arrived_s`` (default ``now``)."""
        arrived_s = now if arrived_s is None else arrived_s
        self.submitted += 1
        self._last_id += 1
        req = SimRequest(self._last_id, arrival.model, arrived_s, tenant=arrival.tenant,
                         priority=arrival.priority,
                         deadline_s=None if arrival.deadline_s is None
                         else arrived_s + arrival.deadline_s,
                         n_prompt=arrival.prompt_tokens, max_tokens=arrival.output_tokens,
                         prefix_id=arrival.prefix_id, prefix_tokens=arrival.prefix_tokens,
                         input_chars=arrival.input_chars)
        model = self.config.models.get(arrival.model)
        if model is not None and model.ttft_deadline_s is not None:  # as the runtime: from
            req.ttft_deadline_s = now + model.ttft_deadline_s      # its arrival there
        if model is not None and model.ttft_target_s is not None:
            req.ttft_target_s = now + model.ttft_target_s
        if self.requests is not None:
            self.requests.append(req)
        if model is None and not any(
                g.group_id == arrival.model for g in self.config.groups):
            raise ValueError(f"workload names model {arrival.model!r}, which the config lacks")
        if not self._take_quota(req, now):
            return req
        if self.front is None:
            self.replicas[0].submit(req, now)
            return req
        ranking = self.front.rank(self._replica_request(req), self._replica_views())
        for rid in ranking.ranked:
            replica = self.replicas[int(rid)]
            if replica.ongoing < self._capacity:
                replica.submit(req, now)
                return req
        self._reject(req, now, "queue_full")
        return req

    def _replica_request(self, req: SimRequest) -> ReplicaRequest:
        key = None if req.prefix_id is None else f"{req.model}:{req.prefix_id}"
        return ReplicaRequest(req.model, self._model_bytes.get(req.model, 0), key)

    def _replica_views(self) -> list[ReplicaView]:
        """The front end's view of every replica (rebuilt only for replicas whose load or
        residency changed since the last request)."""
        views = self._views
        for r in self.replicas:
            i = r.replica_id
            v = views[i]
            if v is None or v.ongoing != r.ongoing or r.residency_version != self._seen[i]:
                resident: frozenset[str] = frozenset()
                free = 0
                for w in r.workers:
                    wv = w.view()
                    resident |= wv.resident
                    free = max(free, wv.free_bytes)
                views[i] = ReplicaView(self._ids[i], r.ongoing, self._capacity, resident, free)
                self._seen[i] = r.residency_version
        return views  # type: ignore[return-value]

    # -- quotas ----------------------------------------------------------------------------

    def _take_quota(self, req: SimRequest, now: float) -> bool:
        quota = self.quotas.get(req.tenant)
        if quota is None:
            return True
        tokens = float(req.n_prompt + req.max_tokens)
        state = self.quota_state.get(req.tenant) or quota.initial(now)
        decision = quota.reserve(state, tokens, now)
        self.quota_state[req.tenant] = decision.state
        if not decision.ok:
            self._reject(req, now, "quota")
            return False
        req.quota_tokens = tokens
        return True

    def _release_quota(self, req: SimRequest, now: float) -> None:
        quota = self.quotas.get(req.tenant)
        if quota is None or req.quota_tokens == 0:
            return
        used = float(req.n_prompt + req.generated) if req.started_s is not None else 0.0
        self.quota_state[req.tenant] = quota.release(
            self.quota_state[req.tenant], refund_request=req.started_s is None,
            refund_tokens=max(0.0, req.quota_tokens - used), now=now)

    # -- ends ------------------------------------------------------------------------------

    def _reject(self, req: SimRequest, now: float, reason: str) -> None:
        req.finish("rejected", now, reason)
        self._ended(req)

    def _ended(self, req: SimRequest) -> None:
        self.ended += 1
        self._release_quota(req, req.end_s if req.end_s is not None else self.loop.now)
        self.recorder.record(req)
        if self.on_end is not None:
            self.on_end(req)

    def forget_history(self) -> None:
        """Count afresh from now: a fleet whose requests have all ended (a warm-up) forgets
        them (its recorder, counts, kept requests and busy time start again) and keeps
        what they left in the workers: loaded models, retained and cached prefixes, the
        learned margins, the quotas' state."""
        self.check_conservation()
        self.recorder = Recorder(self.recorder.ttft_slo_s)
        self.submitted = self.ended = 0
        if self.requests is not None:
            self.requests = []
        self._busy_before_s = sum(r.busy_s() for r in self.replicas)

    def busy_s(self) -> float:
        """Busy worker seconds since the fleet began or last forgot its history."""
        return sum(r.busy_s() for r in self.replicas) - self._busy_before_s

    def check_conservation(self) -> None:
        """Every submitted request ended once; nothing is left anywhere."""
        if self.ended != self.submitted:
            raise ConservationError(f"{self.submitted} submitted, {self.ended} ended")
        for r in self.replicas:
            if r.live or len(r.scheduler) or r.ongoing:
                raise ConservationError(f"replica {r.replica_id} still holds {len(r.live)} "
                                        f"live, {len(r.scheduler)} queued, {r.ongoing} ongoing")
            for w in r.workers:
                if w.inbox or any(e.has_work for e in w.engines.values()):
                    raise ConservationError(f"worker {r.replica_id}/{w.worker_id} holds work")
                for e in w.engines.values():
                    e.kv.check_integrity()
                    if e.kv.free_blocks != e.kv.total_blocks:
                        raise ConservationError("an idle engine holds KV blocks")
                w.residency.check_integrity()
        if self.requests is not None and any(not q.is_terminal for q in self.requests):
            raise ConservationError("a request is not in a terminal state")


def simulate(config: SimConfig, arrivals: Iterable[Arrival], *, ttft_slo_s: float | None = None,
             progress: Callable[[int, float], None] | None = None,
             keep_requests: bool = False, record_decisions: bool = False
             ) -> tuple[dict[str, Any], Fleet]:
    """Run ``arrivals`` through a fleet of ``config`` until every request has ended.

    ``progress(submitted, now)`` is called every 10,000 arrivals. Returns the report (a
    JSON-ready dict) and the fleet (for tests: its requests when ``keep_requests``, each
    replica's ``dispatcher.decisions``, ``core.settlements`` and ``tracker.decisions``
    when ``record_decisions``)."""
    fleet = Fleet(config, ttft_slo_s=ttft_slo_s, keep_requests=keep_requests)
    if record_decisions:
        for replica in fleet.replicas:
            replica.dispatcher.decisions = []
            replica.core.settlements = []
            if replica.tracker is not None:
                replica.tracker.decisions = []
    loop = fleet.loop
    source: Iterator[Arrival] = iter(arrivals)
    first_s: list[float] = []
    last_arrival_s = [0.0]

    def arrive(now: float, arrival: Arrival) -> None:
        fleet.arrive(arrival, now)
        last_arrival_s[0] = now
        if progress is not None and fleet.submitted % 10_000 == 0:
            progress(fleet.submitted, now)
        nxt = next(source, None)
        if nxt is not None:
            loop.at(nxt.time_s, arrive, nxt)

    first = next(source, None)
    wall0 = time.perf_counter()
    if first is not None:
        first_s.append(first.time_s)
        loop.at(first.time_s, arrive, first)
    loop.run()
    wall_s = time.perf_counter() - wall0
    start_s = first_s[0] if first_s else 0.0
    return _report(fleet, start_s, max(last_arrival_s[0] - start_s, 1e-9), wall_s), fleet


def _report(fleet: Fleet, start_s: float, duration_s: float, wall_s: float) -> dict[str, Any]:
    """The drained fleet's report (after its conservation check): arrivals over
    ``duration_s`` from ``start_s``, ``wall_s`` of real time spent simulating."""
    fleet.check_conservation()
    config, loop = fleet.config, fleet.loop
    end_s = max(fleet.recorder.last_end_s, loop.now)
    busy = fleet.busy_s()
    n_workers = config.replicas * config.workers
    report = fleet.recorder.to_json(duration_s)
    report.update({
        "requests": fleet.submitted,
        "arrival_span_s": round(duration_s, 6),
        "drained_at_s": round(end_s, 6),
        "offered_per_s": round(fleet.submitted / duration_s, 4),
        "utilisation": round(busy / (n_workers * max(end_s - start_s, 1e-9)), 6),
        "replicas": [r.summary() for r in fleet.replicas] if config.replicas <= 64 else None,
        "workers": n_workers,
        "events": loop.events_run,
        "wall_s": round(wall_s, 3),
    })
    return report


def simulate_closed_loop(config: SimConfig, requests: Iterable[Arrival], *, clients: int,
                         ttft_slo_s: float | None = None, keep_requests: bool = False,
                         warm: Iterable[Arrival] = ()) -> tuple[dict[str, Any], Fleet]:
    """``clients`` closed-loop clients through a fleet of ``config``: at time 0 each sends
    one of ``requests`` (in their order; their ``time_s`` is not read), and a client
    sends the next as soon as its previous one ended, whatever its terminal state (a
    refused client asks again at once, as a load generator's loop does), until
    ``requests`` run out and every request has ended.

    The report is ``simulate``'s, its arrival span the time from the first request to the
    last sent, plus ``tokens`` (generated by the completed requests) and
    ``tokens_per_s`` (those over the time until the last request ended: what a closed
    loop's clients read per second).

    ``warm``: requests the server served before the loop, one at a time (a previous load
    level's prompts): they run to their end first and are then forgotten
    (``Fleet.forget_history``), so the loop meets the prefixes they left retained and
    cached; the loop's time 0 is when the last of them ended."""
    if clients < 1:
        raise ValueError(f"clients must be >= 1, got {clients}")
    source: Iterator[Arrival] = iter(requests)
    sent_s = [0.0]
    tokens = [0]

    def send(now: float, _: Any = None) -> None:
        arrival = next(source, None)
        if arrival is None:
            return
        fleet.arrive(replace(arrival, time_s=now), now)
        sent_s[0] = now

    def ended(req: SimRequest) -> None:
        if req.status == "completed":
            tokens[0] += req.generated
        # the client hears of the end now and sends its next request (an event, not a
        # call from inside the fleet's bookkeeping)
        fleet.loop.at(req.end_s if req.end_s is not None else fleet.loop.now, send)

    fleet = Fleet(config, ttft_slo_s=ttft_slo_s, keep_requests=keep_requests)
    wall0 = time.perf_counter()
    for arrival in warm:
        now = fleet.loop.now
        fleet.arrive(replace(arrival, time_s=now), now)
        fleet.loop.run()
    start_s = fleet.loop.now
    fleet.forget_history()
    fleet.on_end = ended
    sent_s[0] = start_s
    for _ in range(clients):
        fleet.loop.at(start_s, send)
    fleet.loop.run()
    report = _report(fleet, start_s, max(sent_s[0] - start_s, 1e-9),
                     time.perf_counter() - wall0)
    span_s = max(fleet.recorder.last_end_s - start_s, 1e-9)
    report.update(clients=clients, tokens=tokens[0],
                  tokens_per_s=round(tokens[0] / span_s, 4) if fleet.submitted else 0.0)
    return report, fleet
