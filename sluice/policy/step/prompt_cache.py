"""The prompt cache in host memory: retained prefixes that the slots could not keep, kept
as KV state in RAM under a byte limit and restored into a free slot when a waiting prompt
starts with more of one than any slot holds (llama-server's ``--cache-ram``).

A slot keeps the KV of the sequence it last ran (a retained prefix, ``slot_table``), but
only up to ``max_retained_slots`` of them: more idle streams spread a decode over more KV
streams, which llama.cpp runs slower. A prefix dropped past that limit, or evicted to make
room, is copied to host memory first (the engine saves the slot's state); a later prompt
that shares more of it than the slots and running sequences offer gets it back into the
lowest free slot, trimmed to what it shares, as a retained prefix the step planner then
starts the request in (nothing is computed again up to there). Saving and restoring a
prefix costs a copy of its KV (a few MB, milliseconds); computing it again costs a prefill
(about 3 ms a token for SmolLM2 on 2 cores).

Invariants: ``bytes_used <= limit_bytes`` (an entry larger than the limit is not kept); no
entry's tokens are a prefix of another entry's of the same tenant (the shorter adds
nothing); entries leave least recently used first (a lookup that restores one counts as a
use). Tenants are kept apart as the slots keep them: an entry serves only its own tenant's
prompts unless ``share_prefix_across_tenants``.

Pure: no model, no clock. The payload (the KV state) is opaque here: the engine's bytes,
the simulator's None.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

from sluice.policy.step.prefix_retention import common_prefix_tokens
from sluice.policy.step.step_data import EngineConfig, RetainedSeq, WaitingSeq

P = TypeVar("P")

__all__ = ["CachedPrompt", "PromptCache", "PromptCacheState", "Restore", "choose_restores",
           "prompt_cache_for", "to_keep"]


@dataclass(frozen=True, slots=True)
class CachedPrompt(Generic[P]):
    """One prefix kept in host memory: the tokens its KV covers (positions ``0 .. len -
    1``), whose prompt they came from, and its size."""

    tokens: tuple[int, ...]
    tenant: str
    n_bytes: int
    payload: P


@dataclass(frozen=True, slots=True)
class PromptCacheState:
    """A prompt cache as ``/status.json`` shows it (per generative model)."""

    entries: int
    bytes_used: int
    limit_bytes: int | None
    """None: no limit."""
    stored: int
    """Prefixes put in since the model loaded."""
    restored_tokens: int
    """Tokens restored into slots instead of computed, since the model loaded."""


class PromptCache(Generic[P]):
    """Prefixes' KV in host memory, least recently used first, within ``limit_bytes``
    (None: no limit)."""

    def __init__(self, limit_bytes: int | None) -> None:
        if limit_bytes is not None and limit_bytes < 0:
            raise ValueError(f"limit_bytes must be >= 0 or None, got {limit_bytes}")
        self.limit_bytes = limit_bytes
        self._entries: OrderedDict[int, CachedPrompt[P]] = OrderedDict()
        self._sorted: dict[str, list[tuple[tuple[int, ...], int]]] = {}
        """Per tenant, its entries' ``(tokens, key)`` in token order: the entry sharing
        the longest prefix with a prompt is next to where the prompt would go."""
        self._next_key = 0
        self.bytes_used = 0
        self.stored = 0
        """Entries put in (a counter)."""
        self.restored_tokens = 0
        """Tokens given back by ``take`` (a counter)."""

    def __len__(self) -> int:
        return len(self._entries)

    def state(self) -> PromptCacheState:
        return PromptCacheState(len(self._entries), self.bytes_used, self.limit_bytes,
                                self.stored, self.restored_tokens)

    def entries(self) -> tuple[CachedPrompt[P], ...]:
        """Every entry, least recently used first."""
        return tuple(self._entries.values())

    def put(self, entry: CachedPrompt[P]) -> bool:
        """Keep ``entry`` as the most recently used; whether it was kept. Not kept: larger
        than the limit, or its tokens are a prefix of an entry of its tenant (that entry
        becomes the most recently used instead). Entries of its tenant whose tokens are a
        prefix of its own leave; then the least recently used leave until it fits."""
        if self.limit_bytes is not None and entry.n_bytes > self.limit_bytes:
            return False
        n = len(entry.tokens)
        for key, old in list(self._entries.items()):
            if old.tenant != entry.tenant:
                continue
            shared = common_prefix_tokens(old.tokens, entry.tokens, min(n, len(old.tokens)))
            if shared == n:  # it holds everything the new one does
                self._entries.move_to_end(key)
                return False
            if shared == len(old.tokens):
                self._drop(key)
        while self.limit_bytes is not None and self.bytes_used + entry.n_bytes > self.limit_bytes:
            self._drop(next(iter(self._entries)))
        self._entries[self._next_key] = entry
        insort(self._sorted.setdefault(entry.tenant, []), (entry.tokens, self._next_key))
        self._next_key += 1
        self.bytes_used += entry.n_bytes
        self.stored += 1
        return True

    def best(self, prompt: Sequence[int], tenant: str, shared: bool,
             limit: int) -> tuple[int, int]:
        """``(key, tokens)``: an entry sharing the longest prefix with ``prompt`` (at most
        ``limit`` tokens) among ``tenant``'s (every tenant's with ``shared``); ``(-1, 0)``
        when none shares a token. In token order the longest match is a neighbour of the
        prompt's place, so a lookup reads two entries per tenant, not all."""
        query = tuple(prompt)
        best_key, best_n = -1, 0
        lists = self._sorted.values() if shared else [self._sorted.get(tenant, [])]
        for ordered in lists:
            at = bisect_left(ordered, (query, -1))
            for tokens, key in ordered[max(0, at - 1): at + 1]:
                n = common_prefix_tokens(query, tokens, limit)
                if n > best_n:
                    best_key, best_n = key, n
        return best_key, best_n

    def holds(self, tokens: Sequence[int], tenant: str) -> bool:
        """Whether an entry of ``tenant``'s already holds all of ``tokens`` (a ``put`` of
        them would keep nothing new): the caller can skip reading their KV."""
        return bool(tokens) and self.best(tokens, tenant, False, len(tokens))[1] == len(tokens)

    def take(self, key: int, n_tokens: int) -> CachedPrompt[P]:
        """The entry ``key`` for a restore of its first ``n_tokens``: it stays, as the most
        recently used (``KeyError`` for a key that left)."""
        entry = self._entries[key]
        self._entries.move_to_end(key)
        self.restored_tokens += n_tokens
        return entry

    def discard(self, key: int) -> None:
        """Forget an entry (its restore failed)."""
        if key in self._entries:
            self._drop(key)

    def _drop(self, key: int) -> None:
        entry = self._entries.pop(key)
        self.bytes_used -= entry.n_bytes
        ordered = self._sorted[entry.tenant]
        ordered.pop(bisect_left(ordered, (entry.tokens, key)))
        if not ordered:
            del self._sorted[entry.tenant]


