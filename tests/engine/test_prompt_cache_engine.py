"""The engine's prompt cache in host memory (synthetic backend): a retained prefix dropped
past ``max_retained_slots`` is saved before its KV is cleared and restored into a free slot
for a later prompt that shares it, which then computes only the rest, writes what it
writes without the cache, and leaves the slot table whole."""

from __future__ import annotations

from sluice.engine.continuous import ContinuousEngine
from sluice.engine.request import RequestStatus
from tests.engine.test_continuous import _prompted, engine, model, run_to_idle

PROMPTS = tuple(tuple(range(base, base + 40)) for base in (100, 200, 300))


def _served(eng: ContinuousEngine, prompt: tuple[int, ...]) -> str:
    req = _prompted(prompt, max_tokens=4)
    eng.add(req)
    run_to_idle(eng)
    assert req.final is not None and req.final.status is RequestStatus.COMPLETED, req.final
    return req.final.text


def test_a_dropped_prefix_comes_back_from_host_memory() -> None:
    eng, _ = engine(model(n_seq_max=4, n_ctx_per_seq=128), min_prefix_tokens=8,
                    max_retained_slots=1, cache_ram_bytes=1 << 20)
    cache = eng.prompt_cache
    assert cache is not None
    first = _served(eng, (*PROMPTS[0], 1))
    _served(eng, (*PROMPTS[1], 2))  # the slot cap drops the first prompt's slot
    assert [e.tokens[:40] for e in cache.entries()] == [PROMPTS[0]]
    assert [tuple(r.tokens[:40]) for r in eng.view(0.0).retained] == [PROMPTS[1]]
    before = eng.reused_prefix_tokens
    again = _served(eng, (*PROMPTS[0], 1))
    assert eng.reused_prefix_tokens - before == 40  # all but the last prompt token
    assert cache.restored_tokens == 40
    assert again == first
    eng.slots.check_integrity()


def test_a_restored_prefix_gives_the_text_of_a_fresh_prefill() -> None:
    cold, _ = engine(model(n_seq_max=4, n_ctx_per_seq=128), min_prefix_tokens=8,
                     retain_prefixes=False)
    warm, _ = engine(model(n_seq_max=4, n_ctx_per_seq=128), min_prefix_tokens=8,
                     max_retained_slots=1, cache_ram_bytes=None)
    for prompt in (*PROMPTS, PROMPTS[0], (*PROMPTS[1], 7, 7)):
        assert _served(warm, prompt) == _served(cold, prompt)
    assert warm.prompt_cache is not None and warm.prompt_cache.restored_tokens > 0
    assert cold.prompt_cache is None
    warm.slots.check_integrity()


def test_no_cache_without_bytes_or_with_one_kv_pool() -> None:
    off, _ = engine(model(), cache_ram_bytes=0)
    unified, _ = engine(model(kv_unified=True), cache_ram_bytes=None)
    assert off.prompt_cache is None and unified.prompt_cache is None


def test_one_tenant_does_not_restore_another_tenants_prefix() -> None:
    eng, _ = engine(model(n_seq_max=4, n_ctx_per_seq=128), min_prefix_tokens=8,
                    max_retained_slots=1, cache_ram_bytes=1 << 20)
    for prompt in PROMPTS[:2]:
        req = _prompted((*prompt, 1), max_tokens=2)
        req.tenant_id = "a"
        eng.add(req)
        run_to_idle(eng)
    other = _prompted((*PROMPTS[0], 1), max_tokens=2)
    other.tenant_id = "b"
    eng.add(other)
    run_to_idle(eng)
    assert eng.prompt_cache is not None and eng.prompt_cache.restored_tokens == 0
    assert other.cached_prompt_tokens == 0
