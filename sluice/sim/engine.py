"""A simulated continuous-batching engine: the server's step planner and KV allocator, with
a step-time model in place of the forward pass.

A step is what ``ContinuousEngine.step`` does, in the same order: retire what ended
(deadlines), the same compaction moves, ``plan_step`` on the same kind of view, apply the
admissions, then the pass, charged ``StepCost.predict_s(decode, prefill, context)``
seconds; at its end every chunk that wants logits yields one token, a token past the
deadline expires its request instead (never completed late), and a request that reaches
``max_tokens`` completes and frees its slot and blocks at once. Sequences run to
``max_tokens`` (as the load generator's ``ignore_eos`` asks); ``n`` is 1.

A model with a TPOT target plans every step within ``TpotBudget`` on its step cost (the
server's engine learns that cost online; the simulator's cost file is what it converges
to) at the margin ``TpotMargin`` learns from the charged steps against that cost, as the
engine learns it from its measured cycles; a request with a first-token deadline is
refused on arrival at the engine when ``predict_engine_ttft`` (the server's prediction)
misses it (``deadline_infeasible``), and ends ``expired`` if it has no token by then.

N-gram speculation (a ``SimDrafting``: the workload's chance that the model accepts each
drafted token): every decoding sequence proposes as many tokens as it may draft, with its
own ``AcceptanceRate`` as the engine keeps one; the plan's draft lengths come from the
same ``choose_draft_lengths`` on the same ``DraftBudget``; a step is charged its drafted
tokens as decodes (as the engine's step-time model counts them), and each drafted chunk
keeps the drafts before its first rejection, drawn from the acceptance with the seeded
generator, plus the token after them.

Slots: the engine's ``SlotTable`` (``sluice.policy.step.slot_table``) over a real
``KVBlockAllocator`` decides the view's free and retained slots and applies every
admission, retirement and compaction move, as it does in the engine; its ``SlotOps`` (the
model's KV to clear, trim or copy) have nothing to act on here, and a move's copy is not
charged. A completed sequence's slot keeps its prompt as a donor (the generated tokens,
which no simulated prompt shares, are left out). The prompt cache in host memory
(``sluice.policy.step.prompt_cache``) keeps the retained prompts the table drops and
restores them by the engine's ``choose_restores``; a restore is not charged, and an
entry counts ``kv_bytes_per_token`` a token (the simulated worker's: the model's memory
over its KV cells, an upper bound on its KV's share).
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from itertools import islice

from sluice.policy.step.engine_line import (
    EngineLine,
    EngineShape,
    late_start,
    left_s,
    running_entry,
    step_budget,
)
from sluice.policy.step.prompt_cache import (
    CachedPrompt,
    PromptCache,
    choose_restores,
    prompt_cache_for,
    to_keep,
)
from sluice.policy.step.slot_layout import MAX_SLOT_MOVES_PER_STEP
from sluice.policy.step.slot_table import SlotTable
from sluice.policy.step.speculation import (
    DEFAULT_DRAFT_MAX_TOKENS,
    AcceptanceRate,
    DraftBudget,
    DraftGate,
)
from sluice.policy.step.step_cost import StepCost
from sluice.policy.step.step_data import (
    Admission,
    EngineConfig,
    RunningSeq,
    StepBudget,
    StepPlan,
    StepView,
    WaitingSeq,
)
from sluice.policy.step.step_planner import plan_step, static_wakeup_s
from sluice.policy.step.tpot_budget import TpotBudget
from sluice.policy.step.tpot_margin import TpotMargin
from sluice.policy.step.ttft import LineEntry
from sluice.policy.step.width import WidthPlan
from sluice.sim.request import SimRequest


@dataclass(frozen=True, slots=True)
class SimDrafting:
    """N-gram speculation in a simulated engine."""

    acceptance: float
    """The chance that the model accepts a drafted token (given the drafts before it
    were): what the served engine measured on the workload (``/status.json``
    ``speculation.acceptance``)."""
    draft_max_tokens: int = DEFAULT_DRAFT_MAX_TOKENS

    def __post_init__(self) -> None:
        if not 0.0 <= self.acceptance <= 1.0:
            raise ValueError(f"draft acceptance must be in [0, 1], got {self.acceptance}")
        if self.draft_max_tokens < 1:
            raise ValueError(f"draft_max_tokens must be >= 1, got {self.draft_max_tokens}")


@dataclass(slots=True)
class _Seq:
    req: SimRequest
    slot: int
    n_fed: int = 0
    rate: AcceptanceRate = field(default_factory=AcceptanceRate)
    """Its drafts' measured acceptance (as the engine keeps one per sequence)."""