@dataclass(frozen=True, slots=True)
class Restore:
    """Restore the first ``n_tokens`` of cache entry ``key`` for waiting request
    ``request_id``."""

    request_id: int
    key: int
    n_tokens: int


def prompt_cache_for(config: EngineConfig, *, unified: bool) -> PromptCache[P] | None:
    """The prompt cache an engine of ``config`` keeps (the server's and the simulator's one
    rule): none with ``cache_ram_bytes`` 0, with a unified KV pool (its retained prefixes
    stay in the pool), or when the engine retains or reuses no prefixes."""
    if (config.cache_ram_bytes == 0 or unified or not config.retain_prefixes
            or not config.prefix_reuse):
        return None
    return PromptCache(config.cache_ram_bytes)


def to_keep(cache: PromptCache[P], before: Mapping[int, RetainedSeq],
            cleared: Iterable[int]) -> list[RetainedSeq]:
    """Of the slots a slot-table change clears (``cleared``), the retained prefixes it
    dropped (``before``: the retained slots before the change) that no entry holds whole
    yet, in order: what the caller puts in the cache (the engine reads each one's KV
    first, before it clears the slot)."""
    out = []
    for slot in cleared:
        kept = before.get(slot)
        if kept is not None and not cache.holds(kept.tokens, kept.tenant):
            out.append(kept)
    return out


def choose_restores(cache: PromptCache[P], config: EngineConfig,
                    waiting: Sequence[WaitingSeq],
                    donors: Iterable[tuple[Sequence[int], int, str]],
                    free_slots: int) -> list[Restore]:
    """The restores worth making before the next plan, head of the line first: for each of
    the first waiting requests (one per free slot, at most ``max_retained_slots`` so that
    the restored prefixes do not push each other out), the cache entry that shares the
    longest prefix with its prompt (leaving one prompt token to feed), when that is at
    least ``min_prefix_tokens`` longer than the longest a donor on the model offers
    (``donors``: each one's tokens, how many of them its KV holds, its tenant: the retained
    slots and the running sequences). A restored prefix is a donor for the requests after
    it. Requests that want prompt log-probabilities reuse nothing and are skipped."""
    if not (config.prefix_reuse and config.retain_prefixes) or not len(cache):
        return []
    cap = config.max_retained_slots
    room = free_slots if cap is None else min(free_slots, cap)
    shared = config.share_prefix_across_tenants
    on_model = list(donors)
    out: list[Restore] = []
    for req in waiting:
        if len(out) >= room:
            break
        limit = len(req.prompt_tokens) - 1
        if req.prompt_logprobs or limit < config.min_prefix_tokens:
            continue
        key, n = cache.best(req.prompt_tokens, req.tenant, shared, limit)
        if n < config.min_prefix_tokens:
            continue
        here = max((common_prefix_tokens(req.prompt_tokens, tokens, min(limit, n_held))
                    for tokens, n_held, owner in on_model if shared or owner == req.tenant),
                   default=0)
        if n >= here + config.min_prefix_tokens:
            out.append(Restore(req.request_id, key, n))
            on_model.append((req.prompt_tokens[:n], n, req.tenant))
    return out
