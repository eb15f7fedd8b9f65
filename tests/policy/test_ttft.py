"""The first-token prediction: the waiting line against the step-time model."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sluice.policy.step.step_cost import StepCost
from sluice.policy.step.ttft import LineEntry, max_concurrency, predict_ttft

# 10 ms per decoding sequence, 1 ms per prompt token, no base: at 2 slots a step is 20 ms.
COST = StepCost(base_s=0.0, per_decode_token_s=0.010, per_prefill_token_s=0.001)


def test_an_idle_engine_answers_after_one_prefill_step() -> None:
    """The step that feeds the prompt yields the first token; nothing else decodes in it."""
    p = predict_ttft(COST, concurrency=2, context_tokens_per_seq=0, running=(), waiting=(),
                     new_prompt_tokens=30)
    assert p.start_wait_s == 0.0
    assert p.ttft_s == pytest.approx(0.030)


def test_the_prefill_step_carries_the_decodes_running_beside_it() -> None:
    running = (LineEntry(0, tokens_left=5),)
    p = predict_ttft(COST, concurrency=3, context_tokens_per_seq=0, running=running,
                     waiting=(), new_prompt_tokens=30)
    assert p.ttft_s == pytest.approx(0.030 + 0.010)


def test_a_full_engine_answers_when_the_first_slot_frees() -> None:
    running = (LineEntry(0, tokens_left=5), LineEntry(0, tokens_left=3))
    p = predict_ttft(COST, concurrency=2, context_tokens_per_seq=0, running=running,
                     waiting=(), new_prompt_tokens=10)
    assert p.start_wait_s == pytest.approx(3 * 0.020)
    # it prefills beside the one still running (2 more tokens)
    assert p.ttft_s == pytest.approx(0.060 + 0.010 + 0.010)


def test_the_waiting_line_goes_first_in_its_order() -> None:
    running = (LineEntry(0, tokens_left=5), LineEntry(0, tokens_left=3))
    waiting = (LineEntry(10, tokens_left=4), LineEntry(10, tokens_left=4))
    p = predict_ttft(COST, concurrency=2, context_tokens_per_seq=0, running=running,
                     waiting=waiting, new_prompt_tokens=10)
    # slots free at 60 and 100 ms; the first waiter holds 60 -> 60+10+80 = 150 ms, the
    # second 100 -> 190 ms; the new one starts at 150 ms.
    assert p.start_wait_s == pytest.approx(0.150)


def test_choices_take_as_many_slots() -> None:
    running = (LineEntry(0, tokens_left=2), LineEntry(0, tokens_left=6))
    one = predict_ttft(COST, concurrency=2, context_tokens_per_seq=0, running=running,
                       waiting=(), new_prompt_tokens=0)
    two = predict_ttft(COST, concurrency=2, context_tokens_per_seq=0, running=running,
                       waiting=(), new_prompt_tokens=0, new_n=2)
    assert one.start_wait_s == pytest.approx(0.040)
    assert two.start_wait_s == pytest.approx(0.120)


def test_concurrency_follows_the_step_limit_and_the_context() -> None:
    cost = StepCost(0.010, 0.004, 0.001, per_context_token_s=0.00001)
    assert max_concurrency(cost, None, 32, 100) == 32
    # 10 + 4n + 0.01 * 100 n = 10 + 5n <= 100 -> 18
    assert max_concurrency(cost, 0.100, 32, 100) == 18
    assert max_concurrency(cost, 0.100, 8, 100) == 8
    assert max_concurrency(cost, 0.001, 8, 100) == 1  # always at least one


@given(st.lists(st.integers(0, 50), max_size=8), st.lists(st.integers(1, 50), max_size=8),
       st.integers(1, 8), st.integers(0, 100))
def test_more_in_line_never_predicts_sooner(running: list[int], waiting: list[int],
                                            concurrency: int, prompt: int) -> None:
    run = tuple(LineEntry(0, t) for t in running)
    wait = tuple(LineEntry(5, t) for t in waiting)
    base = predict_ttft(COST, concurrency=concurrency, context_tokens_per_seq=10, running=run,
                        waiting=wait, new_prompt_tokens=prompt)
    more = predict_ttft(COST, concurrency=concurrency, context_tokens_per_seq=10, running=run,
                        waiting=(*wait, LineEntry(5, 10)), new_prompt_tokens=prompt)
    assert more.ttft_s >= base.ttft_s - 1e-12  # (float rounding)
    assert base.ttft_s >= base.start_wait_s + COST.predict_s(0, prompt)


def test_an_engine_prediction_runs_as_many_sequences_as_the_budget_and_kv_allow() -> None:
    """``predict_engine_ttft`` (the engine's and the simulator's one question): 8 slots;
    a 25 ms TPOT target (step limit 21.25 ms at 10 ms a decode) runs 2 of them; a KV pool
    holding 3 such requests runs 3; neither limit: all 8."""
    from sluice.policy.step.kv_blocks import KVBlockAllocator
    from sluice.policy.step.tpot_margin import DEFAULT_MARGIN
    from sluice.policy.step.width import predict_engine_ttft

    roomy = KVBlockAllocator.for_context(8 * 256, 8, 16, unified=True)
    tight = KVBlockAllocator.for_context(3 * 64, 8, 16, unified=True)

    def concurrency(kv: KVBlockAllocator, target_s: float | None) -> int:
        return predict_engine_ttft(COST, tpot_target_s=target_s, n_seq_max=8, kv=kv,
                                   running=(), held_tokens=(), waiting=(), prompt_tokens=32,
                                   n=1, max_tokens=32, margin=DEFAULT_MARGIN).concurrency
    assert concurrency(roomy, None) == 8
    assert concurrency(roomy, 0.025) == 2
    assert concurrency(tight, None) == 3
