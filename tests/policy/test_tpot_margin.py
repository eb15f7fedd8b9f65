"""The TPOT margin learned from measured cycles against predicted steps: no model, no clock."""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sluice.policy.step.step_cost import StepCost
from sluice.policy.step.tpot_budget import TpotBudget
from sluice.policy.step.tpot_margin import (
    DEFAULT_MARGIN,
    MARGIN_CAP,
    MARGIN_FLOOR,
    MarginState,
    TpotMargin,
)


def fed(margin: TpotMargin, ratio: float, steps: int, seed: int = 0,
        noise: float = 0.0) -> TpotMargin:
    """``steps`` steps whose cycle is ``ratio`` times the prediction, each scattered by up
    to ``noise`` either way (predictions between 20 and 140 ms)."""
    rng = random.Random(seed)
    for _ in range(steps):
        predicted_s = rng.uniform(0.020, 0.140)
        margin.observe(predicted_s, predicted_s * ratio * rng.uniform(1 - noise, 1 + noise))
    return margin


def test_cold_is_the_prior() -> None:
    margin = fed(TpotMargin(span=64, min_spans=2), 1.5, 127)  # one span and most of another
    assert margin.margin() == DEFAULT_MARGIN == 0.85
    assert margin.state() == MarginState(0.85, None, 127)


def test_a_calibrated_cycle_keeps_the_cap_which_is_the_prior() -> None:
    margin = fed(TpotMargin(), 1.0, 256, noise=0.3)  # per-step scatter averages out
    assert margin.margin() == MARGIN_CAP == DEFAULT_MARGIN
    assert margin.state().cycle_ratio == pytest.approx(1.0, abs=0.05)


def test_a_calibrated_cycle_raises_it_up_to_a_higher_cap() -> None:
    margin = fed(TpotMargin(cap=0.97), 1.0, 256, noise=0.3)
    assert margin.margin() == 0.97


def test_a_cycle_within_the_cap_keeps_the_prior() -> None:
    assert fed(TpotMargin(), 1.15, 256).margin() == DEFAULT_MARGIN  # 1 / 1.15 = 0.87


def test_a_biased_cycle_lowers_it() -> None:
    margin = fed(TpotMargin(), 1.25, 256, noise=0.3)
    assert margin.margin() == pytest.approx(1 / 1.25, rel=0.03)
    assert margin.margin() < DEFAULT_MARGIN
    fed(margin, 1.0, 256)  # the window forgets it
    assert margin.margin() == DEFAULT_MARGIN


def test_a_cycle_far_off_stops_at_the_floor() -> None:
    assert fed(TpotMargin(), 3.0, 256).margin() == MARGIN_FLOOR == 0.6


def test_the_worst_recent_span_decides_and_old_spans_are_forgotten() -> None:
    margin = fed(TpotMargin(span=64, spans=4), 1.0, 256)
    fed(margin, 1.3, 64)  # one slow span: a request living through it sees 1.3
    assert margin.margin() == pytest.approx(1 / 1.3)
    fed(margin, 1.0, 3 * 64)  # still in the window of 4 spans
    assert margin.margin() == pytest.approx(1 / 1.3)
    fed(margin, 1.0, 64)  # pushed out
    assert margin.margin() == MARGIN_CAP


def test_the_width_plans_scale_is_the_mean_of_the_recent_spans() -> None:
    margin = fed(TpotMargin(span=64, spans=4, min_spans=2), 1.0, 64)
    assert margin.mean_ratio() is None  # cold: one span
    fed(margin, 1.4, 64)  # one slow span beside a calibrated one
    assert margin.mean_ratio() == pytest.approx(1.2)
    assert margin.cycle_ratio() == pytest.approx(1.4)  # the margin reads the worst
    fed(margin, 1.0, 2 * 64)
    assert margin.mean_ratio() == pytest.approx(1.1)


def test_a_partial_span_does_not_count() -> None:
    margin = fed(TpotMargin(span=64, spans=4), 1.0, 256)
    fed(margin, 2.0, 63)
    assert margin.margin() == MARGIN_CAP
    assert margin.state().steps == 256 + 63


def test_nonsense_samples_are_ignored() -> None:
    margin = fed(TpotMargin(span=4, min_spans=1, spans=1), 1.0, 4)
    for predicted_s, measured_s in [(0.0, 0.1), (0.1, 0.0), (float("nan"), 0.1),
                                    (0.1, float("inf")), (-1.0, 0.1)]:
        margin.observe(predicted_s, measured_s)
    assert margin.state().steps == 4
    assert margin.margin() == MARGIN_CAP


def test_the_budget_plans_within_the_learned_share() -> None:
    cost = StepCost(base_s=0.010, per_decode_token_s=0.004, per_prefill_token_s=0.001)
    slow = fed(TpotMargin(), 1.25, 256)
    calibrated = fed(TpotMargin(), 1.0, 256)
    assert TpotBudget(cost, 0.150, slow.margin()).step_limit_s == pytest.approx(0.120, rel=0.03)
    assert TpotBudget(cost, 0.150, calibrated.margin()).step_limit_s == pytest.approx(0.1275)


@given(st.lists(st.tuples(st.floats(0.001, 1.0), st.floats(0.001, 1.0)), max_size=300))
def test_always_within_floor_and_cap(pairs: list[tuple[float, float]]) -> None:
    margin = TpotMargin(span=8, spans=4, min_spans=1)
    for predicted_s, measured_s in pairs:
        margin.observe(predicted_s, measured_s)
        assert MARGIN_FLOOR <= margin.margin() <= MARGIN_CAP


def test_refuses_inconsistent_settings() -> None:
    with pytest.raises(ValueError, match="min_spans"):
        TpotMargin(spans=2, min_spans=3)
    with pytest.raises(ValueError, match="floor"):
        TpotMargin(prior=0.99)  # above the cap