class SimEngine:
    """One resident generative model on one simulated worker."""

    def __init__(self, config: EngineConfig, cost: StepCost, n_ctx_total: int,
                 n_seq_max: int, jitter: Callable[[], float] = lambda: 1.0,
                 tpot_target_s: float | None = None,
                 step_s: Callable[[int, int, int], float] | None = None,
                 drafting: SimDrafting | None = None,
                 rng: random.Random | None = None, kv_bytes_per_token: int = 0) -> None:
        self.config = config
        self.kv_bytes_per_token = kv_bytes_per_token
        """What a prompt-cache entry counts a token as (0: nothing, so none leaves)."""
        self.drafting = drafting if config.mode == "continuous" else None
        self.draft_gate = DraftGate()
        self._step_s = 0.0
        """Speculation, if the simulated model drafts (never in the baselines)."""
        self._rng = rng or random.Random(0)
        """Draws which drafts are accepted."""
        self.draft_tokens = 0
        self.accepted_tokens = 0
        """Drafted tokens verified, and accepted (counters)."""
        self.cost = cost
        """The linear step model the engine's policies plan with (budget, TTFT)."""
        self.step_s = step_s or cost.predict_s
        """Seconds a step takes: ``(decodes, prompt tokens, context)`` (``ModelCost.step_s``;
        the linear model by default)."""
        self.tpot_target_s = tpot_target_s
        self.n_seq_max = n_seq_max
        self.jitter = jitter
        """A factor drawn per step (``ModelCost.jitter``)."""
        self.slots = SlotTable.for_context(config, n_ctx_total, n_seq_max, unified=False)
        """Which slot holds what, with the KV allocator (as the engine's)."""
        self.kv = self.slots.kv
        self.prompt_cache: PromptCache[None] | None = prompt_cache_for(config, unified=False)
        """The retained prompts the slots dropped (as the engine's, without their KV)."""
        self.waiting: deque[SimRequest] = deque()
        self.running: dict[int, _Seq] = {}
        self.tpot_margin = TpotMargin()
        """The margin as the server's engine learns it: each step with decodes, its
        charged seconds against the linear model's prediction."""
        self.steps = 0
        self.busy_s = 0.0
        self.width: WidthPlan | None = None
        """The last width decision made with requests waiting (as the engine's)."""

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def _line(self, now: float) -> EngineLine:
        """The engine as the width plan sees it (as ``ContinuousEngine._line``)."""
        return EngineLine(
            [running_entry(s.req.n_prompt, s.n_fed, s.req.max_tokens, s.req.generated)
             for s in self.running.values()],
            [s.n_fed for s in self.running.values()],
            [LineEntry(r.n_prompt, r.max_tokens) for r in self.waiting],
            [left_s(r.first_token_due_s, now) for r in self.waiting])

    def _shape(self) -> EngineShape:
        return EngineShape(self.cost, self.tpot_target_s, self.n_seq_max, self.kv,
                           self.tpot_margin.margin(), self.tpot_margin.mean_ratio())

    def refusal(self, req: SimRequest, now: float) -> str | None:
        """Why ``req`` is refused on arrival here (as ``ContinuousEngine.add`` refuses): it
        can never fit, or its first token is predicted past its first-token deadline or
        target at the width the engine would plan (the same ``late_start``); else None."""
        if self.kv.never_fits(req.n_prompt + req.max_tokens):
            return "context_length_exceeded"
        late = late_start(self._shape(), lambda: self._line(now), prompt_tokens=req.n_prompt,
                          n=1, max_tokens=req.max_tokens, ttft_target_s=req.ttft_target_s,
                          ttft_deadline_s=req.ttft_deadline_s, arrival_s=req.arrival_s,
                          now=now, line_busy=self.has_work)
        return None if late is None else "deadline_infeasible"

    def budget(self, now: float) -> StepBudget:
        """The step budget of the next plan (the engine's ``step_budget``)."""
        budget, width = step_budget(self._shape(), self.config.mode == "continuous",
                                    lambda: self._line(now), bool(self.waiting))
        if width is not None:
            self.width = width
        return budget

    def expire(self, now: float) -> list[SimRequest]:
        """Requests past their deadline, or their first-token deadline with no token yet,
        leave before the next pass (running ones free their slot and blocks); returned for
        the caller to end."""
        gone = []
        for slot, seq in list(self.running.items()):
            if seq.req.missed_start(now):
                self._retire(slot)
                gone.append(seq.req)
        if any(r.missed_start(now) for r in self.waiting):
            keep: deque[SimRequest] = deque()
            for r in self.waiting:
                if r.missed_start(now):
                    gone.append(r)
                else:
                    keep.append(r)
            self.waiting = keep
        return gone

    def _draft_of(self, seq: _Seq) -> tuple[int, ...]:
        """A decoding sequence's proposal: as many tokens as it may draft (their ids do
        not matter here), one fewer than it has left."""
        if self.drafting is None or seq.n_fed < seq.req.n_prompt:
            return ()
        room = seq.req.max_tokens - seq.req.generated - 1
        return (0,) * max(0, min(self.drafting.draft_max_tokens, room))

    def view(self, now: float) -> StepView:
        return StepView(
            running=tuple(RunningSeq(s.slot, s.req.request_id, s.req.n_prompt, s.n_fed,
                                     s.req.generated, s.req.prompt, draft=self._draft_of(s),
                                     acceptance=s.rate.rate,
                                     first_token_due_s=(s.req.first_token_due_s
                                                        if s.n_fed < s.req.n_prompt
                                                        else None))
                          for s in self.running.values()),
            waiting=tuple(WaitingSeq(r.request_id, r.prompt, r.max_tokens, r.arrival_s,
                                     first_token_due_s=r.first_token_due_s)
                          for r in self.waiting),
            free_slots=self.slots.free_slots,
            kv=self.kv.snapshot(),
            now=now,
            retained=self.slots.retained(),
        )

    def _compact(self) -> None:
        """The engine's compaction moves (running sequences down into the holes ended ones
        left), applied to the slots."""
        for move in self.slots.moves(MAX_SLOT_MOVES_PER_STEP):
            seq = self.running.pop(move.src, None)
            if seq is not None:  # re-inserted last, as the engine's running order has it
                seq.slot = move.dst
                self.running[move.dst] = seq
            self.slots.move(move.src, move.dst)

    def start_step(self, now: float) -> tuple[StepPlan, float]:
        """Plan and apply one step at ``now``; returns the plan and its seconds (0 and
        no chunks when there is nothing to feed)."""
        self._compact()
        self._restore_prefixes()
        budget = self.budget(now)
        drafts = None
        decoding = sum(1 for q in self.running.values() if q.n_fed >= q.req.n_prompt)
        if self.drafting is not None and self.draft_gate.allow(decoding):
            limit_s = budget.step_limit_s if isinstance(budget, TpotBudget) else None
            drafts = DraftBudget(self.cost, limit_s)
        plan = plan_step(self.config, self.view(now), budget, drafts)
        for adm in plan.admissions:
            req = self.waiting.popleft()
            if req.request_id != adm.request_id:  # the planner admits from the head
                raise RuntimeError(f"plan admits {adm.request_id}, head is {req.request_id}")
            req.status = "running"
            req.started_s = now
            self._change_slots(partial(self._apply_admission, adm))
            seq = _Seq(req, adm.slot)
            if adm.prefix is not None:
                seq.n_fed = adm.prefix.n_tokens
            self.running[adm.slot] = seq
        if not plan.chunks:
            return plan, 0.0
        running = self.running
        context = sum(running[c.slot].n_fed * c.n_tokens for c in plan.chunks if c.decode)
        decodes = plan.decode_tokens + plan.draft_tokens  # a draft is charged as a decode
        step_s = self.step_s(decodes, plan.prefill_tokens, context)
        step_s *= self.jitter()
        if plan.decode_tokens:
            self.tpot_margin.observe(
                self.cost.predict_s(decodes, plan.prefill_tokens, context), step_s)
        self.busy_s += step_s
        self._step_s = step_s
        return plan, step_s

    def end_step(self, plan: StepPlan, now: float) -> list[tuple[SimRequest, str]]:
        """The pass ended at ``now``: feed, sample, retire. Returns the requests that end,
        with their terminal state."""
        self.steps += 1
        ended: list[tuple[SimRequest, str]] = []
        accepted_before = self.accepted_tokens
        # in the engine's order: the chunks by slot, those verifying drafts after the rest
        for chunk in sorted(plan.in_slot_order(), key=lambda c: c.draft_tokens > 0):
            seq = self.running.get(chunk.slot)
            if seq is None:
                continue
            seq.n_fed += chunk.n_tokens
            if not chunk.want_logits:
                continue
            req = seq.req
            if req.missed_start(now):  # past its deadline, or its first token's
                self._retire(chunk.slot)
                ended.append((req, "expired"))
                continue
            req.generated += 1 + self._verify(seq, chunk.draft_tokens, chunk.decode)
            if req.first_token_s is None:
                req.first_token_s = now
            if req.generated >= req.max_tokens:
                self._retire(chunk.slot, completed=True)
                ended.append((req, "completed"))
        if self.drafting is not None and plan.decode_tokens and not plan.prefill_tokens:
            self.draft_gate.observe(  # as the engine's gate measures its steps
                plan.decode_tokens, plan.draft_tokens > 0,
                plan.decode_tokens + self.accepted_tokens - accepted_before, self._step_s)
        return ended

    def _verify(self, seq: _Seq, drafted: int, decode: bool) -> int:
        """The drafts of one chunk the model accepts (those before the first rejection,
        each accepted with the workload's probability); the rest leave the KV."""
        if self.drafting is None or not decode:
            return 0
        if not drafted:
            seq.rate.idle()
            return 0
        accepted = 0
        while accepted < drafted and self._rng.random() < self.drafting.acceptance:
            accepted += 1
        seq.n_fed -= drafted - accepted
        seq.rate.observe(drafted, accepted)
        self.draft_tokens += drafted
        self.accepted_tokens += accepted
        return accepted

    def next_wakeup_s(self) -> float | None:
        """Static mode: when the waiting head stops waiting for a full batch."""
        if self.config.mode != "static" or not self.waiting:
            return None
        head = self.waiting[0]
        return static_wakeup_s(self.config, len(self.running),
                               WaitingSeq(head.request_id, (), head.max_tokens,
                                          head.arrival_s))

    def _retire(self, slot: int, completed: bool = False) -> None:
        seq = self.running.pop(slot)
        kept = seq.req.prompt[: min(seq.n_fed, seq.req.n_prompt)] if completed else None
        self._change_slots(partial(self.slots.retire, slot, kept, n_fed=seq.n_fed))

    def _apply_admission(self, adm: Admission) -> tuple[int, ...]:
        return self.slots.apply(adm).clear

    def _change_slots(self, change: Callable[[], tuple[int, ...]]) -> None:
        """A slot-table change; the retained prompts it drops go to the prompt cache (the
        engine's ``_change_slots``)."""
        cache = self.prompt_cache
        if cache is None:
            change()
            return
        before = {r.slot: r for r in self.slots.retained()}
        for kept in to_keep(cache, before, change()):
            cache.put(CachedPrompt(tuple(kept.tokens), kept.tenant,
                                   len(kept.tokens) * self.kv_bytes_per_token, None))

    def _restore_prefixes(self) -> None:
        """The engine's restores before a plan: each into the lowest free slot, as a
        retained prefix of what it shares."""
        cache = self.prompt_cache
        free = self.slots.free_slots
        if cache is None or not self.waiting or not free or not len(cache):
            return
        donors = [(r.tokens, len(r.tokens), r.tenant) for r in self.slots.retained()]
        donors += [(s.req.prompt, s.n_fed, "") for s in self.running.values()]
        head = [WaitingSeq(r.request_id, r.prompt, r.max_tokens, r.arrival_s)
                for r in islice(self.waiting, len(free))]
        for restore in choose_restores(cache, self.config, head, donors, len(free)):
            free = self.slots.free_slots
            if not free:
                return
            entry = cache.take(restore.key, restore.n_tokens)
            self._change_slots(partial(self.slots.adopt, free[0],
                                       entry.tokens[: restore.n_tokens], entry.tenant))
