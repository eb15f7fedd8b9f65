"""Choosing each sequence's next token: per-sequence state, batch-vectorised row work.

A ``TokenChooser`` holds one sequence's sampling state: its parameters, its random stream,
its penalty window, its logit-bias table and its grammar state. One step of the engine
chooses for every sequence that has a logits row:

1. ``BatchRows.build`` (vectorised over the batch): the log-sum-exp of every raw row a
   sequence wants log-probabilities from; one copy of the rows that will be edited (the
   raw rows stay as the model gave them: log-probabilities come from them, and the choices
   of a fork share one); logit bias, then penalties, on those copies in one update each.
2. ``TokenChooser.pick`` (per sequence; the engine's crash barrier wraps it): grammar mask,
   then ``sample_token``, then budget steering of a constrained sequence, then the
   log-probabilities of the token taken (or, for ``post_sampling_probs``, its
   probability in the distribution it was drawn from: ``post_chain_probs`` on the same
   row, after the draw, so the draw and the random stream are the same either way).
3. ``TokenChooser.accept`` (per sequence, barrier-wrapped): the grammar and the penalty
   window take the token.

A plain sequence (no penalties, bias, probabilities or constraint) goes straight to
``sample_token`` on its raw row: the plain path costs what it cost before.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from sluice.engine.constraints import GrammarState
from sluice.engine.logprobs import MAX_TOP_LOGPROBS, row_logsumexp, top_logprobs
from sluice.engine.penalties import (
    BiasTable,
    PenaltyEdit,
    PenaltyWindow,
    apply_bias,
    apply_penalties,
    penalties_active,
)
from sluice.engine.request import SamplingParams, TokenLogprob, TokenProb
from sluice.engine.sampling import new_rng, post_chain_probs, sample_token

WHOLE_CONTEXT = 1 << 30
"""A penalty window longer than any sequence."""


@dataclass(frozen=True, slots=True)
class Pick:
    """The token a sequence takes, with its log-probabilities (or post-chain
    probabilities) when asked for."""

    token: int
    logprob: float | None = None
    top_logprobs: tuple[TokenLogprob, ...] = ()
    prob: float | None = None
    top_probs: tuple[TokenProb, ...] = ()


class TokenChooser:
    """One sequence's sampling state (see the module docstring for the order of work)."""

    def __init__(self, params: SamplingParams, seed: int, choice: int,
                 context_tokens: Sequence[int], vocab_size: int,
                 grammar: GrammarState | None) -> None:
        """``context_tokens``: the sequence so far (the prompt), for the penalty window.
        ``ValueError`` names a parameter the engine cannot serve (a bias for a token
        outside the vocabulary, a repetition penalty that is not positive)."""
        self.params = params
        self.rng = new_rng(seed, choice)
        self.grammar = grammar
        rep = params.repetition_penalty
        if not (math.isfinite(rep) and rep > 0):
            raise ValueError(f"repetition_penalty must be a positive number, got {rep}")
        for name in ("frequency_penalty", "presence_penalty", "min_p"):
            if not math.isfinite(getattr(params, name)):
                raise ValueError(f"{name} must be a finite number")
        self._penalize = penalties_active(rep, params.frequency_penalty,
                                          params.presence_penalty, params.penalty_last_n)
        # penalty_last_n -1 is llama.cpp's "the whole context" (the surface may resolve it)
        last_n = params.penalty_last_n if params.penalty_last_n >= 0 else WHOLE_CONTEXT
        self.window = (PenaltyWindow(last_n, context_tokens[-last_n:])
                       if self._penalize else None)
        bias = BiasTable.build(params.logit_bias, vocab_size) if params.logit_bias else None
        self.bias = None if bias is None or bias.empty else bias
        self.top_k_logprobs = max(0, min(params.top_logprobs, MAX_TOP_LOGPROBS))
        self.wants_post_probs = params.logprobs and params.post_sampling_probs
        """Reports the sampled distribution (``post_chain_probs``), not log-probabilities."""
        self.wants_logprobs = ((params.logprobs or self.top_k_logprobs > 0)
                               and not self.wants_post_probs)
        self.edits_row = self._penalize or self.bias is not None or grammar is not None
        """Its row is changed before sampling (so it samples from a copy)."""

    @property
    def plain(self) -> bool:
        """Nothing but ``sample_token`` on the raw row."""
        return not (self.edits_row or self.wants_logprobs or self.wants_post_probs)

    def fork(self, choice: int, seed: int, context_tokens: Sequence[int],
             vocab_size: int) -> TokenChooser:
        """The chooser of another choice of the same prompt: same parameters, its own
        random stream and a copy of the grammar state."""
        grammar = None if self.grammar is None else self.grammar.fork()
        return TokenChooser(self.params, seed, choice, context_tokens, vocab_size, grammar)

    def penalty_edit(self) -> PenaltyEdit | None:
        if self.window is None:
            return None
        ids, counts = self.window.counts()
        p = self.params
        return PenaltyEdit(ids, counts, p.repetition_penalty, p.frequency_penalty,
                           p.presence_penalty)

    def pick(self, row: np.ndarray, raw: np.ndarray, lse: float, tokens_left: int) -> Pick:
        """Choose from ``row`` (the raw row, or this sequence's edited copy of it, which
        the grammar mask may change further); log-probabilities from ``raw``."""
        subset = None if self.grammar is None else self.grammar.mask_row(row)
        if subset is not None:  # few tokens allowed: the same draw among them only
            token = int(subset[sample_token(row[subset], self.params, self.rng)])
        else:
            token = sample_token(row, self.params, self.rng)
        if self.grammar is not None:
            token = self.grammar.steer(token, tokens_left)
        if self.wants_post_probs:
            return self._post_chain_pick(row, subset, token)
        if not self.wants_logprobs:
            return Pick(token)
        top = top_logprobs(raw, lse, self.top_k_logprobs) if self.top_k_logprobs else ()
        return Pick(token, float(raw[token]) - lse, top)

    def _post_chain_pick(self, row: np.ndarray, subset: np.ndarray | None,
                         token: int) -> Pick:
        """``token`` with its probability in the distribution it was drawn from (0.0
        where budget steering forced a token the chain had dropped) and the chain's
        ``top_logprobs`` most likely candidates."""
        k = self.top_k_logprobs
        if subset is None:
            prob, top = post_chain_probs(row, self.params, token, k)
            return Pick(token, prob=prob, top_probs=top)
        local = np.flatnonzero(subset == token)
        prob, top = post_chain_probs(row[subset], self.params,
                                     int(local[0]) if local.size else -1, k)
        return Pick(token, prob=prob,
                    top_probs=tuple(TokenProb(int(subset[t.token_id]), t.prob) for t in top))

    def accept(self, token: int) -> None:
        """The sequence took ``token``."""
        if self.grammar is not None:
            self.grammar.advance(token)
        if self.window is not None:
            self.window.push(token)


