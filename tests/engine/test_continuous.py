"""The continuous-batching engine, driven step by step on the synthetic model."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from sluice.backends.base import ModelSpec
from sluice.backends.synthetic import SyntheticGenerative
from sluice.engine.continuous import ContinuousEngine, EngineConfig
from sluice.engine.request import Final, Request, RequestStatus, SamplingParams, TokenEvent

_ids = itertools.count(1)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def model(**options: Any) -> SyntheticGenerative:
    opts = {"speed_scale": 0.0, "n_seq_max": 4, "n_ctx_per_seq": 64, **options}
    return SyntheticGenerative(ModelSpec("chat", "generative", "synthetic", 1, options=opts))


def request(n_prompt: int = 4, max_tokens: int = 5, **params: Any) -> Request:
    req = Request(
        request_id=next(_ids), model_id="chat", kind="generative", arrival_s=0.0,
        prompt_tokens=tuple(range(10, 10 + n_prompt)),
        params=SamplingParams(**{"max_tokens": max_tokens, "temperature": 0.0, **params}),
    )
    req.mark_queued(0.0)
    return req


def engine(m: SyntheticGenerative | None = None, **config: Any) -> tuple[ContinuousEngine,
                                                                          list[Request]]:
    retired: list[Request] = []
    eng = ContinuousEngine(m or model(), EngineConfig(kv_block_tokens=8, **config), Clock(),
                           retired.append)
    return eng, retired


def run_to_idle(eng: ContinuousEngine, limit: int = 1000) -> int:
    steps = 0
    while eng.has_work and steps < limit:
        eng.step()
        steps += 1
    return steps


def finals(req: Request) -> list[Final]:
    return [req.final] if req.final else []


def test_generates_exactly_max_tokens_and_frees_everything() -> None:
    eng, retired = engine()
    reqs = [request(max_tokens=n) for n in (3, 5, 7)]
    for r in reqs:
        eng.add(r)
    run_to_idle(eng)
    for r, n in zip(reqs, (3, 5, 7), strict=True):
        assert r.status == RequestStatus.COMPLETED
        assert r.final is not None and r.final.finish_reason == "length"
        assert r.final.completion_tokens == n
    assert retired == sorted(reqs, key=lambda r: r.params.max_tokens)
    assert eng.kv.free_blocks == eng.kv.total_blocks
    eng.kv.check_integrity()


def test_one_decode_token_per_running_sequence_per_step() -> None:
    m = model()
    eng, _ = engine(m)
    for _ in range(3):
        eng.add(request(n_prompt=2, max_tokens=6))
    eng.step()  # prefill all three
    eng.step()
    assert eng.last_batch_size == 3
    assert m.forward_calls == 2


def test_retiring_sequence_admits_the_next_in_the_same_step() -> None:
    eng, _ = engine(model(n_seq_max=2))
    short, long_, waiting = request(max_tokens=1), request(max_tokens=4), request(max_tokens=2)
    for r in (short, long_, waiting):
        eng.add(r)
    eng.step()  # prefill short + long; short samples its only token and retires
    assert short.status == RequestStatus.COMPLETED
    assert waiting.status == RequestStatus.QUEUED
    eng.step()  # long decodes and waiting is admitted into the freed slot
    assert waiting.status == RequestStatus.RUNNING
    run_to_idle(eng)
    assert all(r.status == RequestStatus.COMPLETED for r in (short, long_, waiting))


def test_kv_admission_waits_for_blocks_and_rejects_what_never_fits() -> None:
    eng, retired = engine(model(n_seq_max=4, n_ctx_per_seq=64))
    too_big = request(n_prompt=40, max_tokens=40)
    eng.add(too_big)
    assert too_big.status == RequestStatus.FAILED
    assert too_big.final and too_big.final.error_code == "context_length_exceeded"
    assert retired == [too_big]
    # 4 slots × 64 tokens = 32 blocks of 8; two requests of 64 tokens hold 16 blocks.
    a, b, c = (request(n_prompt=8, max_tokens=56) for _ in range(3))
    for r in (a, b, c):
        eng.add(r)
    eng.step()
    assert eng.kv.used_blocks == 24
    run_to_idle(eng)
    assert eng.kv.free_blocks == eng.kv.total_blocks


def test_chunked_prefill_keeps_decodes_flowing() -> None:
    m = model(n_ctx_per_seq=512)
    eng, _ = engine(m, prefill_chunk_tokens=16, max_batch_tokens=20)
    running = request(n_prompt=2, max_tokens=50)
    tokens: list[TokenEvent] = []
    running.listeners.append(lambda e: tokens.append(e) if isinstance(e, TokenEvent) else None)
    eng.add(running)
    eng.step()
    long_prompt = request(n_prompt=100, max_tokens=2)
    eng.add(long_prompt)
    before = len(tokens)
    steps = 0
    while long_prompt.times.first_token_s is None and steps < 50:
        eng.step()
        steps += 1
    # 100 prompt tokens in chunks of at most 16 (19 per step after the decode token).
    assert steps >= 100 // 19
    assert len(tokens) - before == steps  # the running stream got a token every step


def test_stop_string_and_eos_finish_with_stop() -> None:
    m = model(eos_at_pos=8)
    eng, _ = engine(m)
    eos_req = request(n_prompt=4, max_tokens=20)
    eng.add(eos_req)
    run_to_idle(eng)
    assert eos_req.final and eos_req.final.finish_reason == "stop"
    assert eos_req.final.completion_tokens == 4  # positions 4..7 generated, then EOS

    probe_eng, _ = engine()
    probe = request(max_tokens=3)
    probe_eng.add(probe)
    run_to_idle(probe_eng)
    assert probe.final is not None
    second_word = probe.final.text.split()[1]
    eng2, _ = engine()
    stopped = request(max_tokens=3, stop=(second_word,))
    eng2.add(stopped)
    run_to_idle(eng2)
    assert stopped.final and stopped.final.finish_reason == "stop"
    assert stopped.final.text == probe.final.text.split(second_word)[0]


def test_cancel_and_deadline_retire_running_sequences() -> None:
    eng, _ = engine()
    clock = eng._clock
    assert isinstance(clock, Clock)
    cancel_me = request(max_tokens=50)
    expire_me = request(max_tokens=50)
    expire_me.deadline_s = 1.0
    for r in (cancel_me, expire_me):
        eng.add(r)
    eng.step()
    cancel_me.cancel_requested = True
    clock.now = 2.0
    eng.step()
    assert cancel_me.status == RequestStatus.CANCELLED
    assert expire_me.status == RequestStatus.EXPIRED
    assert not eng.has_work and eng.kv.free_blocks == eng.kv.total_blocks


def test_backend_fault_fails_that_step_and_the_engine_goes_on() -> None:
    eng, _ = engine(model(fail_on_calls=[2]))
    a, b = request(max_tokens=5), request(max_tokens=5)
    eng.add(a)
    eng.add(b)
    eng.step()
    eng.step()  # the injected fault
    assert a.status == b.status == RequestStatus.FAILED
    assert a.final and a.final.error_code == "backend_error"
    c = request(max_tokens=3)
    eng.add(c)
    run_to_idle(eng)
    assert c.status == RequestStatus.COMPLETED


@pytest.mark.parametrize("mode", ["serial", "static"])
def test_baseline_modes_admit_only_into_an_empty_engine(mode: str) -> None:
    eng, _ = engine(mode=mode, static_max_wait_s=0.0)
    reqs = [request(max_tokens=3) for _ in range(6)]
    for r in reqs:
        eng.add(r)
    max_running = 0
    while eng.has_work:
        eng.step()
        max_running = max(max_running, eng.active_count)
        if mode == "static" and eng.running:
            admitted = {s.req.request_id for s in eng.running.values()}
            assert len(admitted) in (4, 2)
    assert max_running == (1 if mode == "serial" else 4)
    assert all(r.status == RequestStatus.COMPLETED for r in reqs)


def test_same_requests_give_the_same_tokens() -> None:
    texts = []
    for _ in range(2):
        eng, _ = engine()
        reqs = [request(max_tokens=6) for _ in range(3)]
        for r in reqs:
            eng.add(r)
        run_to_idle(eng)
        texts.append([r.final.text for r in reqs if r.final])
    assert texts[0] == texts[1]


def test_prefix_reuse_copies_a_running_sequences_prompt_kv() -> None:
    m = model(n_ctx_per_seq=256)
    eng, _ = engine(m, min_prefix_tokens=8)
    shared = tuple(range(100, 140))  # a 40-token "system prompt"
    first = request(max_tokens=30)
    first.prompt_tokens = (*shared, 1, 2)
    eng.add(first)
    eng.step()  # first is prefilled
    second = request(max_tokens=3)
    second.prompt_tokens = (*shared, 7, 8, 9)
    eng.add(second)
    eng.step()
    assert eng.reused_prefix_tokens == 40
    run_to_idle(eng)
    # Same output as computing the whole prompt: the synthetic model checks positions.
    eng2, _ = engine(model(n_ctx_per_seq=256), prefix_reuse=False)
    alone = request(max_tokens=3)
    alone.prompt_tokens = second.prompt_tokens
    eng2.add(alone)
    run_to_idle(eng2)
    assert second.final and alone.final and second.final.text == alone.final.text
    assert eng2.reused_prefix_tokens == 0


def _prompted(prompt: tuple[int, ...], max_tokens: int) -> Request:
    req = request(max_tokens=max_tokens)
    req.prompt_tokens = prompt
    return req


def test_a_retained_prefix_serves_the_next_requests_and_keeps_what_they_do_not_share(
) -> None:
    """One request after another with the same 40-token system prompt: the second feeds
    only its suffix, the prefix copied out of the slot the first left, which keeps its KV;
    so a third repeating the first prompt finds all of it. A prompt that continues every
    token a retained slot holds starts in that slot (trimmed). Each text is that of a full
    prefill."""
    m = model(n_ctx_per_seq=256)
    eng, _ = engine(m, min_prefix_tokens=8)
    shared = tuple(range(100, 140))
    first = _prompted((*shared, 1, 2), max_tokens=5)
    eng.add(first)
    run_to_idle(eng)
    assert eng.kv.free_blocks == eng.kv.total_blocks  # retained KV holds no reservation
    assert m.slot_len[0] == 42 + 5 - 1  # prompt + generated, but the last token: fed
    second = _prompted((*shared, 7, 8, 9), max_tokens=3)
    eng.add(second)
    [held] = eng.view(0.0).retained
    assert held.slot == 0 and len(held.tokens) == 46
    assert tuple(held.tokens[:42]) == first.prompt_tokens
    eng.step()
    assert eng.running[1].req is second and eng.running[1].n_fed == 43  # 40 copied + 3 fed
    assert (eng.reused_prefix_tokens, eng.retained_prefix_tokens) == (40, 0)
    run_to_idle(eng)
    again = _prompted(first.prompt_tokens, max_tokens=5)
    eng.add(again)
    eng.step()
    [seq] = [s for s in eng.running.values() if s.req is again]
    assert seq.n_fed == 42  # all of the first prompt but its last token, found again
    run_to_idle(eng)
    held = {r.slot: tuple(r.tokens) for r in eng.view(0.0).retained}
    assert len(held) == 3  # the three prompts' slots, each kept
    tokens = max(held.values(), key=len)
    onward = _prompted((*tokens, 4, 4), max_tokens=2)  # continues all one slot holds
    eng.add(onward)
    eng.step()
    [seq] = [s for s in eng.running.values() if s.req is onward]
    assert seq.n_fed == len(tokens) + 2 and eng.retained_prefix_tokens == len(tokens)
    run_to_idle(eng)
    eng2, _ = engine(model(n_ctx_per_seq=256), retain_prefixes=False)
    alone = _prompted(second.prompt_tokens, max_tokens=3)
    eng2.add(_prompted(first.prompt_tokens, max_tokens=5))
    run_to_idle(eng2)
    eng2.add(alone)
    run_to_idle(eng2)
    assert eng2.reused_prefix_tokens == 0 and not eng2.view(0.0).retained
    assert second.final and alone.final and second.final.text == alone.final.text
    assert first.final and again.final and again.final.text == first.final.text
    eng.kv.check_integrity()


def test_retained_slots_are_reused_least_recently_used_first_and_capped() -> None:
    m = model(n_seq_max=2, n_ctx_per_seq=128)
    eng, _ = engine(m, min_prefix_tokens=8)
    a, b = tuple(range(100, 120)), tuple(range(200, 220))
    for prompt in (a, b):  # a ends first (slot 0), then b (slot 1)
        eng.add(_prompted((*prompt, 1), max_tokens=2))
        run_to_idle(eng)
    assert [r.slot for r in eng.view(0.0).retained] == [0, 1]
    eng.add(_prompted(tuple(range(300, 320)), max_tokens=2))  # no prefix: takes the LRU slot
    eng.step()
    assert set(eng.running) == {0} and m.slot_len[0] == 20  # cleared, then prefilled
    run_to_idle(eng)
    assert [r.slot for r in eng.view(0.0).retained] == [1, 0]
    eng.add(_prompted((*b, 5), max_tokens=2))  # b's prefix is still retained
    run_to_idle(eng)
    assert eng.retained_prefix_tokens == 20
    capped, _ = engine(model(n_seq_max=2, n_ctx_per_seq=128), min_prefix_tokens=8,
                       max_retained_slots=1)
    for prompt in (a, b):
        capped.add(_prompted((*prompt, 1), max_tokens=2))
        run_to_idle(capped)
    assert [tuple(r.tokens[:20]) for r in capped.view(0.0).retained] == [b]


def test_unified_kv_evicts_retained_prefixes_rather_than_make_a_request_wait() -> None:
    # 4 slots x 32 tokens, unified: one 128-token pool (16 blocks of 8).
    m = model(n_seq_max=4, n_ctx_per_seq=32, kv_unified=True)
    eng, _ = engine(m, min_prefix_tokens=8)
    for base in (100, 200):  # two retained prefixes of 40 + 19 tokens: 8 blocks each
        eng.add(_prompted(tuple(range(base, base + 40)), max_tokens=20))
        run_to_idle(eng)
    assert [r.kv_blocks for r in eng.view(0.0).retained] == [8, 8]
    big = _prompted(tuple(range(300, 350)), max_tokens=10)  # 60 tokens: 8 blocks
    eng.add(big)
    eng.step()  # admitted at once: the older retained prefix is cleared for room
    assert big.status == RequestStatus.RUNNING
    [kept] = eng.view(0.0).retained
    assert kept.slot == 1 and kept.tokens[0] == 200 and 0 not in m.slot_len
    run_to_idle(eng)
    assert big.status == RequestStatus.COMPLETED
    eng.kv.check_integrity()


def test_a_new_sequence_takes_the_lowest_free_slot() -> None:
    # llama.cpp decodes a batch spread over many KV streams far slower than the same batch
    # on the lowest ones, so the running sequences are kept packed: slots 0 and 2 free up
    # (0 first), and the next request takes 0, not the most recently freed 2
    eng, _ = engine(model(n_seq_max=4, n_ctx_per_seq=64), retain_prefixes=False)
    reqs = [request(max_tokens=t) for t in (2, 9, 4)]  # slots 0, 1, 2; 0 ends, then 2
    for r in reqs:
        eng.add(r)
    while reqs[2].final is None:
        eng.step()
    assert set(eng.running) == {1}
    eng.add(request(max_tokens=3))
    eng.step()
    assert set(eng.running) == {0, 1}


def test_running_sequences_move_down_into_the_holes_ended_ones_leave() -> None:
    """Three requests on slots 0-2; the one on slot 0 ends first: the one on slot 2 moves
    to slot 0 (one KV stream copy) and every request's text is what it gets alone."""
    m = model(n_seq_max=4, n_ctx_per_seq=64)
    eng, _ = engine(m, retain_prefixes=False)
    reqs = [request(max_tokens=t) for t in (3, 12, 12)]
    for r in reqs:
        eng.add(r)
    while not reqs[0].is_terminal:
        eng.step()
    eng.step()
    assert set(eng.running) == {0, 1} and eng.slot_moves == 1
    assert eng.running[0].req is reqs[2]
    run_to_idle(eng)
    eng.kv.check_integrity()
    for r in reqs:
        alone_eng, _ = engine(model(n_seq_max=4, n_ctx_per_seq=64), retain_prefixes=False)
        alone = request(max_tokens=r.params.max_tokens)
        alone_eng.add(alone)
        run_to_idle(alone_eng)
        assert r.final and alone.final and r.final.text == alone.final.text


def test_a_retained_prefix_moves_up_out_of_the_running_ones_way() -> None:
    m = model(n_seq_max=4, n_ctx_per_seq=64)
    eng, _ = engine(m, min_prefix_tokens=4)
    short, long_ = _prompted(tuple(range(100, 110)), 2), _prompted(tuple(range(200, 210)), 12)
    eng.add(short)
    eng.add(long_)
    while not short.is_terminal:
        eng.step()
    eng.step()
    # short's prefix (10 prompt + 1 token fed) moved from slot 0 to the top free slot 3,
    # and the long request down from slot 1 to slot 0
    assert [r.slot for r in eng.view(0.0).retained] == [3] and set(eng.running) == {0}
    assert m.slot_len[3] == 11 and 1 not in m.slot_len
    again = _prompted((*range(100, 110), 7), 2)  # reuses the moved prefix
    eng.add(again)
    run_to_idle(eng)
    assert eng.reused_prefix_tokens >= 10 and again.final is not None
    eng.kv.check_integrity()
