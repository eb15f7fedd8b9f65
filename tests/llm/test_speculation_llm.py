"""N-gram speculation on the packaged SmolLM2: asked to repeat a passage, the model's
greedy output repeats its prompt, so drafts from the prompt are accepted; the output is
token for token what the engine writes with drafting off."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from sluice.backends.base import ModelSpec
from sluice.backends.chat import chat_tokens
from sluice.backends.llamacpp import LlamaCppBackend, LlamaCppGenerative
from sluice.engine.continuous import ContinuousEngine, EngineConfig
from sluice.engine.request import Request, SamplingParams, TokenEvent
from sluice.policy.step.step_cost import OnlineStepCost, StepCost

pytestmark = pytest.mark.llm
pytest.importorskip("llama_cpp", reason="the llm extra is not installed")

PASSAGE = ("The river rises in the hills above the town, runs through the old mill and the "
           "market square, and reaches the sea at a harbour where fishing boats have "
           "landed their catch for three hundred years.")
MAX_TOKENS = 72


@pytest.fixture(scope="module")
def engine() -> Iterator[ContinuousEngine]:
    spec = ModelSpec("s", "generative", "llamacpp", 200_000_000,
                     options={"path": "packaged:smollm2-135m-instruct", "n_ctx": 4 * 512,
                              "n_seq_max": 4, "n_threads": 2})
    model = LlamaCppBackend().load(spec)
    assert isinstance(model, LlamaCppGenerative)
    eng = ContinuousEngine(model, EngineConfig(retain_prefixes=False), time.monotonic,
                           lambda r: None)
    # Drafting is priced on the step-time model; learned on a shared host, its context
    # term can be noise large enough that no draft pays. Fixed here to a batch-1 step of
    # this size (12 ms, 2 ms a token), the test checks the mechanism, not the host.
    eng.step_cost = OnlineStepCost(StepCost(0.010, 0.002, 0.0005), min_samples=1 << 30)
    yield eng
    model.close()


def _request(eng: ContinuousEngine, i: int, text: str) -> tuple[Request, list[int]]:
    prompt = chat_tokens(eng.model, eng.model.apply_chat([{"role": "user", "content": text}]))
    req = Request(request_id=i, model_id="s", kind="generative", arrival_s=time.monotonic(),
                  prompt_tokens=tuple(prompt),
                  params=SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0))
    streamed: list[int] = []
    req.listeners.append(lambda e: streamed.append(e.token_id)
                         if isinstance(e, TokenEvent) and e.token_id >= 0 else None)
    req.mark_queued(time.monotonic())
    return req, streamed


def _run(eng: ContinuousEngine, texts: list[str], first_id: int) -> list[list[int]]:
    made = [_request(eng, first_id + i, t) for i, t in enumerate(texts)]
    for req, _ in made:
        eng.add(req)
    for _ in range(2000):
        if not eng.has_work:
            break
        eng.step()
        for slot, seq in eng.running.items():  # a rejected draft's KV is gone at once
            assert eng.model.slot_len[slot] == seq.n_fed  # type: ignore[attr-defined]
    assert not eng.has_work
    for req, _ in made:
        assert req.final is not None and req.final.completion_tokens > 0
    return [streamed for _, streamed in made]


def test_repeating_a_passage_accepts_drafts_and_writes_the_same_tokens(
        engine: ContinuousEngine) -> None:
    texts = [f"Repeat exactly: {PASSAGE}"]
    engine.drafting = False
    plain = _run(engine, texts, 1)
    assert engine.speculation.draft_tokens == 0
    engine.drafting = True
    drafted = _run(engine, texts, 10)
    state = engine.speculation
    assert state.accepted_tokens > 0, state
    assert drafted == plain
    # the passage came back: most of what it wrote was verified drafts
    assert state.accepted_tokens >= len(plain[0]) // 3, state
