"""A deterministic backend with a cost model: no model file, same protocol as the real ones.

Service times come from the spec's ``options`` (all seconds, multiplied by ``speed_scale``):
``load_s``; one-shot ``batch_fixed_s`` + ``per_item_s`` × items; generative ``step_fixed_s``
+ ``decode_per_seq_s`` × decoding sequences + ``prefill_per_token_s`` × prompt tokens in the
pass. Outputs are pure functions of the inputs (a ``rerank`` model's score is
``word_overlap``). Faults: ``fail_load`` (every load raises), ``fail_on_calls`` (the listed
1-based ``run_batch``/``forward`` calls raise) and ``nan_logits_after_token`` (the logits
row after that token id is all NaN: one sequence's distribution breaks, not the pass), for
tests. ``byte_tokens`` makes ids 3..258 the 256 single bytes, so grammars over text (JSON)
can be decoded; ``all_logits`` chunks get a row per position. With ``byte_tokens``,
``reply`` is a text the model writes byte by byte after any prompt, then EOS (a scripted
answer: a model that thinks in tags, for instance). ``markov_order`` (an integer k) makes
the next token a hash of the last k tokens alone (no position): text that repeats itself, so
n-gram drafts are accepted often but not always (speculation tests). Drafted tokens
(``ForwardChunk.draft_tokens``) cost and count as decodes, and get the rows any token at
their position would. ``chat_template`` (a Jinja source) renders chats in place of the
``role: content`` turns, as a GGUF's own template would (a load error if it does not
compile).
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from sluice.backends.base import (
    BackendError,
    FimTokens,
    ForwardChunk,
    GenerativeModel,
    ModelLoadError,
    ModelSpec,
    NoChatTemplateError,
    OneShotModel,
    RerankPair,
    RerankScore,
    TokenTable,
    rerank_pairs,
    resolved_options,
)
from sluice.backends.chat import (
    Capabilities,
    ChatPrompt,
    ChatTemplate,
    RenderOptions,
    jinja_template,
)

SPECIAL_TOKENS = 3
"""Ids 0..2 are reserved: 0 = end of sequence, 1 = begin of sequence, 2 = padding."""
EOS_ID, BOS_ID = 0, 1


def _digest(*parts: object) -> bytes:
    return hashlib.sha256("\x1f".join(map(str, parts)).encode()).digest()


class _CostModel:
    """Reads the cost and fault options of a spec, and counts calls for fault injection."""

    def __init__(self, spec: ModelSpec) -> None:
        opts = spec.options
        self.scale = float(opts.get("speed_scale", 1.0))
        self.fail_on_calls = frozenset(int(n) for n in opts.get("fail_on_calls", ()))
        self._calls = 0
        self._lock = threading.Lock()

    def option_s(self, spec: ModelSpec, key: str, default: float) -> float:
        return float(spec.options.get(key, default)) * self.scale

    def next_call(self, what: str) -> None:
        """Count one call; raise if it is one of the injected failures."""
        with self._lock:
            self._calls += 1
            n = self._calls
        if n in self.fail_on_calls:
            raise BackendError(f"injected fault in {what} call {n}")


def _sleep(seconds: float) -> None:
    if seconds > 0:
        time.sleep(seconds)


_WORD = re.compile(r"\w+")


def word_overlap(pair: RerankPair) -> RerankScore:
    """The synthetic rerank score: the share of the query's distinct lowercase words
    (``\\w+`` runs, so punctuation does not count) that the document holds, in [0, 1];
    tokens: those words."""
    query, document = _WORD.findall(pair.query.lower()), _WORD.findall(pair.document.lower())
    wanted = set(query)
    score = len(wanted & set(document)) / len(wanted) if wanted else 0.0
    return RerankScore(score, len(query), len(document))


class SyntheticOneShot(OneShotModel):
    """Embeddings (unit vectors of ``dim``) or classification scores, from a hash; rerank
    scores by ``word_overlap``."""

    def __init__(self, spec: ModelSpec) -> None:
        self.spec = spec
        self._cost = _CostModel(spec)
        self.dim = int(spec.options.get("dim", 8))
        labels = spec.options.get("labels", ("negative", "positive"))
        self.labels: tuple[str, ...] = tuple(labels)
        self.batch_sizes: list[int] = []
        self.closed = False

    def run_batch(self, inputs: Sequence[Any]) -> list[Any]:
        self._cost.next_call("run_batch")
        self.batch_sizes.append(len(inputs))
        fixed = self._cost.option_s(self.spec, "batch_fixed_s", 0.002)
        per_item = self._cost.option_s(self.spec, "per_item_s", 0.001)
        _sleep(fixed + per_item * len(inputs))
        if self.spec.task == "rerank":
            return [word_overlap(p) for p in rerank_pairs(inputs)]
        return [self._one(x) for x in inputs]

    def _one(self, text: Any) -> Any:
        raw = np.frombuffer(_digest(self.spec.model_id, text) * 4, dtype=np.uint8)[: self.dim]
        vec = raw.astype(np.float32) - 127.5
        vec /= float(np.linalg.norm(vec)) or 1.0
        if self.spec.task == "classification":
            scores = np.exp(vec[: len(self.labels)])
            probs = scores / scores.sum()
            return {lab: float(p) for lab, p in zip(self.labels, probs, strict=True)}
        return vec.tolist()

    def close(self) -> None:
        self.closed = True


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
        h = int.from_bytes(_digest(word)[:4], "little")
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


class SyntheticGenerative(SyntheticTokenizer, GenerativeModel):
    """Next token = a hash of (last token, position), or of the last ``markov_order``
    tokens; EOS at ``eos_at_pos`` if set.

    Checks the engine's bookkeeping: a chunk must start exactly where its slot ends.
    Invariant: ``history[slot]`` holds exactly the ``slot_len[slot]`` tokens the slot's KV
    holds (so a trimmed draft is forgotten).
    """

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__(spec)
        self._cost = _CostModel(spec)
        eos_at = spec.options.get("eos_at_pos")
        self.eos_at_pos: int | None = None if eos_at is None else int(eos_at)
        reply = spec.options.get("reply")
        self.reply: bytes | None = None if reply is None else str(reply).encode()
        self._prompt_end: dict[int, int] = {}
        """Per slot, where its prompt ended (the reply's first byte follows it)."""
        nan_after = spec.options.get("nan_logits_after_token")
        self.nan_after_token: int | None = None if nan_after is None else int(nan_after)
        order = spec.options.get("markov_order")
        self.markov_order: int | None = None if order is None else int(order)
        if self.markov_order is not None and self.markov_order < 1:
            raise ModelLoadError(f"markov_order must be >= 1, got {self.markov_order}")
        self.slot_len: dict[int, int] = {}
        self.history: dict[int, list[int]] = {}
        """The tokens each slot's KV holds, in position order."""
        self.forward_calls = 0
        self.closed = False

    def forward(self, chunks: Sequence[ForwardChunk]) -> np.ndarray:
        self._cost.next_call("forward")
        self.forward_calls += 1
        n_decode = sum(1 + c.draft_tokens if c.draft_tokens else len(c.tokens) == 1
                       for c in chunks)
        n_prefill = sum(len(c.tokens) for c in chunks if len(c.tokens) > 1 and not c.draft_tokens)
        _sleep(
            self._cost.option_s(self.spec, "step_fixed_s", 0.002)
            + self._cost.option_s(self.spec, "decode_per_seq_s", 0.0005) * n_decode
            + self._cost.option_s(self.spec, "prefill_per_token_s", 0.0001) * n_prefill
        )
        rows: list[np.ndarray] = []
        for c in chunks:
            have = self.slot_len.get(c.seq_slot, 0)
            if c.start_pos != have or not 0 <= c.seq_slot < self.n_seq_max:
                raise BackendError(
                    f"slot {c.seq_slot} holds {have} tokens, chunk starts at {c.start_pos}"
                )
            end = c.start_pos + len(c.tokens)
            if end > self.n_ctx_per_seq:
                raise BackendError(f"slot {c.seq_slot} overflows its {self.n_ctx_per_seq} tokens")
            self.slot_len[c.seq_slot] = end
            history = self.history.setdefault(c.seq_slot, [])
            history.extend(c.tokens)
            if (len(c.tokens) > 1 and not c.draft_tokens) or c.start_pos == 0:
                self._prompt_end[c.seq_slot] = end
            if c.draft_tokens:  # a decode and its drafts: each row as a decode's would be
                rows.extend(self._next(c.seq_slot, c.start_pos + i + 1)
                            for i in range(len(c.tokens)))
            elif c.all_logits:
                rows.extend(self._row(c.seq_slot, c.start_pos + i + 1)
                            for i in range(len(c.tokens)))
            elif c.want_logits:
                rows.append(self._next(c.seq_slot, end))
        return np.stack(rows) if rows else np.zeros((0, self.vocab_size), dtype=np.float32)

    def _next(self, slot: int, next_pos: int) -> np.ndarray:
        """The row after position ``next_pos - 1`` of a decoding slot."""
        if self.reply is not None:
            return self._scripted(slot, next_pos)
        return self._row(slot, next_pos)

    def _row(self, slot: int, next_pos: int) -> np.ndarray:
        """The row after the slot's first ``next_pos`` tokens."""
        history = self.history[slot]
        recent = history[max(0, next_pos - (self.markov_order or 0)):next_pos]
        return self._logits(history[next_pos - 1], next_pos, recent)

    def _logits(self, last_token: int, next_pos: int,
                recent: Sequence[int] = ()) -> np.ndarray:
        """The row after ``last_token`` at ``next_pos - 1`` (``recent``: the last
        ``markov_order`` tokens, with ``markov_order``)."""
        if last_token == self.nan_after_token:
            return np.full(self.vocab_size, np.nan, dtype=np.float32)
        logits = np.zeros(self.vocab_size, dtype=np.float32)
        if self.eos_at_pos is not None and next_pos >= self.eos_at_pos:
            logits[EOS_ID] = 10.0
            return logits
        if self.markov_order is None:
            key: tuple[object, ...] = (self.spec.model_id, last_token, next_pos)
        else:
            key = (self.spec.model_id, *recent)
        h = int.from_bytes(_digest(*key)[:8], "little")
        span = self.vocab_size - SPECIAL_TOKENS
        logits[SPECIAL_TOKENS + h % span] = 10.0
        logits[SPECIAL_TOKENS + (h // span) % span] += 5.0
        return logits

    def _scripted(self, slot: int, next_pos: int) -> np.ndarray:
        """The ``reply``'s next byte (EOS past its end)."""
        assert self.reply is not None
        logits = np.zeros(self.vocab_size, dtype=np.float32)
        i = next_pos - self._prompt_end.get(slot, next_pos)
        # far above the rest, so any sampling temperature follows the script
        logits[SPECIAL_TOKENS + self.reply[i] if i < len(self.reply) else EOS_ID] = 100.0
        return logits

    def release_sequence(self, seq_slot: int) -> None:
        self.slot_len.pop(seq_slot, None)
        self.history.pop(seq_slot, None)
        self._prompt_end.pop(seq_slot, None)

    def copy_sequence(self, src_slot: int, dst_slot: int, n_tokens: int) -> None:
        if self.slot_len.get(src_slot, 0) < n_tokens:
            raise BackendError(f"slot {src_slot} holds fewer than {n_tokens} tokens")
        self.slot_len[dst_slot] = n_tokens
        self.history[dst_slot] = self.history.get(src_slot, [])[:n_tokens]
        self._prompt_end[dst_slot] = n_tokens

    def trim_sequence(self, seq_slot: int, n_tokens: int) -> None:
        if not 0 <= n_tokens <= self.slot_len.get(seq_slot, 0):
            raise BackendError(f"slot {seq_slot} holds fewer than {n_tokens} tokens")
        self.slot_len[seq_slot] = n_tokens
        del self.history.get(seq_slot, [])[n_tokens:]

    def save_sequence(self, seq_slot: int, path: Path, tokens: Sequence[int]) -> int:
        if list(tokens) != self.history.get(seq_slot, [])[: len(tokens)] or len(
                tokens) != self.slot_len.get(seq_slot, 0):
            raise BackendError(f"slot {seq_slot} does not hold these {len(tokens)} tokens")
        data = json.dumps({"format": SEQUENCE_FILE, "model": self.spec.model_id,
                           "tokens": list(tokens)}).encode()
        try:
            path.write_bytes(data)
        except OSError as exc:
            raise BackendError(f"could not write {path.name}: {exc.strerror}") from None
        return len(data)

    def load_sequence(self, seq_slot: int, path: Path) -> tuple[list[int], int]:
        self.release_sequence(seq_slot)
        try:
            data = path.read_bytes()
            saved = json.loads(data)
            tokens = [int(t) for t in saved["tokens"]]
            ok = saved["format"] == SEQUENCE_FILE and saved["model"] == self.spec.model_id
        except (OSError, ValueError, KeyError, TypeError):
            ok = False
        if not ok or len(tokens) > self.n_ctx_per_seq:
            raise BackendError(f"{path.name} is not a saved sequence of this model that fits "
                               f"a slot of {self.n_ctx_per_seq} tokens")
        self.slot_len[seq_slot] = len(tokens)
        self.history[seq_slot] = list(tokens)
        self._prompt_end[seq_slot] = len(tokens)
        return tokens, len(data)

    def close(self) -> None:
        self.closed = True


SEQUENCE_FILE = "sluice-synthetic-sequence-1"
"""The format tag of a synthetic model's saved sequence (JSON: its tokens)."""


class SyntheticBackend:
    """Builds synthetic models; counts loads for tests."""

    name = "synthetic"

    def __init__(self) -> None:
        self.loads: list[str] = []

    def load(self, spec: ModelSpec) -> OneShotModel | GenerativeModel:
        if spec.options.get("fail_load"):
            raise ModelLoadError(f"injected load failure for {spec.model_id}")
        scale = float(spec.options.get("speed_scale", 1.0))
        _sleep(float(spec.options.get("load_s", 0.01)) * scale)
        self.loads.append(spec.model_id)
        if spec.kind == "generative":
            return SyntheticGenerative(spec)
        return SyntheticOneShot(spec)

    def load_tokenizer(self, spec: ModelSpec) -> SyntheticTokenizer:
        return SyntheticTokenizer(spec)


__all__ = ["SyntheticBackend", "SyntheticGenerative", "SyntheticOneShot", "SyntheticTokenizer"]
