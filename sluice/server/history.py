"""The status page's last minutes: a bounded ring of points derived from readings of the
metrics ``/metrics`` serves (sluice's Prometheus counters, histograms and gauges), so the
charts and a Prometheus dashboard show one truth.

A ``Reading`` is the cumulative state at one instant; ``History.record`` turns each reading
into a ``Point`` against the readings before it: tokens/s and refusals/s over the interval
since the previous reading, TTFT and TPOT p95 over the last ``window_s`` (interpolated in
the histogram's buckets as Prometheus's ``histogram_quantile`` does), requests waiting and
running as read. Pure: time comes in on the readings, nothing here reads a clock.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from itertools import pairwise

Buckets = tuple[tuple[float, float], ...]
"""A histogram's cumulative buckets: ``(upper bound, observations <= it)`` by rising bound,
the last bound ``inf``; ``()`` before its first observation."""

HISTORY_SPAN_S = 600.0
"""How far back the status page's charts reach."""
SAMPLE_INTERVAL_S = 2.0
"""Seconds between two readings (so the ring holds ``HISTORY_SPAN_S / SAMPLE_INTERVAL_S``
points)."""
QUANTILE_WINDOW_S = 30.0
"""The trailing window a point's p95 values and the tenants' rates are taken over."""


@dataclass(frozen=True, slots=True)
class Reading:
    """The metrics at one instant: counters as cumulative totals, gauges as they stood."""

    at_s: float
    """When it was read (the runtime's clock)."""
    completion_tokens: float
    """``sluice_tokens_total{kind="completion"}`` over every model and tenant."""
    waiting: int
    """``sluice_requests_waiting``."""
    running: int
    """``sluice_requests_running``."""
    ttft: Buckets = ()
    """``sluice_time_to_first_token_seconds``, every label set summed."""
    tpot: Buckets = ()
    """``sluice_time_per_output_token_seconds``, every label set summed."""
    refusals: Mapping[str, float] = field(default_factory=dict)
    """``sluice_rejections_total`` by reason."""
    tenant_requests: Mapping[str, float] = field(default_factory=dict)
    """``sluice_admitted_total`` by tenant label."""
    tenant_tokens: Mapping[str, float] = field(default_factory=dict)
    """``sluice_tokens_total`` (prompt and completion) by tenant label."""


@dataclass(frozen=True, slots=True)
class Point:
    """One sample of the charts, at its reading's time."""

    at_s: float
    tokens_per_s: float
    """Completion tokens counted since the previous reading, per second."""
    waiting: int
    running: int
    ttft_p95_s: float | None
    """Over the observations of the last ``window_s``; ``None`` when there were none."""
    tpot_p95_s: float | None
    refusals_per_s: Mapping[str, float]
    """Refusals since the previous reading, per second, by reason (reasons with none left
    out)."""


@dataclass(frozen=True, slots=True)
class TenantRate:
    """A tenant's admitted requests and counted tokens per second over the window."""

    requests_per_s: float
    tokens_per_s: float


def histogram_quantile(q: float, buckets: Buckets) -> float | None:
    """The ``q`` quantile of cumulative ``buckets``, interpolated linearly inside the bucket
    that holds it (lower bound 0 for the first), as Prometheus's ``histogram_quantile``:
    in the ``inf`` bucket it is the highest finite bound. ``None`` with no observations."""
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"q must be in [0, 1], got {q!r}")
    if not buckets or buckets[-1][1] <= 0:
        return None
    rank = q * buckets[-1][1]
    lower_bound, lower_count = 0.0, 0.0
    for bound, count in buckets:
        if count >= rank:
            if math.isinf(bound):
                return lower_bound
            if count == lower_count:
                return bound
            share = (rank - lower_count) / (count - lower_count)
            return lower_bound + (bound - lower_bound) * share
        lower_bound, lower_count = bound, count
    return lower_bound


def bucket_delta(later: Buckets, earlier: Buckets) -> Buckets:
    """The observations ``later`` holds beyond ``earlier`` (a histogram that had none at
    ``earlier`` is ``()`` there)."""
    before = dict(earlier)
    return tuple((bound, count - before.get(bound, 0.0)) for bound, count in later)


