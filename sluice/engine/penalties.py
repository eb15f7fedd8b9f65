"""Repetition penalties and logit bias: sparse edits of a logits row, llama.cpp's meaning.

Over the last ``penalty_last_n`` tokens of the sequence (prompt and generated, as
llama-server feeds the prompt to its sampler; 0 turns the penalties off), for every token
``t`` seen ``c`` times there (llama.cpp's ``llama_sampler_penalties``):

- ``repetition_penalty`` ``r``: a positive logit is divided by ``r``, a negative one
  multiplied by it (the CTRL paper's penalty with the sign fix; ``r`` = 1 is off);
- ``frequency_penalty`` ``f`` and ``presence_penalty`` ``p``: ``logit -= c * f + p``
  (OpenAI's formula; negative values encourage repetition).

``logit_bias`` adds its value to a token's logit first (llama.cpp's chain puts the bias
sampler before the penalties); a bias of -100 or less bans the token outright (its logit
becomes -inf, so no temperature can bring it back), as OpenAI documents -100.

Extreme values are served, never overflowed: a repetition penalty is taken within
[``MIN_REPETITION``, ``MAX_REPETITION``] (past them the order of the edited logits is the
same), and an edited logit stays within float32's finite range.

Each sequence keeps a ``PenaltyWindow`` (counts updated as tokens arrive, O(1) a token);
``apply_penalties`` and ``apply_bias`` edit the rows of a whole batch in one vectorised
update from the per-sequence pieces that ``edits`` returns.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

BAN_BIAS = -100.0
"""A ``logit_bias`` at or below this bans the token."""

MIN_REPETITION, MAX_REPETITION = 1e-30, 1e30
"""Repetition penalties are clamped to this range (a subnormal one would round to 0 in
float32 and divide by zero)."""

FLOAT32_MAX = float(np.finfo(np.float32).max)


@dataclass(frozen=True, slots=True)
class PenaltyEdit:
    """One sequence's penalty edit of its row: the tokens in its window, their counts,
    and its three penalties."""

    token_ids: np.ndarray
    counts: np.ndarray
    repetition: float
    frequency: float
    presence: float


class PenaltyWindow:
    """The last ``last_n`` tokens of a sequence and how often each occurs in them."""

    def __init__(self, last_n: int, tokens: Iterable[int] = ()) -> None:
        self.last_n = max(0, last_n)
        self._window: deque[int] = deque(maxlen=self.last_n or 1)
        self._counts: Counter[int] = Counter()
        for token in tokens:
            self.push(token)

    def push(self, token: int) -> None:
        """The sequence grew by ``token``."""
        if self.last_n == 0:
            return
        if len(self._window) == self.last_n:
            old = self._window[0]
            self._counts[old] -= 1
            if not self._counts[old]:
                del self._counts[old]
        self._window.append(token)
        self._counts[token] += 1

    def counts(self) -> tuple[np.ndarray, np.ndarray]:
        """``(token_ids, counts)`` of the window, as int64 arrays."""
        if not self._counts:
            empty = np.zeros(0, dtype=np.int64)
            return empty, empty
        ids = np.fromiter(self._counts.keys(), dtype=np.int64, count=len(self._counts))
        counts = np.fromiter(self._counts.values(), dtype=np.int64, count=len(self._counts))
        return ids, counts


def penalties_active(repetition: float, frequency: float, presence: float,
                     last_n: int) -> bool:
    """Whether the penalties change anything."""
    return last_n != 0 and (repetition != 1.0 or frequency != 0.0 or presence != 0.0)


def apply_penalties(logits: np.ndarray, rows: Sequence[int],
                    edits: Sequence[PenaltyEdit]) -> None:
    """Apply each sequence's penalty edit to its row of ``logits`` in place, as one
    vectorised update over the batch (``rows[i]`` is the row of ``edits[i]``)."""
    if not edits:
        return
    sizes = [e.token_ids.size for e in edits]
    if not sum(sizes):
        return
    row_of = np.repeat(np.asarray(rows, dtype=np.int64), sizes)
    ids = np.concatenate([e.token_ids for e in edits])
    counts = np.concatenate([e.counts for e in edits]).astype(np.float32)
    reps = np.clip([e.repetition for e in edits], MIN_REPETITION, MAX_REPETITION)
    rep = np.repeat(reps.astype(np.float32), sizes)
    freq = np.repeat(np.asarray([e.frequency for e in edits], dtype=np.float32), sizes)
    pres = np.repeat(np.asarray([e.presence for e in edits], dtype=np.float32), sizes)
    values = logits[row_of, ids]
    with np.errstate(over="ignore"):  # clipped just below
        values = np.where(values <= 0, values * rep, values / rep)
        values = values - counts * freq - (counts > 0) * pres
    # -inf (a banned token) stays -inf; an overflow becomes the largest finite value
    logits[row_of, ids] = np.where(np.isneginf(values), values,
                                   np.clip(values, -FLOAT32_MAX, FLOAT32_MAX))


@dataclass(frozen=True, slots=True)
class BiasTable:
    """A request's ``logit_bias`` as arrays: additive biases and banned tokens."""

    add_ids: np.ndarray
    add_values: np.ndarray
    banned: np.ndarray

    @classmethod
    def build(cls, pairs: Sequence[tuple[int, float]], vocab_size: int) -> BiasTable:
        """From ``(token id, bias)`` pairs (a later pair for a token wins). ``ValueError``
        names a token outside the vocabulary or a bias that is not a finite number."""
        merged: dict[int, float] = {}
        for token, bias in pairs:
            if not 0 <= int(token) < vocab_size:
                raise ValueError(f"logit_bias token {token} is outside the vocabulary "
                                 f"[0, {vocab_size})")
            if not np.isfinite(bias):
                raise ValueError(f"logit_bias for token {token} must be a finite number")
            merged[int(token)] = float(bias)
        add = {t: b for t, b in merged.items() if b > BAN_BIAS and b != 0.0}
        return cls(
            add_ids=np.fromiter(add.keys(), dtype=np.int64, count=len(add)),
            add_values=np.fromiter(add.values(), dtype=np.float32, count=len(add)),
            banned=np.asarray(sorted(t for t, b in merged.items() if b <= BAN_BIAS),
                              dtype=np.int64),
        )

    @property
    def empty(self) -> bool:
        return not (self.add_ids.size or self.banned.size)


def apply_bias(logits: np.ndarray, rows: Sequence[int], tables: Sequence[BiasTable]) -> None:
    """Apply each sequence's bias table to its row of ``logits`` in place, vectorised
    over the batch (``rows[i]`` is the row of ``tables[i]``)."""
    if not tables:
        return
    rows_arr = np.asarray(rows, dtype=np.int64)
    add_sizes = [t.add_ids.size for t in tables]
    if sum(add_sizes):
        row_of = np.repeat(rows_arr, add_sizes)
        ids = np.concatenate([t.add_ids for t in tables])
        logits[row_of, ids] += np.concatenate([t.add_values for t in tables])
    ban_sizes = [t.banned.size for t in tables]
    if sum(ban_sizes):
        logits[np.repeat(rows_arr, ban_sizes), np.concatenate([t.banned for t in tables])] = (
            -np.inf
        )
