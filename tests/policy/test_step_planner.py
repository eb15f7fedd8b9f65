"""The step planner driven with hand-built views: no model, no engine."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sluice.policy.step.kv_blocks import KVBlockAllocator, KVSnapshot
from sluice.policy.step.prefix_retention import common_prefix_tokens
from sluice.policy.step.slot_table import reserve_admission
from sluice.policy.step.step_data import (
    Admission,
    EngineConfig,
    PlannedChunk,
    PrefixCopy,
    QueuedPrompt,
    RetainedSeq,
    RunningSeq,
    StepLoad,
    StepPlan,
    StepView,
    WaitingSeq,
)
from sluice.policy.step.step_planner import plan_step, static_wakeup_s


def kv(free: int = 64, total: int = 64, block: int = 8, max_seq: int = 512) -> KVSnapshot:
    return KVSnapshot(total_blocks=total, free_blocks=free, block_size_tokens=block,
                      max_seq_tokens=max_seq)


def decoding(slot: int, n_prompt: int = 4, generated: int = 2) -> RunningSeq:
    """A sequence past its prompt: it has fed all but its last sampled token."""
    tokens = tuple(range(1000 * (slot + 1), 1000 * (slot + 1) + n_prompt + generated))
    return RunningSeq(slot, 100 + slot, n_prompt, n_prompt + generated - 1, generated, tokens)


def prefilling(slot: int, n_prompt: int, n_fed: int = 0,
               tokens: tuple[int, ...] | None = None) -> RunningSeq:
    tokens = tokens or tuple(range(1000 * (slot + 1), 1000 * (slot + 1) + n_prompt))
    return RunningSeq(slot, 100 + slot, n_prompt, n_fed, 0, tokens)


def waiting(request_id: int, n_prompt: int = 4, max_tokens: int = 4, since_s: float = 0.0,
            prompt: tuple[int, ...] | None = None) -> WaitingSeq:
    prompt = prompt or tuple(range(request_id * 1000, request_id * 1000 + n_prompt))
    return WaitingSeq(request_id, prompt, max_tokens, since_s)


def view(running: tuple[RunningSeq, ...] = (), waits: tuple[WaitingSeq, ...] = (),
         free_slots: tuple[int, ...] | None = None, snapshot: KVSnapshot | None = None,
         now: float = 0.0, n_slots: int = 4) -> StepView:
    if free_slots is None:
        taken = {s.slot for s in running}
        free_slots = tuple(s for s in range(n_slots) if s not in taken)
    return StepView(running, waits, free_slots, snapshot or kv(), now)


def config(**fields: Any) -> EngineConfig:
    return EngineConfig(**{"kv_block_tokens": 8, "min_prefix_tokens": 4, **fields})


def test_nothing_to_do_is_an_empty_plan() -> None:
    plan = plan_step(config(), view())
    assert plan == StepPlan(chunks=(), admissions=(), held_back=None)


def test_decodes_come_first_then_running_prefills_then_admissions() -> None:
    running = (prefilling(0, n_prompt=10), decoding(1, n_prompt=4, generated=2))
    plan = plan_step(config(), view(running, (waiting(7, n_prompt=5),)))
    assert plan.chunks == (
        PlannedChunk(slot=1, start_pos=5, n_tokens=1, want_logits=True, decode=True),
        PlannedChunk(slot=0, start_pos=0, n_tokens=10, want_logits=True, decode=False),
        PlannedChunk(slot=2, start_pos=0, n_tokens=5, want_logits=True, decode=False),
    )
    assert plan.admissions == (Admission(7, slot=2, reserve_tokens=9, prefix=None),)
    assert plan.held_back is None
    assert (plan.decode_tokens, plan.prefill_tokens) == (1, 15)


def test_token_budget_cuts_prefill_then_stops_admission() -> None:
    running = (decoding(0), decoding(1), prefilling(2, n_prompt=20))
    plan = plan_step(config(max_batch_tokens=10), view(running, (waiting(7),)))
    assert [(c.slot, c.n_tokens, c.want_logits) for c in plan.chunks] == [
        (0, 1, True), (1, 1, True), (2, 8, False)]
    assert plan.admissions == () and plan.held_back == "tokens"


def test_token_budget_bounds_decodes_too() -> None:
    running = (decoding(0), decoding(1), decoding(2))
    plan = plan_step(config(max_batch_tokens=2), view(running))
    assert [c.slot for c in plan.chunks] == [0, 1]


def test_prefill_is_chunked_and_only_the_last_chunk_wants_logits() -> None:
    cfg = config(prefill_chunk_tokens=4)
    first = plan_step(cfg, view((prefilling(0, n_prompt=10, n_fed=0),)))
    last = plan_step(cfg, view((prefilling(0, n_prompt=10, n_fed=8),)))
    assert first.chunks == (PlannedChunk(0, 0, 4, want_logits=False, decode=False),)
    assert last.chunks == (PlannedChunk(0, 8, 2, want_logits=True, decode=False),)


def test_an_admitted_prompt_is_chunked_by_what_is_left_of_the_budget() -> None:
    plan = plan_step(config(max_batch_tokens=6, prefill_chunk_tokens=4),
                     view((decoding(0),), (waiting(7, n_prompt=9), waiting(8))))
    # One decode token, then 4 of 7's prompt (its chunk limit), then 1 of 8's.
    assert [(c.slot, c.start_pos, c.n_tokens) for c in plan.chunks] == [
        (0, 5, 1), (1, 0, 4), (2, 0, 1)]
    assert [a.request_id for a in plan.admissions] == [7, 8]
    assert plan.held_back is None


def test_head_of_line_waits_for_blocks_and_keeps_order() -> None:
    # 3 free blocks of 8 tokens: the head needs 4 blocks, the one behind it would fit.
    big, small = waiting(7, n_prompt=20, max_tokens=12), waiting(8, n_prompt=4, max_tokens=4)
    plan = plan_step(config(), view(waits=(big, small), snapshot=kv(free=3)))
    assert plan.admissions == () and plan.chunks == ()
    assert plan.held_back == "kv"


def test_admissions_in_one_plan_share_the_free_blocks() -> None:
    # 5 free blocks; each request reserves 16 tokens = 2 blocks: two fit, the third waits.
    waits = tuple(waiting(i, n_prompt=8, max_tokens=8) for i in (7, 8, 9))
    plan = plan_step(config(), view(waits=waits, free_slots=(3, 1, 0, 2), snapshot=kv(free=5)))
    assert [(a.request_id, a.slot, a.reserve_tokens) for a in plan.admissions] == [
        (7, 3, 16), (8, 1, 16)]
    assert plan.held_back == "kv"


def test_admissions_stop_at_the_free_slots() -> None:
    waits = tuple(waiting(i) for i in (7, 8, 9))
    plan = plan_step(config(), view((decoding(0), decoding(1)), waits))
    assert [a.slot for a in plan.admissions] == [2, 3]
    assert plan.held_back == "slots"
    full = plan_step(config(), view((decoding(0),), waits, free_slots=()))
    assert full.admissions == () and full.held_back == "slots"


def test_an_applied_plan_fits_the_allocator_it_was_made_from() -> None:
    alloc = KVBlockAllocator(total_blocks=10, block_size_tokens=8, max_seq_tokens=64)
    alloc.allocate(0, 30)  # 4 blocks held by a running sequence
    waits = tuple(waiting(i, n_prompt=8, max_tokens=8) for i in (7, 8, 9, 10))
    plan = plan_step(config(), view((decoding(0),), waits, snapshot=alloc.snapshot(), n_slots=8))
    assert len(plan.admissions) == 3 and plan.held_back == "kv"
    tables = [reserve_admission(alloc, a) for a in plan.admissions]
    assert [len(t) for t in tables] == [2, 2, 2] and alloc.free_blocks == 0
    alloc.check_integrity()
    with pytest.raises(RuntimeError, match="request 7"):
        reserve_admission(alloc, Admission(7, slot=9, reserve_tokens=1, prefix=None))


def test_prefix_reuse_takes_the_longest_already_fed_prefix() -> None:
    shared = tuple(range(500, 540))
    # Slot 0 shares 30 tokens with the new prompt but has fed only 12 of them; slot 1
    # shares 20 and has fed all of them; slot 2 shares 25, fed.
    a = prefilling(0, n_prompt=40, n_fed=12, tokens=(*shared[:30], *range(30)))
    b = prefilling(1, n_prompt=40, n_fed=40, tokens=(*shared[:20], *range(20)))
    c = prefilling(2, n_prompt=40, n_fed=39, tokens=(*shared[:25], *range(15)))
    new = waiting(7, prompt=shared, max_tokens=4)
    plan = plan_step(config(), view((a, b, c), (new,), n_slots=8))
    [adm] = plan.admissions
    assert adm.prefix == PrefixCopy(donor_slot=2, n_tokens=25)
    assert plan.chunks[-1] == PlannedChunk(adm.slot, 25, 15, want_logits=True, decode=False)


def test_prefix_reuse_leaves_one_prompt_token_and_the_first_donor_wins_a_tie() -> None:
    prompt = tuple(range(500, 520))
    donors = tuple(prefilling(s, n_prompt=20, n_fed=20, tokens=prompt) for s in (0, 1))
    plan = plan_step(config(), view(donors, (waiting(7, prompt=prompt),)))
    [adm] = plan.admissions
    assert adm.prefix == PrefixCopy(donor_slot=0, n_tokens=19)
    assert plan.chunks[-1] == PlannedChunk(adm.slot, 19, 1, want_logits=True, decode=False)


def test_prefix_reuse_ignores_short_prefixes_and_can_be_off() -> None:
    prompt = tuple(range(500, 520))
    donor = prefilling(0, n_prompt=20, n_fed=20, tokens=(*prompt[:3], *range(17)))
    short = plan_step(config(min_prefix_tokens=4), view((donor,), (waiting(7, prompt=prompt),)))
    assert short.admissions[0].prefix is None
    same = prefilling(0, n_prompt=20, n_fed=20, tokens=prompt)
    off = plan_step(config(prefix_reuse=False), view((same,), (waiting(7, prompt=prompt),)))
    assert off.admissions[0].prefix is None
    assert off.chunks[-1].start_pos == 0 and off.chunks[-1].n_tokens == 20


def test_prefix_reuse_stays_within_a_tenant_unless_shared() -> None:
    """A donor (running or retained) serves only its own tenant's requests by default."""
    prompt = tuple(range(500, 520))
    running = replace(prefilling(0, n_prompt=20, n_fed=20, tokens=prompt), tenant="a")
    retained = RetainedSeq(1, prompt, tenant="a")
    for tenant, cfg, want in (("b", config(), None), ("a", config(), 19),
                              ("b", config(share_prefix_across_tenants=True), 19)):
        waits = (replace(waiting(7, prompt=prompt), tenant=tenant),)
        plan = plan_step(cfg, replace(view((running,), waits, free_slots=(2, 3)),
                                      retained=(retained,)))
        [adm] = plan.admissions
        assert (adm.prefix.n_tokens if adm.prefix else None) == want, (tenant, cfg)
        if want is not None and cfg.share_prefix_across_tenants is False:
            assert adm.prefix is not None and adm.prefix.donor_slot == 1  # kept in place


