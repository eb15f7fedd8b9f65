"""The variant planner's math and choices, with no model and no clock."""

from __future__ import annotations

import math
from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sluice.policy.variants.planner import (
    PlannerConfig,
    VariantState,
    capacity_per_s,
    choose_variant,
    settled_batch_size,
)
from sluice.policy.variants.queueing import erlang_c, mmc_wait_s
from sluice.policy.variants.service_estimator import Ewma, LengthPrior, ServiceEstimator


def erlang_c_factorial(c: int, a: Fraction) -> Fraction:
    """Erlang C straight from its textbook definition, in exact arithmetic."""
    top = a**c / math.factorial(c) * Fraction(c) / (c - a)
    bottom = sum(a**k / math.factorial(k) for k in range(c)) + top
    return top / bottom


# Published Erlang-C probabilities of waiting (servers, Erlangs, P(wait)):
# 2 servers at 1 Erlang: 1/3; 3 at 2: 4/9 (exact); the call-centre textbook case of
# 10 Erlangs on 11 agents: 0.6821; 5 servers at 4 Erlangs: 0.5541.
PUBLISHED = [(2, 1.0, 1 / 3), (3, 2.0, 4 / 9), (11, 10.0, 0.6821), (5, 4.0, 0.5541)]


@pytest.mark.parametrize(("servers", "erlangs", "p_wait"), PUBLISHED)
def test_erlang_c_matches_published_values(servers: int, erlangs: float, p_wait: float) -> None:
    assert erlang_c(servers, erlangs) == pytest.approx(p_wait, abs=5e-5)


@given(st.integers(1, 60), st.fractions(min_value=0, max_value=1, max_denominator=50))
def test_erlang_c_matches_the_definition(servers: int, rho: Fraction) -> None:
    a = rho * servers
    if a >= servers:
        assert erlang_c(servers, float(a)) == 1.0
        return
    assert erlang_c(servers, float(a)) == pytest.approx(float(erlang_c_factorial(servers, a)),
                                                        rel=1e-9, abs=1e-12)


@pytest.mark.parametrize("rho", [0.1, 0.5, 0.8, 0.95])
def test_one_server_reduces_to_mm1(rho: float) -> None:
    service_s = 0.02
    lam = rho / service_s
    assert erlang_c(1, rho) == pytest.approx(rho)  # P(wait) = ρ
    # M/M/1: Wq = ρ / (μ - λ)
    assert mmc_wait_s(lam, service_s, 1) == pytest.approx(rho / (1 / service_s - lam))


def test_unstable_queue_waits_forever() -> None:
    assert mmc_wait_s(100.0, 0.02, 2) == math.inf
    assert mmc_wait_s(0.0, 0.02, 2) == 0.0
    with pytest.raises(ValueError, match="servers"):
        erlang_c(0, 1.0)


def test_ewma_follows_a_step_change() -> None:
    ewma = Ewma(alpha=0.2)
    for _ in range(50):
        ewma.update(0.010)
    assert ewma.value == pytest.approx(0.010)
    errors = []
    for _ in range(30):
        errors.append(abs(ewma.update(0.030) - 0.030))
    # the error shrinks by (1 - α) each sample: after k samples it is 0.02 × 0.8^k
    for k, err in enumerate(errors, start=1):
        assert err == pytest.approx(0.020 * 0.8**k)
    assert errors[-1] < 0.001


def test_service_estimator_follows_drift_and_keeps_batch_shape() -> None:
    est = ServiceEstimator({1: 0.010, 4: 0.016, 8: 0.024}, alpha=0.25)
    assert est.batch_s(2) == pytest.approx(0.012)
    assert est.batch_s(16) == pytest.approx(0.040)  # extrapolated by the last slope
    for _ in range(40):  # the machine became twice as slow
        est.observe(4, 0.032)
    assert est.batch_s(1) == pytest.approx(0.020, rel=0.01)
    assert est.batch_s(8) == pytest.approx(0.048, rel=0.01)
    assert est.per_item_s(8) < est.per_item_s(1)


def variants(in_system: dict[str, int] | None = None) -> list[VariantState]:
    """A three-variant frontier on 2 workers: 68 / 30 / 12 ms at batch 1."""
    n = in_system or {}
    specs = [("mpnet", 0.866, 0.068), ("mpnet-int8", 0.861, 0.030), ("minilm", 0.798, 0.012)]
    return [
        VariantState(name, acc, servers=2, in_system=n.get(name, 0),
                     batch_s={b: s * (0.6 + 0.4 * b) for b in range(1, 9)})
        for name, acc, s in specs
    ]


CFG = PlannerConfig(max_batch_size=8)


def load(rho: float) -> float:
    """Arrivals per second at ``rho`` × the accurate variant's capacity (full batches)."""
    return rho * capacity_per_s(variants()[0], 8)


