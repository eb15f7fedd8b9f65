"""The pure quota rule: all or nothing across limits, retry-after from the buckets, releases
that refund, a replica's share, and the rate bound as a property."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sluice.policy.capacity.quota import QuotaLimits, QuotaState, TenantQuota
from sluice.policy.capacity.token_bucket import BucketState


def test_all_or_nothing_across_limits() -> None:
    quota = TenantQuota(QuotaLimits(requests_per_s=1.0, request_burst=5.0, tokens_per_s=10.0,
                                    token_capacity=100.0))
    state = quota.initial(0.0)
    first = quota.reserve(state, 80.0, 0.0)
    assert first.ok and first.remaining_requests == 4.0 and first.remaining_tokens == 20.0
    # A request is left but not 50 tokens: nothing at all is taken.
    second = quota.reserve(first.state, 50.0, 0.0)
    assert not second.ok and second.limit == "tokens"
    assert second.state.requests == BucketState(4.0, 0.0)
    assert second.state.tokens == BucketState(20.0, 0.0)
    assert second.state.in_flight == 1
    assert second.retry_after_s == pytest.approx(3.0)  # (50 - 20) / 10
    assert quota.reserve(second.state, 50.0, 3.0).ok


def test_refusal_names_the_longest_wait() -> None:
    quota = TenantQuota(QuotaLimits(requests_per_s=0.5, request_burst=1.0, tokens_per_s=1.0,
                                    token_capacity=10.0, max_concurrent=1),
                        concurrency_retry_s=1.0)
    state = quota.reserve(quota.initial(0.0), 9.0, 0.0).state
    refused = quota.reserve(state, 5.0, 0.0)
    # requests: 2 s; tokens: (5 - 1) / 1 = 4 s; concurrency: 1 s.
    assert not refused.ok and refused.limit == "tokens" and refused.retry_after_s == 4.0
    later = quota.release(state, refund_request=False, refund_tokens=0.0, now=0.0)
    refused = quota.reserve(later, 1.0, 0.0)
    assert refused.limit == "requests" and refused.retry_after_s == 2.0


def test_too_large_never_fits() -> None:
    quota = TenantQuota(QuotaLimits(tokens_per_s=1.0, token_capacity=10.0))
    assert not quota.fits(11) and quota.fits(10)
    refused = quota.reserve(quota.initial(0.0), 11.0, 0.0)
    assert refused.limit == "too_large" and refused.retry_after_s == math.inf


def test_concurrency_cap_and_release() -> None:
    quota = TenantQuota(QuotaLimits(max_concurrent=2), concurrency_retry_s=1.0)
    state = quota.initial(0.0)
    for _ in range(2):
        decision = quota.reserve(state, 1.0, 0.0)
        assert decision.ok
        state = decision.state
    refused = quota.reserve(state, 1.0, 0.0)
    assert refused.limit == "concurrent" and refused.retry_after_s == 1.0
    state = quota.release(state, refund_request=False, refund_tokens=0.0, now=0.0)
    assert state.in_flight == 1 and quota.reserve(state, 1.0, 0.0).ok
    empty = QuotaState(None, None, 0)
    assert quota.release(empty, refund_request=True, refund_tokens=5.0, now=0.0).in_flight == 0


def test_release_refunds_up_to_capacity() -> None:
    quota = TenantQuota(QuotaLimits(requests_per_s=1.0, request_burst=2.0, tokens_per_s=1.0,
                                    token_capacity=100.0))
    state = quota.reserve(quota.initial(0.0), 60.0, 0.0).state
    # Used 25 of the 60 reserved; the request ran, so it stays counted.
    settled = quota.release(state, refund_request=False, refund_tokens=35.0, now=0.0)
    assert settled.tokens == BucketState(75.0, 0.0)
    assert settled.requests == BucketState(1.0, 0.0)
    # Never ran: the request and all its tokens come back, capped at capacity.
    refunded = quota.release(state, refund_request=True, refund_tokens=500.0, now=0.0)
    assert refunded.tokens == BucketState(100.0, 0.0)
    assert refunded.requests == BucketState(2.0, 0.0)


def test_settle_refunds_tokens_and_keeps_the_request_and_slot() -> None:
    quota = TenantQuota(QuotaLimits(requests_per_s=1.0, request_burst=2.0, tokens_per_s=1.0,
                                    token_capacity=100.0, max_concurrent=1))
    state = quota.reserve(quota.initial(0.0), 90.0, 0.0).state  # an upper bound
    settled = quota.settle(state, 60.0, 0.0)  # the exact count was 30
    assert settled.tokens == BucketState(70.0, 0.0)
    assert settled.requests == BucketState(1.0, 0.0) and settled.in_flight == 1
    assert quota.settle(state, 500.0, 0.0).tokens == BucketState(100.0, 0.0)
    assert quota.settle(state, 0.0, 0.0) == state
    assert TenantQuota(QuotaLimits(max_concurrent=1)).settle(state, 5.0, 0.0) == state


def test_unlimited_dimensions_are_untouched() -> None:
    quota = TenantQuota(QuotaLimits(requests_per_s=1.0))
    decision = quota.reserve(quota.initial(0.0), 1e9, 0.0)
    assert decision.ok and decision.state.tokens is None and decision.remaining_tokens is None
    assert QuotaLimits().unlimited and not QuotaLimits(max_concurrent=1).unlimited


def test_scaled_share() -> None:
    limits = QuotaLimits(requests_per_s=10.0, request_burst=3.0, tokens_per_s=100.0,
                         token_capacity=6000.0, max_concurrent=5)
    half = limits.scaled(0.5)
    assert half == QuotaLimits(5.0, 1.5, 50.0, 3000.0, 3)
    tiny = limits.scaled(0.1)
    assert tiny.request_burst == 1.0 and tiny.max_concurrent == 1  # never below one
    assert QuotaLimits(max_concurrent=4).scaled(1.0) == QuotaLimits(max_concurrent=4)
    for bad in (0.0, 1.5, math.nan):
        with pytest.raises(ValueError, match="share"):
            limits.scaled(bad)


@pytest.mark.parametrize(("field", "value"), [
    ("requests_per_s", 0.0), ("requests_per_s", math.inf), ("tokens_per_s", -1.0),
    ("request_burst", 0.5), ("token_capacity", 0.0), ("max_concurrent", 0),
])
def test_limits_validation_names_the_field(field: str, value: float) -> None:
    with pytest.raises(ValueError, match=field):
        QuotaLimits(**{field: value})  # type: ignore[arg-type]


@settings(max_examples=200, deadline=None)
@given(
    rate=st.floats(0.1, 50.0),
    burst=st.floats(1.0, 20.0),
    gaps=st.lists(st.floats(0.0, 0.5), min_size=1, max_size=200),
)
def test_admitted_requests_never_exceed_burst_plus_rate_times_time(
    rate: float, burst: float, gaps: list[float]
) -> None:
    """Over every window [t_i, t_j] of arrivals: admitted <= burst + rate * (t_j - t_i)."""
    quota = TenantQuota(QuotaLimits(requests_per_s=rate, request_burst=burst))
    state = quota.initial(0.0)
    now, admitted_at = 0.0, []
    for gap in gaps:
        now += gap
        decision = quota.reserve(state, 1.0, now)
        state = decision.state
        if decision.ok:
            admitted_at.append(now)
        else:
            # Retry-after is exact: the same reservation then succeeds.
            assert quota.reserve(state, 1.0, now + decision.retry_after_s).ok
    for i, start in enumerate(admitted_at):
        for j in range(i, len(admitted_at)):
            assert j - i + 1 <= burst + rate * (admitted_at[j] - start) + 1e-9


@settings(max_examples=200, deadline=None)
@given(
    rate=st.floats(1.0, 100.0),
    capacity=st.floats(50.0, 500.0),
    ops=st.lists(st.tuples(st.floats(0.0, 2.0), st.integers(1, 50), st.floats(0.0, 1.0),
                           st.booleans()), max_size=100),
)
def test_settled_tokens_never_exceed_capacity_plus_rate_times_time(
    rate: float, capacity: float, ops: list[tuple[float, int, float, bool]]
) -> None:
    """Reserve an estimate, settle to what was used (all of it back if it never ran): the
    tokens really used up to time T stay within capacity + rate * T."""
    quota = TenantQuota(QuotaLimits(tokens_per_s=rate, token_capacity=capacity))
    state = quota.initial(0.0)
    now, used = 0.0, 0.0
    for gap, estimate, fraction, ran in ops:
        now += gap
        decision = quota.reserve(state, float(estimate), now)
        state = decision.state
        if not decision.ok:
            continue
        actual = round(estimate * fraction) if ran else 0
        used += actual
        state = quota.release(state, refund_request=not ran,
                              refund_tokens=float(estimate - actual), now=now)
        assert 0.0 <= (state.tokens.tokens if state.tokens else 0.0) <= capacity
        assert used <= capacity + rate * now + 1e-6
