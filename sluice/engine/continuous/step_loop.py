"""The step loop: plan = the pure step planner decides (``plan_step`` on the engine's
``view``, within the ``budget``); apply = start what it admitted and pair every chunk
with its sequence's tokens; logits = one ``forward`` call; update = the token path;
then the step's measured time feeds the step-time model and the TPOT margin."""

from __future__ import annotations

import numpy as np

from sluice.backends.base import ForwardChunk
from sluice.engine.continuous.arrivals import Arrivals
from sluice.engine.continuous.slot_moves import SlotMoves
from sluice.engine.continuous.state import (
    _Batch,
    _waiting_view,
)
from sluice.policy.step.engine_line import step_budget
from sluice.policy.step.speculation import DraftBudget
from sluice.policy.step.step_cost import StepSample
from sluice.policy.step.step_data import StepBudget, StepPlan, StepView
from sluice.policy.step.step_planner import plan_step
from sluice.policy.step.tpot_budget import TpotBudget


class StepLoop(SlotMoves, Arrivals):
    """One engine step and what it plans with."""

    def step(self) -> bool:
        """One engine step; False when there was nothing to run."""
        now = self._clock()
        self._retire_stopped(now)
        self._compact()
        restore_s = self._restore_prefixes()
        budget = self.budget()
        drafts = self._draft_budget(budget)
        plan = plan_step(self.config, self.view(now, drafting=drafts is not None), budget,
                         drafts)
        batch = self._apply(plan, now)  # admit, reserve KV, copy prefixes
        if not batch.chunks:
            self._last_step_end_s = None
            return False
        logits = self._forward(batch)  # execute
        if logits is not None:
            self._update(batch, logits)  # fork, choose, stream, retire
            end = self._clock()
            cycle_s = end - (now if self._last_step_end_s is None else self._last_step_end_s)
            self._last_step_end_s = end
            self._learn(batch, cycle_s, restore_s)
        return True

    def budget(self) -> StepBudget:
        """The step budget for the next plan: the TPOT target against the step-time model
        learned so far, at the width ``sluice.policy.step.width`` plans for the waiting line,
        or the token budget alone when the model sets no target."""
        budget, width = step_budget(self._shape(), self.config.mode == "continuous",
                                    self._line, bool(self.waiting))
        if width is not None:
            self.width = width
        return budget

    def _draft_budget(self, budget: StepBudget) -> DraftBudget | None:
        """What drafting may spend in the next step: priced on the learned step-time model,
        within the TPOT budget's step limit (None: the engine does not draft)."""
        if not self.drafting or not self.draft_gate.allow(self._decoding()):
            return None
        limit_s = budget.step_limit_s if isinstance(budget, TpotBudget) else None
        return DraftBudget(self.step_cost.current(), limit_s)

    def _decoding(self) -> int:
        """Running sequences whose prompt is fed: those the next step decodes."""
        return sum(1 for seq in self.running.values() if not seq.prefilling)

    def _learn(self, batch: _Batch, seconds: float, restore_s: float = 0.0) -> None:
        """Feed one step's measured time to the step-time model and the tally: from the
        end of the previous step (the worker's work between steps included) to the last
        token of this one streamed, which is what a running sequence waits between
        tokens. A step with decodes also feeds the margin: its cycle against what the model
        predicted (before this observation refits it) for the same step. A drafted token
        counts as a decode in the step-time model (a token with a logits row, as
        ``sluice.policy.step.speculation`` prices it); a step of decodes alone also feeds
        the draft gate (drafting's measured tokens/s against plain steps'). The seconds
        ``restore_s`` spent putting prompts back from the host-memory prompt cache before the
        plan are the running sequences' wait too (the margin counts them), but not the cost
        of the step's contents: the step-time model, the gate and the tally leave them
        out."""
        decodes = batch.decode_tokens + batch.draft_tokens
        if batch.decode_tokens:
            predicted_s = self.step_cost.current().predict_s(
                decodes, batch.prefill_tokens, batch.context_tokens)
            self.tpot_margin.observe(predicted_s, seconds)
        step_s = max(seconds - restore_s, 1e-6)
        self.step_cost.observe(StepSample(decodes, batch.prefill_tokens, step_s,
                                          batch.context_tokens))
        if self.drafting and batch.decode_tokens and not batch.prefill_tokens:
            self.draft_gate.observe(batch.decode_tokens, batch.draft_tokens > 0,
                                    batch.decode_tokens + batch.accepted_tokens, step_s)
        self.step_times.observe(batch.decode_tokens, batch.prefill_tokens, step_s,
                                batch.context_tokens, batch.draft_tokens,
                                batch.accepted_tokens)

    def view(self, now: float, drafting: bool = True) -> StepView:
        """The engine as the step planner sees it (ended requests already swept out); with
        ``drafting`` false (the step may not draft) no sequence looks up a proposal."""
        draft_max = self.model.spec.draft_max_tokens if drafting else 0
        return StepView(
            running=tuple(seq.view(draft_max) for seq in self.running.values()),
            waiting=tuple(_waiting_view(req) for req in self.waiting),
            free_slots=self.slots.free_slots,
            kv=self.kv.snapshot(),
            now=now,
            retained=self.slots.retained(),
        )

    def _apply(self, plan: StepPlan, now: float) -> _Batch:
        """Carry out a plan in its order: start the admitted requests, then pair every
        chunk with its sequence's tokens."""
        not_started = self._start(plan.admissions, now)
        batch = _Batch()
        for chunk in plan.in_slot_order():
            seq = self.running.get(chunk.slot)
            if chunk.slot in not_started or seq is None:
                continue  # not started, or its request failed while starting
            proposal = seq.drafts.proposal if seq.drafts is not None else ()
            drafted = proposal[: chunk.draft_tokens]
            if drafted:  # its decode token, then the drafts, with every row's logits
                tokens = (seq.tokens[chunk.start_pos], *drafted)
            else:
                tokens = tuple(seq.tokens[chunk.start_pos : chunk.start_pos + chunk.n_tokens])
            batch.chunks.append(
                ForwardChunk(chunk.slot, tokens, chunk.start_pos, chunk.want_logits,
                             chunk.all_logits or bool(drafted), draft_tokens=len(drafted))
            )
            batch.owners.append(seq)
            batch.drafted.append(drafted)
            if chunk.decode:
                batch.decode_tokens += 1
                batch.draft_tokens += len(drafted)
                batch.context_tokens += chunk.start_pos * len(tokens)
                if proposal and not drafted and seq.drafts is not None:
                    seq.drafts.rate.idle()
            else:
                batch.prefill_tokens += chunk.n_tokens
        self.last_batch_size = len(batch.chunks)
        return batch

    def _forward(self, batch: _Batch) -> np.ndarray | None:
        """One forward pass; a backend fault fails that batch's requests (``None``)."""
        try:
            return self.model.forward(batch.chunks)
        except Exception as exc:  # the worker must outlive any backend fault
            self._fail(batch, exc)
            return None