def test_a_retained_donor_beats_a_running_one_and_keeps_what_the_prompt_does_not_share(
) -> None:
    shared = tuple(range(500, 530))
    kept = RetainedSeq(3, (*shared[:20], 9, 9, 9))  # an ended sequence's KV in idle slot 3
    running = prefilling(0, n_prompt=30, n_fed=30, tokens=(*shared[:20], *range(10)))
    other = RetainedSeq(2, tuple(range(40)))
    plan = plan_step(config(), StepView((running,), (waiting(7, prompt=shared),
                                                     waiting(8, prompt=(*shared[:12], 1, 2))),
                                        (1,), kv(), 0.0, retained=(kept, other)))
    first, second = plan.admissions
    # 20 of the donor's 23 tokens are shared: copied out into the free slot, so slot 3
    # keeps its KV for a later prompt that shares all of it
    assert first.slot == 1 and not first.in_place and first.prefix == PrefixCopy(3, 20)
    assert plan.chunks[1] == PlannedChunk(1, 20, 10, want_logits=True, decode=False)
    # With no free slot left, the next one sharing 12 tokens is admitted into the
    # retained donor (the retained slot wins the tie with the running donor), trimmed.
    assert second.slot == 3 and second.in_place and second.prefix == PrefixCopy(3, 12)
    # a prompt that continues every token the donor holds loses nothing: in place
    whole = RetainedSeq(3, shared[:20])
    plan = plan_step(config(), StepView((), (waiting(7, prompt=shared),), (1,), kv(), 0.0,
                                        retained=(whole,)))
    [adm] = plan.admissions
    assert adm.slot == 3 and adm.in_place and adm.prefix == PrefixCopy(3, 20)


