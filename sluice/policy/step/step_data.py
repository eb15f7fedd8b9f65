"""The plain data of step planning: how an engine batches (``EngineConfig``), what the
planner sees (``StepView`` of ``RunningSeq``, ``WaitingSeq``, ``RetainedSeq``; the
``StepBudget`` it asks), and what it decides (``StepPlan`` of ``PlannedChunk`` and
``Admission``). ``sluice.policy.step.step_planner`` states the invariants every plan keeps."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

from sluice.policy.step.kv_blocks import KVSnapshot

BatchingMode = Literal["continuous", "static", "serial"]
LineOrder = Literal["arrival", "priority_deadline"]
HoldReason = Literal["mode", "slots", "tokens", "kv", "step_budget"]
"""Why the head of the waiting line was not admitted: the batching mode (a baseline with a
running batch, or static still waiting for a full one), no free slot, no token budget left
in this step, not enough free KV blocks, or the ``StepBudget`` refused."""


@dataclass(frozen=True)
class EngineConfig:
    """How a generative model's engine batches (the planner's configuration)."""

    mode: BatchingMode = "continuous"
    """``continuous`` (default), ``static`` or ``serial`` (baselines)."""
    max_batch_tokens: int = 512
    """Tokens fed in one forward pass (decode tokens + prefill chunks)."""
    prefill_chunk_tokens: int = 256
    """Longest prefill piece of one prompt in one pass (chunked prefill)."""
    kv_block_tokens: int = 16
    """KV block size for admission accounting."""
    static_max_wait_s: float = 0.05
    """Static mode: how long to wait for a full batch."""
    prefix_reuse: bool = True
    """Reuse the KV of a shared prompt prefix (from a running sequence or a retained slot)
    instead of recomputing it."""
    min_prefix_tokens: int = 16
    """Shortest shared prefix worth reusing."""
    retain_prefixes: bool = True
    """A sequence that ends keeps its KV in its idle slot (a retained prefix) as a donor
    for later prompts, until the slot or its KV blocks are wanted (the engine's choice;
    the planner only sees ``StepView.retained``)."""
    max_retained_slots: int | None = None
    """Most slots holding a retained prefix at once (None: every idle slot may)."""
    cache_ram_bytes: int | None = 0
    """Host memory for the retained prefixes the slots drop (``prompt_cache``), restored
    when a prompt shares more of one than the slots offer: 0 keeps none, None has no
    limit. Only with one KV stream per slot (a unified cache keeps its prefixes in the
    pool)."""
    share_prefix_across_tenants: bool = False
    """Reuse one tenant's prompt prefix for another's request. Off: a donor serves only
    requests of its own tenant, since a first token that comes faster would tell a tenant
    that another tenant's prompt began with what it sent."""
    prompt_logprobs_chunk_tokens: int = 32
    """Longest prefill piece of a prompt whose log-probabilities are wanted (its pass
    returns a logits row per token)."""
    line_order: LineOrder = "arrival"
    """How the engine orders its waiting line: ``arrival`` (the order the scheduler
    dispatched in), or ``priority_deadline`` (priority class, then the earliest deadline
    to start by, then arrival: the ``priority_edf`` scheduler's order, kept inside the
    engine too)."""

    def __post_init__(self) -> None:
        if self.max_retained_slots is not None and self.max_retained_slots < 0:
            raise ValueError(f"engine.max_retained_slots must be >= 0, got "
                             f"{self.max_retained_slots}")
        if self.cache_ram_bytes is not None and self.cache_ram_bytes < 0:
            raise ValueError(f"engine.cache_ram_bytes must be >= 0 or None, got "
                             f"{self.cache_ram_bytes}")
        for name in ("max_batch_tokens", "prefill_chunk_tokens", "kv_block_tokens",
                     "prompt_logprobs_chunk_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"engine.{name} must be >= 1, got {getattr(self, name)}")
        if self.mode not in ("continuous", "static", "serial"):
            raise ValueError(f"engine.mode must be continuous|static|serial, got {self.mode!r}")
        if self.line_order not in ("arrival", "priority_deadline"):
            raise ValueError(f"engine.line_order must be arrival|priority_deadline, got "
                             f"{self.line_order!r}")


# -- what the planner sees ------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RunningSeq:
    """A sequence that holds a slot (and its KV blocks)."""

    slot: int
    request_id: int
    n_prompt: int
    """Prompt length in tokens."""
    n_fed: int
    """Positions whose KV exists (prompt and generated tokens fed so far)."""
    n_generated: int
    """Tokens sampled so far."""
    tokens: Sequence[int]
    """Prompt + generated tokens; prefix reuse compares the first ``n_fed``. Read only
    while planning (the engine passes its own list rather than copying it every step)."""
    prompt_logprobs: bool = False
    """Its prefill chunks want every position's logits (and are kept short)."""
    tenant: str = ""
    """Whose prompt it holds: a prefix donor only for that tenant's requests (unless
    ``share_prefix_across_tenants``)."""
    draft: Sequence[int] = ()
    """Tokens proposed to follow its last sampled token (n-gram lookup), at most as many
    as it may verify in one step; empty: it does not draft this step."""
    acceptance: float = 0.0
    """Its drafts' measured acceptance rate (``AcceptanceRate.rate``)."""
    first_token_due_s: float | None = None
    """While it prefills: when its first token is due (its first-token target or
    deadline, the earlier; None: neither), on the clock of ``StepView.now``."""

    @property
    def prefilling(self) -> bool:
        """Whether prompt tokens are still to be fed."""
        return self.n_fed < self.n_prompt


@dataclass(frozen=True, slots=True)
class WaitingSeq:
    """A request waiting for a slot; ended and cancelled ones are left out by the caller."""

    request_id: int
    prompt_tokens: Sequence[int]
    max_tokens: int
    waiting_since_s: float
    """When it began waiting (static mode waits from the head's)."""
    n: int = 1
    """Choices: the slots it takes (each reserving ``reserve_tokens``)."""
    prompt_logprobs: bool = False
    """It wants every prompt position's logits: no prefix copy, short chunks."""
    tenant: str = ""
    """Whose request it is: it reuses only that tenant's prefixes (unless
    ``share_prefix_across_tenants``)."""
    first_token_due_s: float | None = None
    """When its first token is due (its first-token target or deadline, the earlier;
    None: neither), on the clock of ``StepView.now``."""

    @property
    def reserve_tokens(self) -> int:
        """KV tokens it reserves in each of its slots when admitted: its whole budget."""
        return len(self.prompt_tokens) + self.max_tokens


@dataclass(frozen=True, slots=True)
class RetainedSeq:
    """An idle slot that kept the KV of the sequence it last ran (a retained prefix)."""

    slot: int
    tokens: Sequence[int]
    """The tokens whose KV the slot holds, at positions ``0 .. len - 1``."""
    kv_blocks: int = 0
    """Blocks of the shared pool that KV fills (a unified KV cache); 0 when each slot has
    its own stream, so the retained KV takes nothing from other slots."""
    tenant: str = ""
    """Whose prompt the KV came from."""


@dataclass(frozen=True, slots=True)
class StepView:
    """Everything one plan depends on.

    Invariant: ``sum(r.kv_blocks for r in retained) <= kv.free_blocks`` (retained KV is
    counted free in the allocator, and only lent)."""

    running: tuple[RunningSeq, ...]
    """In the engine's order (admission order); decodes and prefills follow it."""
    waiting: tuple[WaitingSeq, ...]
    """In the order to admit (head first)."""
    free_slots: tuple[int, ...]
    """In the order to hand out."""
    kv: KVSnapshot
    now: float
    retained: tuple[RetainedSeq, ...] = ()
    """Idle slots holding a retained prefix, least recently used first; none of them is
    in ``free_slots``."""


@dataclass(frozen=True, slots=True)
class StepLoad:
    """What the plan holds so far, for a ``StepBudget`` to judge one more piece."""

    decode_tokens: int
    prefill_tokens: int
    sequences: int
    """Sequences holding a slot once the plan is applied (running + admitted so far)."""
    context_tokens: int = 0
    """KV positions the step's decodes attend to (the decoding sequences' fed tokens)."""
    held_tokens: int = 0
    """KV positions the slot-holding sequences hold once their prompts are fed: what
    their decodes will attend to in the coming steps (running + admitted so far, each
    fork counted)."""


@dataclass(frozen=True, slots=True)
class QueuedPrompt:
    """A prompt this step feeds (or admitted without a chunk), as ``StepBudget.hurry_tokens``
    sees it: the tokens it has still to feed after this step's chunk, and the seconds from
    the plan's ``now`` until its first token is due (None: it has no target)."""

    tokens_after_step: int
    due_in_s: float | None


class StepBudget(Protocol):
    """A limit on a step beyond ``max_batch_tokens``, e.g. predicted step time against a
    TPOT target. The planner asks before each prefill chunk and each admission, and once
    more after the admissions (``hurry_tokens``); answers must depend only on the
    arguments (and the object's own state), never on a clock."""

    def prefill_room_tokens(self, load: StepLoad) -> int:
        """How many more prefill tokens the step may take (0 = none)."""
        ...

    def may_admit(self, load: StepLoad, request: WaitingSeq) -> bool:
        """Whether ``request`` may start in this step."""
        ...

    def hurry_tokens(self, load: StepLoad, queued: Sequence[QueuedPrompt]) -> int:
        """Prompt tokens past ``prefill_room_tokens`` that the step should still feed, in
        feed order over ``queued`` (this step's prompts, in the order they are fed), so
        that prompts whose first tokens the budget's pace would make late get them now
        (0 = none)."""
        ...


class TokensOnly:
    """No limit beyond ``max_batch_tokens`` (the default)."""

    def prefill_room_tokens(self, load: StepLoad) -> int:
        return sys.maxsize

    def may_admit(self, load: StepLoad, request: WaitingSeq) -> bool:
        return True

    def hurry_tokens(self, load: StepLoad, queued: Sequence[QueuedPrompt]) -> int:
        return 0  # no pace: every prompt already gets all the room there is


TOKENS_ONLY = TokensOnly()


# -- what the planner decides ---------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PlannedChunk:
    """Tokens ``start_pos .. start_pos + n_tokens - 1`` of the sequence in ``slot``."""

    slot: int
    start_pos: int
    n_tokens: int
    want_logits: bool
    """Sample after this chunk (it ends the prompt, or it is a decode)."""
    decode: bool
    """One generated token (else a piece of the prompt)."""
    all_logits: bool = False
    """Return the logits after every token of the chunk (prompt log-probabilities)."""
    draft_tokens: int = 0
    """A decode carrying this many drafted tokens after its decode token (the first of
    the sequence's ``draft``), each to be verified from the logits row before it (which
    the chunk wants for every token)."""


@dataclass(frozen=True, slots=True)
class PrefixCopy:
    """Start a sequence with the first ``n_tokens`` of ``donor_slot``'s KV: copied, or,
    when ``donor_slot`` is the admission's own (retained) slot, kept in place and the rest
    of that slot's KV trimmed."""

    donor_slot: int
    n_tokens: int


@dataclass(frozen=True, slots=True)
class Admission:
    """Start waiting request ``request_id`` in ``slot``, reserving ``reserve_tokens``
    there and in each of ``fork_slots``."""

    request_id: int
    slot: int
    reserve_tokens: int
    prefix: PrefixCopy | None
    """Copied before its first chunk, which then starts at ``prefix.n_tokens``."""
    fork_slots: tuple[int, ...] = ()
    """Slots of choices 1..n-1: held from now, filled by a copy of ``slot``'s prompt KV
    when its prefill ends (the fork)."""
    evict: tuple[int, ...] = ()
    """Retained slots to clear before reserving, to give their KV blocks back (they
    become free slots, handed out after ``view.free_slots``). Retained slots among
    ``slots`` are cleared too, except a slot kept in place (``prefix.donor_slot ==
    slot``)."""

    @property
    def in_place(self) -> bool:
        """Admitted into a retained slot whose KV prefix it keeps (no copy)."""
        return self.prefix is not None and self.prefix.donor_slot == self.slot

    @property
    def slots(self) -> tuple[int, ...]:
        """Every slot the admission takes, ``slot`` first."""
        return (self.slot, *self.fork_slots)


@dataclass(frozen=True, slots=True)
class StepPlan:
    """One step: chunks in feed order; admissions in the order to apply them (before the
    pass: their chunks are among ``chunks``)."""

    chunks: tuple[PlannedChunk, ...]
    admissions: tuple[Admission, ...]
    held_back: HoldReason | None
    """Why the head of the waiting line stays waiting (``None``: nothing waits)."""

    @property
    def decode_tokens(self) -> int:
        return sum(1 for c in self.chunks if c.decode)

    @property
    def prefill_tokens(self) -> int:
        return sum(c.n_tokens for c in self.chunks if not c.decode)

    @property
    def draft_tokens(self) -> int:
        return sum(c.draft_tokens for c in self.chunks)

    def in_slot_order(self) -> tuple[PlannedChunk, ...]:
        """The chunks in slot order: the order an engine feeds them (the llama.cpp backend
        feeds a batch that way, and a batch given in that order comes back without a gather,
        a copy of every logits row) and takes their tokens, in the server and the
        simulator alike."""
        return tuple(sorted(self.chunks, key=lambda c: c.slot))

