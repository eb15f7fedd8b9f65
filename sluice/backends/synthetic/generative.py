"""The synthetic generative model: hashed next tokens (or a scripted reply) over per-slot
KV bookkeeping that checks the engine's, and saved sequences as JSON files."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from sluice.backends.base import (
    BackendError,
    ForwardChunk,
    GenerativeModel,
    ModelLoadError,
    ModelSpec,
)
from sluice.backends.synthetic.cost import CostModel, digest, sleep
from sluice.backends.synthetic.tokenizer import EOS_ID, SPECIAL_TOKENS, SyntheticTokenizer

SEQUENCE_FILE = "sluice-synthetic-sequence-1"
"""The format tag of a synthetic model's saved sequence (JSON: its tokens)."""


class SyntheticGenerative(SyntheticTokenizer, GenerativeModel):
    """Next token = a hash of (last token, position), or of the last ``markov_order``
    tokens; EOS at ``eos_at_pos`` if set.

    Checks the engine's bookkeeping: a chunk must start exactly where its slot ends.
    Invariant: ``history[slot]`` holds exactly the ``slot_len[slot]`` tokens the slot's KV
    holds (so a trimmed draft is forgotten).
    """

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__(spec)
        self._cost = CostModel(spec)
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
        sleep(
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
        h = int.from_bytes(digest(*key)[:8], "little")
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

    def sequence_state(self, seq_slot: int) -> bytes:
        n = self.slot_len.get(seq_slot, 0)
        if n == 0:
            raise BackendError(f"slot {seq_slot} holds no KV")
        return json.dumps({"format": SEQUENCE_FILE, "model": self.spec.model_id,
                           "tokens": self.history.get(seq_slot, [])[:n]}).encode()

    def set_sequence_state(self, seq_slot: int, state: bytes, n_tokens: int) -> None:
        self.release_sequence(seq_slot)
        try:
            saved = json.loads(state)
            tokens = [int(t) for t in saved["tokens"]]
            ok = saved["model"] == self.spec.model_id
        except (ValueError, KeyError, TypeError):
            ok, tokens = False, []
        if not ok or len(tokens) != n_tokens or n_tokens > self.n_ctx_per_seq:
            raise BackendError(f"this state is not {n_tokens} tokens of this model's KV")
        self.slot_len[seq_slot] = n_tokens
        self.history[seq_slot] = tokens
        self._prompt_end[seq_slot] = n_tokens

    def close(self) -> None:
        self.closed = True