def test_retained_slots_are_handed_out_least_recently_used_first_when_none_is_free() -> None:
    old, new = RetainedSeq(1, tuple(range(50, 70))), RetainedSeq(3, tuple(range(80, 100)))
    plan = plan_step(config(), StepView((), (waiting(7), waiting(8), waiting(9)), (), kv(), 0.0,
                                        retained=(old, new)))
    assert [(a.slot, a.prefix, a.evict) for a in plan.admissions] == [(1, None, ()),
                                                                      (3, None, ())]
    assert plan.held_back == "slots"


def test_retained_kv_is_evicted_least_recently_used_first_when_blocks_are_wanted() -> None:
    # 5 free blocks of 8 tokens, 3 of them lent to retained prefixes (unified KV).
    lent = (RetainedSeq(1, tuple(range(50, 66)), kv_blocks=2),
            RetainedSeq(2, tuple(range(80, 88)), kv_blocks=1))
    need_three = waiting(7, n_prompt=20, max_tokens=4)  # 24 tokens: 3 blocks
    plan = plan_step(config(), StepView((), (need_three, waiting(8), waiting(9)),
                                        (0,), kv(free=5), 0.0, retained=lent))
    first, second, third = plan.admissions
    assert (first.slot, first.evict) == (0, (1,))  # 5 - 1 lent >= 3
    assert (second.slot, second.evict) == (1, ())  # the evicted slot is free now
    assert (third.slot, third.evict) == (2, ())  # cleared for it: its block comes back
    too_big = waiting(9, n_prompt=40, max_tokens=8)  # 6 blocks: never waits on lent ones,
    plan = plan_step(config(), StepView((), (too_big,), (0,), kv(free=5), 0.0, retained=lent))
    assert plan.held_back == "kv" and not plan.admissions  # but waits for real ones


