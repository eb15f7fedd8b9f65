"""State-based prediction (``sluice.policy.variants.backlog``) and the planner's use of it: the
queue and the batches in flight decide, with no model and no clock."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sluice.policy.variants.backlog import (
    Backlog,
    Margin,
    Move,
    PredictionError,
    Queued,
    finishes_s,
    placement,
    replan,
)
from sluice.policy.variants.planner import (
    PlannerConfig,
    VariantState,
    capacity_per_s,
    choose_variant,
)
from sluice.policy.variants.variant_tracker import GroupPlan, VariantInfo, VariantTracker

# Batch times (s) by size: "acc" gains nothing from batching (like mpnet FP32 on one
# thread), "mid" a little, "fast" is cheap.
CURVES = {
    "acc": {b: 0.050 * b for b in range(1, 9)},
    "mid": {b: 0.010 + 0.005 * b for b in range(1, 9)},
    "fast": {b: 0.001 * b + 0.001 for b in range(1, 9)},
}
ACCURACY = {"acc": 0.88, "mid": 0.86, "fast": 0.77}


def queue(*variants: str, time_left_s: float | None = None) -> tuple[Queued, ...]:
    return tuple(Queued(v, time_left_s) for v in variants)


def test_contiguous_runs_batch_and_start_in_order() -> None:
    state = Backlog(busy_s=(0.010,), queued=queue("acc", "acc", "mid", "acc"))
    ends = finishes_s(state, CURVES, max_batch_size=8)
    # acc×2 after the batch in flight, then mid×1, then acc×1 (not merged across "mid")
    assert ends == pytest.approx([0.110, 0.110, 0.125, 0.175])


def test_a_long_run_is_cut_at_max_batch_size() -> None:
    ends = finishes_s(Backlog((0.0,), queue(*["mid"] * 10)), CURVES, max_batch_size=8)
    assert ends[:8] == pytest.approx([CURVES["mid"][8]] * 8)
    assert ends[8:] == pytest.approx([CURVES["mid"][8] + CURVES["mid"][2]] * 2)


def test_batches_go_to_the_first_free_worker() -> None:
    state = Backlog(busy_s=(0.030, 0.0), queued=queue("acc", "mid", "fast"))
    ends = finishes_s(state, CURVES, max_batch_size=8)
    # acc on the idle worker (0 → 0.05), mid on the other (0.03 → 0.045), fast after mid
    assert ends == pytest.approx([0.050, 0.045, 0.047])


def test_placement_joins_the_tail_batch_unless_a_member_would_miss() -> None:
    state = Backlog((0.0,), (Queued("mid", 0.5),))
    joined = placement(state, "mid", CURVES, 8)
    assert (joined.batch_size, joined.start_s) == (2, 0.0)
    assert joined.finish_s == pytest.approx(CURVES["mid"][2])
    assert not joined.delays_others
    tight = Backlog((0.0,), (Queued("mid", CURVES["mid"][1]),))
    assert placement(tight, "mid", CURVES, 8).delays_others
    apart = placement(state, "fast", CURVES, 8)
    assert apart.batch_size == 1
    assert apart.start_s == pytest.approx(CURVES["mid"][1])


def test_an_empty_backlog_is_empty() -> None:
    assert Backlog((0.0, 0.0)).is_empty
    assert not Backlog((0.001,)).is_empty
    with pytest.raises(ValueError, match="busy_s"):
        Backlog(())
    with pytest.raises(ValueError, match="busy_s"):
        Backlog((-1.0,))


def test_replan_moves_the_first_miss_to_the_most_accurate_variant_that_fits() -> None:
    # Three acc requests in one batch (150 ms) behind 40 ms of work; 120 ms left each.
    state = Backlog((0.040,), queue("acc", "acc", "acc", time_left_s=0.120))
    opts = {i: ["mid", "fast"] for i in range(3)}
    moves = replan(state, CURVES, 8, opts)
    # Moving the first two to mid leaves the third alone on acc: 40 + 20 + 50 = 110 ms.
    assert moves == [Move(0, "mid"), Move(1, "mid")]
    after = Backlog(state.busy_s, queue("mid", "mid", "acc", time_left_s=0.120))
    assert max(finishes_s(after, CURVES, 8)) <= 0.120


def test_replan_fails_what_no_variant_can_save_and_leaves_the_rest() -> None:
    state = Backlog((0.200,), (Queued("acc", 0.100), Queued("acc", None), Queued("acc", 1.0)))
    moves = replan(state, CURVES, 8, {0: ["mid", "fast"], 2: ["fast"]})
    assert moves == [Move(0, None)]  # 200 ms of work ahead: nothing meets 100 ms
    # a request without options is never moved, even when it misses
    assert replan(state, CURVES, 8, {}) == []


@settings(deadline=None)  # timing is not what these test (a loaded machine is slow)
@given(st.lists(st.sampled_from(["acc", "mid", "fast"]), max_size=12),
       st.lists(st.floats(0.0, 0.3), min_size=1, max_size=3),
       st.floats(0.01, 0.5))
def test_after_replanning_every_moved_request_meets_its_deadline(
    variants: list[str], busy: list[float], time_left_s: float
) -> None:
    state = Backlog(tuple(busy), queue(*variants, time_left_s=time_left_s))
    opts = {i: [v for v in ("mid", "fast") if CURVES[v][1] < CURVES[q][1]]
            for i, q in enumerate(variants)}
    moves = replan(state, CURVES, 8, opts)
    moved = {m.index: m.variant for m in moves}
    kept = [(i, moved.get(i, q)) for i, q in enumerate(variants)
            if moved.get(i, q) is not None]
    after = Backlog(state.busy_s, tuple(Queued(str(v), time_left_s) for _, v in kept))
    ends = finishes_s(after, CURVES, 8)
    for (i, _), end in zip(kept, ends, strict=True):
        if i in moved:
            assert end <= time_left_s + 1e-12


def variants() -> list[VariantState]:
    return [VariantState(n, ACCURACY[n], servers=1, in_system=0, batch_s=CURVES[n])
            for n in ("acc", "mid", "fast")]


CFG = PlannerConfig(max_batch_size=8)
CAPACITY_PER_S = capacity_per_s(variants()[0], 8)


@settings(deadline=None)  # timing is not what these test (a loaded machine is slow)
@given(st.floats(0.0, 0.499), st.floats(0.0521, 5.0))
def test_below_half_load_an_empty_backlog_gives_accurate_only(
    utilization: float, time_left_s: float
) -> None:
    choice = choose_variant(variants(), arrival_per_s=utilization * CAPACITY_PER_S,
                            time_left_s=time_left_s, config=CFG, backlog=Backlog((0.0,)))
    assert (choice.variant, choice.reason) == ("acc", "low_load")
    assert choice.pool_idle and choice.accurate_fits_alone


def test_a_burst_the_rate_has_not_seen_moves_the_choice_at_once() -> None:
    """A low measured rate, but 100 ms of accurate work already queued: the accurate
    variant would finish this request (in that batch, now of 3) at 150 ms, leaving no
    room in a 150 ms deadline; the planner places it on the most accurate variant that
    meets it, now (not seconds later when the rate shows)."""
    state = Backlog((0.0,), queue("acc", "acc", time_left_s=0.3))
    choice = choose_variant(variants(), arrival_per_s=0.1 * CAPACITY_PER_S,
                            time_left_s=0.150, config=CFG, backlog=state)
    assert (choice.variant, choice.reason) == ("mid", "backlog")
    acc, mid = choice.predictions[:2]
    assert (acc.batch_size, acc.backlog_wait_s) == (3, 0.0)  # it would join that batch
    assert acc.sojourn_s == pytest.approx(0.150) and not acc.meets_deadline
    assert mid.backlog_wait_s == pytest.approx(0.100)
    assert choice.predicted_sojourn_s == pytest.approx(0.115)


def test_room_is_left_for_one_more_request_on_the_fastest_variant() -> None:
    fast_1 = CURVES["fast"][1]
    # accurate would end exactly at the deadline: no room left for a next arrival
    exact = choose_variant(variants(), arrival_per_s=0.0, time_left_s=0.050, config=CFG,
                           backlog=Backlog((0.0,)))
    assert exact.variant == "mid"
    roomy = choose_variant(variants(), arrival_per_s=0.0, time_left_s=0.050 + fast_1,
                           config=CFG, backlog=Backlog((0.0,)))
    assert roomy.variant == "acc"


def test_joining_a_batch_that_would_then_miss_is_not_allowed() -> None:
    state = Backlog((0.0,), (Queued("acc", 0.060),))  # alone it ends at 50 ms of 60
    choice = choose_variant(variants(), arrival_per_s=0.0, time_left_s=1.0, config=CFG,
                            backlog=state)
    acc = choice.predictions[0]
    assert acc.delays_others and not acc.meets_deadline
    assert choice.variant == "mid"


def test_above_the_line_the_steady_state_still_counts() -> None:
    """A short queue at 95 % of the accurate capacity: the state alone says "acc" fits,
    the Erlang-C bound says its queue would grow past the deadline."""
    busy = Backlog((0.010,))
    choice = choose_variant(variants(), arrival_per_s=0.95 * CAPACITY_PER_S,
                            time_left_s=0.150, config=CFG, backlog=busy)
    assert choice.variant == "mid"
    assert choice.predictions[0].erlang_wait_s > 0.150
    assert choice.predictions[0].backlog_wait_s == pytest.approx(0.010)


def test_an_idle_pool_serves_accurately_whatever_the_rate() -> None:
    """Nothing queued or running: the request's own service time is the whole
    prediction, so accuracy returns as soon as a backlog clears, at any rate."""
    for rho in (0.95, 1.3, 3.0):
        choice = choose_variant(variants(), arrival_per_s=rho * CAPACITY_PER_S,
                                time_left_s=0.150, config=CFG, backlog=Backlog((0.0,)))
        assert (choice.variant, choice.reason) == ("acc", "meets_deadline")
        assert choice.predicted_sojourn_s == pytest.approx(CURVES["acc"][1])


@settings(deadline=None)  # timing is not what these test (a loaded machine is slow)
@given(st.lists(st.sampled_from(["acc", "mid", "fast"]), max_size=10),
       st.floats(0.0, 0.2), st.floats(0.0, 1.5), st.floats(0.001, 0.5))
def test_a_chosen_variant_is_predicted_to_meet_the_deadline(
    queued: list[str], busy_s: float, utilization: float, time_left_s: float
) -> None:
    state = Backlog((busy_s,), queue(*queued, time_left_s=1.0))
    choice = choose_variant(variants(), arrival_per_s=utilization * CAPACITY_PER_S,
                            time_left_s=time_left_s, config=CFG, backlog=state)
    if choice.variant is None:
        assert not any(p.meets_deadline for p in choice.predictions)
    elif choice.reason != "low_load" or choice.variant != "acc":
        assert choice.predicted_sojourn_s <= time_left_s
    else:
        assert choice.predictions[0].meets_deadline


def test_the_prediction_error_margin_is_a_quantile_of_recent_relative_errors() -> None:
    err = PredictionError(window=100, quantile=0.9, min_samples=10, horizon_s=5.0,
                          floor_s=0.010, prior_ratio=0.25)
    for _ in range(9):  # 30 ms late on a 50 ms prediction: half of (50 + 10) ms
        err.observe(0.030, 0.050, now=1.0)
    assert err.margin(1.0) == Margin(0.25, 0.010)  # too few to trust: the prior
    err.observe(0.030, 0.050, now=1.0)
    assert err.margin(1.0).ratio == pytest.approx(0.5)
    # the margin grows with the prediction it guards: a deep queue keeps more room
    assert err.margin(1.0).of(0.050) == pytest.approx(0.030)
    assert err.margin(1.0).of(0.190) == pytest.approx(0.100)
    for k in range(100):  # the window forgets: now 0..0.99, the 90th is 0.89
        err.observe(k / 100 * 0.060, 0.050, now=2.0)
    assert err.margin(2.0).ratio == pytest.approx(0.89)
    for _ in range(100):
        err.observe(-0.010, 0.050, now=3.0)  # early finishes never make a negative margin
    assert err.margin(3.0).ratio == 0.0
    # an overload's errors are forgotten horizon_s after they were seen
    for _ in range(50):
        err.observe(0.120, 0.050, now=4.0)
    assert err.margin(4.0).ratio == pytest.approx(2.0)
    assert err.margin(9.5).ratio == 0.25  # all older than 5 s: back to the prior
    with pytest.raises(ValueError, match="quantile"):
        PredictionError(quantile=0.0)
    with pytest.raises(ValueError, match="ratio"):
        Margin(-0.1)


def test_the_tracker_keeps_its_measured_error_free_before_each_deadline() -> None:
    tracker = VariantTracker(
        [GroupPlan("g", ("acc", "mid", "fast"), CFG)],
        {n: VariantInfo(ACCURACY[n], 1, CURVES[n]) for n in ("acc", "mid", "fast")})
    now = 10.0
    # cold: the prior margin (25 % of 50 + 10 ms = 15 ms) still fits acc in 70 ms
    assert tracker.plan("g", now + 0.070, now).variant == "acc"
    for rid in range(20):  # every request finished 30 ms after a 50 ms prediction
        tracker.admitted(rid, "acc", now + 1.0, "g", predicted_finish_s=now + 0.050,
                         predicted_sojourn_s=0.050)
        tracker.finished(rid, "acc", now=now + 0.080)
    margin = tracker.errors["g"].margin(now)
    assert margin.of(0.050) == pytest.approx(0.030)
    later = tracker.plan("g", now + 0.070, now)
    assert later.variant == "mid"  # 50 ms + its 30 ms margin no longer fit in 70 ms
    # requests that never ran (rejected, cancelled) tell nothing about the prediction
    tracker.admitted(99, "acc", now + 1.0, "g", predicted_finish_s=now,
                     predicted_sojourn_s=0.050)
    tracker.finished(99, "acc", now=now + 5.0, ran=False)
    assert tracker.errors["g"].margin(now) == margin


def test_replan_keeps_the_margin_for_moves_but_fails_only_sure_misses() -> None:
    # acc alone ends at 50 ms of 60 left: with 25 ms of margin it should move...
    state = Backlog((0.0,), (Queued("acc", 0.060),))
    margin = Margin(0.5, 0.0)  # 25 ms after a 50 ms finish
    assert replan(state, CURVES, 8, {0: ["mid", "fast"]}, margin=margin) == [Move(0, "mid")]
    # ... but with nothing faster it stays: it may still make it
    assert replan(state, CURVES, 8, {0: []}, margin=margin) == []
    # a sure miss (work ahead past its deadline) with nowhere to go fails
    late = Backlog((0.070,), (Queued("acc", 0.060),))
    assert replan(late, CURVES, 8, {0: ["mid"]}, margin=margin) == [Move(0, None)]


def test_a_batch_takes_the_time_of_its_longest_member() -> None:
    def scale(variant: str, longest: int, size: int) -> float:  # twice the curve at 200 characters
        return 1.0 if longest <= 0 else longest / 100

    state = Backlog((0.0,), (Queued("acc", length=100), Queued("acc", length=200),
                             Queued("mid", length=50)))
    # acc's batch of 2 is padded to 200 characters: twice its 100 ms curve
    assert finishes_s(state, CURVES, 8, scale) == pytest.approx([0.200, 0.200, 0.2075])
    assert finishes_s(state, CURVES, 8) == pytest.approx([0.100, 0.100, 0.115])
    # a new long request on an idle pool: its own batch is long too
    place = placement(Backlog((0.0,)), "acc", CURVES, 8, length=300, scale=scale)
    assert (place.start_s, place.finish_s) == (0.0, pytest.approx(0.150))


def test_a_long_input_on_an_idle_pool_goes_to_a_variant_that_meets_it() -> None:
    def scale(variant: str, longest: int, size: int) -> float:
        return 1.0 if longest <= 0 else longest / 100

    idle = Backlog((0.0,))
    short = choose_variant(variants(), arrival_per_s=0.0, time_left_s=0.150, config=CFG,
                           backlog=idle, length=100, scale=scale)
    assert (short.variant, short.reason) == ("acc", "low_load")
    long = choose_variant(variants(), arrival_per_s=0.0, time_left_s=0.150, config=CFG,
                          backlog=idle, length=400, scale=scale)  # acc: 200 ms
    assert (long.variant, long.reason) == ("mid", "backlog")
    # the decision says why: the pool was idle, and acc alone would miss
    assert (short.pool_idle, short.accurate_fits_alone) == (True, True)
    assert (long.pool_idle, long.accurate_fits_alone) == (True, False)


def test_the_choice_says_whether_the_accurate_variant_would_have_fitted_alone() -> None:
    """Behind 100 ms of work acc (50 ms) misses a 150 ms deadline, which it meets on an
    idle pool: the request goes elsewhere because the pool was busy, and says so."""
    busy = choose_variant(variants(), arrival_per_s=0.0, time_left_s=0.150, config=CFG,
                          backlog=Backlog((0.100,)))
    assert (busy.variant, busy.reason) == ("mid", "backlog")
    assert (busy.pool_idle, busy.accurate_fits_alone) == (False, True)
    short = choose_variant(variants(), arrival_per_s=0.0, time_left_s=0.040, config=CFG,
                           backlog=Backlog((0.100,)))
    assert short.accurate_fits_alone is False
    no_state = choose_variant(variants(), arrival_per_s=0.0, time_left_s=0.150, config=CFG)
    assert (no_state.pool_idle, no_state.accurate_fits_alone) == (None, None)
    no_deadline = choose_variant(variants(), arrival_per_s=0.0, time_left_s=None,
                                 config=CFG, backlog=Backlog((0.100,)))
    assert (no_deadline.pool_idle, no_deadline.accurate_fits_alone) == (False, None)
