"""Prometheus metrics (prefix ``sluice_``): an ``Observer`` for events, and a collector
that reads gauges from a runtime snapshot at scrape time. Each app has its own
registry, so several servers can live in one process (tests).

Names follow what dashboards for vLLM expect where the meaning is the same (the mapping is
in docs/operations.md, "Metrics"): TTFT, TPOT (a request's mean time per output token after
the first), ITL (every gap between two tokens of a sequence), requests running and waiting,
KV use, and prefix-cache queries and hits in tokens. The ``vllm:*`` names the Gateway API Inference
Extension reads and llama-server's ``llamacpp:*`` names come from ``peer_metrics``."""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, disable_created_metrics
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from sluice.engine.observer import Observer
from sluice.engine.request import Request, RequestStatus
from sluice.engine.runtime import RuntimeSnapshot
from sluice.engine.worker import WorkerState
from sluice.server.peer_metrics import LlamaTally, requests_running, requests_waiting

disable_created_metrics()  # type: ignore[no-untyped-call]

LATENCY_BUCKETS_S = (
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0,
)
TOKEN_BUCKETS_S = (0.002, 0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.25, 0.5, 1.0)
BATCH_BUCKETS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 64, 128)


OTHER_TENANT = "other"
"""The ``tenant`` label of every tenant that is not configured (``X-Tenant-ID`` on an open
server can name any): one series for them all, so they cannot grow the series without bound."""


def tenant_labels(configured: Iterable[str]) -> Callable[[str], str]:
    """The ``tenant`` label of a tenant id: itself when configured (or ``default``), else
    ``OTHER_TENANT``."""
    known = frozenset(configured) | {"default"}

    def label(tenant_id: str) -> str:
        return tenant_id if tenant_id in known else OTHER_TENANT

    return label