def test_static_mode_waits_for_a_full_batch_or_the_head_s_wait() -> None:
    cfg = config(mode="static", static_max_wait_s=0.5)
    two = (waiting(7, since_s=1.0), waiting(8, since_s=1.2))
    early = plan_step(cfg, view(waits=two, now=1.4))
    assert early.admissions == () and early.held_back == "mode"
    assert static_wakeup_s(cfg, 0, two[0]) == 1.5
    late = plan_step(cfg, view(waits=two, now=1.5))
    assert [a.request_id for a in late.admissions] == [7, 8]
    five = tuple(waiting(i, since_s=1.0) for i in range(7, 12))
    full = plan_step(cfg, view(waits=five, now=1.0))
    assert [a.request_id for a in full.admissions] == [7, 8, 9, 10]
    assert full.held_back == "slots"


def test_static_and_serial_admit_only_into_an_empty_engine() -> None:
    for mode in ("static", "serial"):
        cfg = config(mode=mode, static_max_wait_s=0.0)
        busy = plan_step(cfg, view((decoding(0),), (waiting(7),), now=9.0))
        assert busy.admissions == () and busy.held_back == "mode"
        assert [c.slot for c in busy.chunks] == [0]
        assert static_wakeup_s(cfg, 1, waiting(7)) is None
    serial = plan_step(config(mode="serial"), view(waits=(waiting(7), waiting(8))))
    assert [a.request_id for a in serial.admissions] == [7]
    assert serial.held_back == "mode"
    assert static_wakeup_s(config(), 0, waiting(7)) is None  # continuous never waits


