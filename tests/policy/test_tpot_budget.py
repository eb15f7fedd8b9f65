"""The TPOT step budget driven through the pure step planner: no model, no clock."""

from __future__ import annotations

import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sluice.policy.step.kv_blocks import KVSnapshot
from sluice.policy.step.step_cost import StepCost
from sluice.policy.step.step_data import EngineConfig, RunningSeq, StepLoad, StepView, WaitingSeq
from sluice.policy.step.step_planner import plan_step
from sluice.policy.step.tpot_budget import TpotBudget

# 10 ms + 4 ms per decoding sequence + 1 ms per prompt token (no context term): under a
# 100 ms target at margin 1, 22 sequences decode at once; 8 decodes leave 58 prompt tokens.
COST = StepCost(base_s=0.010, per_decode_token_s=0.004, per_prefill_token_s=0.001)


def budget(target_s: float = 0.100, cost: StepCost = COST, **kw: float) -> TpotBudget:
    return TpotBudget(cost, target_s, margin=kw.pop("margin", 1.0), **kw)  # type: ignore[arg-type]


def decoding(slot: int, n_fed: int = 10) -> RunningSeq:
    return RunningSeq(slot, 100 + slot, n_prompt=5, n_fed=n_fed, n_generated=n_fed - 4,
                      tokens=tuple(range(n_fed + 1)))


def prefilling(slot: int, n_prompt: int) -> RunningSeq:
    return RunningSeq(slot, 100 + slot, n_prompt, 0, 0, tuple(range(7000, 7000 + n_prompt)))


def waiting(request_id: int, n_prompt: int = 4, n: int = 1) -> WaitingSeq:
    return WaitingSeq(request_id, tuple(range(request_id * 1000, request_id * 1000 + n_prompt)),
                      max_tokens=8, waiting_since_s=0.0, n=n)


def view(running: tuple[RunningSeq, ...], waits: tuple[WaitingSeq, ...] = (),
         n_slots: int = 64) -> StepView:
    taken = {r.slot for r in running}
    free = tuple(s for s in range(n_slots) if s not in taken)
    return StepView(running, waits, free, KVSnapshot(4096, 4096, 16, 4096), now=0.0)


CONFIG = EngineConfig(max_batch_tokens=4096, prefill_chunk_tokens=4096, prefix_reuse=False)


def test_admits_while_the_predicted_decode_step_fits_the_target() -> None:
    running = tuple(decoding(s) for s in range(20))
    plan = plan_step(CONFIG, view(running, tuple(waiting(i, n_prompt=1) for i in range(1, 6))),
                     budget())
    # 20 running + 2 admitted = 22 decodes: 10 + 88 = 98 ms <= 100; a 23rd would be 102.
    assert [a.request_id for a in plan.admissions] == [1, 2]
    assert plan.held_back == "step_budget"


def test_a_request_with_n_choices_counts_every_choice() -> None:
    running = tuple(decoding(s) for s in range(20))
    plan = plan_step(CONFIG, view(running, (waiting(1, n_prompt=1, n=3),)), budget())
    assert plan.admissions == () and plan.held_back == "step_budget"
    plan = plan_step(CONFIG, view(running, (waiting(1, n_prompt=1, n=2),)), budget())
    assert [a.request_id for a in plan.admissions] == [1]


def test_an_empty_engine_always_admits_one() -> None:
    slow = StepCost(base_s=1.0, per_decode_token_s=1.0, per_prefill_token_s=0.0)
    plan = plan_step(CONFIG, view((), (waiting(1), waiting(2))), budget(cost=slow))
    assert [a.request_id for a in plan.admissions] == [1]
    assert plan.held_back == "step_budget"


def test_prefill_chunks_are_cut_to_what_fits_beside_the_decodes() -> None:
    running = (*(decoding(s) for s in range(8)), prefilling(8, n_prompt=500))
    plan = plan_step(CONFIG, view(running), budget())
    # 10 + 8 * 4 = 42 ms of decodes leave 58 ms: 58 prompt tokens.
    assert plan.decode_tokens == 8
    assert plan.prefill_tokens == 58
    step_s = COST.predict_s(plan.decode_tokens, plan.prefill_tokens)
    assert step_s <= 0.100 + 1e-12


def test_a_step_without_decodes_prefills_without_a_time_limit() -> None:
    plan = plan_step(CONFIG, view((prefilling(0, n_prompt=500),)), budget())
    assert plan.prefill_tokens == 500


def test_full_decodes_still_feed_a_minimum_prefill_so_prompts_progress() -> None:
    running = (*(decoding(s) for s in range(30)), prefilling(30, n_prompt=500),
               prefilling(31, n_prompt=500))
    plan = plan_step(CONFIG, view(running), budget(min_prefill_tokens=16))
    prefills = [c for c in plan.chunks if not c.decode]
    assert [(c.slot, c.n_tokens) for c in prefills] == [(30, 16)]


