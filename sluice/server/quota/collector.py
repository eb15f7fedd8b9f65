"""``QuotaCollector``: the quota gauges and counters for ``/metrics``, read at scrape time."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from sluice.server.quota.failover import FailoverQuotaStore
from sluice.server.quota.gate import QuotaGate


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
        yield GaugeMetricFamily(
            "sluice_quota_replicas",
            "Replicas assumed to share the quotas; this replica's local share is 1/replicas",
            value=gate.replicas)
        store = gate.store
        if isinstance(store, FailoverQuotaStore):
            yield CounterMetricFamily("sluice_quota_backend_errors",
                                      "Failed calls to the shared quota store",
                                      value=store.backend_errors)
            yield CounterMetricFamily("sluice_quota_fallbacks",
                                      "Times the shared quota store became unreachable",
                                      value=store.outages)
            yield CounterMetricFamily(
                "sluice_quota_cancelled_reservations",
                "Reservations whose call to the shared store failed, cancelled there once it "
                "answered (a slow store may have run them)",
                value=store.cancelled_reservations)
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