class TwoSeqsThreeTokens:
    """A step budget: at most 3 prefill tokens per step, at most 2 sequences at once."""

    def __init__(self) -> None:
        self.loads: list[StepLoad] = []

    def prefill_room_tokens(self, load: StepLoad) -> int:
        self.loads.append(load)
        return max(0, 3 - load.prefill_tokens)

    def may_admit(self, load: StepLoad, request: WaitingSeq) -> bool:
        self.loads.append(load)
        return load.sequences < 2

    def hurry_tokens(self, load: StepLoad, queued: Sequence[QueuedPrompt]) -> int:
        return 0


def test_a_step_budget_sizes_prefill_chunks_and_stops_admissions() -> None:
    budget = TwoSeqsThreeTokens()
    plan = plan_step(config(), view((decoding(0),), (waiting(7), waiting(8))), budget)
    assert [(c.slot, c.n_tokens, c.want_logits) for c in plan.chunks] == [
        (0, 1, True), (1, 3, False)]
    assert [a.request_id for a in plan.admissions] == [7]
    assert plan.held_back == "step_budget"
    assert budget.loads == [
        # slot 0 has fed 5 (its decode attends to them); 7 adds its 4-token prompt
        StepLoad(decode_tokens=1, prefill_tokens=0, sequences=1, context_tokens=5,
                 held_tokens=5),  # may 7 start?
        StepLoad(decode_tokens=1, prefill_tokens=0, sequences=2, context_tokens=5,
                 held_tokens=9),  # 7's first chunk
        StepLoad(decode_tokens=1, prefill_tokens=3, sequences=2, context_tokens=5,
                 held_tokens=9),  # may 8 start?
    ]


def test_a_request_with_n_choices_takes_n_slots_and_reserves_each() -> None:
    plan = plan_step(config(), view(waits=(waiting(1, n_prompt=6, max_tokens=10), replace(
        waiting(2, n_prompt=5, max_tokens=3), n=3)), snapshot=kv(free=20)))
    assert plan.admissions == (
        Admission(1, slot=0, reserve_tokens=16, prefix=None),
        Admission(2, slot=1, reserve_tokens=8, prefix=None, fork_slots=(2, 3)),
    )
    # Only choice 0 prefills: the prompt is computed once, the forks copy it.
    assert [(c.slot, c.n_tokens, c.want_logits) for c in plan.chunks] == [
        (0, 6, True), (1, 5, True)]
    alloc = KVBlockAllocator(20, 8, 512)
    for adm in plan.admissions:
        reserve_admission(alloc, adm)
    assert alloc.free_blocks == 20 - 2 - 3 * 1
    alloc.check_integrity()


def test_choices_wait_for_enough_slots_and_blocks_keeping_order() -> None:
    three = replace(waiting(1, n_prompt=4, max_tokens=4), n=3)
    plan = plan_step(config(), view((decoding(0), decoding(1)), (three, waiting(2))))
    assert plan.admissions == () and plan.held_back == "slots"  # 2 free slots, 3 choices
    plan = plan_step(config(), view(waits=(three, waiting(2)), snapshot=kv(free=2)))
    assert plan.admissions == () and plan.held_back == "kv"  # one block each, 3 needed
    plan = plan_step(config(), view(waits=(three, waiting(2)), snapshot=kv(free=4)))
    assert [a.slots for a in plan.admissions] == [(0, 1, 2), (3,)]


def test_a_failed_reservation_of_choices_reserves_nothing() -> None:
    alloc = KVBlockAllocator(3, 8, 512)
    with pytest.raises(RuntimeError, match="stale"):
        reserve_admission(alloc, Admission(1, 0, 16, None, fork_slots=(1,)))
    assert alloc.free_blocks == 3
    alloc.check_integrity()


