"""What the continuous engine holds: a request's ``_Group`` of ``_Sequence`` choices, the
slot views it shows (``SlotState``, ``SlotHolding``), one pass's ``_Batch``, and the
engine's fields (``EngineState``), declared once for the parts that make up
``ContinuousEngine``."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

from sluice.backends.base import ForwardChunk, GenerativeModel
from sluice.engine.chooser import TokenChooser
from sluice.engine.request import (
    FINISH_REASON,
    ChoiceFinal,
    Request,
    RequestStatus,
    SamplingParams,
    TokenLogprob,
)
from sluice.engine.speculation import (
    SequenceDrafts,
    SpeculationState,
)
from sluice.engine.step_times import StepTimes
from sluice.engine.textstream import TextStream
from sluice.engine.thinking import ThinkingBudget
from sluice.policy.step.kv_blocks import KVBlockAllocator
from sluice.policy.step.prompt_cache import PromptCache
from sluice.policy.step.slot_table import SlotTable
from sluice.policy.step.speculation import DraftGate
from sluice.policy.step.step_cost import OnlineStepCost
from sluice.policy.step.step_data import EngineConfig, RunningSeq, WaitingSeq
from sluice.policy.step.tpot_margin import TpotMargin
from sluice.policy.step.width import WidthPlan


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
            if (draft_max_tokens > 0 and room > 0 and not self.prefilling
                    and not self.group.fork_slots):
                draft = self.drafts.propose(min(draft_max_tokens, room))
            acceptance = self.drafts.rate.rate
        return RunningSeq(
            self.slot, self.req.request_id, self.n_prompt, self.n_fed, self.generated,
            self.tokens, prompt_logprobs=self.group.prompt_logprobs is not None,
            tenant=self.req.tenant_id, draft=draft, acceptance=acceptance,
            first_token_due_s=self.req.first_token_due_s if self.prefilling else None,
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
                      prompt_logprobs=p.prompt_logprobs, tenant=req.tenant_id,
                      first_token_due_s=req.first_token_due_s)


def _budget(params: SamplingParams) -> ThinkingBudget | None:
    return None if params.thinking is None else ThinkingBudget(params.thinking)


def _reason_of(status: RequestStatus) -> str:
    return FINISH_REASON.get(status, "error")


class EngineState:
    """The engine's fields (``ContinuousEngine.__init__`` sets them), declared once for every
    part. Owned by the engine's worker thread."""

    model: GenerativeModel
    config: EngineConfig
    _clock: Callable[[], float]
    _on_retire: Callable[[Request], None]
    """Called once for every request that leaves the engine (in a terminal state)."""
    slots: SlotTable
    """Which slot holds what (free, retained, running, held), with the KV allocator."""
    kv: KVBlockAllocator
    waiting: deque[Request]
    running: dict[int, _Sequence]
    """Running sequences by slot, in the order they started (or moved)."""
    _groups: dict[int, _Group]
    """Started requests by request id (a group outlives none of its sequences)."""
    steps: int
    _last_step_end_s: float | None
    """When the previous step ended, while the engine has had work since (else None)."""
    last_batch_size: int
    reused_prefix_tokens: int
    """Prompt tokens not recomputed thanks to prefix reuse (a counter)."""
    retained_prefix_tokens: int
    """Of those, the tokens kept in place in a retained slot (a counter)."""
    forked_prompt_tokens: int
    """Prompt tokens not recomputed because ``n`` choices shared one prefill."""
    slot_moves: int
    """KV streams copied to keep running sequences on the lowest slots (a counter)."""
    prompt_cache: PromptCache[bytes] | None
    """Dropped retained prefixes' KV in host memory (None: the engine keeps none)."""
    step_cost: OnlineStepCost
    """The step-time model, learned from the steps this engine runs."""
    tpot_margin: TpotMargin
    """The share of the TPOT target a planned step may take, learned from how the steps'
    measured cycles compare with the model's predictions."""
    step_times: StepTimes
    """Every step's time by its decodes and whether it fed a prompt (cumulative)."""
    tpot_target_s: float | None
    width: WidthPlan | None
    """The last width decision made with requests waiting (``sluice.policy.step.width``): how
    many sequences the TPOT target let decode at once, and why."""
    drafting: bool
    """Greedy sequences draft tokens (n-gram speculation; the baselines never do)."""
    speculation: SpeculationState
    """The drafted and accepted tokens so far, and the last verifying step's."""
    draft_gate: DraftGate
    """Drafting at a batch size only while its measured tokens/s beat plain steps'."""

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def requests(self) -> list[Request]:
        """Every request the engine holds (waiting and running)."""
        return [*self.waiting, *(g.req for g in self._groups.values())]