@given(st.floats(0, 0.499), st.floats(0.001, 10.0), st.integers(0, 40))
def test_below_half_load_picks_what_accurate_only_picks(
    utilization: float, time_left_s: float, backlog: int
) -> None:
    lam = load(utilization)
    vs = variants({"mpnet": backlog})
    adaptive = choose_variant(vs, arrival_per_s=lam, time_left_s=time_left_s, config=CFG)
    accurate = choose_variant(vs, arrival_per_s=lam, time_left_s=time_left_s,
                              config=PlannerConfig(policy="accurate"))
    assert adaptive.variant == accurate.variant == "mpnet"
    assert adaptive.reason == "low_load"


@given(st.floats(0.0, 0.499), st.floats(0.0, 5.0))
def test_a_noisy_rate_estimate_never_leaves_accurate_only_below_half_load(
    utilization: float, stderr_per_s: float
) -> None:
    """Below the line, an uncertain rate changes nothing: the margin only ever keeps the
    accurate choice longer."""
    choice = choose_variant(variants({"mpnet": 40}), arrival_per_s=load(utilization),
                            arrival_stderr_per_s=stderr_per_s, time_left_s=0.05, config=CFG)
    assert (choice.variant, choice.reason) == ("mpnet", "low_load")


def test_a_rate_just_above_half_load_must_be_sure_before_the_planner_predicts() -> None:
    lam = load(0.55)
    vs = variants({"mpnet": 8})
    # From a handful of arrivals (large standard error) the planner stays accurate-only ...
    unsure = choose_variant(vs, arrival_per_s=lam, arrival_stderr_per_s=0.1 * lam,
                            time_left_s=0.25, config=CFG)
    assert (unsure.variant, unsure.reason) == ("mpnet", "low_load")
    # ... from many (small error) it predicts, and the backlog sends this one elsewhere.
    sure = choose_variant(vs, arrival_per_s=lam, arrival_stderr_per_s=0.01 * lam,
                          time_left_s=0.25, config=CFG)
    assert sure.reason == "meets_deadline" and sure.variant != "mpnet"
    # With z = 0 the point estimate alone decides.
    point = choose_variant(vs, arrival_per_s=lam, arrival_stderr_per_s=0.1 * lam,
                           time_left_s=0.25, config=PlannerConfig(low_load_confidence_z=0.0))
    assert point.reason == "meets_deadline"


def test_no_low_load_line_always_predicts() -> None:
    cfg = PlannerConfig(low_load_utilization=0.0)
    choice = choose_variant(variants({"mpnet": 40}), arrival_per_s=0.5,
                            arrival_stderr_per_s=0.5, time_left_s=0.25, config=cfg)
    assert choice.reason != "low_load"


def test_bad_confidence_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="low_load_confidence_z"):
        PlannerConfig(low_load_confidence_z=-1.0)
    with pytest.raises(ValueError, match="arrival_stderr_per_s"):
        choose_variant(variants(), arrival_per_s=1.0, arrival_stderr_per_s=-0.1,
                       time_left_s=None, config=CFG)


def test_high_load_degrades_to_a_faster_variant() -> None:
    lam = load(0.95)
    choice = choose_variant(variants(), arrival_per_s=lam, time_left_s=0.25, config=CFG)
    assert choice.variant == "mpnet-int8"
    assert choice.reason == "meets_deadline"
    first = choice.predictions[0]
    assert first.variant == "mpnet" and not first.meets_deadline
    assert first.erlang_wait_s > 0.25
    assert first.batch_size > 1  # the queue settles at batches big enough to keep up
    assert choice.predicted_sojourn_s <= 0.25


def test_a_backlog_alone_moves_the_choice() -> None:
    lam = load(0.6)
    idle = choose_variant(variants(), arrival_per_s=lam, time_left_s=0.5, config=CFG)
    assert idle.variant == "mpnet"
    busy = choose_variant(variants({"mpnet": 20}), arrival_per_s=lam, time_left_s=0.5,
                          config=CFG)
    assert busy.variant == "mpnet-int8"
    assert busy.predictions[0].backlog_wait_s > busy.predictions[0].erlang_wait_s


def test_nothing_fits_rejects_with_a_retry_after() -> None:
    choice = choose_variant(variants({"minilm": 200}), arrival_per_s=400.0,
                            time_left_s=0.05, config=CFG)
    assert choice.variant is None
    assert choice.reason == "deadline_infeasible"
    assert choice.retry_after_s > 0
    assert not any(p.meets_deadline for p in choice.predictions)


def test_pessimism_is_safer() -> None:
    lam = load(0.7)
    relaxed = choose_variant(variants(), arrival_per_s=lam, time_left_s=0.3, config=CFG)
    careful = choose_variant(variants(), arrival_per_s=lam, time_left_s=0.3,
                             config=PlannerConfig(pessimism=2.0))
    rank = [v.name for v in variants()]
    assert relaxed.variant is not None and careful.variant is not None
    assert rank.index(careful.variant) > rank.index(relaxed.variant)