def test_prompt_logprobs_need_every_position_no_prefix_and_short_chunks() -> None:
    donor = decoding(0, n_prompt=12, generated=3)
    prompt = (*donor.tokens[:10], 7, 7)
    want = replace(waiting(1, prompt=prompt), prompt_logprobs=True)
    plan = plan_step(config(prompt_logprobs_chunk_tokens=5), view((donor,), (want,)))
    assert plan.admissions[0].prefix is None
    assert plan.chunks[-1] == PlannedChunk(1, 0, 5, want_logits=False, decode=False,
                                           all_logits=True)
    running = RunningSeq(1, 101, 12, 10, 0, prompt, prompt_logprobs=True)
    plan = plan_step(config(prompt_logprobs_chunk_tokens=5), view((running,)))
    assert plan.chunks == (PlannedChunk(1, 10, 2, want_logits=True, decode=False,
                                        all_logits=True),)


def test_common_prefix_is_bounded_by_the_limit() -> None:
    assert common_prefix_tokens([1, 2, 3, 4], [1, 2, 3, 9], 10) == 3
    assert common_prefix_tokens([1, 2, 3, 4], [1, 2, 3, 4], 2) == 2
    assert common_prefix_tokens([1, 2], [1, 2], 0) == 0
    assert common_prefix_tokens([], [1], -1) == 0


# -- properties on random views --------------------------------------------------------------


@st.composite
def random_case(draw: st.DrawFn) -> tuple[EngineConfig, StepView]:
    n_slots = draw(st.integers(1, 6))
    block = draw(st.sampled_from([1, 4, 8]))
    total = draw(st.integers(1, 100))
    cfg = EngineConfig(
        mode=draw(st.sampled_from(["continuous", "continuous", "static", "serial"])),
        max_batch_tokens=draw(st.integers(1, 80)),
        prefill_chunk_tokens=draw(st.integers(1, 16)),
        kv_block_tokens=block,
        static_max_wait_s=draw(st.sampled_from([0.0, 1.0])),
        prefix_reuse=draw(st.booleans()),
        min_prefix_tokens=draw(st.integers(0, 4)),
        prompt_logprobs_chunk_tokens=draw(st.integers(1, 8)),
    )
    alphabet = st.integers(0, 2)  # few symbols, so prompts share prefixes
    slots = draw(st.permutations(range(n_slots)))
    n_running = draw(st.integers(0, n_slots))
    running = []
    for slot in slots[:n_running]:
        prompt = draw(st.lists(alphabet, min_size=1, max_size=24))
        generated = draw(st.lists(alphabet, max_size=4))
        if generated:  # decoding: everything fed but the last sampled token
            n_fed = len(prompt) + len(generated) - 1
        else:
            n_fed = draw(st.integers(0, len(prompt) - 1))
        running.append(RunningSeq(slot, 100 + slot, len(prompt), n_fed, len(generated),
                                  (*prompt, *generated), prompt_logprobs=draw(st.booleans())))
    waits = []
    for i in range(draw(st.integers(0, 8))):
        prompt = draw(st.lists(alphabet, min_size=1, max_size=24))
        if running and draw(st.booleans()):  # often a running sequence's prefix + a tail
            donor = draw(st.sampled_from(running)).tokens
            prompt = [*donor[: draw(st.integers(0, len(donor)))], *prompt]
        waits.append(WaitingSeq(i, tuple(prompt), draw(st.integers(1, 16)),
                                draw(st.floats(0.0, 2.0)), n=draw(st.sampled_from([1, 1, 2, 3])),
                                prompt_logprobs=draw(st.booleans())))
    snapshot = KVSnapshot(total, draw(st.integers(0, total)), block, draw(st.integers(1, 128)))
    idle = list(slots[n_running:])
    n_retained = draw(st.integers(0, len(idle)))
    retained, lent_left = [], snapshot.free_blocks
    for slot in draw(st.permutations(idle[:n_retained])):  # least recently used first
        tokens = draw(st.lists(alphabet, min_size=1, max_size=24))
        lent = draw(st.integers(0, lent_left))  # lent blocks are part of the free ones
        lent_left -= lent
        retained.append(RetainedSeq(slot, tuple(tokens), lent))
    for i, w in enumerate(waits):  # often a retained prefix + a tail
        if retained and draw(st.booleans()):
            donor = draw(st.sampled_from(retained)).tokens
            prompt = (*donor[: draw(st.integers(0, len(donor)))], *w.prompt_tokens)
            waits[i] = replace(w, prompt_tokens=prompt)
    cfg = replace(cfg, retain_prefixes=True)
    return cfg, StepView(tuple(running), tuple(waits), tuple(idle[n_retained:]), snapshot,
                         draw(st.floats(0.0, 3.0)), retained=tuple(retained))


