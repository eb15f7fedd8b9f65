"""The tokenizer and chat template of a GGUF, over any loaded ``llama_model``."""

from __future__ import annotations

import ctypes
import threading
import weakref
from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from typing import Any

from sluice.backends.base import (
    FimTokens,
    ModelLoadError,
    ModelSpec,
    NoChatTemplateError,
    TokenTable,
    resolved_options,
)
from sluice.backends.chat import ChatPrompt, ChatTemplate, RenderOptions
from sluice.backends.llamacpp.metadata import gguf_sampling
from sluice.backends.llamacpp.native import free_native, tokenize
from sluice.backends.llamacpp.options import LlamaCppOptions, ctx_layout, resolve_model_path
from sluice.backends.llamacpp.templates import pick_template

_TABLES: dict[tuple[str, int, int, int], TokenTable] = {}
"""Token tables by GGUF file (path, size, mtime) and vocabulary size."""
_TABLES_LOCK = threading.Lock()


class LlamaCppTokenizer:
    """Tokenizer and chat template of a GGUF, over any loaded ``llama_model``.

    Built by ``LlamaCppBackend.load_tokenizer`` on a vocab-only model (no weights), so it
    is cheap and independent of the worker's context; a lock serialises its calls so
    several control-plane threads may share it. ``tokenize`` parses special-token text
    such as ``<start_of_turn>`` into its special token unless ``special=False``; chat
    prompts (``apply_chat``) keep user text plain.
    """

    def __init__(
        self,
        lib: Any,
        spec: ModelSpec,
        options: LlamaCppOptions,
        model: Any,
        *,
        standalone: bool = True,
    ) -> None:
        """Wrap ``model``; a ``standalone`` tokenizer owns it (frees it on ``close``) and
        locks its calls, while a model's own tokenizer is driven by its worker thread."""
        self.spec = spec
        self.options = options
        self._lib = lib
        self._vocab = lib.llama_model_get_vocab(model)
        self._lock: AbstractContextManager[Any] = threading.Lock() if standalone else nullcontext()
        self.vocab_size = int(lib.llama_vocab_n_tokens(self._vocab))
        self.n_seq_max = options.n_seq_max
        self.n_ctx_total, self.n_ctx_per_seq = ctx_layout(options.n_ctx, options.n_seq_max,
                                                          options.kv_unified)
        self.eos_token_ids = frozenset(
            t for t in range(self.vocab_size) if lib.llama_vocab_is_eog(self._vocab, t)
        )
        self._pieces: dict[int, bytes] = {}
        self._max_token_bytes: int | None = None
        try:
            self.template: ChatTemplate | None = pick_template(lib, model, self._vocab,
                                                               options.chat_template)
        except ValueError as exc:
            raise ModelLoadError(f"{spec.model_id}: {exc}") from exc
        self.chat_template: str | None = None if self.template is None else self.template.name
        self.model_sampling: Mapping[str, float | int] = gguf_sampling(lib, model)
        self.fim_tokens: FimTokens | None = _fim_tokens(lib, self._vocab)
        if standalone:
            self._finalizer = weakref.finalize(self, free_native, lib, None, model)

    @property
    def closed(self) -> bool:
        return not self._finalizer.alive

    def close(self) -> None:
        """Free the native model. Idempotent."""
        self._finalizer()

    def tokenize(self, text: str, *, add_bos: bool, special: bool = True) -> list[int]:
        with self._lock:
            return tokenize(self._lib, self._vocab, text, add_bos=add_bos, special=special)

    def token_bytes(self, token_id: int) -> bytes:
        piece = self._pieces.get(token_id)
        if piece is None:
            if not 0 <= token_id < self.vocab_size:
                raise ValueError(f"token id {token_id} is outside the vocabulary")
            piece = self._piece(token_id)
            self._pieces[token_id] = piece
        return piece

    def token_table(self) -> TokenTable:
        """Every token's piece (``llama_token_to_piece`` with special tokens rendered by
        name, as llguidance's own llama.cpp bridge reads them) and the special set:
        control and unknown tokens, and user-defined ``<...>`` tokens that look like
        control ones. Built once per GGUF file and process (2 x 262,144 ctypes calls, 1-3
        s), shared by every tokenizer and model of that file."""
        path = resolve_model_path(self.spec, self.options)
        stat = path.stat()
        key = (str(path), stat.st_size, stat.st_mtime_ns, self.vocab_size)
        with _TABLES_LOCK:
            table = _TABLES.get(key)
            if table is None:
                table = _TABLES[key] = self._build_table()
        return table

    def max_token_bytes(self) -> int | None:
        """The longest piece of the token table (special tokens by name, as
        ``tokenize(special=True)`` parses them): 48 bytes for Gemma 3."""
        if self._max_token_bytes is None:
            self._max_token_bytes = max(len(p) for p in self.token_table().pieces)
        return self._max_token_bytes

    def _build_table(self) -> TokenTable:
        lib, vocab = self._lib, self._vocab
        special_attr = lib.LLAMA_TOKEN_ATTR_CONTROL | lib.LLAMA_TOKEN_ATTR_UNKNOWN
        size = 256
        buf = ctypes.create_string_buffer(size)
        pieces: list[bytes] = []
        special: set[int] = set()
        with self._lock:
            for t in range(self.vocab_size):
                n = lib.llama_token_to_piece(vocab, t, buf, size, 0, True)
                if n < 0:  # longer than any real piece; render it the slow way
                    big = ctypes.create_string_buffer(-n)
                    n = lib.llama_token_to_piece(vocab, t, big, -n, 0, True)
                    piece = big.raw[:n]
                else:
                    piece = buf.raw[:n]
                attr = lib.llama_vocab_get_attr(vocab, t)
                if attr & special_attr or (
                    attr & lib.LLAMA_TOKEN_ATTR_USER_DEFINED
                    and piece.startswith(b"<") and piece.endswith(b">")
                ):
                    special.add(t)
                pieces.append(piece)
        return TokenTable(tuple(pieces), frozenset(special))

    def _piece(self, token_id: int) -> bytes:
        size = 32
        while True:
            buf = ctypes.create_string_buffer(size)
            # special=False: control tokens (BOS, EOS, <end_of_turn>) render as b"".
            with self._lock:
                n = self._lib.llama_token_to_piece(self._vocab, token_id, buf, size, 0, False)
            if n >= 0:
                return buf.raw[:n]
            size = -n

    def render_chat(self, messages: Sequence[Mapping[str, Any]]) -> str:
        return self._chat().render_text(messages)

    def apply_chat(self, messages: Sequence[Mapping[str, Any]],
                   tools: Sequence[Mapping[str, Any]] | None = None,
                   options: RenderOptions | None = None) -> ChatPrompt:
        return self._chat().apply(messages, tools, resolved_options(self.spec, options))

    def _chat(self) -> ChatTemplate:
        if self.template is None:
            raise NoChatTemplateError(f"{self.spec.model_id} is a completion model: it has no "
                                      f"chat template")
        return self.template


def _fim_tokens(lib: Any, vocab: Any) -> FimTokens | None:
    """The vocabulary's fill-in-the-middle tokens (llama.cpp: -1 where the GGUF has none)."""
    ids = {name: int(getattr(lib, f"llama_vocab_fim_{name}")(vocab))
           for name in ("pre", "suf", "mid", "rep", "sep")}
    if min(ids["pre"], ids["suf"], ids["mid"]) < 0:
        return None
    return FimTokens(ids["pre"], ids["suf"], ids["mid"],
                     repo=ids["rep"] if ids["rep"] >= 0 else None,
                     file_sep=ids["sep"] if ids["sep"] >= 0 else None)
