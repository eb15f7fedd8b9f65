"""``n`` choices sharing one prefill, prompt log-probabilities, seeds, and the per-request
crash barrier, on the synthetic model (engine driven step by step, and one runtime)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest

from sluice.backends.base import ForwardChunk
from sluice.backends.synthetic import SyntheticGenerative
from sluice.engine import chooser as chooser_module
from sluice.engine.request import Final, RequestStatus, SamplingParams, TokenEvent
from sluice.engine.runtime import Runtime
from tests.engine.conftest import generative
from tests.engine.test_continuous import Clock, engine, model, request, run_to_idle
from tests.engine.test_sampling_controls import log_softmax


class CountingModel(SyntheticGenerative):
    """The synthetic model, counting the prompt tokens each slot is fed."""

    def __init__(self, **options: Any) -> None:
        super().__init__(model(**options).spec)
        self.fed: list[tuple[int, int]] = []  # (slot, tokens) of every prefill chunk
        self.copies: list[tuple[int, int, int]] = []

    def forward(self, chunks: Sequence[ForwardChunk]) -> np.ndarray:
        self.fed.extend((c.seq_slot, len(c.tokens)) for c in chunks if len(c.tokens) > 1)
        return super().forward(chunks)

    def copy_sequence(self, src_slot: int, dst_slot: int, n_tokens: int) -> None:
        self.copies.append((src_slot, dst_slot, n_tokens))
        super().copy_sequence(src_slot, dst_slot, n_tokens)


def test_n_choices_share_one_prefill_and_free_every_slot() -> None:
    m = CountingModel(n_ctx_per_seq=128)
    eng, retired = engine(m)
    req = request(n_prompt=20, max_tokens=5, n=3, temperature=2.0, seed=7)
    events: list[Any] = []
    req.listeners.append(events.append)
    eng.add(req)
    eng.step()  # prefill choice 0, fork, first token of every choice
    assert m.fed == [(0, 20)]  # the prompt was computed once
    assert sorted(m.copies) == [(0, 1, 20), (0, 2, 20)]
    assert eng.forked_prompt_tokens == 40 and eng.active_count == 3
    run_to_idle(eng)
    final = req.final
    assert final is not None and final.status == RequestStatus.COMPLETED
    assert [c.index for c in final.choices] == [0, 1, 2]
    assert all(c.finish_reason == "length" and c.completion_tokens == 5 for c in final.choices)
    assert final.completion_tokens == 15 and final.prompt_tokens == 20  # prompt counted once
    assert final.text == final.choices[0].text
    tokens = [e for e in events if isinstance(e, TokenEvent) and e.token_id >= 0]
    for c in final.choices:  # each choice's stream, in order, spells its text
        mine = [e for e in tokens if e.choice == c.index]
        assert [e.index for e in mine] == list(range(5))
        assert "".join(e.text for e in mine) == c.text
    assert len({c.text for c in final.choices}) > 1  # independent random streams
    assert retired == [req] and isinstance(events[-1], Final)
    assert eng.kv.free_blocks == eng.kv.total_blocks and not eng.running
    eng.kv.check_integrity()


def test_choice_zero_is_the_single_choice_answer_for_the_same_seed() -> None:
    texts = []
    for n in (1, 3, 3):
        eng, _ = engine()
        req = request(n_prompt=6, max_tokens=8, n=n, temperature=1.5, seed=-(2**70))
        eng.add(req)
        run_to_idle(eng)
        assert req.final is not None
        texts.append([c.text for c in req.final.choices] or [req.final.text])
    assert texts[0][0] == texts[1][0] == texts[2][0]
    assert texts[1] == texts[2]  # same seed, same choices


def test_choices_wait_for_slots_and_an_impossible_n_fails_at_once() -> None:
    eng, _ = engine(model(n_seq_max=4))
    busy = request(max_tokens=4)
    pair = request(max_tokens=3, n=4)
    eng.add(busy)
    eng.step()
    eng.add(pair)
    eng.step()
    assert pair.status == RequestStatus.QUEUED  # 3 free slots, 4 choices
    run_to_idle(eng)
    assert pair.final and len(pair.final.choices) == 4
    too_many = request(n=5)
    eng.add(too_many)
    assert too_many.final and too_many.final.status == RequestStatus.FAILED
    assert "n must be between 1 and 4" in (too_many.final.error or "")


def test_cancel_and_deadline_end_every_choice_and_free_held_slots() -> None:
    eng, retired = engine(model(n_ctx_per_seq=512), prefill_chunk_tokens=8)
    clock = eng._clock
    assert isinstance(clock, Clock)
    cancelled = request(n_prompt=40, max_tokens=30, n=2)  # still prefilling: slot 1 held
    eng.add(cancelled)
    eng.step()
    assert cancelled.status == RequestStatus.RUNNING and eng.kv.used_blocks > 0
    cancelled.cancel_requested = True
    eng.step()
    assert cancelled.status == RequestStatus.CANCELLED and retired == [cancelled]
    assert eng.kv.free_blocks == eng.kv.total_blocks and not eng.running
    expiring = request(n_prompt=4, max_tokens=30, n=3)
    expiring.deadline_s = 1.0
    eng.add(expiring)
    eng.step()
    eng.step()
    assert eng.active_count == 3
    clock.now = 2.0
    eng.step()
    final = expiring.final
    assert final and final.status == RequestStatus.EXPIRED and len(final.choices) == 3
    assert eng.kv.free_blocks == eng.kv.total_blocks and not eng.running
    eng.kv.check_integrity()


def test_prompt_logprobs_match_the_model_s_rows_across_chunks() -> None:
    eng, _ = engine(model(n_ctx_per_seq=256), prompt_logprobs_chunk_tokens=7)
    prompt = tuple(range(50, 80))  # 30 tokens: chunks of 7
    donor = request(max_tokens=20)
    donor.prompt_tokens = prompt
    eng.add(donor)
    eng.step()  # a running sequence with the same prompt: echo must not copy from it
    req = request(max_tokens=2, prompt_logprobs=True, n=2)
    req.prompt_tokens = prompt
    eng.add(req)
    run_to_idle(eng)
    final = req.final
    assert final is not None and final.status == RequestStatus.COMPLETED
    assert eng.reused_prefix_tokens == 0
    assert final.prompt_logprobs[0] is None and len(final.prompt_logprobs) == len(prompt)
    reference = model()
    for pos in range(1, len(prompt)):
        entry = final.prompt_logprobs[pos]
        assert entry is not None and entry.token_id == prompt[pos]
        expected = log_softmax(reference._logits(prompt[pos - 1], pos))[prompt[pos]]
        assert entry.logprob == pytest.approx(expected, abs=1e-5)
    assert len(final.choices) == 2


def test_a_failure_in_one_sequence_s_own_work_fails_that_request_alone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A chooser that raises for one request (as a bug in sampling, a grammar engine or a
    detokenizer would) fails that request; the other choices and requests in the same
    steps complete."""
    real_pick = chooser_module.TokenChooser.pick

    def pick(self: chooser_module.TokenChooser, *args: Any, **kwargs: Any) -> Any:
        if self.params.top_logprobs == 7:
            raise RuntimeError("boom in this request's sampler")
        return real_pick(self, *args, **kwargs)

    monkeypatch.setattr(chooser_module.TokenChooser, "pick", pick)
    eng, _ = engine()
    doomed = request(max_tokens=5, n=2, top_logprobs=7)
    others = [request(max_tokens=5, logprobs=True), request(max_tokens=5, n=2)]
    for r in (others[0], doomed, others[1]):
        eng.add(r)
    run_to_idle(eng)
    assert doomed.final and doomed.final.status == RequestStatus.FAILED
    assert doomed.final.error_code == "internal_error"
    assert "boom in this request's sampler" in (doomed.final.error or "")
    assert all(r.final and r.final.status == RequestStatus.COMPLETED for r in others)
    assert eng.kv.free_blocks == eng.kv.total_blocks


def test_n_choices_through_the_runtime_free_the_kv(runtime_factory: Any) -> None:
    rt: Runtime = runtime_factory([generative("chat", vocab_size=64)])
    finals: list[Final] = []
    reqs = []
    for i in range(3):
        req = rt.new_request("chat", prompt_tokens=(3, 4, 5, 6),
                             params=SamplingParams(max_tokens=6, n=2 + i % 2,
                                                   temperature=1.0, seed=i))
        req.listeners.append(lambda e: finals.append(e) if isinstance(e, Final) else None)
        reqs.append(req)
        assert rt.submit(req, timeout_s=5) is None
    deadline = time.monotonic() + 10
    while len(finals) < 3 and time.monotonic() < deadline:
        time.sleep(0.005)
    assert sorted(len(f.choices) for f in finals) == [2, 2, 3]
    assert all(f.status == RequestStatus.COMPLETED for f in finals)
    free, total = rt.workers[0].call(rt.workers[0].integrity).result(5)["chat"]
    assert free == total
