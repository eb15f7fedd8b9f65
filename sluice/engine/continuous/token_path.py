"""The token path: a request's choice 0 is built when it starts (chooser, grammar,
drafts); after each pass the prefills that ended fork into their held slots, every
sequence with a logits row chooses and accepts its token (or its verified drafts), and
a token streams out or ends its choice (stop, length, deadline). A request that asks
hears how far its prompt is computed when it starts and after each pass that feeds it
(``PromptProgress``)."""

from __future__ import annotations

from functools import partial

import numpy as np

from sluice.backends.base import ForwardChunk
from sluice.engine.chooser import BatchRows, Pick, TokenChooser
from sluice.engine.constraints import start_grammar
from sluice.engine.continuous.retirement import Retirement
from sluice.engine.continuous.state import (
    _Batch,
    _budget,
    _Group,
    _Sequence,
)
from sluice.engine.logprobs import prompt_token_logprobs
from sluice.engine.request import (
    PromptProgress,
    RequestStatus,
    SamplingParams,
    TokenEvent,
    TokenLogprob,
    expired_what,
)
from sluice.engine.sampling import sample_token
from sluice.engine.speculation import (
    SequenceDrafts,
    drafts_for,
    greedy_verify,
)
from sluice.engine.textstream import TextStream
from sluice.engine.thinking import ThinkingBudget
from sluice.policy.step.step_data import Admission


