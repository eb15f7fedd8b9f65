"""The host-memory prompt cache on the real model (SmolLM2, llama.cpp's
``llama_state_seq_get_data`` / ``_set_data``): a long prompt whose slot was dropped past the
retained-slot cap comes back from host memory into another slot, is not computed again,
and its greedy answer is the one a fresh prefill gives."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from sluice.backends.base import ModelSpec
from sluice.backends.llamacpp import LlamaCppBackend, LlamaCppGenerative
from sluice.engine.continuous import ContinuousEngine, EngineConfig
from sluice.engine.request import Request, RequestStatus, SamplingParams

pytestmark = pytest.mark.llm
pytest.importorskip("llama_cpp", reason="the llm extra is not installed")

PASSAGES = (
    "The river rose in the night and the old mill by the bridge took water up to its "
    "second floor. By morning the miller had moved the sacks of grain to the loft. " * 3,
    "A small observatory on the hill opens its dome on clear evenings; visitors queue on "
    "the gravel path to look at the rings of Saturn through the brass telescope. " * 3,
)


@pytest.fixture(scope="module")
def model() -> Iterator[LlamaCppGenerative]:
    spec = ModelSpec("s", "generative", "llamacpp", 400_000_000,
                     options={"path": "packaged:smollm2-135m-instruct", "n_ctx": 4 * 512,
                              "n_seq_max": 4, "n_threads": 2})
    loaded = LlamaCppBackend().load(spec)
    assert isinstance(loaded, LlamaCppGenerative)
    yield loaded
    loaded.close()


def _answer(eng: ContinuousEngine, text: str, request_id: int) -> Request:
    req = Request(request_id=request_id, model_id="s", kind="generative",
                  arrival_s=time.monotonic(),
                  prompt_tokens=tuple(eng.model.tokenize(f"Repeat: {text}", add_bos=True)),
                  params=SamplingParams(max_tokens=16, temperature=0.0))
    req.mark_queued(time.monotonic())
    eng.add(req)
    for _ in range(500):
        if not eng.has_work:
            break
        eng.step()
    assert req.final is not None and req.final.status is RequestStatus.COMPLETED, req.final
    return req


def test_a_dropped_prompt_is_restored_from_host_memory(model: LlamaCppGenerative) -> None:
    cold = ContinuousEngine(model, EngineConfig(retain_prefixes=False), time.monotonic,
                            lambda r: None)
    fresh = _answer(cold, PASSAGES[0], 1)
    assert cold.prompt_cache is None and fresh.cached_prompt_tokens == 0
    for slot in range(model.n_seq_max):
        model.release_sequence(slot)
    warm = ContinuousEngine(model, EngineConfig(max_retained_slots=1,
                                                cache_ram_bytes=256 << 20),
                            time.monotonic, lambda r: None)
    _answer(warm, PASSAGES[0], 2)
    _answer(warm, PASSAGES[1], 3)  # the cap of one retained slot drops the first prompt's
    cache = warm.prompt_cache
    assert cache is not None and len(cache) == 1 and cache.bytes_used > 0
    again = _answer(warm, PASSAGES[0], 4)
    n_prompt = len(again.prompt_tokens)
    assert again.cached_prompt_tokens == n_prompt - 1  # only the last token was fed
    assert cache.restored_tokens == n_prompt - 1
    assert again.final is not None and fresh.final is not None
    assert again.final.text == fresh.final.text
    warm.slots.check_integrity()
