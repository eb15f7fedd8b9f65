"""Readings of the metrics for the status page's history (``sluice.server.history``): taken
from the Prometheus observer's own counters and histograms and from the runtime snapshot
the ``/metrics`` gauges read, every ``History.interval_s`` on the server's event loop."""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Callable, Iterator

from prometheus_client import Counter, Histogram
from prometheus_client.samples import Sample

from sluice.engine.runtime import RuntimeSnapshot
from sluice.server.history import Buckets, History, Reading
from sluice.server.metrics import PrometheusObserver
from sluice.server.peer_metrics import requests_running, requests_waiting

log = logging.getLogger("sluice.server")


def _samples(metric: Counter | Histogram, suffix: str) -> Iterator[Sample]:
    for family in metric.collect():
        for sample in family.samples:
            if sample.name.endswith(suffix):
                yield sample


def summed_buckets(histogram: Histogram) -> Buckets:
    """The histogram's cumulative buckets, every label set summed (as ``sum by (le)``)."""
    counts: dict[float, float] = {}
    for sample in _samples(histogram, "_bucket"):
        bound = math.inf if sample.labels["le"] == "+Inf" else float(sample.labels["le"])
        counts[bound] = counts.get(bound, 0.0) + sample.value
    return tuple(sorted(counts.items()))


def summed_by(counter: Counter, label: str, **only: str) -> dict[str, float]:
    """The counter's totals summed by ``label``, over the label sets that carry ``only``."""
    out: dict[str, float] = {}
    for sample in _samples(counter, "_total"):
        if all(sample.labels.get(k) == v for k, v in only.items()):
            key = sample.labels[label]
            out[key] = out.get(key, 0.0) + sample.value
    return out


def read_metrics(observer: PrometheusObserver, snap: RuntimeSnapshot, at_s: float) -> Reading:
    """What ``/metrics`` would show at ``at_s``, as a ``Reading``."""
    return Reading(
        at_s=at_s,
        completion_tokens=sum(summed_by(observer.tokens, "kind", kind="completion").values()),
        waiting=requests_waiting(snap),
        running=requests_running(snap),
        ttft=summed_buckets(observer.ttft),
        tpot=summed_buckets(observer.tpot),
        refusals=summed_by(observer.rejections, "reason"),
        tenant_requests=summed_by(observer.admitted_total, "tenant"),
        tenant_tokens=summed_by(observer.tokens, "tenant"),
    )


async def sample_forever(history: History, read: Callable[[], Reading]) -> None:
    """Record a reading now and every ``history.interval_s`` after, until cancelled. A
    reading that raises is logged and skipped: the charts get a gap, the server serves on."""
    while True:
        try:
            history.record(read())
        except Exception:
            log.exception("status history: a metrics reading failed")
        await asyncio.sleep(history.interval_s)
