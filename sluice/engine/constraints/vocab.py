"""A tokenizer's vocabulary as llguidance needs it, built once per tokenizer.

llguidance takes every token's bytes (special tokens prefixed with 0xFF, the convention
its own llama.cpp bridge ``llguidance.llamacpp`` uses), the EOS ids that end generation
where the grammar accepts, and a tokenize function. The bytes come from the backend's
``token_table`` (``llama_token_to_piece`` for GGUF models); tokenizing goes through the
tokenizer object (held weakly: the grammar vocabulary never keeps a model alive), plain
(special-token text stays text), not through a raw ``llama_vocab`` pointer that could
outlive its model.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import llguidance

from sluice.backends.base import Tokenizer

SPECIAL_PREFIX = b"\xff"
"""llguidance's mark of a special token: such a token is never part of matched text."""

_CACHE: weakref.WeakKeyDictionary[Any, llguidance.LLTokenizer] = weakref.WeakKeyDictionary()
_LOCK = threading.Lock()


class _Wrapper:
    """The duck type ``llguidance.TokenizerWrapper`` reads (tokens, EOS, BOS, special ids,
    and ``__call__`` tokenizing a string)."""

    def __init__(self, tokens: list[bytes], eos: int, special: Sequence[int],
                 tokenize: Callable[[str], list[int]]) -> None:
        self.tokens = tokens
        self.eos_token_id = eos
        self.bos_token_id = None
        self.special_token_ids = list(special)
        self.is_tokenizer_wrapper = True
        self._tokenize = tokenize

    def __call__(self, text: str) -> list[int]:
        if not isinstance(text, str):  # llguidance probes for a bytes tokenizer
            raise TypeError("text only")
        return self._tokenize(text)


def ll_tokenizer_from_table(pieces: Sequence[bytes], special: frozenset[int] | set[int],
                            eos_ids: Sequence[int],
                            tokenize: Callable[[str], list[int]]) -> llguidance.LLTokenizer:
    """An ``LLTokenizer`` over ``pieces`` (token id = index); ``special`` and the EOS ids
    are marked special, the EOS ids end generation where the grammar accepts."""
    eos = sorted(eos_ids)
    if not eos:
        raise ValueError("a grammar needs an end-of-sequence token; the vocabulary has none")
    marked = set(special) | set(eos)
    tokens = [
        SPECIAL_PREFIX + (p or b"<special_%d>" % t) if t in marked else p
        for t, p in enumerate(pieces)
    ]
    wrapper = _Wrapper(tokens, eos[0], sorted(marked), tokenize)
    return llguidance.LLTokenizer(
        llguidance.TokenizerWrapper(wrapper), n_vocab=len(tokens), eos_token=eos
    )


def ll_tokenizer(tokenizer: Tokenizer) -> llguidance.LLTokenizer:
    """The llguidance vocabulary of ``tokenizer``, cached on its ``TokenTable`` (so the
    control plane's tokenizer and the worker's model of one GGUF file share it). Building
    it takes 1-3 s for 262,144 tokens, once per process and model file."""
    table = tokenizer.token_table()
    with _LOCK:
        cached = _CACHE.get(table)
    if cached is not None:
        return cached
    ref = weakref.ref(tokenizer)
    built: list[llguidance.LLTokenizer] = []

    def tokenize(text: str) -> list[int]:
        # llguidance tokenizes the text a grammar forces, so this must be the model's own
        # plain tokenization (no special-token parsing); if the tokenizer that built this
        # vocabulary is gone, llguidance's greedy tokenization of the same pieces serves.
        owner = ref()
        if owner is not None:
            return list(owner.tokenize(text, add_bos=False, special=False))
        return list(built[0].greedy_tokenize(text))

    built.append(ll_tokenizer_from_table(table.pieces, table.special,
                                         sorted(tokenizer.eos_token_ids), tokenize))
    with _LOCK:
        return _CACHE.setdefault(table, built[0])
