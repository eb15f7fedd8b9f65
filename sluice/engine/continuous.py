"""Continuous batching for one loaded generative model.

The step loop reads like the design: plan = the pure step planner decides which tokens to
feed (one decode token per running sequence, then prefill chunks, then newly admitted
requests while KV blocks and slots allow; see ``sluice.policy.step_planner``); apply = the
engine starts what it admitted (slots, KV blocks, prefix copy); logits = one ``forward``
call; update = fork, choose, stream, retire. A retiring sequence frees its slot and blocks
at once, so the next waiting request is admitted in the very next plan.

Slots: ``self.slots`` (``sluice.policy.slot_table``, the simulator's too) applies the
plan's admissions and every retirement and move to its free, retained, running and held
slots and the KV allocator, and returns what the model's KV must do (clear, trim, copy).
Retained prefixes (``engine.retain_prefixes``): a choice that completes leaves its KV in
its idle slot with its blocks returned to the allocator. The planner sees those slots as
donors and as slots to hand out when none is free; the engine then trims a slot kept in
place, or clears one handed out or evicted for KV room. Invariant: a slot is exactly one
of free, retained or holding a sequence (or a fork slot of a started request); a retained
slot's model KV is the tokens the table keeps for it.

A request is a ``_Group`` of ``n`` choices, each a ``_Sequence`` in its own slot. Choice 0
prefills; when its prefill ends the group forks (``_fork``): the prompt's KV is copied into
the slots the admission held, and every choice draws its first token from the one logits
row. The request ends (one ``Final``, with ``choices`` when ``n`` > 1) when its last choice
does; a cancel, a deadline or a failure ends every choice at once.

Token choice (``sluice.engine.chooser``): log-sum-exps, bias and penalties vectorised over
the step's rows, then per sequence the grammar mask, sampling and log-probabilities. The
crash barrier: everything one request does alone (starting its choosers and grammar,
prompt log-probabilities, choosing, accepting, detokenizing) runs in ``_barrier``, so an
exception there fails that request alone; a fault in the shared forward pass fails that
pass's requests.

``mode`` selects the baselines we measure against: ``static`` admits only into an empty
engine (waiting up to ``static_max_wait_s`` to fill it) and runs that batch to the end;
``serial`` runs one request at a time.

Owned by one worker thread; nothing here is shared across threads except the requests'
thread-safe state machines.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, Literal

import numpy as np

from sluice.backends.base import BackendError, ForwardChunk, GenerativeModel, ModelLoadError
from sluice.engine.chooser import BatchRows, Pick, TokenChooser
from sluice.engine.constraints import ConstraintError, GrammarFailure, start_grammar
from sluice.engine.logprobs import prompt_token_logprobs
from sluice.engine.request import (
    FINISH_REASON,
    ChoiceFinal,
    Request,
    RequestStatus,
    SamplingParams,
    TokenEvent,
    TokenLogprob,
    expired_what,
)
from sluice.engine.sampling import SamplingError, sample_token
from sluice.engine.speculation import (
    SequenceDrafts,
    SpeculationState,
    drafts_for,
    greedy_verify,
)
from sluice.engine.step_times import StepTimes
from sluice.engine.step_warmup import measure_step_cost
from sluice.engine.textstream import TextStream
from sluice.engine.thinking import ThinkingBudget
from sluice.policy.admission import clamp_retry_after
from sluice.policy.slot_layout import MAX_SLOT_MOVES_PER_STEP
from sluice.policy.slot_table import SlotTable
from sluice.policy.speculation import DraftBudget
from sluice.policy.step_cost import DEFAULT_STEP_COST, OnlineStepCost, StepCost, StepSample
from sluice.policy.step_planner import (
    TOKENS_ONLY,
    Admission,
    BatchingMode,
    EngineConfig,
    PrefixCopy,
    RunningSeq,
    StepBudget,
    StepPlan,
    StepView,
    WaitingSeq,
    plan_step,
    static_wakeup_s,
)
from sluice.policy.tpot_budget import TpotBudget
from sluice.policy.tpot_margin import TpotMargin
from sluice.policy.ttft import LineEntry, TtftPrediction
from sluice.policy.width import WidthPlan, arrival_due_s, engine_width, predict_engine_ttft

STEP_COST_WINDOW = 192
"""Steps the step-time model is fitted on (about 25 s of 130 ms steps): a host that slows
down (other jobs on its cores) is followed within seconds, not minutes."""
DEFAULT_NEW_TOKENS_GUESS = 128
"""Tokens a sequence is assumed to hold beyond its prompt when the KV pool's room for
sequences is estimated for a TTFT prediction that names no budget."""

__all__ = ["BatchingMode", "ContinuousEngine", "EngineConfig", "SlotHolding", "SlotState"]


@dataclass(frozen=True, slots=True)
class SlotState:
    """One sequence slot as llama-server's ``/slots`` shows it: the request using it (with
    its prompt and tokens decoded so far), or idle, holding ``n_prompt_tokens`` of a
    retained prefix (0: empty)."""

    slot: int
    request_id: int | None = None
    """The request running in it (or holding it for a choice not yet forked)."""
    n_prompt_tokens: int = 0
    n_decoded: int = 0
    max_tokens: int = 0


@dataclass(eq=False)
class _Group:
    """One request: its ``n`` choices, the slots held for those not yet forked, and what
    the finished ones produced."""

    req: Request
    n: int
    seed: int
    fork_slots: list[int] = field(default_factory=list)
    """Slots (and KV) held for choices 1..n-1 until choice 0's prefill ends."""
    finished: dict[int, ChoiceFinal] = field(default_factory=dict)
    live: list[_Sequence] = field(default_factory=list)
    prompt_logprobs: list[TokenLogprob | None] | None = None


