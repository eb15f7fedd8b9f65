"""Slot compaction on the real model: when a sequence ends below running ones, the engine
copies the highest running sequence's KV stream into the hole (``policy/step/slot_layout.py``,
llama.cpp's cross-stream ``seq_cp``). The moved sequence must go on exactly as if it had
never moved: its greedy text equals the text it gets alone."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from sluice.backends.base import ModelSpec
from sluice.backends.llamacpp import LlamaCppBackend, LlamaCppGenerative
from sluice.engine.continuous import ContinuousEngine, EngineConfig
from sluice.engine.request import Request, SamplingParams

pytestmark = pytest.mark.llm
pytest.importorskip("llama_cpp", reason="the llm extra is not installed")

PROMPTS = ("Name a color.", "What is the capital of France?", "Count from 1 to 5.")
MAX_TOKENS = (2, 20, 20)


@pytest.fixture(scope="module")
def engine() -> Iterator[ContinuousEngine]:
    spec = ModelSpec("g", "generative", "llamacpp", 600_000_000,
                     options={"path": "packaged:gemma-3-270m", "n_ctx": 4 * 128,
                              "n_seq_max": 4, "n_threads": 2})
    model = LlamaCppBackend().load(spec)
    assert isinstance(model, LlamaCppGenerative)
    eng = ContinuousEngine(model, EngineConfig(retain_prefixes=False), time.monotonic,
                           lambda r: None)
    yield eng
    model.close()


def _request(eng: ContinuousEngine, i: int, text: str, max_tokens: int) -> Request:
    req = Request(request_id=i, model_id="g", kind="generative", arrival_s=time.monotonic(),
                  prompt_tokens=tuple(eng.model.tokenize(text, add_bos=True)),
                  params=SamplingParams(max_tokens=max_tokens, temperature=0.0))
    req.mark_queued(time.monotonic())
    return req


def _run(eng: ContinuousEngine) -> None:
    for _ in range(500):
        if not eng.has_work:
            return
        eng.step()
    raise AssertionError("the engine did not finish")


def test_a_moved_sequence_writes_what_it_writes_alone(engine: ContinuousEngine) -> None:
    alone = []
    for i, (text, n) in enumerate(zip(PROMPTS, MAX_TOKENS, strict=True)):
        req = _request(engine, 100 + i, text, n)
        engine.add(req)
        _run(engine)
        assert req.final is not None
        alone.append(req.final.text)
    moves_before = engine.slot_moves
    together = [_request(engine, i, t, n) for i, (t, n) in enumerate(zip(PROMPTS, MAX_TOKENS,
                                                                          strict=True))]
    for req in together:
        engine.add(req)
    _run(engine)
    # the first ended on slot 0 while the others ran on 1 and 2: one moved down
    assert engine.slot_moves > moves_before
    assert [r.final.text if r.final else None for r in together] == alone
