"""The status page's history: the ring stays bounded and in order, rates and p95 values are
computed from the readings as Prometheus would, and a reading comes from the same counters
``/metrics`` exposes. Also the observers it is fed by: the fan-out and the decision log."""

from __future__ import annotations

import math
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from sluice.engine.observer import Observer, Observers
from sluice.engine.request import Request, RequestStatus
from sluice.engine.runtime import RuntimeSnapshot
from sluice.server.decisions import DecisionLog
from sluice.server.history import History, Reading, histogram_quantile
from sluice.server.metrics import PrometheusObserver
from sluice.server.sampler import read_metrics

INF = math.inf


def reading(at_s: float, tokens: float = 0.0, waiting: int = 0, running: int = 0,
            **counters: Any) -> Reading:
    return Reading(at_s=at_s, completion_tokens=tokens, waiting=waiting, running=running,
                   **counters)


def test_quantile_interpolates_inside_the_bucket_as_prometheus_does() -> None:
    buckets = ((0.1, 50.0), (0.5, 90.0), (1.0, 100.0), (INF, 100.0))
    assert histogram_quantile(0.95, buckets) == pytest.approx(0.75)  # 0.5 + 0.5 * 5/10
    assert histogram_quantile(0.5, buckets) == pytest.approx(0.1)
    assert histogram_quantile(0.25, buckets) == pytest.approx(0.05)  # from 0 in the first
    # in the +Inf bucket: the highest finite bound
    assert histogram_quantile(0.95, ((0.1, 1.0), (0.5, 1.0), (INF, 10.0))) == 0.5
    assert histogram_quantile(0.95, ()) is None
    assert histogram_quantile(0.95, ((0.1, 0.0), (INF, 0.0))) is None
    with pytest.raises(ValueError, match="q must be in"):
        histogram_quantile(1.5, buckets)


def test_rates_are_the_increase_since_the_previous_reading_per_second() -> None:
    history = History(span_s=60, interval_s=2, window_s=10)
    assert history.record(reading(0.0, tokens=0, refusals={"quota": 1.0})) is None
    point = history.record(reading(2.0, tokens=100, waiting=3, running=2,
                                   refusals={"quota": 4.0, "queue_full": 1.0}))
    assert point is not None
    assert point.tokens_per_s == pytest.approx(50.0)
    assert (point.waiting, point.running) == (3, 2)
    assert point.refusals_per_s == {"quota": pytest.approx(1.5), "queue_full": pytest.approx(0.5)}
    # an interval of 4 s with no new tokens or refusals
    point = history.record(reading(6.0, tokens=100, refusals={"quota": 4.0, "queue_full": 1.0}))
    assert point is not None
    assert point.tokens_per_s == 0.0 and point.refusals_per_s == {}
    history.check_integrity()


def test_p95_covers_the_observations_of_the_window_only() -> None:
    """Ten slow first tokens in the first 2 s, ten fast ones at 10-12 s: with a 10 s window
    the p95 at 10 s is among the slow ones, at 12 s the fast ones' alone, and once neither
    is in the window there is none."""
    history = History(span_s=600, interval_s=2, window_s=10)
    slow = ((0.05, 0.0), (1.0, 0.0), (5.0, 10.0), (INF, 10.0))
    both = ((0.05, 10.0), (1.0, 10.0), (5.0, 20.0), (INF, 20.0))
    history.record(reading(0.0))
    points = {at: history.record(reading(float(at), ttft=slow)) for at in range(2, 12, 2)}
    p10 = points[10]
    assert p10 is not None and p10.ttft_p95_s is not None
    assert 1.0 < p10.ttft_p95_s <= 5.0  # the base is the empty reading at 0 s
    p12 = history.record(reading(12.0, ttft=both))
    assert p12 is not None
    assert p12.ttft_p95_s == pytest.approx(0.0475)  # base at 2 s: the fast ten only
    for at in range(14, 26, 2):
        last = history.record(reading(float(at), ttft=both))
    assert last is not None and last.ttft_p95_s is None  # nothing new within 10 s
    assert last.tpot_p95_s is None
    history.check_integrity()


