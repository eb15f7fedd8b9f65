"""Token bucket: refill, take, refund, and exact retry-after."""

from __future__ import annotations

import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sluice.policy.capacity.token_bucket import BucketState, TokenBucket


def test_starts_full_and_refills_at_rate() -> None:
    bucket = TokenBucket(rate_per_s=2.0, capacity=10.0)
    state = bucket.initial(now=100.0)
    assert state == BucketState(10.0, 100.0)
    taken = bucket.take(state, 10.0, now=100.0)
    assert taken.ok and taken.state.tokens == 0.0 and taken.retry_after_s == 0.0
    assert bucket.refill(taken.state, 101.5).tokens == 3.0
    assert bucket.refill(taken.state, 1000.0).tokens == 10.0


def test_failed_take_says_how_long_to_wait() -> None:
    bucket = TokenBucket(rate_per_s=2.0, capacity=10.0)
    state = BucketState(1.0, 0.0)
    result = bucket.take(state, 4.0, now=0.0)
    assert not result.ok and result.retry_after_s == 1.5
    assert result.state == state  # nothing taken
    assert bucket.take(result.state, 4.0, now=1.5).ok


def test_amount_over_capacity_never_fits() -> None:
    bucket = TokenBucket(rate_per_s=1.0, capacity=5.0)
    result = bucket.take(bucket.initial(0.0), 6.0, now=0.0)
    assert not result.ok and result.retry_after_s == math.inf


def test_clock_going_backwards_adds_nothing() -> None:
    bucket = TokenBucket(rate_per_s=1.0, capacity=10.0)
    state = BucketState(2.0, 50.0)
    assert bucket.refill(state, 40.0) == state
    # Retry-after counts from the state's own time, not the earlier now.
    result = bucket.take(state, 5.0, now=40.0)
    assert not result.ok and result.retry_after_s == 13.0


def test_give_back_is_capped() -> None:
    bucket = TokenBucket(rate_per_s=1.0, capacity=10.0)
    state = bucket.give_back(BucketState(8.0, 0.0), 5.0, now=0.0)
    assert state.tokens == 10.0


@pytest.mark.parametrize("field", ["rate_per_s", "capacity"])
@pytest.mark.parametrize("bad", [0.0, -1.0, math.nan, math.inf])
def test_validation_names_field(field: str, bad: float) -> None:
    args = {"rate_per_s": 1.0, "capacity": 1.0, field: bad}
    with pytest.raises(ValueError, match=field):
        TokenBucket(**args)


def test_negative_amount_rejected() -> None:
    bucket = TokenBucket(1.0, 1.0)
    with pytest.raises(ValueError, match="amount"):
        bucket.take(bucket.initial(0.0), -1.0, 0.0)
    with pytest.raises(ValueError, match="amount"):
        bucket.give_back(bucket.initial(0.0), math.nan, 0.0)


@settings(max_examples=300, deadline=None)
@given(
    rate=st.floats(1e-3, 1e4),
    capacity=st.floats(1e-3, 1e6),
    start=st.floats(0, 1e7),
    ops=st.lists(
        st.tuples(st.sampled_from(["take", "take", "give"]), st.floats(0, 1.2),
                  st.floats(-5, 100)),
        max_size=40,
    ),
)
def test_bounds_and_exact_retry_after(
    rate: float, capacity: float, start: float, ops: list[tuple[Any, ...]]
) -> None:
    """Tokens stay in [0, capacity]; after a failed take (amount <= capacity), taking the same
    amount from the returned state at exactly now + retry_after_s succeeds."""
    bucket = TokenBucket(rate, capacity)
    state = bucket.initial(start)
    now = start
    for kind, fraction, step_s in ops:
        now += step_s  # may go backwards
        amount = fraction * capacity
        if kind == "give":
            state = bucket.give_back(state, amount, now)
        else:
            result = bucket.take(state, amount, now)
            if result.ok:
                assert result.retry_after_s == 0.0
                assert result.state.tokens == pytest.approx(
                    bucket.refill(state, now).tokens - amount)
            elif amount > capacity:
                assert result.retry_after_s == math.inf
            else:
                wait = result.retry_after_s
                assert 0 <= wait < math.inf
                assert bucket.take(result.state, amount, now + wait).ok
                assert bucket.take(state, amount, now + wait).ok
                # and not much earlier: the deficit over the rate, from the state's time
                deficit_s = (amount - result.state.tokens) / rate
                lag_s = max(0.0, result.state.updated_s - now)
                assert wait <= lag_s + deficit_s + 1e-6 * (1 + abs(now) + deficit_s)
            state = result.state
        assert 0.0 <= state.tokens <= capacity