def test_the_context_term_counts_what_the_decodes_attend_to() -> None:
    cost = StepCost(base_s=0.010, per_decode_token_s=0.0, per_prefill_token_s=0.001,
                    per_context_token_s=0.0001)
    running = (decoding(0, n_fed=300), decoding(1, n_fed=300), prefilling(2, n_prompt=500))
    plan = plan_step(CONFIG, view(running), budget(cost=cost))
    # 10 ms + 600 context tokens * 0.1 ms = 70 ms: 30 prompt tokens fit in 100 ms.
    assert plan.prefill_tokens == 30
    # Admission counts the KV the new request's prompt adds to every later decode step:
    # held = 300 + 300 + its 400 = 1000 -> 110 ms: over the target; with 200, 90 ms.
    plan = plan_step(CONFIG, view(running[:2], (waiting(1, n_prompt=400),)), budget(cost=cost))
    assert plan.admissions == () and plan.held_back == "step_budget"
    plan = plan_step(CONFIG, view(running[:2], (waiting(1, n_prompt=200),)), budget(cost=cost))
    assert [a.request_id for a in plan.admissions] == [1]


def test_margin_plans_below_the_target() -> None:
    running = tuple(decoding(s) for s in range(16))
    plan = plan_step(CONFIG, view(running, (waiting(1, n_prompt=1),)), budget(margin=0.7))
    # 16 + 1 decodes: 78 ms > 0.7 * 100 ms
    assert plan.admissions == ()


def test_load_fields_reach_the_budget() -> None:
    seen: list[StepLoad] = []

    class Spy:
        def prefill_room_tokens(self, load: StepLoad) -> int:
            seen.append(load)
            return sys.maxsize

        def may_admit(self, load: StepLoad, request: WaitingSeq) -> bool:
            seen.append(load)
            return True

    running = (decoding(0, n_fed=10), decoding(1, n_fed=20), prefilling(2, n_prompt=7))
    plan_step(CONFIG, view(running, (waiting(1, n_prompt=5, n=2),)), Spy())
    assert seen[0] == StepLoad(decode_tokens=2, prefill_tokens=0, sequences=3,
                               context_tokens=30, held_tokens=37)
    # after the admission: its two slots and their prompts are held
    assert seen[-1].sequences == 5 and seen[-1].held_tokens == 47
    assert seen[-1].prefill_tokens == 7


def test_bad_settings_are_refused_by_name() -> None:
    with pytest.raises(ValueError, match="tpot_target_s"):
        TpotBudget(COST, 0.0)
    with pytest.raises(ValueError, match="margin"):
        TpotBudget(COST, 0.1, margin=1.5)
    with pytest.raises(ValueError, match="min_prefill_tokens"):
        TpotBudget(COST, 0.1, min_prefill_tokens=0)


@settings(max_examples=200, deadline=None)
@given(n_decoding=st.integers(0, 40), prompts=st.lists(st.integers(1, 600), max_size=4),
       waits=st.lists(st.integers(1, 300), max_size=6),
       target_ms=st.floats(20, 400), base_ms=st.floats(0, 20), per_ms=st.floats(0.1, 8),
       prefill_us=st.floats(10, 2000))
def test_no_planned_step_breaks_the_target_unless_progress_needs_it(
        n_decoding: int, prompts: list[int], waits: list[int], target_ms: float,
        base_ms: float, per_ms: float, prefill_us: float) -> None:
    cost = StepCost(base_ms / 1000, per_ms / 1000, prefill_us / 1e6)
    b = budget(target_s=target_ms / 1000, cost=cost)
    running = (*(decoding(s) for s in range(n_decoding)),
               *(prefilling(n_decoding + i, p) for i, p in enumerate(prompts)))
    plan = plan_step(CONFIG, view(running, tuple(waiting(i + 1, w) for i, w in enumerate(waits))),
                     b)
    decodes = plan.decode_tokens
    step_s = cost.predict_s(decodes, plan.prefill_tokens)
    if decodes and cost.predict_s(decodes, 0) + 16 * cost.per_prefill_token_s <= b.step_limit_s:
        assert step_s <= b.step_limit_s + 1e-9
    elif decodes:  # the decodes fill the target: at most the progress minimum is fed
        assert plan.prefill_tokens <= 16
    # admissions never push the predicted decode step past the target (unless the engine
    # held nothing: the first one is always taken)
    if plan.admissions and running:
        assert cost.predict_s(len(running) + len(plan.admissions), 0) <= b.step_limit_s + 1e-9