@dataclass
class BatchRows:
    """One step's rows, prepared for every job ``(chooser, raw row index)``: ``work[j]``
    is job ``j``'s edited copy (or None: it samples from the raw row) and ``lse[r]`` the
    log-sum-exp of raw row ``r`` (NaN where no job wanted it)."""

    work: list[np.ndarray | None]
    lse: np.ndarray

    @classmethod
    def build(cls, logits: np.ndarray, jobs: Sequence[tuple[TokenChooser, int]]) -> BatchRows:
        lse = np.full(logits.shape[0], np.nan)
        want = sorted({r for c, r in jobs if c.wants_logprobs})
        if want:
            lse[want] = row_logsumexp(logits if len(want) == logits.shape[0] else logits[want])
        edited = [j for j, (c, _) in enumerate(jobs) if c.edits_row]
        work: list[np.ndarray | None] = [None] * len(jobs)
        if edited:
            copies = logits[[jobs[j][1] for j in edited]]  # one gather: the copies
            biased = [(k, jobs[j][0].bias) for k, j in enumerate(edited)
                      if jobs[j][0].bias is not None]
            apply_bias(copies, [k for k, _ in biased], [b for _, b in biased if b is not None])
            edits = [(k, jobs[j][0].penalty_edit()) for k, j in enumerate(edited)]
            present = [(k, e) for k, e in edits if e is not None]
            apply_penalties(copies, [k for k, _ in present], [e for _, e in present])
            for k, j in enumerate(edited):
                work[j] = copies[k]
        return cls(work, lse)