@dataclass(eq=False)
class _Sequence:
    """One choice bound to a slot: ``tokens`` = prompt + generated so far."""

    group: _Group
    choice: int
    slot: int
    tokens: list[int]
    n_prompt: int
    chooser: TokenChooser
    text: TextStream
    n_fed: int = 0
    generated: int = 0
    thinking: ThinkingBudget | None = None
    drafts: SequenceDrafts | None = None
    """Its n-gram drafting state (None: it never drafts, ``sluice.engine.speculation``)."""

    @property
    def req(self) -> Request:
        return self.group.req

    @property
    def prefilling(self) -> bool:
        return self.n_fed < self.n_prompt

    def view(self, draft_max_tokens: int) -> RunningSeq:
        """The sequence as the planner sees it, with this step's draft proposal: up to
        ``draft_max_tokens``, and one fewer than the tokens it has left (the token after
        the last draft comes with them), so its KV stays within its reservation."""
        draft: tuple[int, ...] = ()
        acceptance = 0.0
        if self.drafts is not None:
            self.drafts.proposal = ()
            room = self.req.params.max_tokens - self.generated - 1
            if room > 0 and not self.prefilling and not self.group.fork_slots:
                draft = self.drafts.propose(min(draft_max_tokens, room))
            acceptance = self.drafts.rate.rate
        return RunningSeq(
            self.slot, self.req.request_id, self.n_prompt, self.n_fed, self.generated,
            self.tokens, prompt_logprobs=self.group.prompt_logprobs is not None,
            tenant=self.req.tenant_id, draft=draft, acceptance=acceptance,
        )


@dataclass(frozen=True)
class SlotHolding:
    """What one slot holds: ``running`` (a sequence; ``tokens`` are those its KV holds),
    ``held`` (kept for a request's later choice), ``retained`` (an ended sequence's prefix)
    or ``free``; ``tenant``: whose prompt the tokens came from."""

    state: Literal["running", "held", "retained", "free"]
    tokens: tuple[int, ...]
    tenant: str


@dataclass
class _Batch:
    """What one forward pass feeds, and which sequence owns each chunk."""

    chunks: list[ForwardChunk] = field(default_factory=list)
    owners: list[_Sequence] = field(default_factory=list)
    drafted: list[tuple[int, ...]] = field(default_factory=list)
    """Per chunk, the drafted tokens it verifies (empty for most)."""
    decode_tokens: int = 0
    prefill_tokens: int = 0
    context_tokens: int = 0
    """KV positions the decodes (and their drafted tokens) attend to (the step-time
    model's context term)."""
    draft_tokens: int = 0
    accepted_tokens: int = 0
    """Drafted tokens the model agreed with (known after the pass)."""