class PrometheusObserver(Observer):
    """Counts and histograms, labelled by model and tenant (``tenant_label`` maps a tenant id
    to its label; by default every id is its own label)."""

    def __init__(self, registry: CollectorRegistry,
                 tenant_label: Callable[[str], str] | None = None,
                 generative: Collection[str] = ()) -> None:
        """``generative``: the generative model ids (their steps are llama-server's
        decodes in ``llama``, the tally behind the ``llamacpp:*`` names)."""
        self._tenant = tenant_label or (lambda tenant_id: tenant_id)
        self.llama = LlamaTally(generative)
        self.requests = Counter(
            "sluice_requests", "Requests by terminal state", ["model", "tenant", "state"],
            registry=registry,
        )
        self.rejections = Counter(
            "sluice_rejections", "Requests refused at admission, by reason",
            ["model", "tenant", "reason"], registry=registry,
        )
        self.admitted_total = Counter(
            "sluice_admitted", "Requests admitted into the queue", ["model", "tenant"],
            registry=registry,
        )
        self.goodput = Counter(
            "sluice_goodput", "Completed requests that met their deadline (or had none)",
            ["model", "tenant"], registry=registry,
        )
        self.tokens = Counter(
            "sluice_tokens", "Tokens processed", ["model", "tenant", "kind"], registry=registry
        )
        self.ttft = Histogram(
            "sluice_time_to_first_token_seconds", "Arrival to first generated token",
            ["model", "tenant"], buckets=LATENCY_BUCKETS_S, registry=registry,
        )
        self.tpot = Histogram(
            "sluice_time_per_output_token_seconds",
            "Time per output token (TPOT): a completed request's mean time between its "
            "generated tokens, (finish - first token) / (tokens - 1)",
            ["model"], buckets=TOKEN_BUCKETS_S, registry=registry,
        )
        self.itl = Histogram(
            "sluice_inter_token_latency_seconds",
            "Inter-token latency (ITL): each gap between two consecutive generated tokens "
            "of one sequence",
            ["model"], buckets=TOKEN_BUCKETS_S, registry=registry,
        )
        self._itl_by_model: dict[str, Any] = {}
        self.prefix_queries = Counter(
            "sluice_prefix_cache_queries",
            "Prompt tokens of generative requests that started, each looked up for a reusable "
            "prefix (hits are sluice_prefix_cache_hits_total)",
            ["model"], registry=registry,
        )
        self.e2e = Histogram(
            "sluice_request_latency_seconds", "Arrival to terminal state (completed requests)",
            ["model", "tenant"], buckets=LATENCY_BUCKETS_S, registry=registry,
        )
        self.queue_wait = Histogram(
            "sluice_queue_wait_seconds", "Admission to start of execution",
            ["model", "tenant"], buckets=LATENCY_BUCKETS_S, registry=registry,
        )
        self.batch_size = Histogram(
            "sluice_batch_size", "Members of each one-shot batch or decode step",
            ["model"], buckets=BATCH_BUCKETS, registry=registry,
        )
        self.predicted_wait = Histogram(
            "sluice_predicted_wait_seconds",
            "The planner's predicted queue wait for the variant it chose (planned requests)",
            ["model"], buckets=LATENCY_BUCKETS_S, registry=registry,
        )
        self.variant_choices = Counter(
            "sluice_variant_choices", "Variants the planner chose for group requests",
            ["group", "variant", "reason"], registry=registry,
        )
        self.planner_rejections = Counter(
            "sluice_planner_rejections",
            "Group requests rejected at once because no variant could meet the deadline",
            ["group"], registry=registry,
        )
        self.loads = Counter(
            "sluice_model_loads", "Model loads", ["worker", "model"], registry=registry
        )
        self.load_failures = Counter(
            "sluice_model_load_failures", "Model loads that raised", ["worker", "model"],
            registry=registry,
        )
        self.evictions = Counter(
            "sluice_model_evictions", "Models unloaded to make room or on request",
            ["worker", "model"], registry=registry,
        )
        self.idle_unloads = Counter(
            "sluice_model_idle_unloads", "Models unloaded because their keep-alive ran out",
            ["worker", "model"], registry=registry,
        )
        self.worker_deaths = Counter(
            "sluice_worker_deaths", "Workers the supervisor declared dead and replaced "
            "(cause: died = its thread ended, stalled = no progress within the watchdog)",
            ["worker", "cause"], registry=registry,
        )
        self.worker_failed_requests = Counter(
            "sluice_worker_failed_requests",
            "Requests ended (failed, worker_failed) because their worker died",
            ["worker"], registry=registry,
        )
        self.worker_recovery = Histogram(
            "sluice_worker_recovery_seconds",
            "A worker's death to its replacement having loaded the dead one's models",
            buckets=LATENCY_BUCKETS_S, registry=registry,
        )

    def planned(self, group_id: str, variant: str | None, reason: str) -> None:
        if variant is None:
            self.planner_rejections.labels(group_id).inc()
        else:
            self.variant_choices.labels(group_id, variant, reason).inc()

    def admitted(self, req: Request) -> None:
        self.admitted_total.labels(req.model_id, self._tenant(req.tenant_id)).inc()

    def rejected(self, model_id: str, tenant_id: str, reason: str) -> None:
        self.rejections.labels(model_id, self._tenant(tenant_id), reason).inc()

    def token_gap(self, model_id: str, seconds: float) -> None:
        child = self._itl_by_model.get(model_id)
        if child is None:  # labels() costs a lock and a lookup; this runs once a token
            child = self._itl_by_model[model_id] = self.itl.labels(model_id)
        child.observe(seconds)

    def finished(self, req: Request) -> None:
        self.llama.finished(req)
        model, tenant, t = req.model_id, self._tenant(req.tenant_id), req.times
        self.requests.labels(model, tenant, req.status.name.lower()).inc()
        if req.kind == "generative" and t.started_s is not None:
            self.prefix_queries.labels(model).inc(len(req.prompt_tokens))
        if req.status == RequestStatus.REJECTED:
            return
        if req.predicted_wait_s is not None:
            self.predicted_wait.labels(model).observe(req.predicted_wait_s)
        if t.started_s is not None and t.queued_s is not None:
            self.queue_wait.labels(model, tenant).observe(t.started_s - t.queued_s)
        if req.status != RequestStatus.COMPLETED or t.finished_s is None:
            return
        self.e2e.labels(model, tenant).observe(t.finished_s - t.arrival_s)
        if req.deadline_s is None or t.finished_s <= req.deadline_s:
            self.goodput.labels(model, tenant).inc()
        if req.kind != "generative":
            return
        final = req.final
        completion = final.completion_tokens if final else req.completion_tokens
        choices = max(1, len(final.choices) if final else 1)
        self.tokens.labels(model, tenant, "prompt").inc(len(req.prompt_tokens))
        self.tokens.labels(model, tenant, "completion").inc(completion)
        if t.first_token_s is not None:
            self.ttft.labels(model, tenant).observe(t.first_token_s - t.arrival_s)
            per_choice = completion / choices  # n choices decode side by side
            if per_choice > 1:
                self.tpot.labels(model).observe(
                    (t.finished_s - t.first_token_s) / (per_choice - 1))

    def batch(self, worker_id: int, model_id: str, size: int) -> None:
        self.batch_size.labels(model_id).observe(size)
        self.llama.step(model_id, size)

    def model_loaded(self, worker_id: int, model_id: str, seconds: float) -> None:
        self.loads.labels(str(worker_id), model_id).inc()

    def model_evicted(self, worker_id: int, model_id: str) -> None:
        self.evictions.labels(str(worker_id), model_id).inc()

    def model_idle_unloaded(self, worker_id: int, model_id: str) -> None:
        self.idle_unloads.labels(str(worker_id), model_id).inc()

    def model_load_failed(self, worker_id: int, model_id: str, error: str) -> None:
        self.load_failures.labels(str(worker_id), model_id).inc()

    def worker_died(self, worker_id: int, cause: str, failed_requests: int) -> None:
        self.worker_deaths.labels(str(worker_id), cause).inc()
        self.worker_failed_requests.labels(str(worker_id)).inc(failed_requests)

    def worker_recovered(self, worker_id: int, seconds: float) -> None:
        self.worker_recovery.observe(seconds)


