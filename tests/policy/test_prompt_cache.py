"""The host-memory prompt cache's rules (``sluice.policy.step.prompt_cache``): the byte
limit, least recently used first out, no entry a prefix of another of its tenant, the
longest match found, and which waiting requests a restore is worth making for."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from sluice.policy.step.prefix_retention import common_prefix_tokens
from sluice.policy.step.prompt_cache import CachedPrompt, PromptCache, choose_restores
from sluice.policy.step.step_data import EngineConfig, WaitingSeq


def entry(tokens: tuple[int, ...], tenant: str = "t", n_bytes: int = 10) -> CachedPrompt[None]:
    return CachedPrompt(tokens, tenant, n_bytes, None)


def waiting(request_id: int, prompt: tuple[int, ...], tenant: str = "t") -> WaitingSeq:
    return WaitingSeq(request_id, prompt, 8, 0.0, tenant=tenant)


def test_least_recently_used_entries_leave_to_fit_the_limit() -> None:
    cache: PromptCache[None] = PromptCache(25)
    for base in (100, 200):
        assert cache.put(entry(tuple(range(base, base + 20))))
    key, n = cache.best(tuple(range(100, 130)), "t", False, 29)
    assert n == 20
    cache.take(key, n)  # the first is now the most recently used
    assert cache.put(entry(tuple(range(300, 320))))
    assert [e.tokens[0] for e in cache.entries()] == [100, 300]
    assert cache.bytes_used == 20
    assert not cache.put(entry((1, 2), n_bytes=26))  # larger than the whole limit


def test_a_longer_entry_replaces_its_prefix_and_a_prefix_is_not_kept() -> None:
    cache: PromptCache[None] = PromptCache(None)
    assert cache.put(entry((1, 2, 3)))
    assert cache.put(entry((1, 2, 3, 4, 5)))
    assert [e.tokens for e in cache.entries()] == [(1, 2, 3, 4, 5)]
    assert not cache.put(entry((1, 2)))
    assert cache.holds((1, 2, 3), "t") and not cache.holds((1, 2, 3, 4, 5, 6), "t")
    assert not cache.holds((1, 2), "u") and not cache.holds((), "t")
    assert cache.put(entry((1, 2), tenant="u"))  # another tenant's is its own
    assert cache.best((1, 2, 3, 9), "u", False, 3)[1] == 2
    assert cache.best((1, 2, 3, 9), "u", True, 3)[1] == 3


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.lists(st.integers(0, 3), min_size=1, max_size=8),
                          st.sampled_from("ab"), st.integers(1, 40)), max_size=25),
       st.lists(st.integers(0, 3), min_size=1, max_size=8))
def test_the_cache_keeps_its_invariants(puts: list[tuple[list[int], str, int]],
                                        prompt: list[int]) -> None:
    cache: PromptCache[None] = PromptCache(60)
    for tokens, tenant, n_bytes in puts:
        cache.put(entry(tuple(tokens), tenant, n_bytes))
        kept = cache.entries()
        assert cache.bytes_used == sum(e.n_bytes for e in kept) <= 60
        for a in kept:
            for b in kept:
                if a is not b and a.tenant == b.tenant:
                    assert common_prefix_tokens(a.tokens, b.tokens, len(a.tokens)) < len(
                        a.tokens)
    for shared in (False, True):
        _, n = cache.best(tuple(prompt), "a", shared, len(prompt) - 1)
        assert n == max((common_prefix_tokens(prompt, e.tokens, len(prompt) - 1)
                         for e in cache.entries() if shared or e.tenant == "a"), default=0)


def test_a_restore_is_made_only_where_it_beats_the_slots_by_a_useful_prefix() -> None:
    config = EngineConfig(min_prefix_tokens=4, max_retained_slots=2)
    cache: PromptCache[None] = PromptCache(None)
    cache.put(entry(tuple(range(100, 120))))
    cache.put(entry(tuple(range(200, 210))))
    line = [waiting(1, tuple(range(100, 125))),  # 20 from the cache
            waiting(2, tuple(range(100, 122))),  # then from the first restore: none
            waiting(3, tuple(range(200, 212))),  # a slot holds 8 of its 10: not worth it
            waiting(4, (*range(200, 210), 5))]
    donors = [(tuple(range(200, 208)), 8, "t")]
    picks = choose_restores(cache, config, line, donors, free_slots=4)
    assert [(p.request_id, p.n_tokens) for p in picks] == [(1, 20)]
    short_line = [waiting(5, tuple(range(200, 212))), waiting(6, tuple(range(100, 125)))]
    picks = choose_restores(cache, config, short_line, [], free_slots=1)
    assert [(p.request_id, p.n_tokens) for p in picks] == [(5, 10)]  # one free slot
    off = EngineConfig(min_prefix_tokens=4, retain_prefixes=False)
    assert choose_restores(cache, off, line, [], free_slots=4) == []