def _waiting_view(req: Request) -> WaitingSeq:
    since = req.times.started_s or req.arrival_s
    p = req.params
    return WaitingSeq(req.request_id, req.prompt_tokens, p.max_tokens, since, n=max(1, p.n),
                      prompt_logprobs=p.prompt_logprobs, tenant=req.tenant_id)


class ContinuousEngine:
    """Admits, steps and retires the generative requests of one model."""

    def __init__(
        self,
        model: GenerativeModel,
        config: EngineConfig,
        clock: Callable[[], float],
        on_retire: Callable[[Request], None],
    ) -> None:
        self.model = model
        self.config = config
        self._clock = clock
        self._on_retire = on_retire
        self.slots = SlotTable.for_context(config, model.n_ctx_total, model.n_seq_max,
                                           unified=model.kv_unified)
        """Which slot holds what (free, retained, running, held), with the KV allocator."""
        self.kv = self.slots.kv
        self.waiting: deque[Request] = deque()
        self.running: dict[int, _Sequence] = {}
        self._groups: dict[int, _Group] = {}
        """Started requests by request id (a group outlives none of its sequences)."""
        self.steps = 0
        self._last_step_end_s: float | None = None
        """When the previous step ended, while the engine has had work since (else None)."""
        self.last_batch_size = 0
        self.reused_prefix_tokens = 0
        """Prompt tokens not recomputed thanks to prefix reuse (a counter)."""
        self.retained_prefix_tokens = 0
        """Of those, the tokens kept in place in a retained slot (a counter)."""
        self.forked_prompt_tokens = 0
        """Prompt tokens not recomputed because ``n`` choices shared one prefill."""
        self.slot_moves = 0
        """KV streams copied to keep running sequences on the lowest slots (a counter)."""
        self.step_cost = OnlineStepCost(_step_cost_prior(model),
                                        window=STEP_COST_WINDOW, refit_every=16)
        """The step-time model, learned from the steps this engine runs."""
        self.tpot_margin = TpotMargin()
        """The share of the TPOT target a planned step may take, learned from how the
        steps' measured cycles compare with the model's predictions."""
        self.step_times = StepTimes()
        """Every step's time by its decodes and whether it fed a prompt (cumulative)."""
        self.tpot_target_s = model.spec.tpot_target_s
        self.width: WidthPlan | None = None
        """The last width decision made with requests waiting (``sluice.policy.width``):
        how many sequences the TPOT target let decode at once, and why."""
        self.drafting = model.spec.speculation == "auto" and config.mode == "continuous"
        """Greedy sequences draft tokens (n-gram speculation; the baselines never do)."""
        self.speculation = SpeculationState(model.spec.speculation)
        """The drafted and accepted tokens so far, and the last verifying step's."""

    # -- queue ---------------------------------------------------------------------------

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
            now = self._clock()
            ttft, retry_s = late
            due = arrival_due_s(req.ttft_target_s, req.ttft_deadline_s, now,
                                line_busy=self.has_work)
            left_s = (due or now) - now
            what = ("deadline" if req.ttft_deadline_s is not None
                    and req.ttft_deadline_s == due else "target")
            req.finish(RequestStatus.REJECTED, now, error_code="deadline_infeasible",
                       error=f"first-token {what} infeasible: predicted first token in "
                             f"{ttft.ttft_s:.3g} s (a slot frees in {ttft.start_wait_s:.3g} s "
                             f"at {ttft.concurrency} sequences, {ttft.decode_step_s * 1000:.0f}"
                             f" ms a step), {left_s:.3g} s left; retry in {retry_s:.3g} s",
                       retry_after_s=retry_s)
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

    def _line(self, position: int | None = None) -> tuple[list[LineEntry], list[int],
                                                          list[LineEntry], list[float | None]]:
        """The engine as the width plan and the TTFT prediction see it: the running
        sequences (and held fork slots), the KV positions they hold, the waiting line up
        to ``position`` (all of it by default), and each waiting request's seconds until
        its first token is due (None: no target or deadline)."""
        running = [LineEntry(max(0, s.n_prompt - s.n_fed),
                             max(0, s.req.params.max_tokens - s.generated))
                   for s in self.running.values()]
        running += [LineEntry(0, g.req.params.max_tokens, len(g.fork_slots))
                    for g in self._groups.values() if g.fork_slots]
        ahead = list(self.waiting)[:position]
        waiting = [LineEntry(len(r.prompt_tokens), r.params.max_tokens, max(1, r.params.n))
                   for r in ahead]
        now = self._clock()
        lefts = [None if (due := r.first_token_due_s) is None else due - now for r in ahead]
        return running, [s.n_fed for s in self.running.values()], waiting, lefts

    def predict_ttft(self, prompt_tokens: int, n: int = 1, position: int | None = None,
                     max_tokens: int = DEFAULT_NEW_TOKENS_GUESS,
                     ttft_left_s: float | None = None) -> TtftPrediction:
        """When a request with this prompt (and token budget), joining the waiting line at
        ``position`` (its end by default) now, would get its first token: the running
        sequences and the line ahead of it against the learned step-time model, at the
        width the engine would plan with it in line (``ttft_left_s``: seconds until its
        own first token is due)."""
        running, held, waiting, lefts = self._line(position)
        return predict_engine_ttft(
            self.step_cost.current(), tpot_target_s=self.tpot_target_s,
            n_seq_max=self.model.n_seq_max, kv=self.kv, running=running, held_tokens=held,
            waiting=waiting, prompt_tokens=prompt_tokens, n=n, max_tokens=max_tokens,
            margin=self.tpot_margin.margin(), waiting_ttft_left_s=lefts,
            ttft_left_s=ttft_left_s)

    def _late_start(self, req: Request, position: int) -> tuple[TtftPrediction, float] | None:
        """For a request whose first token is due (a target or a deadline) and predicted
        late even at the widest width the engine would plan: the prediction and a
        Retry-After (when the line ahead will have drained enough); else None."""
        now = self._clock()
        due = arrival_due_s(req.ttft_target_s, req.ttft_deadline_s, now,
                                line_busy=self.has_work)
        if due is None:
            return None
        ttft = self.predict_ttft(len(req.prompt_tokens), max(1, req.params.n), position,
                                 req.params.max_tokens, due - now)
        if now + ttft.ttft_s <= due:
            return None
        allowed_s = due - req.arrival_s
        retry_s = clamp_retry_after(ttft.ttft_s - allowed_s, 1.0, 60.0)
        return ttft, retry_s

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    @property
    def active_count(self) -> int:
        return len(self.running)

    def requests(self) -> list[Request]:
        """Every request the engine holds (waiting and running)."""
        return [*self.waiting, *(g.req for g in self._groups.values())]

    def next_wakeup_s(self, now: float) -> float | None:
        """Static mode: when the oldest waiting request stops waiting for a full batch."""
        head = _waiting_view(self.waiting[0]) if self.waiting else None
        return static_wakeup_s(self.config, len(self.running), head)

    # -- slots ---------------------------------------------------------------------------

    def slot_states(self) -> tuple[SlotState, ...]:
        """Every slot, in order (see ``SlotState``)."""
        out = []
        for slot, entry in enumerate(self.slots.layout()):
            seq = self.running.get(slot)
            if seq is not None:
                out.append(SlotState(slot, seq.req.request_id, seq.n_prompt, seq.generated,
                                     seq.req.params.max_tokens))
            elif entry.kind == "held" and entry.request_id in self._groups:
                req = self._groups[entry.request_id].req
                out.append(SlotState(slot, req.request_id, len(req.prompt_tokens), 0,
                                     req.params.max_tokens))
            else:
                out.append(SlotState(slot, n_prompt_tokens=len(entry.tokens)))
        return tuple(out)

    def erase_slot(self, slot: int) -> int | None:
        """Forget an idle slot's retained prefix; the tokens it held (0 for an empty slot),
        or ``None`` when a request is using the slot (nothing changes)."""
        if self.slots.kind(slot) in ("running", "held"):
            return None
        tokens = self.slots.forget(slot)
        if tokens is None:
            return 0
        self.model.release_sequence(slot)
        return len(tokens)

    def slot_holding(self, slot: int) -> SlotHolding:
        """What ``slot`` holds now: a running sequence (its fed tokens), a fork slot held
        for a started request, a retained prefix, or nothing."""
        entry = self.slots.entry(slot)
        seq = self.running.get(slot)
        if seq is not None:
            return SlotHolding("running", tuple(seq.tokens[: seq.n_fed]), seq.req.tenant_id)
        if entry.kind == "retained":
            return SlotHolding("retained", tuple(entry.tokens), entry.tenant)
        return SlotHolding("held" if entry.kind == "held" else "free", (), "")

    def adopt_slot(self, slot: int, tokens: list[int], tenant: str) -> None:
        """The model's KV in the free ``slot`` now holds ``tokens`` (a restored sequence):
        keep it as the most recently used retained prefix of ``tenant``."""
        self._clear(self.slots.adopt(slot, tokens, tenant))

    # -- the step loop -------------------------------------------------------------------

    def step(self) -> bool:
        """One engine step; False when there was nothing to run."""
        now = self._clock()
        self._retire_stopped(now)
        self._compact()
        budget = self.budget()
        plan = plan_step(self.config, self.view(now), budget, self._draft_budget(budget))
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
            self._learn(batch, cycle_s)
        return True

    def _compact(self) -> None:
        """Move running sequences down into the holes ended ones left (and retained prefixes
        out of their way), so that a decode step spans as few KV streams as it feeds
        (``sluice.policy.slot_layout``). Only with one stream per slot: a unified cache
        has no streams to span. A failed copy ends the moved sequence's request (or
        forgets the retained prefix)."""
        for action in self.slots.moves(MAX_SLOT_MOVES_PER_STEP):
            if action.src in self.running:
                seq = self.running[action.src]
                if not self._barrier(seq.group, partial(self._move_sequence, seq, action.dst)):
                    return  # its request failed and freed its slots: the rest is stale
            else:
                self._move_retained(action.src, action.dst)
            self.slot_moves += 1

    def _move_sequence(self, seq: _Sequence, dst: int) -> bool:
        src = seq.slot
        self.model.copy_sequence(src, dst, seq.n_fed)
        self.slots.move(src, dst)
        self.model.release_sequence(src)
        del self.running[src]
        seq.slot = dst
        self.running[dst] = seq
        return True

    def _move_retained(self, src: int, dst: int) -> None:
        tokens = self.slots.entry(src).tokens
        try:
            self.model.copy_sequence(src, dst, len(tokens))
        except BackendError:
            self.slots.forget(src)
            self._clear((src, dst))
            return
        self.slots.move(src, dst)  # same place in the least-recently-used order
        self.model.release_sequence(src)

    def budget(self) -> StepBudget:
        """The step budget for the next plan: the TPOT target against the step-time model
        learned so far, at the width ``sluice.policy.width`` plans for the waiting line,
        or the token budget alone when the model sets no target."""
        if self.tpot_target_s is None or self.config.mode != "continuous":
            return TOKENS_ONLY
        cost = self.step_cost.current()
        margin = self.tpot_margin.margin()
        if not self.waiting:  # nothing to admit: the width decides nothing this step
            return TpotBudget(cost, self.tpot_target_s, margin)
        running, held, waiting, lefts = self._line()
        self.width = engine_width(cost, tpot_target_s=self.tpot_target_s, margin=margin,
                                  n_seq_max=self.model.n_seq_max, kv=self.kv,
                                  running=running, held_tokens=held, waiting=waiting,
                                  ttft_left_s=lefts)
        return TpotBudget(cost, self.tpot_target_s, margin, limit_s=self.width.step_limit_s)

    def _draft_budget(self, budget: StepBudget) -> DraftBudget | None:
        """What drafting may spend in the next step: priced on the learned step-time model,
        within the TPOT budget's step limit (None: the engine does not draft)."""
        if not self.drafting:
            return None
        limit_s = budget.step_limit_s if isinstance(budget, TpotBudget) else None
        return DraftBudget(self.step_cost.current(), limit_s)

    def _learn(self, batch: _Batch, seconds: float) -> None:
        """Feed one step's measured time to the step-time model and the tally: from the
        end of the previous step (the worker's work between steps included) to the last
        token of this one streamed, which is what a running sequence waits between
        tokens. A step with decodes also feeds the margin: its cycle against what the model
        predicted (before this observation refits it) for the same step. A drafted token
        counts as a decode in the step-time model (a token with a logits row, as
        ``sluice.policy.speculation`` prices it)."""
        decodes = batch.decode_tokens + batch.draft_tokens
        if batch.decode_tokens:
            predicted_s = self.step_cost.current().predict_s(
                decodes, batch.prefill_tokens, batch.context_tokens)
            self.tpot_margin.observe(predicted_s, seconds)
        self.step_cost.observe(StepSample(decodes, batch.prefill_tokens, seconds,
                                          batch.context_tokens))
        self.step_times.observe(batch.decode_tokens, batch.prefill_tokens, seconds,
                                batch.context_tokens, batch.draft_tokens,
                                batch.accepted_tokens)

    def view(self, now: float) -> StepView:
        """The engine as the step planner sees it (ended requests already swept out)."""
        draft_max = self.model.spec.draft_max_tokens
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

    def _start(self, admissions: tuple[Admission, ...], now: float) -> set[int]:
        """Start admitted requests in plan order: take the slots, reserve their KV blocks,
        forget the slot's old KV, copy a shared prefix, build choice 0's chooser. Returns
        the slots left unstarted.

        A request cancelled or ended by another thread since the plan was made stays in the
        line, where the next step's sweep ends it properly; the admissions after it wait
        for the next plan too, since this plan counted on its slot and prefix."""
        for i, adm in enumerate(admissions):
            index = self._waiting_index(adm.request_id)
            req = self.waiting[index]
            donor = adm.prefix.donor_slot if adm.prefix and not adm.in_place else None
            # a donor kept in place earlier in this plan may have failed while starting
            if (donor is not None and donor not in self.running) or not req.mark_running(now):
                return {s for a in admissions[i:] for s in a.slots}
            del self.waiting[index]
            self._clear(self.slots.apply(adm).clear)
            seed = req.params.seed if req.params.seed is not None else req.request_id
            group = _Group(req, n=len(adm.slots), seed=seed, fork_slots=list(adm.fork_slots))
            if req.params.prompt_logprobs:
                group.prompt_logprobs = [None]
            self._groups[req.request_id] = group
            seq = self._barrier(group, partial(self._first_sequence, group, adm))
            if seq is None:  # its parameters or grammar failed it (fork slots are freed)
                self._free_slot(adm.slot)
                continue
            self.running[adm.slot] = seq
            group.live.append(seq)
            if adm.prefix is not None:
                self._barrier(group, partial(self._reuse_prefix, seq, adm.prefix))
        return set()

    def _reuse_prefix(self, seq: _Sequence, prefix: PrefixCopy) -> None:
        """Start ``seq`` after a prefix: kept in its own retained slot (trimmed past the
        prefix), or copied from a donor."""
        if prefix.donor_slot == seq.slot:
            self.model.trim_sequence(seq.slot, prefix.n_tokens)
            self.retained_prefix_tokens += prefix.n_tokens
        else:
            self.model.copy_sequence(prefix.donor_slot, seq.slot, prefix.n_tokens)
        seq.n_fed = prefix.n_tokens
        self.reused_prefix_tokens += prefix.n_tokens
        req = seq.group.req
        req.cached_prompt_tokens = max(req.cached_prompt_tokens, prefix.n_tokens)

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

    def _drafts(self, params: SamplingParams, chooser: TokenChooser,
                thinking: ThinkingBudget | None, tokens: list[int]) -> SequenceDrafts | None:
        """Drafting state over ``tokens`` for a sequence that may draft, else None."""
        if not (self.drafting and drafts_for(params, chooser, thinking)):
            return None
        return SequenceDrafts.over(tokens)

    def _waiting_index(self, request_id: int) -> int:
        # Admissions come from the head of the line, so this is almost always index 0.
        for index, req in enumerate(self.waiting):
            if req.request_id == request_id:
                return index
        raise RuntimeError(f"plan admits request {request_id}, which is not waiting")

    def _forward(self, batch: _Batch) -> np.ndarray | None:
        """One forward pass; a backend fault fails that batch's requests (``None``)."""
        try:
            return self.model.forward(batch.chunks)
        except Exception as exc:  # the worker must outlive any backend fault
            self._fail(batch, exc)
            return None

    # -- after the pass: fork, choose, stream, retire ---------------------------------------

    def _update(self, batch: _Batch, logits: np.ndarray) -> None:
        now = self._clock()
        self.steps += 1
        jobs: list[tuple[_Sequence, int]] = []  # (sequence, its logits row)
        verifies: list[tuple[_Sequence, tuple[int, ...], int, int]] = []  # rows lo..hi
        row = 0
        for chunk, seq, drafted in zip(batch.chunks, batch.owners, batch.drafted, strict=True):
            first_row, row = row, row + chunk.n_rows
            seq.n_fed += len(chunk.tokens)
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
                                      top_logprobs=pick.top_logprobs))
        if seq.text.stopped or (grammar is not None and grammar.done):
            self._finish_choice(seq, "stop", now)
        elif seq.generated >= params.max_tokens:
            self._finish_choice(seq, "length", now)

    # -- retiring ----------------------------------------------------------------------------

    def _barrier(self, group: _Group, work: Callable[[], Any]) -> Any:
        """Run one request's own work; an exception there ends that request alone (FAILED,
        with a message saying what broke) and returns None."""
        try:
            return work()
        except Exception as exc:  # attributable to this request: it alone fails
            message, code = _fault_message(exc)
            self._end(group, RequestStatus.FAILED, self._clock(), error=message,
                      error_code=code)
            return None

    def _clear(self, slots: tuple[int, ...]) -> None:
        """Clear the model's KV in ``slots`` (the slot table freed or re-assigned them)."""
        for slot in slots:
            self.model.release_sequence(slot)

    def _free_slot(self, slot: int) -> None:
        self._clear(self.slots.retire(slot))

    def _drop_sequence(self, seq: _Sequence, now: float, retain: bool = False) -> None:
        """Free a choice's slot and KV (``retain``: keep the KV as a retained prefix when
        the engine retains prefixes; past ``max_retained_slots`` the least recently used
        retained slot is cleared), and flush its held-back text."""
        if self.running.get(seq.slot) is seq:
            del self.running[seq.slot]
            kept = seq.tokens[: seq.n_fed] if retain else None
            self._clear(self.slots.retire(seq.slot, kept, n_fed=seq.n_fed,
                                          tenant=seq.req.tenant_id))
        if seq in seq.group.live:
            seq.group.live.remove(seq)
        tail = seq.text.flush()
        if tail:
            seq.req.emit_token(TokenEvent(index=seq.generated - 1, token_id=-1, text=tail,
                                          time_s=now, choice=seq.choice))

    def _finish_choice(self, seq: _Sequence, reason: str, now: float) -> None:
        """A choice ended normally (its KV may be retained); the request completes with
        its last choice."""
        self._drop_sequence(seq, now, retain=True)
        group = seq.group
        group.finished[seq.choice] = ChoiceFinal(seq.choice, seq.text.text, reason,
                                                 seq.generated, seq.text.matched)
        if not group.live and not group.fork_slots:
            self._end(group, RequestStatus.COMPLETED, now)

    def _end(self, group: _Group, status: RequestStatus, now: float, **final: Any) -> None:
        """End a request and every choice it still runs: free their slots, KV and held
        fork slots, then deliver its one ``Final``."""
        for seq in list(group.live):
            self._drop_sequence(seq, now)
            group.finished.setdefault(seq.choice, ChoiceFinal(
                seq.choice, seq.text.text, final.get("finish_reason", "") or
                _reason_of(status), seq.generated))
        for slot in group.fork_slots:
            self._free_slot(slot)
        group.fork_slots.clear()
        self._groups.pop(group.req.request_id, None)
        req = group.req
        if not req.is_terminal:
            choices = tuple(group.finished.get(i) or ChoiceFinal(i, "", _reason_of(status), 0)
                            for i in range(group.n))
            first = choices[0]
            final.setdefault("finish_reason", first.finish_reason)
            final.setdefault("text", first.text)
            final.setdefault("stop_sequence", first.stop_sequence)
            final.setdefault("completion_tokens", sum(c.completion_tokens for c in choices))
            if group.n > 1:
                final.setdefault("choices", choices)
            if group.prompt_logprobs is not None:
                final.setdefault("prompt_logprobs", tuple(group.prompt_logprobs))
            req.finish(status, now, **final)
        self._on_retire(req)

    def _retire_stopped(self, now: float) -> None:
        """Cancelled, expired or already-ended requests leave before the next pass."""
        for group in list(self._groups.values()):
            req = group.req
            if req.is_terminal:
                self._end(group, req.status, now)
            elif req.cancel_requested:
                self._end(group, RequestStatus.CANCELLED, now, error="cancelled by client")
            elif req.missed_start(now):
                self._end(group, RequestStatus.EXPIRED, now,
                          error=f"{expired_what(req, now)} passed while running",
                          error_code="deadline")
        keep: deque[Request] = deque()
        for req in self.waiting:
            if req.cancel_requested:
                req.finish(RequestStatus.CANCELLED, now, error="cancelled by client")
            elif req.missed_start(now):
                req.finish(
                    RequestStatus.EXPIRED, now,
                    error=f"{expired_what(req, now)} passed while waiting for a slot",
                    error_code="deadline",
                )
            if req.is_terminal:
                self._on_retire(req)
            else:
                keep.append(req)
        self.waiting = keep

    def _fail(self, batch: _Batch, exc: Exception) -> None:
        now = self._clock()
        for group in {id(s.group): s.group for s in batch.owners}.values():
            self._end(group, RequestStatus.FAILED, now, error=f"backend error: {exc}",
                      error_code="backend_error")

    def abort_all(self, now: float, error: str) -> None:
        """Cancel everything (shutdown)."""
        for req in self.requests():
            req.finish(RequestStatus.CANCELLED, now, error=error, error_code="shutdown")
        self._retire_stopped(now)


