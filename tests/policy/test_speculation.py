"""N-gram speculation's pure parts: the per-sequence index, the acceptance rate, and the
draft-length choice against the step-time model."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sluice.policy.step.kv_blocks import KVSnapshot
from sluice.policy.step.speculation import (
    AcceptanceRate,
    DraftBudget,
    DraftCandidate,
    NgramIndex,
    PlannedStep,
    choose_draft_lengths,
    draft_token_s,
)
from sluice.policy.step.step_cost import StepCost
from sluice.policy.step.step_data import EngineConfig, RunningSeq, StepView
from sluice.policy.step.step_planner import plan_step

COST = StepCost(base_s=0.010, per_decode_token_s=0.003, per_prefill_token_s=0.0005)


def reference_proposal(tokens: list[int], k: int, max_n: int = 3, min_n: int = 1
                       ) -> tuple[int, ...]:
    """Prompt lookup by brute force: the longest suffix (max_n..min_n) with an earlier
    occurrence, its latest such occurrence, up to k tokens after it."""
    size = len(tokens)
    for n in range(min(max_n, size - 1), min_n - 1, -1):
        suffix = tokens[size - n:]
        for end in range(size - 1, n - 1, -1):
            if tokens[end - n:end] == suffix:
                return tuple(tokens[end:min(end + k, size)])
    return ()


# -- the index ---------------------------------------------------------------------------


def test_the_latest_earlier_occurrence_of_the_longest_suffix_proposes_what_followed() -> None:
    tokens = [1, 2, 3, 9, 1, 2, 3, 4, 5, 8, 2, 3]
    index = NgramIndex(tokens)
    # "2 3" (then "3") occurred before; "8 2 3" did not: the 2-gram wins, latest first
    assert index.propose(3) == (4, 5, 8)
    tokens.append(4)  # "2 3 4" ends at 8: what followed it
    assert index.propose(2) == (5, 8)


def test_no_earlier_occurrence_proposes_nothing_and_a_repeat_proposes_itself() -> None:
    assert NgramIndex([1, 2, 3]).propose(4) == ()
    assert NgramIndex([7, 7]).propose(4) == (7,)
    assert NgramIndex([1, 2, 1]).propose(0) == ()
    assert NgramIndex([1]).propose(3) == ()


def test_min_n_refuses_short_matches() -> None:
    assert NgramIndex([5, 6, 5], min_n=2).propose(3) == ()
    with pytest.raises(ValueError, match="min_n"):
        NgramIndex([1], max_n=2, min_n=3)


@settings(max_examples=300, deadline=None)
@given(tokens=st.lists(st.integers(0, 6), min_size=1, max_size=60),
       grow=st.lists(st.integers(0, 6), max_size=20), k=st.integers(0, 8),
       max_n=st.integers(1, 4))
def test_the_index_agrees_with_brute_force_as_the_sequence_grows(
        tokens: list[int], grow: list[int], k: int, max_n: int) -> None:
    index = NgramIndex(tokens, max_n=max_n)
    assert index.propose(k) == (reference_proposal(tokens, k, max_n) if k else ())
    for token in grow:
        tokens.append(token)
        assert index.propose(k) == (reference_proposal(tokens, k, max_n) if k else ())


# -- acceptance --------------------------------------------------------------------------


def test_acceptance_follows_the_drafts_and_idle_steps_drift_back_to_the_prior() -> None:
    assert AcceptanceRate().rate == 0.7  # a fresh sequence's first draft pays at batch 1
    rate = AcceptanceRate(prior=0.5)
    assert rate.rate == 0.5
    for _ in range(20):
        rate.observe(drafted=4, accepted=4)
    high = rate.rate
    assert 0.9 < high < 1.0
    for _ in range(20):
        rate.observe(drafted=4, accepted=0)  # one verified, rejected, each time
    low = rate.rate
    assert 0.0 < low < 0.2
    for _ in range(600):
        rate.idle()
    assert low < rate.rate == pytest.approx(0.5, abs=0.05)


def test_acceptance_counts_only_the_verified_drafts() -> None:
    rate = AcceptanceRate(prior=0.5, prior_weight=2.0, decay=1.0)
    rate.observe(drafted=5, accepted=2)  # 2 accepted, the third rejected, 2 never verified
    assert rate.rate == pytest.approx((2 + 1) / (3 + 2))
    rate.observe(drafted=0, accepted=0)
    assert rate.rate == pytest.approx(3 / 5)
    with pytest.raises(ValueError, match="accepted"):
        rate.observe(drafted=1, accepted=2)
    with pytest.raises(ValueError, match="prior"):
        AcceptanceRate(prior=1.0)


@given(st.lists(st.tuples(st.integers(0, 8), st.integers(0, 8)), max_size=40),
       st.floats(0.01, 0.99), st.floats(0.0, 1.0))
def test_acceptance_stays_strictly_between_0_and_1(
        steps: list[tuple[int, int]], prior: float, decay: float) -> None:
    rate = AcceptanceRate(prior=prior, decay=decay)
    for drafted, accepted in steps:
        rate.observe(drafted, min(accepted, drafted))
        assert 0.0 < rate.rate < 1.0


# -- the draft-length choice ---------------------------------------------------------------


def step_of(decodes: int, context: int = 0, prefill: int = 0) -> PlannedStep:
    return PlannedStep(decodes, prefill, context, output_tokens=decodes)


def test_a_lone_sequence_drafts_while_tokens_per_second_rise() -> None:
    budget = DraftBudget(COST)
    (k,) = choose_draft_lengths(budget, step_of(1), [DraftCandidate(16, 0.8, 0)], 64)
    # draft j pays while 0.8**j / 3 ms > expected tokens / step ms
    t, e, j = 0.013, 1.0, 0
    while 0.8 ** (j + 1) * t > e * 0.003:
        j += 1
        t, e = t + 0.003, e + 0.8 ** j
    assert k == j and 3 <= k < 16


def test_low_acceptance_or_a_compute_bound_batch_drafts_nothing() -> None:
    budget = DraftBudget(COST)
    assert choose_draft_lengths(budget, step_of(1), [DraftCandidate(8, 0.1, 0)], 64) == (0,)
    # 64 decodes: the step is almost all per-token cost; 0.8 no longer beats E / T
    many = [DraftCandidate(8, 0.8, 0) for _ in range(64)]
    assert choose_draft_lengths(budget, step_of(64), many, 512) == (0,) * 64


def test_drafts_go_to_the_sequences_most_likely_to_be_right() -> None:
    budget = DraftBudget(COST)
    lengths = choose_draft_lengths(
        budget, step_of(4), [DraftCandidate(8, 0.3, 0), DraftCandidate(8, 0.95, 0),
                             DraftCandidate(8, 0.6, 0), DraftCandidate(2, 0.95, 0)], 64)
    # 0.6 beat the plain step's 4 tokens in 22 ms, not the step once the 0.95s drafted
    assert lengths == (0, 6, 0, 2)


def test_the_step_limit_the_tokens_and_the_proposals_bound_the_drafts() -> None:
    one = [DraftCandidate(16, 0.95, 0)]
    # beside a sequence with no proposal, within a 25 ms step: 16 ms of two decodes, then
    # 3 ms a draft -> 3 drafts (the other waits the whole step for its one token)
    assert choose_draft_lengths(DraftBudget(COST, 0.025), step_of(2), one, 64) == (3,)
    # alone, the limit binds its time per token (the step over its expected tokens), not
    # the step: it drafts as far as drafting pays, as with no limit
    unlimited = choose_draft_lengths(DraftBudget(COST), step_of(1), one, 64)
    assert unlimited[0] > 4
    assert choose_draft_lengths(DraftBudget(COST, 0.025), step_of(1), one, 64) == unlimited
    # a plain step already past the limit: drafting alone still shortens its tokens' time,
    # but may not make its neighbour's step longer
    assert choose_draft_lengths(DraftBudget(COST, 0.005), step_of(1), one, 64) == unlimited
    assert choose_draft_lengths(DraftBudget(COST, 0.005), step_of(2), one, 64) == (0,)
    assert choose_draft_lengths(DraftBudget(COST), step_of(1), one, 2) == (2,)
    assert choose_draft_lengths(DraftBudget(COST), step_of(1), [DraftCandidate(3, 0.95, 0)],
                                64) == (3,)
    assert choose_draft_lengths(DraftBudget(COST), step_of(1), one, 0) == (0,)
    with pytest.raises(ValueError, match="step_limit_s"):
        DraftBudget(COST, 0.0)


def test_a_longer_context_makes_drafting_dearer() -> None:
    cost = StepCost(0.010, 0.003, 0.0005, per_context_token_s=0.00001)
    assert draft_token_s(cost, 1000) == pytest.approx(0.013)
    short = choose_draft_lengths(DraftBudget(cost), step_of(1, 10), [DraftCandidate(16, 0.8, 10)],
                                 64)
    long_ = choose_draft_lengths(DraftBudget(cost), step_of(1, 2000),
                                 [DraftCandidate(16, 0.8, 2000)], 64)
    assert long_[0] < short[0]


candidates = st.lists(st.builds(DraftCandidate, st.integers(0, 16), st.floats(0.0, 0.999),
                                st.integers(0, 4000)), min_size=1, max_size=24)
costs = st.builds(StepCost, st.floats(0.0, 0.05), st.floats(0.0, 0.01), st.floats(0.0, 0.001),
                  st.floats(0.0, 1e-5))


@settings(max_examples=300, deadline=None)
@given(cost=costs, cands=candidates, room=st.integers(0, 200),
       limit=st.one_of(st.none(), st.floats(0.001, 0.5)), prefill=st.integers(0, 256))
def test_every_choice_keeps_its_bounds_and_each_draft_paid_when_it_was_added(
        cost: StepCost, cands: list[DraftCandidate], room: int, limit: float | None,
        prefill: int) -> None:
    step = PlannedStep(len(cands), prefill, sum(c.context_tokens for c in cands), len(cands))
    lengths = choose_draft_lengths(DraftBudget(cost, limit), step, cands, room)
    assert len(lengths) == len(cands) and sum(lengths) <= room
    assert all(0 <= k <= c.max_tokens for k, c in zip(lengths, cands, strict=True))
    total_s = cost.predict_s(step.decode_tokens, prefill, step.context_tokens) + sum(
        k * draft_token_s(cost, c.context_tokens) for k, c in zip(lengths, cands, strict=True))
    base_s = cost.predict_s(step.decode_tokens, prefill, step.context_tokens)
    yields = [1 + sum(c.acceptance ** j for j in range(1, k + 1))
              for k, c in zip(lengths, cands, strict=True)]
    if limit is not None and any(lengths):
        # no stream's expected time per token past the limit (or the plain step past it)
        assert total_s / min(yields) <= max(limit, base_s) * (1 + 1e-9)
    # drafting only ever raises expected tokens per second over not drafting
    expected = sum(yields)
    if any(lengths) and base_s > 0:
        assert expected / total_s >= len(cands) / base_s * (1 - 1e-9)
    # greedy best first: within one sequence the marginal gains fall, so every later
    # draft of any sequence is worth no more than the last one taken of each
    if any(lengths) and all(math.isfinite(c.acceptance) for c in cands):
        taken = [c.acceptance ** k / draft_token_s(cost, c.context_tokens)
                 for k, c in zip(lengths, cands, strict=True) if k and
                 draft_token_s(cost, c.context_tokens) > 0]
        left = [c.acceptance ** (k + 1) / draft_token_s(cost, c.context_tokens)
                for k, c in zip(lengths, cands, strict=True)
                if k < c.max_tokens and draft_token_s(cost, c.context_tokens) > 0]
        if taken and left and limit is None and sum(lengths) < room:
            assert max(left) <= min(taken) * (1 + 1e-9)


# -- in the step planner -------------------------------------------------------------------


def decoding(slot: int, draft: tuple[int, ...], acceptance: float) -> RunningSeq:
    tokens = tuple(range(10 * slot, 10 * slot + 6))
    return RunningSeq(slot, 100 + slot, 4, 5, 2, tokens, draft=draft, acceptance=acceptance)


def kv() -> KVSnapshot:
    return KVSnapshot(total_blocks=64, free_blocks=64, block_size_tokens=8, max_seq_tokens=512)


def test_the_planner_lengthens_the_decode_chunks_that_draft_and_only_those() -> None:
    running = (decoding(0, (7, 8, 9, 10), 0.9), decoding(1, (), 0.9),
               decoding(2, (4, 4), 0.05))
    view = StepView(running, (), (3,), kv(), 0.0)
    config = EngineConfig(kv_block_tokens=8)
    plain = plan_step(config, view)
    assert all(c.n_tokens == 1 and c.draft_tokens == 0 for c in plain.chunks)
    plan = plan_step(config, view, drafts=DraftBudget(COST))
    by_slot = {c.slot: c for c in plan.chunks}
    assert by_slot[0].draft_tokens == 4 and by_slot[0].n_tokens == 5
    assert by_slot[1].draft_tokens == 0 and by_slot[2].draft_tokens == 0
    assert [c.slot for c in plan.chunks] == [c.slot for c in plain.chunks]
    assert all(c.decode and c.want_logits for c in plan.chunks)
    assert (plan.decode_tokens, plan.draft_tokens) == (3, 4)
    # the token budget bounds drafts: three decodes leave one token
    tight = plan_step(EngineConfig(kv_block_tokens=8, max_batch_tokens=4), view,
                      drafts=DraftBudget(COST))
    assert tight.draft_tokens == 1


def test_the_draft_gate_measures_plain_steps_first_then_drafting_then_keeps_the_faster() -> None:
    from sluice.policy.step.speculation import DraftGate

    gate = DraftGate(explore_every=4, min_samples=2)
    assert not gate.allow(8)  # no plain steps measured yet
    gate.observe(8, False, 8, 0.1)  # 80 tok/s plain
    gate.observe(8, False, 8, 0.1)
    assert gate.allow(8)  # plain measured: drafting gets its samples
    gate.observe(8, True, 9, 0.14)  # drafting yields more tokens a step but 64 tok/s
    gate.observe(8, True, 9, 0.14)
    turns = [gate.allow(8) for _ in range(8)]
    assert turns == [False, False, False, True, False, False, False, True]  # explores 1 in 4
    assert not gate.allow(1)  # each batch size is measured on its own
    gate.observe(1, False, 1, 0.03)
    gate.observe(1, False, 1, 0.03)
    gate.observe(1, True, 3, 0.04)
    gate.observe(1, True, 3, 0.04)
    assert [gate.allow(1) for _ in range(3)] == [True, True, True]  # 75 beats 33 tok/s
    one, eight = gate.state()
    assert (eight.batch, eight.drafting) == (8, False)  # 64 tok/s drafting loses to 80
    assert eight.plain_tokens_per_s == pytest.approx(80.0)
    assert eight.draft_tokens_per_s == pytest.approx(9 / 0.14)
    assert (one.batch, one.drafting) == (1, True)
    for _ in range(3):
        gate.state()
    # reading the state takes no turn: turns 9 to 12 follow, the 12th explores
    assert [gate.allow(8) for _ in range(4)] == [False, False, False, True]


def test_the_draft_gate_state_shows_an_unmeasured_arm_as_none_and_the_rule_it_follows() -> None:
    from sluice.policy.step.speculation import DraftGate, GateArms

    gate = DraftGate(min_samples=2)
    assert gate.state() == ()
    gate.observe(2, False, 2, 0.1)
    assert gate.state() == (GateArms(2, 20.0, None, False),)  # one plain step of 20 tok/s
    gate.observe(2, False, 2, 0.1)
    assert gate.state()[0].drafting  # plain measured: drafting is to be measured next
    assert [gate.allow(2) for _ in range(3)] == [True] * 3


def test_the_draft_gate_follows_a_change_and_ignores_empty_steps() -> None:
    from sluice.policy.step.speculation import DraftGate

    gate = DraftGate(explore_every=2, min_samples=1, alpha=0.5)
    gate.observe(4, False, 4, 0.1)  # 40 tok/s
    gate.observe(4, True, 4, 0.2)  # 20 tok/s
    gate.observe(4, True, 4, 0.0)  # no time measured: ignored
    (arms,) = gate.state()
    assert (arms.plain_tokens_per_s, arms.draft_tokens_per_s) == (
        pytest.approx(40.0), pytest.approx(20.0))
    assert not arms.drafting
    for _ in range(4):  # the text starts repeating: drafts accepted, 100 tok/s
        gate.observe(4, True, 10, 0.1)
    (arms,) = gate.state()
    assert arms.draft_tokens_per_s is not None and arms.draft_tokens_per_s > 40.0
    assert arms.drafting
    assert gate.allow(4) or gate.allow(4)  # wins now (one of two turns explores plain)
    with pytest.raises(ValueError):
        DraftGate(explore_every=1)