def test_the_ring_is_bounded_and_keeps_the_newest_points_in_order() -> None:
    history = History(span_s=20, interval_s=2, window_s=5)
    assert history.capacity == 10
    for i in range(100):
        history.record(reading(float(i), tokens=float(i * i)))
        history.check_integrity()
    points = history.points()
    assert len(points) == len(history) == 10
    assert [p.at_s for p in points] == [float(i) for i in range(90, 100)]
    assert [p.tokens_per_s for p in points] == [float(2 * i - 1) for i in range(90, 100)]


def test_tenant_rates_are_over_the_window() -> None:
    history = History(span_s=60, interval_s=1, window_s=4)
    for at in range(10):
        history.record(reading(float(at), tenant_requests={"a": float(at), "b": 2.0 * at},
                               tenant_tokens={"a": 10.0 * at}))
    rates = history.tenant_rates()
    assert rates["a"].requests_per_s == pytest.approx(1.0)
    assert rates["a"].tokens_per_s == pytest.approx(10.0)
    assert rates["b"].requests_per_s == pytest.approx(2.0)
    assert rates["b"].tokens_per_s == 0.0


def test_a_reading_must_come_after_the_last_and_bad_settings_are_refused() -> None:
    history = History()
    history.record(reading(5.0))
    with pytest.raises(ValueError, match="not after the last one"):
        history.record(reading(5.0))
    with pytest.raises(ValueError, match="interval_s must be a finite number > 0"):
        History(interval_s=0)
    with pytest.raises(ValueError, match="window_s must be a finite number > 0"):
        History(window_s=math.nan)


def test_a_reading_sums_the_prometheus_series_by_the_chart_s_dimension() -> None:
    registry = CollectorRegistry()
    obs = PrometheusObserver(registry)
    obs.tokens.labels("m1", "t1", "completion").inc(30)
    obs.tokens.labels("m2", "t2", "completion").inc(12)
    obs.tokens.labels("m1", "t1", "prompt").inc(100)
    obs.ttft.labels("m1", "t1").observe(0.02)
    obs.ttft.labels("m2", "t2").observe(0.3)
    obs.rejected("m1", "t1", "quota")
    obs.rejected("m2", "t2", "quota")
    obs.rejected("m2", "t1", "queue_full")
    snap = RuntimeSnapshot(queue_depth=2, queue_capacity=8, live_requests=2, draining=False,
                           completions_per_s=0.0, workers=(), inbox_depths=())
    r = read_metrics(obs, snap, at_s=7.0)
    assert r.at_s == 7.0 and r.completion_tokens == 42.0
    assert (r.waiting, r.running) == (2, 0)
    assert r.refusals == {"quota": 2.0, "queue_full": 1.0}
    assert r.tenant_tokens == {"t1": 130.0, "t2": 12.0}
    ttft = dict(r.ttft)
    assert ttft[0.01] == 0.0 and ttft[0.025] == 1.0 and ttft[0.25] == 1.0
    assert ttft[0.5] == 2.0 and ttft[INF] == 2.0
    assert [b for b, _ in r.ttft] == sorted(b for b, _ in r.ttft)
    assert r.tpot == ()  # no observation yet


class Recorder(Observer):
    def __init__(self, name: str, calls: list[tuple[str, str]]) -> None:
        self.name, self.calls = name, calls

    def rejected(self, model_id: str, tenant_id: str, reason: str) -> None:
        self.calls.append((self.name, reason))


def test_observers_reach_each_member_that_records_the_call_in_order() -> None:
    calls: list[tuple[str, str]] = []
    both = Observers(Recorder("first", calls), Observer(), Recorder("second", calls))
    both.rejected("m", "t", "quota")
    both.finished(Request(1, "m", "generative", arrival_s=0.0))  # no member records it
    assert calls == [("first", "quota"), ("second", "quota")]


def test_the_decision_log_keeps_the_last_requests_newest_first() -> None:
    log = DecisionLog(kept=3)
    for i in range(1, 6):
        req = Request(i, "m", "generative", arrival_s=float(i), tenant_id="t" * 300)
        req.finish(RequestStatus.REJECTED, float(i) + 0.5, error="full", error_code="queue_full")
        log.finished(req)
    latest = log.latest()
    assert [d.request_id for d in latest] == [5, 4, 3]
    assert latest[0].state == "rejected" and latest[0].reason == "queue_full"
    assert latest[0].at_s == 5.5 and latest[0].worker_id is None
    assert len(latest[0].tenant_id) == 200  # cut
    with pytest.raises(ValueError, match="kept must be >= 1"):
        DecisionLog(kept=0)
