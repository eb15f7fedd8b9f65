"""Retained prefixes on the real model (Gemma 3 270M): a slot trimmed past a kept prefix
continues like a fresh prefill, and the engine serves a repeated system prompt from the
slot the previous request left, feeding only the new suffix, with the text of a run
without the cache (greedy)."""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import pytest

pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed (the 'llm' extra)")

from sluice.backends.base import BackendError, ModelSpec
from sluice.backends.llamacpp import LlamaCppBackend, LlamaCppGenerative
from sluice.engine.continuous import ContinuousEngine, EngineConfig
from sluice.engine.request import Request, RequestStatus, SamplingParams
from tests.backends.test_llamacpp import _assert_margin_rule, _prefill

pytestmark = pytest.mark.llm

SYSTEM = ("You are a helpful assistant who answers short questions about the geography of "
          "Europe, its countries, their rivers and their capital cities. Answer in one short "
          "sentence. Question:")
_ids = itertools.count(1)


def _spec(unified: bool) -> ModelSpec:
    return ModelSpec("gemma-3-270m", "generative", "llamacpp", 400 * 2**20, options={
        "path": "packaged:gemma-3-270m",
        "n_ctx": 1024, "n_seq_max": 2, "n_threads": 2, "kv_unified": unified})


@pytest.fixture(scope="module", params=[False, True], ids=["split", "unified"])
def model(request: pytest.FixtureRequest) -> Iterator[LlamaCppGenerative]:
    m = LlamaCppBackend().load(_spec(request.param))
    yield m
    m.close()


def test_trim_keeps_a_prefix_that_continues_like_a_fresh_prefill(
        model: LlamaCppGenerative) -> None:
    system = model.tokenize(SYSTEM, add_bos=True)
    a = model.tokenize(" Which river flows through Vienna? Answer:", add_bos=False)
    b = model.tokenize(" What is the capital of Italy? Answer:", add_bos=False)
    _prefill(model, 0, system + a)
    model.trim_sequence(0, len(system))
    assert model.slot_len[0] == len(system)
    kept = _prefill(model, 0, b, len(system))
    model.release_sequence(1)
    whole = _prefill(model, 1, system + b)
    _assert_margin_rule(whole, kept, "trimmed prefix")
    with pytest.raises(BackendError, match="cannot keep"):
        model.trim_sequence(0, model.slot_len[0] + 1)
    for slot in (0, 1):
        model.release_sequence(slot)


def _request(prompt: tuple[int, ...]) -> Request:
    req = Request(request_id=next(_ids), model_id="gemma-3-270m", kind="generative",
                  arrival_s=0.0, prompt_tokens=prompt,
                  params=SamplingParams(max_tokens=8, temperature=0.0))
    req.mark_queued(0.0)
    return req


def _serve(model: LlamaCppGenerative, prompts: list[tuple[int, ...]],
           retain: bool) -> tuple[ContinuousEngine, list[Request]]:
    """Run the prompts one after another (each alone) through a fresh engine."""
    for slot in range(model.n_seq_max):
        model.release_sequence(slot)
    eng = ContinuousEngine(model, EngineConfig(retain_prefixes=retain), lambda: 0.0,
                           lambda _: None)
    reqs = []
    for prompt in prompts:
        req = _request(prompt)
        eng.add(req)
        while eng.has_work:
            eng.step()
        reqs.append(req)
    return eng, reqs


def test_a_repeated_system_prompt_prefills_only_its_new_suffix(
        model: LlamaCppGenerative) -> None:
    system = tuple(model.tokenize(SYSTEM, add_bos=True))
    first = (*system, *model.tokenize(" Which river flows through Vienna? Answer:",
                                      add_bos=False))
    second = (*system, *model.tokenize(" What is the capital of Italy? Answer:",
                                       add_bos=False))
    eng, (_, hit) = _serve(model, [first, second], retain=True)
    assert hit.status == RequestStatus.COMPLETED
    # copied out of the slot the first left, which keeps its KV (more than the shared part)
    assert eng.reused_prefix_tokens == len(system) and eng.retained_prefix_tokens == 0
    assert len(eng.view(0.0).retained) == 2
    cold, (_, miss) = _serve(model, [first, second], retain=False)
    assert cold.reused_prefix_tokens == 0
    assert hit.final and miss.final and hit.final.text == miss.final.text
    assert hit.final.text.strip()