def per_s(later: Mapping[str, float], earlier: Mapping[str, float],
          seconds: float) -> dict[str, float]:
    """Each key's increase from ``earlier`` to ``later`` per second (keys with none left
    out)."""
    out: dict[str, float] = {}
    for key, value in later.items():
        grown = value - earlier.get(key, 0.0)
        if grown > 0:
            out[key] = grown / seconds
    return out


class History:
    """The last ``span_s`` of points, one per reading (a reading every ``interval_s``).

    Invariants: at most ``capacity`` points, oldest first, their times strictly rising;
    the readings kept are those a new point's window needs (the newest and those up to
    ``window_s`` before it, at least two), so memory is bounded by ``capacity`` and the
    window whatever the traffic. Owned by one thread (the server's event loop)."""

    def __init__(self, span_s: float = HISTORY_SPAN_S, interval_s: float = SAMPLE_INTERVAL_S,
                 window_s: float = QUANTILE_WINDOW_S) -> None:
        for name, value in (("span_s", span_s), ("interval_s", interval_s),
                            ("window_s", window_s)):
            if not math.isfinite(value) or value <= 0:
                raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
        self.interval_s = interval_s
        self.window_s = window_s
        self.capacity = max(1, math.floor(span_s / interval_s))
        self._points: deque[Point] = deque(maxlen=self.capacity)
        self._readings: deque[Reading] = deque(maxlen=self.capacity + 1)
        self._tenant_rates: dict[str, TenantRate] = {}

    def __len__(self) -> int:
        return len(self._points)

    def record(self, reading: Reading) -> Point | None:
        """Add ``reading``; returns its point (``None`` for the first reading, which has no
        interval before it). A reading not later than the last one is a ``ValueError``."""
        if self._readings and reading.at_s <= self._readings[-1].at_s:
            raise ValueError(f"reading at {reading.at_s} is not after the last one "
                             f"({self._readings[-1].at_s})")
        previous = self._readings[-1] if self._readings else None
        self._readings.append(reading)
        while len(self._readings) > 2 and self._readings[0].at_s < reading.at_s - self.window_s:
            self._readings.popleft()
        if previous is None:
            return None
        base = self._readings[0]  # the oldest within the window (or the previous reading)
        span_s = reading.at_s - base.at_s
        self._tenant_rates = {
            tenant: TenantRate(
                requests_per_s=max(0.0, reading.tenant_requests.get(tenant, 0.0)
                                   - base.tenant_requests.get(tenant, 0.0)) / span_s,
                tokens_per_s=max(0.0, reading.tenant_tokens.get(tenant, 0.0)
                                 - base.tenant_tokens.get(tenant, 0.0)) / span_s)
            for tenant in sorted({*reading.tenant_requests, *reading.tenant_tokens})}
        dt_s = reading.at_s - previous.at_s
        point = Point(
            at_s=reading.at_s,
            tokens_per_s=max(0.0, reading.completion_tokens - previous.completion_tokens) / dt_s,
            waiting=reading.waiting,
            running=reading.running,
            ttft_p95_s=histogram_quantile(0.95, bucket_delta(reading.ttft, base.ttft)),
            tpot_p95_s=histogram_quantile(0.95, bucket_delta(reading.tpot, base.tpot)),
            refusals_per_s=per_s(reading.refusals, previous.refusals, dt_s),
        )
        self._points.append(point)
        return point

    def points(self) -> Sequence[Point]:
        """The points held, oldest first."""
        return tuple(self._points)

    def check_integrity(self) -> None:
        """Raise ``AssertionError`` if an invariant of the class docstring does not hold."""
        assert len(self._points) <= self.capacity
        times = [p.at_s for p in self._points]
        assert all(a < b for a, b in pairwise(times)), times
        kept = [r.at_s for r in self._readings]
        assert all(a < b for a, b in pairwise(kept)), kept
        if len(kept) > 2:
            assert kept[0] >= kept[-1] - self.window_s, kept
        if times:
            assert times[-1] == kept[-1]

    def tenant_rates(self) -> Mapping[str, TenantRate]:
        """Per tenant label, its rates over the window ending at the last reading."""
        return dict(self._tenant_rates)
