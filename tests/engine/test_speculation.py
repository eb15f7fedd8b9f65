"""N-gram speculation in the continuous engine, on the synthetic model: greedy output is
token for token what it is without drafting, the KV of rejected drafts is gone at once,
and only greedy sequences that allow it draft."""

from __future__ import annotations

import itertools
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sluice.backends.base import ModelSpec
from sluice.backends.synthetic import SyntheticGenerative
from sluice.backends.synthetic.tokenizer import SPECIAL_TOKENS
from sluice.engine.continuous import ContinuousEngine, EngineConfig
from sluice.engine.request import Request, RequestStatus, SamplingParams, TokenEvent

_ids = itertools.count(1)


class TickClock:
    """A clock a millisecond later at every reading: every step takes a positive time, so
    the engine's step tally counts it."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        self.now += 0.001
        return self.now


def spec_model(speculation: str = "auto", draft_max: int = 16, **options: Any
               ) -> SyntheticGenerative:
    opts = {"speed_scale": 0.0, "n_seq_max": 4, "n_ctx_per_seq": 256, "vocab_size": 32,
            "markov_order": 1, **options}
    return SyntheticGenerative(ModelSpec("chat", "generative", "synthetic", 1, options=opts,
                                         speculation=speculation,  # type: ignore[arg-type]
                                         draft_max_tokens=draft_max))


_streamed: dict[int, list[tuple[int, int, int]]] = {}
"""Per request id, the (choice, index, token id) of every token streamed."""


def prompted(prompt: tuple[int, ...], max_tokens: int, **params: Any) -> Request:
    req = Request(request_id=next(_ids), model_id="chat", kind="generative", arrival_s=0.0,
                  prompt_tokens=prompt,
                  params=SamplingParams(**{"max_tokens": max_tokens, "temperature": 0.0,
                                           **params}))
    seen = _streamed.setdefault(req.request_id, [])
    req.listeners.append(lambda e: seen.append((e.choice, e.index, e.token_id))
                         if isinstance(e, TokenEvent) and e.token_id >= 0 else None)
    req.mark_queued(0.0)
    return req


def tokens_of(req: Request) -> list[tuple[int, int, int]]:
    """Its streamed tokens by choice, then index (drafting changes how the choices'
    tokens interleave in the stream, never what each choice streams)."""
    return sorted(_streamed.pop(req.request_id, []))


def run(model: SyntheticGenerative, reqs: list[Request], config: EngineConfig | None = None,
        ) -> ContinuousEngine:
    """Run to idle, checking after every step that each running sequence's KV holds exactly
    the positions the engine counts as fed (a rejected draft's KV is gone at once)."""
    eng = ContinuousEngine(model, config or EngineConfig(kv_block_tokens=8), TickClock(),
                           lambda r: None)
    for r in reqs:
        eng.add(r)
    for _ in range(2000):
        if not eng.has_work:
            break
        eng.step()
        for slot, seq in eng.running.items():
            assert model.slot_len.get(slot, 0) == seq.n_fed
            assert model.history.get(slot, []) == seq.tokens[: seq.n_fed]
        eng.kv.check_integrity()
    assert not eng.has_work
    return eng


def outcome(req: Request) -> tuple[Any, ...]:
    final = req.final
    assert final is not None
    return (final.status, final.finish_reason, final.text, final.completion_tokens,
            tokens_of(req))


REPEATING = (5, 6, 7, 8, 9, 5, 6, 7, 10, 11, 5, 6)


def test_greedy_drafts_are_accepted_and_the_output_is_unchanged() -> None:
    on, off = spec_model(), spec_model("off")
    with_drafts = [prompted(REPEATING, 60) for _ in range(2)]
    without = [prompted(REPEATING, 60) for _ in range(2)]
    eng_on, eng_off = run(on, with_drafts), run(off, without)
    assert [outcome(r) for r in with_drafts] == [outcome(r) for r in without]
    state = eng_on.speculation
    assert state.accepted_tokens > 0 and state.draft_tokens >= state.accepted_tokens
    assert state.verify_steps > 0 and state.acceptance is not None
    assert eng_off.speculation.draft_tokens == 0
    assert on.forward_calls < off.forward_calls  # accepted drafts saved steps
    drafted = {k: b for k, b in eng_on.step_times.snapshot().items() if k.endswith("+draft")}
    assert sum(b.draft_tokens for b in drafted.values()) == state.draft_tokens
    assert sum(b.accepted_tokens for b in drafted.values()) == state.accepted_tokens
    assert not any(k.endswith("+draft") for k in eng_off.step_times.snapshot())


def test_sampled_requests_and_requests_that_turn_it_off_never_draft() -> None:
    sampled = prompted(REPEATING, 40, temperature=0.7, seed=3)
    refused = prompted(REPEATING, 40, speculation=False)
    penalised = prompted(REPEATING, 40, repetition_penalty=1.1)
    logprobs = prompted(REPEATING, 40, logprobs=True)
    eng = run(spec_model(), [sampled, refused, penalised, logprobs])
    assert all(r.status == RequestStatus.COMPLETED for r in (sampled, refused, penalised,
                                                           logprobs))
    assert eng.speculation.draft_tokens == 0


def test_a_model_with_speculation_off_never_drafts() -> None:
    eng = run(spec_model("off"), [prompted(REPEATING, 40)])
    assert eng.speculation.draft_tokens == 0 and eng.speculation.mode == "off"


def test_the_baselines_never_draft() -> None:
    eng = run(spec_model(), [prompted(REPEATING, 40)],
              EngineConfig(kv_block_tokens=8, mode="serial"))
    assert eng.speculation.draft_tokens == 0


def test_drafts_stay_within_max_tokens_and_the_draft_limit() -> None:
    model = spec_model(draft_max=2)
    req = prompted(REPEATING, 9)
    eng = run(model, [req])
    assert req.final is not None and req.final.completion_tokens == 9
    assert eng.speculation.draft_tokens > 0
    buckets = eng.step_times.snapshot()
    assert all(b.draft_tokens <= 2 * b.steps for k, b in buckets.items() if "draft" in k)


def test_a_scripted_reply_is_the_same_with_drafts() -> None:
    reply = "abcabcabcabcabcabc"
    prompt = tuple(SPECIAL_TOKENS + b for b in b"say abcabc")
    outs = []
    for speculation in ("auto", "off"):
        model = spec_model(speculation, byte_tokens=True, vocab_size=300, reply=reply,
                           markov_order=None)
        req = prompted(prompt, 40)
        eng = run(model, [req])
        outs.append((req.final.text if req.final else None, eng.speculation.accepted_tokens))
    assert outs[0][0] == outs[1][0] == reply
    assert outs[0][1] > 0 and outs[1][1] == 0


prompts = st.lists(st.integers(SPECIAL_TOKENS, 20), min_size=1, max_size=24).map(tuple)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(order=st.one_of(st.none(), st.integers(1, 3)), vocab=st.integers(8, 24),
       jobs=st.lists(st.tuples(prompts, st.integers(1, 40), st.integers(1, 2)), min_size=1,
                     max_size=5),
       draft_max=st.integers(1, 8), eos_at=st.one_of(st.none(), st.integers(4, 60)),
       retain=st.booleans())
def test_greedy_output_is_token_for_token_the_same_with_speculation_on_and_off(
        order: int | None, vocab: int, jobs: list[tuple[tuple[int, ...], int, int]],
        draft_max: int, eos_at: int | None, retain: bool) -> None:
    options: dict[str, Any] = {"vocab_size": vocab, "markov_order": order, "eos_at_pos": eos_at}
    config = EngineConfig(kv_block_tokens=8, retain_prefixes=retain, min_prefix_tokens=4)
    results = []
    for speculation in ("auto", "off"):
        model = spec_model(speculation, draft_max, **options)
        reqs = [prompted(tuple(t % vocab if t % vocab >= SPECIAL_TOKENS else SPECIAL_TOKENS
                               for t in prompt), max_tokens, n=n)
                for prompt, max_tokens, n in jobs]
        run(model, reqs, config)
        results.append([(outcome(r), r.final.choices if r.final else None) for r in reqs])
    assert results[0] == results[1]
