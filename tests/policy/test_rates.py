"""The sliding-window rate meter behind Retry-After and the planner's arrival rate."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sluice.policy.queues.rates import RateMeter


def test_empty_meter_reads_zero() -> None:
    assert RateMeter(10.0).rate_per_s(5.0) == 0.0


def test_rate_over_a_full_window() -> None:
    m = RateMeter(window_s=10.0)
    for i in range(50):
        m.record(i * 0.5)  # 2 events/s for 25 s
    # The window holds (14.5, 24.5] plus the edge event at 14.5: 21 events over 10 s.
    assert m.rate_per_s(24.5) == pytest.approx(2.1)


def test_events_leave_the_window() -> None:
    m = RateMeter(window_s=5.0)
    m.record(0.0, count=10)
    assert m.rate_per_s(1.0) == pytest.approx(10.0)
    assert m.rate_per_s(5.0 + 1e-9) == 0.0


def test_min_span_keeps_a_first_burst_from_reading_as_a_huge_rate() -> None:
    fast = RateMeter(window_s=10.0)
    damped = RateMeter(window_s=10.0, min_span_s=2.0)
    for m in (fast, damped):
        m.record(100.0, count=4)
    assert fast.rate_per_s(100.0) == pytest.approx(4000.0)
    assert damped.rate_per_s(100.0) == pytest.approx(2.0)
    # Past the minimum span the true elapsed time is used.
    assert damped.rate_per_s(104.0) == pytest.approx(1.0)


@pytest.mark.parametrize(("window_s", "min_span_s"), [(0.0, 1e-3), (1.0, 0.0), (1.0, 2.0)])
def test_bad_windows_are_refused(window_s: float, min_span_s: float) -> None:
    with pytest.raises(ValueError, match="must be"):
        RateMeter(window_s, min_span_s)


@given(st.lists(st.floats(min_value=0.0, max_value=100.0), max_size=200),
       st.floats(min_value=0.5, max_value=30.0))
def test_rate_counts_exactly_the_events_in_the_window(times: list[float], window_s: float) -> None:
    times = sorted(times)
    m = RateMeter(window_s=window_s)
    for t in times:
        m.record(t)
    now = times[-1] if times else 0.0
    inside = sum(1 for t in times if t >= now - window_s)
    span = min(window_s, max(now - times[0], 1e-3)) if times else 1.0
    assert m.rate_per_s(now) == pytest.approx(inside / span if times else 0.0)


def test_stderr_is_that_of_a_poisson_count() -> None:
    m = RateMeter(window_s=10.0, min_span_s=2.0)
    m.record(0.0, count=100)
    rate, stderr = m.rate_and_stderr(10.0)
    assert rate == pytest.approx(10.0)
    assert stderr == pytest.approx(1.0)  # √100 / 10 s
    # A first burst: few events over the minimum span, so a wide error.
    first = RateMeter(window_s=10.0, min_span_s=2.0)
    first.record(0.0, count=4)
    assert first.rate_and_stderr(0.0) == pytest.approx((2.0, 1.0))
    assert RateMeter(10.0).rate_and_stderr(1.0) == (0.0, 0.0)


def test_a_restored_meter_reads_as_the_live_one_on_another_clock() -> None:
    live = RateMeter(window_s=3.0, min_span_s=2.0)
    for i in range(40):
        live.record(1000.0 + i * 0.1)  # 10/s for 4 s, first event long ago
    carried = RateMeter(window_s=3.0, min_span_s=2.0)
    carried.restore(live.state(1004.5), now=0.0)  # a simulation's clock starts at 0
    fresh = RateMeter(window_s=3.0, min_span_s=2.0)
    first = []
    for dt in (0.0, 0.7, 2.0):
        live.record(1004.5 + dt)
        carried.record(dt)
        fresh.record(dt)
        assert carried.rate_and_stderr(dt) == pytest.approx(live.rate_and_stderr(1004.5 + dt))
        first.append((fresh.rate_per_s(dt), live.rate_per_s(1004.5 + dt)))
    # started empty, a meter reads the load that went before as absent: 1 event over its
    # 2 s minimum span against the live one's 26 over its 3 s window (25 carried + 1)
    assert first[0] == (pytest.approx(0.5), pytest.approx(26 / 3))