class SnapshotCollector(Collector):
    """Gauges read from the runtime when Prometheus scrapes. ``sluice_worker_up``: 1 while
    a worker serves; 0 while it is dead, stopped, or being replaced (its replacement has
    not yet loaded the dead one's models)."""

    def __init__(self, snapshot: Callable[[], RuntimeSnapshot]) -> None:
        self._snapshot = snapshot

    def collect(self) -> Iterator[Metric]:
        snap = self._snapshot()
        yield GaugeMetricFamily("sluice_queue_depth", "Requests in the global queue",
                                value=snap.queue_depth)
        yield GaugeMetricFamily("sluice_queue_capacity", "Global queue bound",
                                value=snap.queue_capacity)
        yield GaugeMetricFamily("sluice_draining", "1 while the server drains",
                                value=int(snap.draining))
        inbox = GaugeMetricFamily("sluice_worker_inbox_depth", "Requests waiting at a worker",
                                  labels=["worker"])
        active = GaugeMetricFamily("sluice_worker_active", "Requests running on a worker",
                                   labels=["worker"])
        resident = GaugeMetricFamily("sluice_worker_resident_bytes",
                                     "Estimated bytes of resident models", labels=["worker"])
        budget = GaugeMetricFamily("sluice_worker_budget_bytes", "Model memory budget",
                                   labels=["worker"])
        kv_used = GaugeMetricFamily("sluice_kv_blocks_used", "KV blocks held by sequences",
                                    labels=["worker", "model"])
        kv_total = GaugeMetricFamily("sluice_kv_blocks_total", "KV blocks of a loaded model",
                                     labels=["worker", "model"])
        kv_usage = GaugeMetricFamily("sluice_kv_usage_ratio", "Fraction of KV blocks in use",
                                     labels=["worker", "model"])
        for state, depth in zip(snap.workers, snap.inbox_depths, strict=True):
            w = str(state.worker_id)
            inbox.add_metric([w], depth)
            active.add_metric([w], state.active_count)
            resident.add_metric([w], state.resident_bytes)
            budget.add_metric([w], state.budget_bytes)
            for m in state.models:
                if m.kv_total_blocks:
                    used = m.kv_total_blocks - (m.kv_free_blocks or 0)
                    kv_used.add_metric([w, m.model_id], used)
                    kv_total.add_metric([w, m.model_id], m.kv_total_blocks)
                    kv_usage.add_metric([w, m.model_id], used / m.kv_total_blocks)
        yield from (inbox, active, resident, budget, kv_used, kv_total, kv_usage)
        if snap.worker_status:
            up = GaugeMetricFamily(
                "sluice_worker_up", "1 while the worker serves; 0 while it is dead or being "
                "replaced", labels=["worker"])
            for state, status in zip(snap.workers, snap.worker_status, strict=True):
                up.add_metric([str(state.worker_id)], int(status == "up"))
            yield up
        hits = CounterMetricFamily(
            "sluice_prefix_cache_hits",
            "Prompt tokens whose KV was reused instead of computed: copied from a running "
            "sequence, kept in a slot's retained prefix, or restored from the prompt cache "
            "in host memory (per load of the model: restarts at 0 when it is loaded again)",
            labels=["worker", "model"])
        for state in snap.workers:
            for m in state.models:
                hits.add_metric([str(state.worker_id), m.model_id], m.prefix_hit_tokens)
        yield hits
        yield from speculation_counters(snap.workers)
        yield GaugeMetricFamily(
            "sluice_requests_running", "Requests executing on a worker (all models)",
            value=requests_running(snap))
        yield GaugeMetricFamily(
            "sluice_requests_waiting",
            "Requests admitted and not yet running: the global queue, worker inboxes, and "
            "requests waiting for KV blocks", value=requests_waiting(snap))


def speculation_counters(workers: Iterable[WorkerState]) -> Iterator[Metric]:
    """``sluice_spec_draft_tokens_total`` and ``sluice_spec_accepted_tokens_total`` by
    worker and model: the tokens n-gram speculation drafted and the model accepted (per
    load of the model, as the engine counts them)."""
    drafted = CounterMetricFamily(
        "sluice_spec_draft_tokens",
        "Tokens drafted by n-gram speculation and verified in a decode step (per load of "
        "the model: restarts at 0 when it is loaded again)", labels=["worker", "model"])
    accepted = CounterMetricFamily(
        "sluice_spec_accepted_tokens",
        "Drafted tokens the model agreed with: each a token gained over plain decoding "
        "(per load of the model)", labels=["worker", "model"])
    for state in workers:
        for m in state.models:
            if m.speculation is not None:
                labels = [str(state.worker_id), m.model_id]
                drafted.add_metric(labels, m.speculation.draft_tokens)
                accepted.add_metric(labels, m.speculation.accepted_tokens)
    yield from (drafted, accepted)
