"""Admission: check order, computed Retry-After, validation."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sluice.policy.queues.admission import (
    REJECT_REASONS,
    AdmissionConfig,
    AdmissionPolicy,
    Rejection,
    retry_after_for_backlog,
)


def policy(capacity: int = 10) -> AdmissionPolicy:
    return AdmissionPolicy(AdmissionConfig(queue_capacity=capacity))


def test_admits_below_capacity() -> None:
    assert policy().decide(queue_depth=9, completions_per_s=5.0, now=0.0) is None


def test_queue_full_retry_after_is_backlog_over_rate() -> None:
    # 14 queued, capacity 10 → 5 must complete before this one fits; at 2/s that is 2.5 s.
    rejection = policy().decide(queue_depth=14, completions_per_s=2.0, now=0.0)
    assert rejection is not None
    assert rejection.reason == "queue_full"
    assert rejection.retry_after_s == 2.5
    assert "14" in rejection.message and "10" in rejection.message


def test_queue_full_retry_after_is_clamped() -> None:
    fast = policy().decide(queue_depth=10, completions_per_s=100.0, now=0.0)
    slow = policy().decide(queue_depth=1000, completions_per_s=0.5, now=0.0)
    unknown = policy().decide(queue_depth=13, completions_per_s=0.0, now=0.0)
    assert fast is not None and fast.retry_after_s == 1.0
    assert slow is not None and slow.retry_after_s == 60.0
    # no measured rate yet: one completion a second is assumed (4 too many → 4 s)
    assert unknown is not None and unknown.retry_after_s == 4.0


def test_draining_comes_first() -> None:
    rejection = policy().decide(
        queue_depth=1000, completions_per_s=4.0, now=0.0, deadline_s=-1.0, draining=True
    )
    assert rejection is not None
    assert rejection.reason == "draining"
    assert 1.0 <= rejection.retry_after_s <= 60.0


def test_queue_full_before_deadline() -> None:
    rejection = policy().decide(
        queue_depth=10, completions_per_s=4.0, now=0.0, deadline_s=0.5, predicted_wait_s=9.0
    )
    assert rejection is not None and rejection.reason == "queue_full"


def test_deadline_infeasible_uses_predicted_wait() -> None:
    p = policy()
    rejection = p.decide(
        queue_depth=3,
        completions_per_s=1.0,
        now=100.0,
        deadline_s=105.0,
        predicted_wait_s=4.0,
        predicted_service_s=1.5,
    )
    assert rejection is not None
    assert rejection.reason == "deadline_infeasible"
    assert rejection.retry_after_s == 4.0
    # Exactly on the deadline is feasible.
    assert (
        p.decide(
            queue_depth=3,
            completions_per_s=1.0,
            now=100.0,
            deadline_s=105.5,
            predicted_wait_s=4.0,
            predicted_service_s=1.5,
        )
        is None
    )


def test_no_deadline_is_always_feasible() -> None:
    assert policy().decide(queue_depth=0, completions_per_s=1.0, now=0.0,
                           predicted_wait_s=1e9) is None


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"queue_capacity": 0}, "queue_capacity"),
        ({"queue_capacity": 1, "min_retry_after_s": -1.0}, "min_retry_after_s"),
        ({"queue_capacity": 1, "min_retry_after_s": 5.0, "max_retry_after_s": 2.0},
         "max_retry_after_s"),
    ],
)
def test_config_validation_names_the_field(kwargs: dict[str, float], field: str) -> None:
    with pytest.raises(ValueError, match=field):
        AdmissionConfig(**kwargs)  # type: ignore[arg-type]


def test_decide_rejects_negative_inputs() -> None:
    with pytest.raises(ValueError, match="predicted_wait_s"):
        policy().decide(queue_depth=0, completions_per_s=1.0, now=0.0, predicted_wait_s=-1.0)


def test_rejection_validates_reason_and_retry() -> None:
    with pytest.raises(ValueError, match="reason"):
        Rejection("nope", 1.0, "")
    with pytest.raises(ValueError, match="retry_after_s"):
        Rejection("quota", -1.0, "")
    with pytest.raises(ValueError, match="retry_after_s"):
        Rejection("quota", math.nan, "")
    assert set(REJECT_REASONS) >= {"quota", "too_large", "no_feasible_worker"}


@given(
    excess=st.integers(-5, 10_000),
    rate=st.floats(-1.0, 1e6, allow_nan=False),
    lo=st.floats(0.0, 10.0),
    span=st.floats(0.0, 100.0),
)
def test_retry_after_for_backlog_stays_in_range(
    excess: int, rate: float, lo: float, span: float
) -> None:
    hi = lo + span
    value = retry_after_for_backlog(excess, rate, lo, hi)
    assert lo <= value <= hi
    if rate <= 0:
        assert value == min(hi, max(lo, max(0, excess) * 1.0))
    elif lo <= max(0, excess) / rate <= hi:
        assert value == max(0, excess) / rate