class TokenPath(Retirement):
    """From logits to streamed tokens."""

    def _first_sequence(self, group: _Group, adm: Admission) -> _Sequence:
        """Choice 0 of a just-admitted request (its grammar compiled, its parameters
        checked: a fault here is the request's own)."""
        req = group.req
        grammar = None
        if req.params.constraint is not None:
            grammar = start_grammar(req.params.constraint, self.model)
        chooser = TokenChooser(req.params, group.seed, 0, req.prompt_tokens,
                               self.model.vocab_size, grammar)
        tokens, thinking = list(req.prompt_tokens), _budget(req.params)
        return _Sequence(group, 0, adm.slot, tokens, len(tokens), chooser,
                         TextStream(req.params.stop), thinking=thinking,
                         drafts=self._drafts(req.params, chooser, thinking, tokens))

    def _report_progress(self, seq: _Sequence, now: float) -> None:
        """Tell a request that asked how far its prompt is computed (``PromptProgress``):
        choice 0 feeds the prompt for every choice."""
        req = seq.req
        if req.report_progress and seq.choice == 0 and not req.is_terminal:
            req.emit_progress(PromptProgress(total=seq.n_prompt, cache=req.cached_prompt_tokens,
                                             processed=min(seq.n_fed, seq.n_prompt),
                                             time_s=now))

    def _drafts(self, params: SamplingParams, chooser: TokenChooser,
                thinking: ThinkingBudget | None, tokens: list[int]) -> SequenceDrafts | None:
        """Drafting state over ``tokens`` for a sequence that may draft, else None."""
        if not (self.drafting and drafts_for(params, chooser, thinking)):
            return None
        return SequenceDrafts.over(tokens)

    def _update(self, batch: _Batch, logits: np.ndarray) -> None:
        now = self._clock()
        self.steps += 1
        jobs: list[tuple[_Sequence, int]] = []  # (sequence, its logits row)
        verifies: list[tuple[_Sequence, tuple[int, ...], int, int]] = []  # rows lo..hi
        row = 0
        for chunk, seq, drafted in zip(batch.chunks, batch.owners, batch.drafted, strict=True):
            first_row, row = row, row + chunk.n_rows
            fed_prompt = seq.prefilling
            seq.n_fed += len(chunk.tokens)
            if fed_prompt:
                self._report_progress(seq, now)
            if drafted:
                if not seq.req.is_terminal:
                    verifies.append((seq, drafted, first_row, row))
                continue
            if chunk.all_logits:
                self._barrier(seq.group, partial(self._prompt_logprobs, seq, chunk,
                                                 logits[first_row:row]))
            if not chunk.want_logits or seq.req.is_terminal:
                continue
            if seq.group.fork_slots and not seq.prefilling:
                forked = self._barrier(seq.group, partial(self._fork, seq))
                jobs.extend((s, row - 1) for s in forked or ())
            elif self.running.get(seq.slot) is seq:
                jobs.append((seq, row - 1))
        if jobs:
            self._choose_all(jobs, logits, now)
        for seq, drafted, lo, hi in verifies:
            if self.running.get(seq.slot) is seq:
                accepted = self._barrier(seq.group, partial(self._take_verified, seq, drafted,
                                                            logits[lo:hi], now))
                batch.accepted_tokens += accepted or 0
        if batch.draft_tokens:
            self.speculation = self.speculation.after(batch.draft_tokens,
                                                      batch.accepted_tokens)

    def _take_verified(self, seq: _Sequence, drafted: tuple[int, ...], rows: np.ndarray,
                       now: float) -> int:
        """A drafted decode's outcome (``greedy_verify`` over its rows): the KV of the
        rejected drafts is removed before any token is streamed, then each token taken is
        accepted as a decode's would be (the sequence may end at any of them). Returns the
        drafts accepted."""
        taken = greedy_verify(rows, drafted, seq.req.params, seq.chooser)
        accepted = len(taken) - 1
        if accepted < len(drafted):
            seq.n_fed -= len(drafted) - accepted
            self.model.trim_sequence(seq.slot, seq.n_fed)
        if seq.drafts is not None:
            seq.drafts.rate.observe(len(drafted), accepted)
        for token in taken:
            self._accept(seq, Pick(token), now)
            if self.running.get(seq.slot) is not seq:
                break  # it ended (stop, length, deadline)
        return accepted

    def _choose_all(self, jobs: list[tuple[_Sequence, int]], logits: np.ndarray,
                    now: float) -> None:
        """Choose and accept one token for each job (sequence, its logits row)."""
        plain = all(seq.chooser.plain for seq, _ in jobs)
        rows = None
        if not plain:
            try:  # one vectorised pass for the whole step's rows
                rows = BatchRows.build(logits, [(s.chooser, r) for s, r in jobs])
            except Exception:  # someone's parameters broke it: each builds its own, alone
                rows = None
        for j, (seq, r) in enumerate(jobs):
            if self.running.get(seq.slot) is not seq:
                continue  # its request ended earlier in this update
            self._barrier(seq.group, partial(self._choose_and_accept, seq, logits, r,
                                             rows, j, now))

    def _prompt_logprobs(self, seq: _Sequence, chunk: ForwardChunk, rows: np.ndarray) -> None:
        """Log-probabilities of the prompt tokens this all-logits chunk predicts."""
        record = seq.group.prompt_logprobs
        if record is None:
            return
        start = chunk.start_pos
        targets = seq.tokens[start + 1 : min(start + len(chunk.tokens), seq.n_prompt - 1) + 1]
        values = prompt_token_logprobs(rows, targets)
        record.extend(TokenLogprob(t, v) for t, v in zip(targets, values, strict=True))

    def _fork(self, parent: _Sequence) -> list[_Sequence]:
        """Choice 0's prefill just ended: copy its prompt KV into the held slots and start
        choices 1..n-1 there. Returns every choice, parent first."""
        group = parent.group
        out = [parent]
        for choice, slot in enumerate(list(group.fork_slots), start=1):
            self.model.copy_sequence(parent.slot, slot, parent.n_prompt)
            self.slots.fork(slot)
            group.fork_slots.remove(slot)
            tokens, params = list(parent.tokens), group.req.params
            chooser = parent.chooser.fork(choice, group.seed, tokens, self.model.vocab_size)
            thinking = _budget(params)
            child = _Sequence(
                group, choice, slot, tokens, parent.n_prompt, chooser,
                TextStream(params.stop), n_fed=parent.n_prompt, thinking=thinking,
                drafts=self._drafts(params, chooser, thinking, tokens),
            )
            self.running[slot] = child
            group.live.append(child)
            self.forked_prompt_tokens += parent.n_prompt
            out.append(child)
        return out

    def _choose_and_accept(self, seq: _Sequence, logits: np.ndarray, r: int,
                           rows: BatchRows | None, j: int, now: float) -> None:
        """One sequence's token from logits row ``r``: choose it, then stream it (or
        retire). ``rows``: the step's prepared rows (``j`` is this sequence's job), or None
        when they could not be prepared together (this sequence prepares its own)."""
        chooser = seq.chooser
        raw = logits[r]
        work: np.ndarray | None = None
        lse = np.nan
        if not chooser.plain:
            if rows is None:
                rows, j = BatchRows.build(logits, [(chooser, r)]), 0
            work, lse = rows.work[j], float(rows.lse[r])
        if chooser.plain:
            pick = Pick(sample_token(raw, seq.req.params, chooser.rng))
        else:
            tokens_left = seq.req.params.max_tokens - seq.generated
            pick = chooser.pick(raw if work is None else work, raw, lse, tokens_left)
        self._accept(seq, pick, now)

    def _accept(self, seq: _Sequence, pick: Pick, now: float) -> None:
        params = seq.req.params
        if seq.req.missed_start(now):
            # The pass ended past the deadline (or the first-token deadline, before the
            # first token): its token is not delivered, so a request either completes in
            # time or ends expired, never completes late.
            self._end(seq.group, RequestStatus.EXPIRED, now,
                      error=f"{expired_what(seq.req, now)} passed while running",
                      error_code="deadline")
            return
        forced = seq.thinking.next_forced() if seq.thinking is not None else None
        if forced is not None:  # the thinking budget is spent: its end tag, not a sample
            pick = Pick(forced)
        token = pick.token
        grammar = seq.chooser.grammar
        if token in self.model.eos_token_ids and (grammar is not None or not params.ignore_eos):
            self._finish_choice(seq, "stop", now)
            return
        seq.chooser.accept(token)
        seq.tokens.append(token)
        index = seq.generated
        seq.generated += 1
        delta = seq.text.push(self.model.token_bytes(token))
        if seq.thinking is not None:
            seq.thinking.observe(seq.text.text)
        seq.req.emit_token(TokenEvent(index=index, token_id=token, text=delta, time_s=now,
                                      choice=seq.choice, logprob=pick.logprob,
                                      top_logprobs=pick.top_logprobs, prob=pick.prob,
                                      top_probs=pick.top_probs))
        if seq.text.stopped or (grammar is not None and grammar.done):
            self._finish_choice(seq, "stop", now)
        elif seq.generated >= params.max_tokens:
            self._finish_choice(seq, "length", now)
