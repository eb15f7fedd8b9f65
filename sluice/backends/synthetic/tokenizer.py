"""The synthetic tokenizer: whitespace words (or single bytes) hashed into a small
vocabulary, and ``role: content`` chat turns unless a spec gives its own Jinja template."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from sluice.backends.base import (
    FimTokens,
    ModelLoadError,
    ModelSpec,
    NoChatTemplateError,
    TokenTable,
    resolved_options,
)
from sluice.backends.chat import (
    Capabilities,
    ChatPrompt,
    ChatTemplate,
    RenderOptions,
    jinja_template,
)
from sluice.backends.synthetic.cost import digest

SPECIAL_TOKENS = 3
"""Ids 0..2 are reserved: 0 = end of sequence, 1 = begin of sequence, 2 = padding."""
EOS_ID, BOS_ID = 0, 1


class SyntheticTokenizer:
    """Whitespace words hashed into a small vocabulary; token text is `` w<id>``."""

    def __init__(self, spec: ModelSpec) -> None:
        self.spec = spec
        self.vocab_size = int(spec.options.get("vocab_size", 512))
        self.n_seq_max = int(spec.options.get("n_seq_max", 8))
        self.n_ctx_per_seq = int(spec.options.get("n_ctx_per_seq", 512))
        self.n_ctx_total = self.n_ctx_per_seq * self.n_seq_max
        self.kv_unified = bool(spec.options.get("kv_unified", False))
        """One pool of ``n_ctx_total`` tokens that any slot may fill."""
        if self.kv_unified:
            self.n_ctx_per_seq = self.n_ctx_total
        self.eos_token_ids = frozenset({EOS_ID})
        self.byte_tokens = bool(spec.options.get("byte_tokens", False))
        """Ids 3..258 are the 256 single bytes (grammar tests need JSON's characters)."""
        source = spec.options.get("chat_template")
        if source:
            try:
                self.template = jinja_template(str(source))
            except ValueError as exc:
                raise ModelLoadError(f"{spec.model_id}: {exc}") from exc
        self.chat_template: str | None = (None if spec.options.get("completion_only")
                                          else self.template.name)
        """``completion_only``: a model without a chat template, as a base GGUF."""
        self.model_sampling: Mapping[str, float | int] = dict(
            spec.options.get("model_sampling", {}))
        """What a GGUF's ``general.sampling.*`` keys would recommend (by field name)."""
        top = self.vocab_size
        self.fim_tokens: FimTokens | None = (
            FimTokens(top - 3, top - 2, top - 1) if spec.options.get("fim") else None)
        """``fim``: the three highest ids are the prefix, suffix and middle tokens."""

    def tokenize(self, text: str, *, add_bos: bool, special: bool = True) -> list[int]:
        if self.byte_tokens:
            ids = [SPECIAL_TOKENS + b for b in text.encode()]
        else:
            ids = [self._word_id(w) for w in text.split()]
        return [BOS_ID, *ids] if add_bos else ids

    def _word_id(self, word: str) -> int:
        if word.startswith("w") and word[1:].isdigit():
            n = int(word[1:])
            if SPECIAL_TOKENS <= n < self.vocab_size:
                return n  # round-trips generated text
        h = int.from_bytes(digest(word)[:4], "little")
        return SPECIAL_TOKENS + h % (self.vocab_size - SPECIAL_TOKENS)

    def token_bytes(self, token_id: int) -> bytes:
        if token_id < SPECIAL_TOKENS:
            return b""
        if self.byte_tokens and token_id < SPECIAL_TOKENS + 256:
            return bytes([token_id - SPECIAL_TOKENS])
        return f" w{token_id}".encode()

    def max_token_bytes(self) -> int | None:
        """One byte per token with ``byte_tokens``; words have no length bound."""
        return 1 if self.byte_tokens else None

    def token_table(self) -> TokenTable:
        names = (b"<eos>", b"<bos>", b"<pad>")
        pieces = [*names, *(self.token_bytes(t) for t in range(SPECIAL_TOKENS, self.vocab_size))]
        return TokenTable(tuple(pieces), frozenset(range(SPECIAL_TOKENS)))

    def render_chat(self, messages: Sequence[Mapping[str, Any]]) -> str:
        self._check_chat()
        return self.template.render_text(messages)

    def apply_chat(self, messages: Sequence[Mapping[str, Any]],
                   tools: Sequence[Mapping[str, Any]] | None = None,
                   options: RenderOptions | None = None) -> ChatPrompt:
        self._check_chat()
        return self.template.apply(messages, tools, resolved_options(self.spec, options))

    def _check_chat(self) -> None:
        if self.chat_template is None:
            raise NoChatTemplateError(f"{self.spec.model_id} is a completion model")

    template = ChatTemplate("synthetic", lambda m, _t, o: _render_turns(m, o.add_generation_prompt),
                            caps=Capabilities(system=True))
    """``role: content`` turns, then ``assistant:``; tools in the generic format (the
    ``chat_template`` option's Jinja template instead, per tokenizer)."""


def _render_turns(messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool) -> str:
    turns = [f"{m['role']}: {m.get('content') or ''}" for m in messages]
    return " ".join([*turns, "assistant:"] if add_generation_prompt else turns)
