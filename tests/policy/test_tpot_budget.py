"""The TPOT step budget driven through the pure step planner: no model, no clock."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sluice.policy.step.kv_blocks import KVSnapshot
from sluice.policy.step.step_cost import StepCost
from sluice.policy.step.step_data import (
    EngineConfig,
    QueuedPrompt,
    RunningSeq,
    StepLoad,
    StepView,
    WaitingSeq,
)
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


def prefilling(slot: int, n_prompt: int, due_s: float | None = None) -> RunningSeq:
    return RunningSeq(slot, 100 + slot, n_prompt, 0, 0, tuple(range(7000, 7000 + n_prompt)),
                      first_token_due_s=due_s)


def waiting(request_id: int, n_prompt: int = 4, n: int = 1,
            due_s: float | None = None) -> WaitingSeq:
    return WaitingSeq(request_id, tuple(range(request_id * 1000, request_id * 1000 + n_prompt)),
                      max_tokens=8, waiting_since_s=0.0, n=n, first_token_due_s=due_s)


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


def test_a_prompt_the_pace_brings_on_time_in_the_next_step_keeps_the_pace() -> None:
    # 8 decodes leave 58 prompt tokens a step (42 ms of 100): 100 tokens fit in this step
    # and the next, whose end (~200 ms) is before the 2 s due time
    running = (*(decoding(s) for s in range(8)), prefilling(8, n_prompt=100, due_s=2.0))
    plan = plan_step(CONFIG, view(running), budget())
    assert plan.prefill_tokens == 58


def test_a_prompt_the_pace_would_make_late_is_fed_now() -> None:
    # the same 100 tokens due in 150 ms: at the pace its first token comes after ~200 ms
    running = (*(decoding(s) for s in range(8)), prefilling(8, n_prompt=100, due_s=0.150))
    plan = plan_step(CONFIG, view(running), budget())
    assert plan.prefill_tokens == 100
    assert [c.want_logits for c in plan.chunks if not c.decode] == [True]


def test_a_prompt_the_pace_would_spread_past_the_next_step_is_fed_now() -> None:
    # 200 tokens at 58 a step take 4 steps: fed now, with the prompt ahead of it
    running = (*(decoding(s) for s in range(8)), prefilling(8, n_prompt=30),
               prefilling(9, n_prompt=200, due_s=60.0))
    plan = plan_step(CONFIG, view(running), budget())
    assert [(c.slot, c.n_tokens) for c in plan.chunks if not c.decode] == [(8, 30), (9, 200)]


def test_prompts_without_a_first_token_target_keep_the_pace() -> None:
    running = (*(decoding(s) for s in range(8)), prefilling(8, n_prompt=30),
               prefilling(9, n_prompt=200))
    plan = plan_step(CONFIG, view(running), budget())
    assert plan.prefill_tokens == 58


def test_hurried_prompts_stop_at_the_last_late_one() -> None:
    # the first waits past the next step (fed now); the one after it has no target
    running = tuple(decoding(s) for s in range(8))
    waits = (waiting(1, n_prompt=150, due_s=60.0), waiting(2, n_prompt=300))
    plan = plan_step(CONFIG, view(running, waits), budget())
    assert [a.request_id for a in plan.admissions] == [1, 2]
    fed = {c.slot: c.n_tokens for c in plan.chunks if not c.decode}
    assert sorted(fed.values()) == [150]


def test_a_hurried_step_keeps_the_token_budget_and_chunk_cap() -> None:
    config = EngineConfig(max_batch_tokens=128, prefill_chunk_tokens=64, prefix_reuse=False)
    running = (*(decoding(s) for s in range(8)),
               *(prefilling(8 + i, n_prompt=100, due_s=0.1) for i in range(3)))
    plan = plan_step(config, view(running), budget())
    assert [c.n_tokens for c in plan.chunks if not c.decode] == [64, 56]
    assert sum(c.n_tokens for c in plan.chunks) == 128


def test_a_prompt_admitted_without_a_chunk_gets_one_when_hurried() -> None:
    # 18 decodes (91 ms) leave 9 prompt tokens: the first admission gets the progress
    # minimum (16), the second none at the pace; both are due now
    running = tuple(decoding(s) for s in range(18))
    cost = StepCost(base_s=0.010, per_decode_token_s=0.0045, per_prefill_token_s=0.001)
    waits = (waiting(1, n_prompt=40, due_s=0.01), waiting(2, n_prompt=40, due_s=0.01))
    paced = plan_step(CONFIG, view(running, tuple(replace(w, first_token_due_s=None)
                                                  for w in waits)), budget(cost=cost))
    assert len(paced.admissions) == 2
    assert [c.n_tokens for c in paced.chunks if not c.decode] == [16]
    plan = plan_step(CONFIG, view(running, waits), budget(cost=cost))
    slots = [a.slot for a in plan.admissions]
    assert [(c.slot, c.n_tokens, c.want_logits) for c in plan.chunks if not c.decode] == [
        (slots[0], 40, True), (slots[1], 40, True)]


def test_hurry_counts_the_tokens_up_to_the_last_late_prompt() -> None:
    b = budget()
    load = StepLoad(decode_tokens=8, prefill_tokens=58, sequences=9)
    on_time = [QueuedPrompt(0, 0.0), QueuedPrompt(40, 5.0)]
    assert b.hurry_tokens(load, on_time) == 0
    assert b.hurry_tokens(load, [QueuedPrompt(40, 5.0), QueuedPrompt(100, 5.0),
                                 QueuedPrompt(20, None)]) == 140
    assert b.hurry_tokens(load, [QueuedPrompt(40, 0.05)]) == 40
    assert b.hurry_tokens(StepLoad(0, 58, 1), [QueuedPrompt(400, 0.0)]) == 0


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

        def hurry_tokens(self, load: StepLoad, queued: Sequence[QueuedPrompt]) -> int:
            return 0

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


@settings(max_examples=200, deadline=None)
@given(n_decoding=st.integers(1, 40), prompts=st.lists(st.integers(1, 600), max_size=4),
       waits=st.lists(st.integers(1, 300), max_size=6), max_batch=st.integers(40, 2048),
       chunk=st.integers(1, 512), target_ms=st.floats(20, 400), per_ms=st.floats(0.1, 8))
def test_prompts_due_now_are_fed_in_feed_order_up_to_the_budgets(
        n_decoding: int, prompts: list[int], waits: list[int], max_batch: int, chunk: int,
        target_ms: float, per_ms: float) -> None:
    """Every prompt due now (the pace makes it late) is fed as far as the token budget and
    its chunk cap allow, in feed order: a prompt is cut short only by its cap or by the
    tokens running out, and nothing after a prompt the tokens ran out on is fed."""
    config = EngineConfig(max_batch_tokens=max_batch, prefill_chunk_tokens=chunk,
                          prefix_reuse=False)
    cost = StepCost(0.005, per_ms / 1000, 0.001)
    running = (*(decoding(s) for s in range(n_decoding)),
               *(prefilling(n_decoding + i, p, due_s=0.0) for i, p in enumerate(prompts)))
    w = tuple(waiting(i + 1, n, due_s=0.0) for i, n in enumerate(waits))
    plan = plan_step(config, view(running, w), budget(target_s=target_ms / 1000, cost=cost))
    assert sum(c.n_tokens for c in plan.chunks) <= max_batch
    fed = {c.slot: c for c in plan.chunks if not c.decode}
    lengths = {r.slot: r.n_prompt for r in running if r.prefilling}
    lengths |= {a.slot: len(q.prompt_tokens) for a, q in zip(plan.admissions, w, strict=False)}
    order = [r.slot for r in running if r.prefilling] + [a.slot for a in plan.admissions]
    left = max_batch - plan.decode_tokens
    for slot in order:
        want = min(lengths[slot], chunk)
        got = fed[slot].n_tokens if slot in fed else 0
        assert got == min(want, left), (slot, got, want, left)
        assert slot not in fed or fed[slot].want_logits == (got == lengths[slot])
        left -= got
