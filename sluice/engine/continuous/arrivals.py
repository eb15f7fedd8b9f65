"""Arrival checks: a request that can never be held (its prompt, ``n``, its KV) fails at
once; one whose first token is due (a target or a deadline) and predicted late even at
the widest width the engine would plan is refused with a Retry-After
(``deadline_infeasible``); the rest join the waiting line, in arrival or urgency
order."""

from __future__ import annotations

from sluice.engine.continuous.retirement import Retirement
from sluice.engine.request import (
    Request,
    RequestStatus,
)
from sluice.policy.step.engine_line import (
    EngineLine,
    EngineShape,
    LateStart,
    late_start,
    left_s,
    running_entry,
)
from sluice.policy.step.ttft import LineEntry, TtftPrediction

DEFAULT_NEW_TOKENS_GUESS = 128
"""Tokens a sequence is assumed to hold beyond its prompt when the KV pool's room for
sequences is estimated for a TTFT prediction that names no budget."""


class Arrivals(Retirement):
    """The waiting line and the TTFT prediction."""

    def add(self, req: Request) -> None:
        """Queue a request; one that can never be held (slots or KV) fails at once."""
        if not self.has_work:
            self._last_step_end_s = None  # the time until this step was idle, not work
        need = len(req.prompt_tokens) + req.params.max_tokens
        n = req.params.n
        prompt = req.prompt_tokens
        vocab = self.model.vocab_size
        if not prompt or min(prompt) < 0 or max(prompt) >= vocab:
            # would fail the whole forward pass it joins: its prompt fails it alone
            self._refuse(req, f"the prompt must be 1 or more token ids in [0, {vocab})",
                         "invalid_request_error")
        elif not 1 <= n <= self.model.n_seq_max:
            self._refuse(req, f"n must be between 1 and {self.model.n_seq_max} (the "
                              f"sequences this model runs at once), got {n}",
                         "invalid_request_error")
        elif self.kv.never_fits(need):
            self._refuse(req, f"prompt ({len(req.prompt_tokens)}) + max_tokens "
                              f"({req.params.max_tokens}) exceeds {self.kv.max_seq_tokens} "
                              "tokens per sequence", "context_length_exceeded")
        elif self.kv.blocks_needed(need) * n > self.kv.total_blocks:
            self._refuse(req, f"{n} choices of prompt + max_tokens ({need} tokens) exceed "
                              "the model's KV cache", "context_length_exceeded")
        elif (late := self._late_start(req, self._line_position(req))) is not None:
            now, ttft = self._clock(), late.ttft
            left_s = late.due_s - now
            what = ("deadline" if req.ttft_deadline_s is not None
                    and req.ttft_deadline_s == late.due_s else "target")
            req.finish(RequestStatus.REJECTED, now, error_code="deadline_infeasible",
                       error=f"first-token {what} infeasible: predicted first token in "
                             f"{ttft.ttft_s:.3g} s (a slot frees in {ttft.start_wait_s:.3g} s "
                             f"at {ttft.concurrency} sequences, {ttft.decode_step_s * 1000:.0f}"
                             f" ms a step), {left_s:.3g} s left; retry in "
                             f"{late.retry_after_s:.3g} s",
                       retry_after_s=late.retry_after_s)
            self._on_retire(req)
        else:
            self.waiting.insert(self._line_position(req), req)

    def _line_position(self, req: Request) -> int:
        """Where ``req`` joins the waiting line: at the end, or (``priority_deadline``)
        after every request of a more urgent class or the same class and an earlier or
        equal deadline to start by (arrival order among equals)."""
        if self.config.line_order == "arrival":
            return len(self.waiting)
        key = _urgency(req)
        for i, other in enumerate(self.waiting):
            if key < _urgency(other):
                return i
        return len(self.waiting)

    def _refuse(self, req: Request, error: str, code: str) -> None:
        req.finish(RequestStatus.FAILED, self._clock(), error=error, error_code=code)
        self._on_retire(req)

    def _line(self, position: int | None = None) -> EngineLine:
        """The engine as the width plan and the TTFT prediction see it: the running
        sequences (and held fork slots), the KV positions they hold, and the waiting line
        up to ``position`` (all of it by default)."""
        running = [running_entry(s.n_prompt, s.n_fed, s.req.params.max_tokens, s.generated)
                   for s in self.running.values()]
        running += [LineEntry(0, g.req.params.max_tokens, len(g.fork_slots))
                    for g in self._groups.values() if g.fork_slots]
        ahead = list(self.waiting)[:position]
        waiting = [LineEntry(len(r.prompt_tokens), r.params.max_tokens, max(1, r.params.n))
                   for r in ahead]
        now = self._clock()
        return EngineLine(running, [s.n_fed for s in self.running.values()], waiting,
                          [left_s(r.first_token_due_s, now) for r in ahead])

    def _shape(self) -> EngineShape:
        """The learned step-time model, the TPOT target, slots, KV, margin and cycle ratio."""
        return EngineShape(self.step_cost.current(), self.tpot_target_s,
                           self.model.n_seq_max, self.kv, self.tpot_margin.margin(),
                           self.tpot_margin.mean_ratio())

    def predict_ttft(self, prompt_tokens: int, n: int = 1, position: int | None = None,
                     max_tokens: int = DEFAULT_NEW_TOKENS_GUESS,
                     ttft_left_s: float | None = None) -> TtftPrediction:
        """When a request with this prompt (and token budget), joining the waiting line at
        ``position`` (its end by default) now, would get its first token: the running
        sequences and the line ahead of it against the learned step-time model, at the
        width the engine would plan with it in line (``ttft_left_s``: seconds until its
        own first token is due)."""
        return self._shape().predict_ttft(self._line(position), prompt_tokens, n, max_tokens,
                                          ttft_left_s)

    def _late_start(self, req: Request, position: int) -> LateStart | None:
        """For a request whose first token is due and predicted late even at the widest
        width the engine would plan (``sluice.policy.step.engine_line.late_start``, as the
        simulator's engine asks it): the prediction and a Retry-After; else None."""
        return late_start(self._shape(), lambda: self._line(position),
                          prompt_tokens=len(req.prompt_tokens), n=max(1, req.params.n),
                          max_tokens=req.params.max_tokens, ttft_target_s=req.ttft_target_s,
                          ttft_deadline_s=req.ttft_deadline_s, arrival_s=req.arrival_s,
                          now=self._clock(), line_busy=self.has_work)


def _urgency(req: Request) -> tuple[int, float]:
    """Priority class (0 most urgent), then the time to start by (none: last)."""
    start_by = req.start_by_s
    return req.priority, float("inf") if start_by is None else start_by