@settings(max_examples=300, deadline=None)
@given(case=random_case())
def test_plans_never_over_commit(case: tuple[EngineConfig, StepView]) -> None:
    cfg, v = case
    plan = plan_step(cfg, v)
    by_slot = {s.slot: s for s in v.running}
    admitted = {a.slot: a for a in plan.admissions}
    # Budget, slots and blocks.
    assert sum(c.n_tokens for c in plan.chunks) <= cfg.max_batch_tokens
    assert len({c.slot for c in plan.chunks}) == len(plan.chunks)
    handed_out = [slot for a in plan.admissions for slot in a.slots]
    assert len(set(handed_out)) == len(handed_out)
    retained = {r.slot: r for r in v.retained}
    in_place = {a.slot for a in plan.admissions if a.in_place}
    evicted = [slot for a in plan.admissions for slot in a.evict]
    assert in_place <= set(retained) and len(set(evicted)) == len(evicted)
    assert all(retained[slot].kv_blocks for slot in evicted)
    assert set(handed_out) <= {*v.free_slots, *retained}
    for i, a in enumerate(plan.admissions):  # an evicted slot is free for later admissions
        assert not set(a.slots) & {s for b in plan.admissions[i:] for s in b.evict}
    # Free slots first (in order); a retained slot is cleared for a request only when no
    # free one is left, least recently used first.
    others = [slot for slot in handed_out if slot not in in_place]
    free_taken = [slot for slot in others if slot in v.free_slots]
    assert free_taken == list(v.free_slots[: len(free_taken)])
    cleared = [slot for slot in others if slot in retained and slot not in evicted]
    if cleared:
        assert len(free_taken) == len(v.free_slots)
        assert cleared == [s for s in retained if s not in in_place and s not in evicted][
            : len(cleared)]
    blocks = sum(v.kv.blocks_needed(a.reserve_tokens) * len(a.slots) for a in plan.admissions)
    still_lent = sum(r.kv_blocks for r in v.retained
                     if r.slot not in handed_out and r.slot not in evicted)
    assert blocks + still_lent <= v.kv.free_blocks
    wants = {w.request_id: w for w in v.waiting}
    for a in plan.admissions:  # one slot per choice; the fork slots are fed nothing yet
        assert len(a.slots) == wants[a.request_id].n
        assert not {c.slot for c in plan.chunks} & set(a.fork_slots)
    # Head-of-line order, and a reason whenever someone is left waiting.
    assert [a.request_id for a in plan.admissions] == [
        w.request_id for w in v.waiting[: len(plan.admissions)]]
    assert (plan.held_back is None) == (len(plan.admissions) == len(v.waiting))
    if cfg.mode != "continuous" and v.running:
        assert not plan.admissions
    if cfg.mode == "serial":
        assert len(plan.admissions) <= 1
    # Feed order: decodes, running prefills, admitted prefills.
    kinds = ["decode" if c.decode else "running" if c.slot in by_slot else "admitted"
             for c in plan.chunks]
    assert kinds == sorted(kinds, key=["decode", "running", "admitted"].index)
    for c in plan.chunks:
        if c.decode:
            seq = by_slot[c.slot]
            assert not seq.prefilling and c.start_pos == seq.n_fed and c.n_tokens == 1
            continue
        if c.slot in by_slot:
            n_prompt, n_fed = by_slot[c.slot].n_prompt, by_slot[c.slot].n_fed
        else:
            adm = admitted[c.slot]
            prompt = v.waiting[[a.slot for a in plan.admissions].index(c.slot)].prompt_tokens
            n_prompt, n_fed = len(prompt), adm.prefix.n_tokens if adm.prefix else 0
        owner_wants = (by_slot[c.slot].prompt_logprobs if c.slot in by_slot
                       else wants[admitted[c.slot].request_id].prompt_logprobs)
        cap = cfg.prompt_logprobs_chunk_tokens if owner_wants else cfg.prefill_chunk_tokens
        assert c.start_pos == n_fed and 1 <= c.n_tokens <= cap
        assert c.want_logits == (n_fed + c.n_tokens == n_prompt)
        assert c.all_logits == owner_wants
    # Nothing runnable is skipped while tokens are left.
    if sum(c.n_tokens for c in plan.chunks) < cfg.max_batch_tokens:
        assert {c.slot for c in plan.chunks} >= set(by_slot)
    # Prefixes: kept in place from a retained slot, or copied from a running sequence's
    # fed tokens, a slot kept in place earlier in the plan or a retained slot that no
    # earlier admission took or cleared (and this one neither takes nor evicts); one
    # prompt token left.
    kept: dict[int, tuple[int, ...]] = {}
    gone: set[int] = set()
    for a, w in zip(plan.admissions, v.waiting, strict=False):
        if a.prefix is not None:
            assert not w.prompt_logprobs  # it needs every prompt position computed
            n = a.prefix.n_tokens
            donor_slot = a.prefix.donor_slot
            if a.in_place:
                held: tuple[int, ...] = tuple(retained[a.slot].tokens)
                kept[a.slot] = tuple(w.prompt_tokens[:n])
            elif donor_slot in kept:
                held = kept[donor_slot]
            elif donor_slot in retained:
                assert donor_slot not in gone | set(a.slots) | set(a.evict)
                held = tuple(retained[donor_slot].tokens)
            else:
                donor = by_slot[donor_slot]
                held = tuple(donor.tokens[: donor.n_fed])
            assert max(1, cfg.min_prefix_tokens) <= n <= min(len(held), len(w.prompt_tokens) - 1)
            assert tuple(w.prompt_tokens[:n]) == held[:n]
        gone |= set(a.slots) | set(a.evict)
    # The plan applies to an allocator in that state.
    alloc = KVBlockAllocator(v.kv.total_blocks, v.kv.block_size_tokens, v.kv.max_seq_tokens)
    for i in range(v.kv.total_blocks - v.kv.free_blocks):
        alloc.allocate(-1 - i, 1)  # blocks held by the running sequences
    assert alloc.free_blocks == v.kv.free_blocks
    for a in plan.admissions:
        reserve_admission(alloc, a)
    alloc.check_integrity()


@settings(max_examples=200, deadline=None)
@given(case=random_case())
def test_retained_kv_never_makes_a_request_wait(case: tuple[EngineConfig, StepView]) -> None:
    """With prefix reuse off, a view with retained slots plans the same admissions as the
    view with those slots released: free, their lent blocks free."""
    cfg, v = case
    cfg = replace(cfg, prefix_reuse=False)
    released = replace(v, free_slots=(*v.free_slots, *(r.slot for r in v.retained)),
                       retained=())
    plan, plain = plan_step(cfg, v), plan_step(cfg, released)
    assert [a.request_id for a in plan.admissions] == [a.request_id for a in plain.admissions]
    assert plan.held_back == plain.held_back
    def feeds(p: StepPlan) -> list[tuple[int, int, bool]]:  # the slots may differ
        return [(c.start_pos, c.n_tokens, c.decode) for c in p.chunks]

    assert feeds(plan) == feeds(plain)