def test_baselines_ignore_load() -> None:
    vs = variants({"mpnet": 100})
    fast = choose_variant(vs, arrival_per_s=1000.0, time_left_s=0.01,
                          config=PlannerConfig(policy="fastest"))
    assert fast.variant == "minilm"
    acc = choose_variant(vs, arrival_per_s=1000.0, time_left_s=0.01,
                         config=PlannerConfig(policy="accurate"))
    assert acc.variant == "mpnet"


def test_config_names_the_bad_field() -> None:
    with pytest.raises(ValueError, match="pessimism"):
        PlannerConfig(pessimism=0)
    with pytest.raises(ValueError, match="policy"):
        PlannerConfig(policy="cheapest")  # type: ignore[arg-type]


def test_capacity_and_settled_batch_size() -> None:
    v = VariantState("x", 0.9, servers=2, in_system=0,
                     batch_s={1: 0.010, 2: 0.015, 3: 0.030, 4: 0.050})
    assert capacity_per_s(v, 4) == pytest.approx(2 * 2 / 0.015)  # batch 2 is the best
    assert settled_batch_size(v, 150.0, 4) == 1  # 150/s × 10 ms = 1.5 < 2 workers
    assert settled_batch_size(v, 250.0, 4) == 2  # batch 1 cannot keep up, batch 2 can
    assert settled_batch_size(v, 400.0, 4) == 4  # nothing keeps up: the largest


def test_service_estimator_learns_how_a_batch_grows_with_its_longest_input() -> None:
    est = ServiceEstimator({1: 0.050}, alpha=0.1)
    assert est.batch_s(1, longest=400) == pytest.approx(0.050)  # nothing learnt: the drift
    # a padded batch costs 20 ms + 0.25 ms a character: 50 ms at the mean of 120
    for length in [20, 120, 220] * 30:
        est.observe(1, 0.020 + 0.00025 * length, longest=length)
    assert est.length.slope * 0.050 == pytest.approx(0.00025, rel=0.05)
    assert est.batch_s(1, longest=120) == pytest.approx(0.050, rel=0.05)
    assert est.batch_s(1, longest=400) == pytest.approx(0.120, rel=0.05)
    assert est.batch_s(1) == pytest.approx(0.050, rel=0.05)  # length unknown: the mean
    # never below a quarter of the drift, however short
    assert est.batch_s(1, longest=1) >= 0.25 * est.batch_s(1)
    # batches of unknown length feed the drift only
    est.observe(1, 0.100)
    assert est.length.samples == 90


def test_the_length_correction_starts_at_the_length_the_drift_saw() -> None:
    """The profile's batches averaged 120 characters, this server's traffic 60: the drift
    learns the ratio at 60, so a 60-character batch is predicted at what it took, not
    below it (the correction is centred on the drift's own mean length)."""
    prior = LengthPrior(slope=0.00025 / 0.050, mean=120.0, var=6667.0)
    est = ServiceEstimator({1: 0.050}, alpha=0.1, length_prior=prior)
    for length in [40, 60, 80] * 30:  # 20 ms + 0.25 ms a character, as the prior says
        est.observe(1, 0.020 + 0.00025 * length, longest=length)
    assert est.drift_length.value == pytest.approx(60.0, abs=5)
    assert est.batch_s(1, longest=60) == pytest.approx(0.035, rel=0.03)
    assert est.batch_s(1, longest=200) == pytest.approx(0.070, rel=0.05)


def test_a_measured_length_prior_sizes_the_first_batch_and_the_server_takes_over() -> None:
    # the profile measured 0.25 ms a character at 50 ms for the mean of 120 characters
    prior = LengthPrior(slope=0.00025 / 0.050, mean=120.0, var=6667.0)  # in characters
    est = ServiceEstimator({1: 0.050}, alpha=0.1, length_prior=prior)
    assert est.batch_s(1, longest=400) == pytest.approx(0.120)  # before any batch
    assert est.batch_s(1, longest=120) == pytest.approx(0.050)
    cold = ServiceEstimator({1: 0.050}, alpha=0.1)
    assert cold.batch_s(1, longest=400) == pytest.approx(0.050)  # no prior: not sized
    # this server's batches do not grow with length: its own slope replaces the prior's
    for length in [20, 120, 220] * 100:
        est.observe(1, 0.050, longest=length)
    assert est.batch_s(1, longest=400) == pytest.approx(0.050, rel=0.05)
    with pytest.raises(ValueError):
        LengthPrior(slope=-1.0, mean=120.0, var=1.0)
    with pytest.raises(ValueError):
        LengthPrior(slope=0.5, mean=1.0, var=0.1, typical_longest_chars=((1, 0.0),))
