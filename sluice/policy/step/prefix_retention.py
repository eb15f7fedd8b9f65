"""Retained prefixes: whether an ended sequence's idle slot keeps its KV, which retained
prefix is dropped past ``max_retained_slots``, and how long a prompt's match with a
donor's tokens is. The planner picks donors by ``common_prefix_tokens``; the
``SlotTable`` (the engine's and the simulator's slot bookkeeping) retains by the other
two."""

from __future__ import annotations

from collections.abc import Sequence
from itertools import islice
from typing import TypeVar

from sluice.policy.step.step_data import EngineConfig

_T = TypeVar("_T")


def retains(config: EngineConfig, n_fed: int) -> bool:
    """Whether a sequence that completed after feeding ``n_fed`` tokens keeps its KV in
    its idle slot as a retained prefix (the engine's and the simulator's one rule)."""
    return config.retain_prefixes and config.prefix_reuse and n_fed >= config.min_prefix_tokens


def retain_prefix(config: EngineConfig, retained: dict[int, _T], slot: int,
                  tokens: _T) -> list[int]:
    """Keep ``tokens`` in idle ``slot`` as the most recently used retained prefix
    (``retained``: slot -> tokens, least recently used first). Returns the least recently
    used slots dropped past ``config.max_retained_slots``, oldest first: the caller clears
    and frees them."""
    retained[slot] = tokens
    dropped: list[int] = []
    cap = config.max_retained_slots
    while cap is not None and len(retained) > cap:
        oldest = next(iter(retained))
        del retained[oldest]
        dropped.append(oldest)
    return dropped


def common_prefix_tokens(a: Sequence[int], b: Sequence[int], limit: int) -> int:
    """Length of the common prefix of ``a`` and ``b``, at most ``limit``."""
    if limit <= 0:
        return 0
    n = 0
    for x, y in zip(islice(a, limit), islice(b, limit), strict=False):
        if x != y:
            break
        n += 1
    return n
