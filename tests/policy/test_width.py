"""The width plan: the TPOT target's width, widened past the budget (never past the target)
while the waiting line would miss its first-token targets; the most tokens/s when no width
meets the TPOT target."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from sluice.policy.step.kv_blocks import KVBlockAllocator
from sluice.policy.step.step_cost import StepCost
from sluice.policy.step.ttft import LineEntry
from sluice.policy.step.width import arrival_due_s, engine_width, plan_width, predict_engine_ttft

# 2 ms + 10 ms a decode; 0.1 ms a prompt token. A 100 ms target at margin 0.6 (a 60 ms
# budget): 5 decode within the budget (52 ms), 9 within the target (92 ms), 10 past it.
COST = StepCost(0.002, 0.010, 0.0001)
TARGET_S, MARGIN = 0.100, 0.6
BUSY = tuple(LineEntry(0, 100) for _ in range(5))  # 5 running, each ~100 steps from done


def width(waiting: int, left_s: float | None = 1.0, running: tuple[LineEntry, ...] = BUSY,
          slots: int = 16, target_s: float | None = TARGET_S,
          cycle_ratio: float | None = None):
    line = [LineEntry(4, 50)] * waiting
    return plan_width(COST, tpot_target_s=target_s, margin=MARGIN, slots=slots,
                      context_tokens_per_seq=0, running=running, waiting=line,
                      ttft_left_s=[left_s] * waiting, cycle_ratio=cycle_ratio)


def test_without_a_tpot_target_every_slot_runs() -> None:
    plan = width(3, target_s=None)
    assert (plan.concurrency, plan.reason, plan.step_limit_s) == (16, "no_target", None)


def test_the_tpot_budget_binds_while_the_line_is_on_time() -> None:
    for plan in (width(0), width(3, left_s=None), width(3, left_s=60.0)):
        assert (plan.concurrency, plan.reason, plan.tpot_concurrency) == (5, "tpot", 5)
        assert plan.step_limit_s == TARGET_S * MARGIN
        assert plan.on_time == plan.waiting


def test_a_line_that_would_miss_its_targets_widens_to_the_narrowest_width_on_time() -> None:
    # 3 waiting behind 5 running (~5 s from a free slot): at 8 wide all 3 start at once.
    plan = width(3)
    assert (plan.concurrency, plan.reason, plan.on_time, plan.within_both) == (8, "ttft", 3, 8)
    assert plan.step_limit_s == COST.predict_s(8) and plan.step_s <= TARGET_S


def test_widening_stops_at_the_tpot_target_itself() -> None:
    # 6 waiting: 9 wide (92 ms) starts 4 of them; 10 would take 102 ms, past the target.
    plan = width(6)
    assert (plan.concurrency, plan.reason, plan.on_time, plan.within_both) == (9, "ttft", 4, 9)


def test_widening_stops_where_the_measured_cycle_passes_the_target() -> None:
    # Cycles measured 1.25x the predicted step: 7 wide (72 ms predicted, 90 ms a cycle)
    # is the widest within the target; 8 (82 ms, 102.5 ms a cycle) would put every
    # running request past it. Unmeasured, or a model that runs long (ratio < 1), widens
    # as the prediction alone allows.
    plan = width(6, cycle_ratio=1.25)
    assert (plan.concurrency, plan.reason) == (7, "ttft")
    assert width(6, cycle_ratio=None).concurrency == width(6, cycle_ratio=0.8).concurrency == 9
    # a cycle that misses the target even at the budget's width: the budget stands, or
    # the most tokens/s when some of the line would be late
    assert width(6, cycle_ratio=2.0).reason in ("tpot", "throughput")
    assert width(6, cycle_ratio=2.0).within_both == 0


def test_a_line_that_widening_cannot_help_keeps_the_budget() -> None:
    # Targets already past: no width puts anyone on time, so none spends the TPOT margin.
    plan = width(3, left_s=0.0)
    assert (plan.concurrency, plan.reason, plan.on_time) == (5, "tpot", 0)


def test_a_model_slower_than_its_target_alone_runs_for_tokens_per_second() -> None:
    plan = width(3, target_s=0.010)  # 12 ms a step at batch 1
    assert (plan.concurrency, plan.reason, plan.within_both) == (16, "throughput", 0)
    # with nothing late, the budget's width stays
    assert width(3, left_s=60.0, target_s=0.010).reason == "tpot"


def test_the_width_follows_the_line_step_by_step() -> None:
    """A burst is admitted one request a step: the width stays at 8 while any of it
    waits, and is the budget's again once the line is served (the decision is made per
    step, from the state alone; the admitted ones run on)."""
    running = list(BUSY)
    waiting, lefts = [LineEntry(4, 50)] * 3, [1.0] * 3
    seen = []
    while True:
        plan = plan_width(COST, tpot_target_s=TARGET_S, margin=MARGIN, slots=16,
                          context_tokens_per_seq=0, running=running, waiting=waiting,
                          ttft_left_s=lefts)
        seen.append((plan.concurrency, plan.reason))
        if len(running) >= plan.concurrency or not waiting:
            break
        running.append(waiting.pop(0))  # one admission, as the step budget would allow
        lefts.pop(0)
    assert seen == [(8, "ttft"), (8, "ttft"), (8, "ttft"), (5, "tpot")]


def test_a_request_late_even_widened_is_predicted_late() -> None:
    """The refusal's question (``predict_engine_ttft`` with targets): a new request that
    the widest width within the TPOT target cannot start in time is predicted past its
    target; one that widening starts is predicted within it."""
    kv = KVBlockAllocator.for_context(16 * 256, 16, 16, unified=False)

    def ttft(waiting: int, left_s: float) -> float:
        line = [LineEntry(4, 50)] * waiting
        return predict_engine_ttft(
            COST, tpot_target_s=TARGET_S, n_seq_max=16, kv=kv, running=BUSY,
            held_tokens=[0] * 5, waiting=line, prompt_tokens=4, n=1, max_tokens=50,
            margin=MARGIN, waiting_ttft_left_s=[1.0] * waiting, ttft_left_s=left_s).ttft_s
    assert ttft(2, 1.0) < 1.0   # 8 wide starts the line and it
    assert ttft(4, 1.0) > 1.0   # 9 wide starts 4 of the 5: it is the fifth
    assert ttft(4, 60.0) < 60.0


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 12), st.integers(0, 12), st.floats(0.0, 10.0), st.integers(1, 24),
       st.sampled_from([0.005, 0.05, 0.1, 0.4]))
def test_every_plan_is_within_its_bounds(n_running: int, n_waiting: int, left_s: float,
                                         slots: int, target_s: float) -> None:
    running = [LineEntry(0, 20 + i) for i in range(n_running)]
    plan = plan_width(COST, tpot_target_s=target_s, margin=MARGIN, slots=slots,
                      context_tokens_per_seq=8, running=running,
                      waiting=[LineEntry(4, 30)] * n_waiting, ttft_left_s=[left_s] * n_waiting)
    assert 1 <= plan.concurrency <= slots and plan.on_time <= plan.waiting == n_waiting
    assert plan.concurrency >= plan.tpot_concurrency
    if plan.reason == "tpot":
        assert plan.concurrency == plan.tpot_concurrency
    if plan.reason == "ttft":  # widened, never past the target
        assert plan.step_s <= target_s and plan.on_time > 0
    if plan.reason == "throughput":
        assert COST.predict_s(1, 0, 8) > target_s


def test_an_engine_width_holds_only_what_its_kv_pool_holds() -> None:
    tight = KVBlockAllocator.for_context(6 * 64, 16, 16, unified=True)
    plan = engine_width(COST, tpot_target_s=TARGET_S, margin=MARGIN, n_seq_max=16, kv=tight,
                        running=BUSY, held_tokens=[0] * 5, waiting=[LineEntry(4, 50)] * 3,
                        ttft_left_s=[1.0] * 3)
    assert plan.concurrency == 6  # 64-token reservations: 6 fit the pool


def test_a_passed_target_refuses_nothing_on_arrival_but_a_deadline_still_does() -> None:
    # target ahead: it is what the arrival is judged against (the earlier of the two)
    assert arrival_due_s(12.0, 15.0, now=10.0, line_busy=True) == 12.0
    assert arrival_due_s(12.0, None, now=10.0, line_busy=True) == 12.0
    # target passed before the request reached the engine (its model was loading)
    assert arrival_due_s(9.0, None, now=10.0, line_busy=True) is None
    assert arrival_due_s(9.0, 15.0, now=10.0, line_busy=True) == 15.0
    # a passed deadline still counts: the request is refused, as before
    assert arrival_due_s(None, 9.5, now=10.0, line_busy=True) == 9.5
    assert arrival_due_s(None, None, now=10.0, line_busy=True) is None


def test_an_idle_engine_judges_a_request_by_its_deadline_only() -> None:
    """Nothing running or waiting: refusing by the soft target would protect no one (a host
    slower than the target, e.g. one loaded by other jobs, would refuse every request)."""
    assert arrival_due_s(12.0, None, now=10.0, line_busy=False) is None
    assert arrival_due_s(12.0, 15.0, now=10.0, line_busy=False) == 15.0
    assert arrival_due_s(12.0, 11.0, now=10.0, line_busy=False) == 11.0