def _urgency(req: Request) -> tuple[int, float]:
    """Priority class (0 most urgent), then the time to start by (none: last)."""
    start_by = req.start_by_s
    return req.priority, float("inf") if start_by is None else start_by


def _step_cost_prior(model: GenerativeModel) -> StepCost:
    """The profiled step-time model the spec names, else one measured by a warm-up of real
    steps when the spec asks for it, else the rough default."""
    path = model.spec.step_cost_path
    if path is None:
        return (measure_step_cost(model, DEFAULT_STEP_COST) if model.spec.step_cost_warmup
                else DEFAULT_STEP_COST)
    try:
        return StepCost.load(Path(path).expanduser())
    except (OSError, ValueError, KeyError) as exc:
        raise ModelLoadError(f"step_cost_file {path}: {exc}") from exc


def _budget(params: SamplingParams) -> ThinkingBudget | None:
    return None if params.thinking is None else ThinkingBudget(params.thinking)


def _reason_of(status: RequestStatus) -> str:
    return FINISH_REASON.get(status, "error")


def _fault_message(exc: Exception) -> tuple[str, str]:
    """What a client is told when its request's own work fails."""
    if isinstance(exc, SamplingError):
        return str(exc), "internal_error"
    if isinstance(exc, ConstraintError):
        return f"invalid response_format: {exc}", "invalid_request_error"
    if isinstance(exc, GrammarFailure):
        return f"constrained decoding failed: {exc}", "grammar_error"
    if isinstance(exc, ValueError):
        return str(exc), "invalid_request_error"
    return f"internal error in this request ({type(exc).__name__}: {exc})", "internal_error"
