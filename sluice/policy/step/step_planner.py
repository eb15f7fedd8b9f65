"""The continuous-batching step planner: what one forward pass of a generative model feeds.

``plan_step(config, view)`` looks at plain views of the engine (running sequences, the
waiting line, free slots, KV capacity, ``now``) and returns a ``StepPlan``: the chunks to
feed, in feed order, and the waiting requests to start, in the order they must be
applied. It decides only; the engine (or the simulator) applies the plan: it starts the
admitted requests, reserves their KV blocks (a ``SlotTable``, ``sluice.policy.step.slot_table``),
copies shared prefixes, runs the pass, and samples. This is vLLM v1's ``SchedulerOutput``
split: the views, the plan and the ``StepBudget`` seam are plain data in
``sluice.policy.step.step_data``.

Invariants of every plan (``tests/policy/test_step_planner.py`` checks them on random
views):

- **Feed order**: one decode chunk per decoding sequence (in ``view.running`` order), then
  one prefill chunk per prefilling sequence (same order), then the first prefill chunk of
  each admitted request (in admission order). At most one chunk per slot.
- **Token budget**: the chunks' tokens add up to at most ``max_batch_tokens``; a prefill
  chunk has at most ``prefill_chunk_tokens``; a chunk starts at the sequence's fed count
  and wants logits exactly when it reaches the end of the prompt (decodes always do).
- **Admission**: requests are taken from the head of ``view.waiting`` in its order; the
  first that cannot start ends admission for this step (head-of-line: order is kept), and
  ``held_back`` says why. Each takes distinct slots: a retained donor it is admitted
  into, else ``view.free_slots`` in that order, then retained slots least recently used
  first (their KV cleared). It reserves ``prompt + max_tokens`` tokens per slot; together
  they fit the free KV blocks (planned on a local copy of the counts, never by touching
  the allocator).
- **Retained KV is reclaimable**: the blocks retained slots fill (``RetainedSeq.kv_blocks``,
  part of ``kv.free_blocks``) are lent, not held: an admission that needs them evicts
  retained slots, least recently used first (``Admission.evict``). Retained slots and
  their KV count as free for ``slots`` and ``kv``, so they never make a request wait (with
  prefix reuse off, a plan admits exactly what it would with every retained slot
  released). After the plan, the admissions' blocks plus the blocks of the slots still
  retained fit ``kv.free_blocks``.
- **Prefix reuse**: an admitted request may start after the longest prefix of its prompt
  that a donor already holds, if that is at least ``min_prefix_tokens`` and leaves one
  prompt token to feed for logits; its first chunk then starts there. Donors, in the order
  that wins a tie: retained slots (``view.retained``: idle slots that kept the KV of the
  sequence they last ran), slots kept in place earlier in this plan, then running
  sequences (their fed tokens). A retained donor that holds more than the shared prefix is
  copied from into a free slot and stays retained, so a prompt that shares only a chat
  template's opening with it does not cost its KV; one whose every token the prompt
  continues, or one left when no slot is free (or whose blocks the request needs), is
  admitted *into* (``prefix.donor_slot == slot``) and the engine trims its KV past the
  prefix.
  A request that wants prompt log-probabilities never copies (it
  needs the logits of every prompt position), and its prefill chunks want all logits and
  hold at most ``prompt_logprobs_chunk_tokens`` (a logits row per token is 1 MiB on a
  262k vocabulary).
- **Choices** (``n`` > 1): the admission of a request with ``n`` choices takes ``n``
  slots (in ``free_slots`` order) and reserves ``prompt + max_tokens`` in each; choice 0
  prefills in ``Admission.slot`` and ``fork_slots`` wait. When the prefill ends, the
  engine forks: it copies the prompt's KV into each fork slot (the prefix-reuse copy) and
  samples every choice's first token from the one logits row, so the prompt is computed
  once. A request with more choices than free slots waits (``slots``).
- **Baselines**: ``static`` and ``serial`` admit only into an empty engine; ``serial`` one
  request at a time; ``static`` when the line fills every slot or its head has waited
  ``static_max_wait_s``.
- **Hurry**: after the admissions the budget may ask for more prompt tokens
  (``StepBudget.hurry_tokens``, for first tokens its pace would hold back); they lengthen
  the prefill chunks in feed order, each within its cap and the token budget, and give a
  chunk to an admitted request that had none (such requests are the last fed, so the
  feed order holds).
- **Speculation** (a ``DraftBudget`` given): after the admissions, the decode chunk of a
  sequence with a proposal (``RunningSeq.draft``) may carry the first ``draft_tokens`` of
  it after its decode token (``n_tokens = 1 + draft_tokens``, every row's logits wanted),
  as ``sluice.policy.step.speculation.choose_draft_lengths`` decides from the tokens left in the
  budget and the step's time limit. Drafting never changes the admissions, the prefill
  chunks or which sequences decode; without a ``DraftBudget`` no chunk drafts.

Extension points: a ``StepBudget`` bounds prefill tokens and admissions by more than the
token count (a step-time model keeping each running sequence's time per output token
within a target); the waiting line is admitted in the order it is given, so a scheduler
orders it first; admissions are a list of decisions, so preemptions can be added as
further decisions applied in order.
"""


from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from sluice.policy.step.kv_blocks import KVSnapshot
from sluice.policy.step.prefix_retention import common_prefix_tokens
from sluice.policy.step.speculation import (
    DraftBudget,
    DraftCandidate,
    PlannedStep,
    choose_draft_lengths,
)
from sluice.policy.step.step_data import (
    TOKENS_ONLY,
    Admission,
    EngineConfig,
    HoldReason,
    PlannedChunk,
    PrefixCopy,
    QueuedPrompt,
    RetainedSeq,
    StepBudget,
    StepLoad,
    StepPlan,
    StepView,
    WaitingSeq,
)


def plan_step(config: EngineConfig, view: StepView, budget: StepBudget = TOKENS_ONLY,
              drafts: DraftBudget | None = None) -> StepPlan:
    """Decode tokens first, then prefill chunks of running sequences, then admissions while
    the token budget, slots and KV blocks allow, then (``drafts`` given) drafted tokens on
    the decodes that pay for them. Pure: the view is not changed."""
    return _Draft(config, view, budget, drafts).plan()


def static_wakeup_s(config: EngineConfig, n_running: int, head: WaitingSeq | None) -> float | None:
    """Static mode: when the waiting line's head stops waiting for a full batch (``None``
    when not in static mode, when a batch runs, or when nothing waits)."""
    if config.mode != "static" or n_running or head is None:
        return None
    return head.waiting_since_s + config.static_max_wait_s



class _Draft:
    """One plan being built: local copies of the token budget, slots and KV counts."""

    def __init__(self, config: EngineConfig, view: StepView, budget: StepBudget,
                 drafts: DraftBudget | None = None) -> None:
        self.config = config
        self.view = view
        self.budget = budget
        self.drafts = drafts
        self.tokens_left = config.max_batch_tokens
        self.decode_tokens = 0
        self.context_tokens = 0
        self.held_tokens = sum(max(r.n_fed, r.n_prompt) for r in view.running)
        self.kv = view.kv
        self.chunks: list[PlannedChunk] = []
        self.admissions: list[Admission] = []
        self.free_left = list(view.free_slots)
        self.retained_left = list(view.retained)
        """Retained slots not yet handed out or evicted, least recently used first."""
        self.kept: list[tuple[int, Sequence[int], int, str]] = []
        """Donors made by this plan: (slot, prompt, tokens kept in place, tenant)."""
        self.feeds: list[_Feed] = []
        """The prompts this step feeds (or admitted without a chunk), in feed order."""

    def plan(self) -> StepPlan:
        for seq in self.view.running:
            if not seq.prefilling and self.tokens_left > 0:
                self._chunk(seq.slot, seq.n_fed, 1, want_logits=True, decode=True)
                self.context_tokens += seq.n_fed
        for seq in self.view.running:
            if seq.prefilling and self.tokens_left > 0:
                self._prefill(seq.slot, seq.n_prompt, seq.n_fed, seq.prompt_logprobs,
                              seq.first_token_due_s)
        held_back = self._admit()
        self._hurry()
        if self.drafts is not None:
            self._speculate(self.drafts)
        return StepPlan(tuple(self.chunks), tuple(self.admissions), held_back)

    def _speculate(self, drafts: DraftBudget) -> None:
        """Lengthen the decode chunks of sequences with a proposal by the drafted tokens
        that pay for themselves (``choose_draft_lengths``), within the tokens left."""
        by_slot = {seq.slot: seq for seq in self.view.running if seq.draft}
        drafting = [i for i, c in enumerate(self.chunks) if c.decode and c.slot in by_slot]
        if not drafting or self.tokens_left <= 0:
            return
        load = self._load()
        step = PlannedStep(load.decode_tokens, load.prefill_tokens, load.context_tokens,
                           output_tokens=sum(1 for c in self.chunks if c.want_logits))
        seqs = [by_slot[self.chunks[i].slot] for i in drafting]
        lengths = choose_draft_lengths(
            drafts, step, [DraftCandidate(len(s.draft), s.acceptance, s.n_fed) for s in seqs],
            self.tokens_left)
        for i, k in zip(drafting, lengths, strict=True):
            if k:
                self.chunks[i] = replace(self.chunks[i], n_tokens=1 + k, draft_tokens=k)
                self.tokens_left -= k

    def _load(self) -> StepLoad:
        return StepLoad(
            decode_tokens=self.decode_tokens,
            prefill_tokens=self.config.max_batch_tokens - self.tokens_left - self.decode_tokens,
            sequences=len(self.view.running) + sum(len(a.slots) for a in self.admissions),
            context_tokens=self.context_tokens,
            held_tokens=self.held_tokens,
        )

    def _chunk(self, slot: int, start: int, n: int, want_logits: bool, decode: bool,
               all_logits: bool = False) -> None:
        self.chunks.append(PlannedChunk(slot, start, n, want_logits, decode, all_logits))
        self.tokens_left -= n
        self.decode_tokens += decode

    def _prefill(self, slot: int, n_prompt: int, n_fed: int, all_logits: bool,
                 due_s: float | None) -> None:
        cap = (self.config.prompt_logprobs_chunk_tokens if all_logits
               else self.config.prefill_chunk_tokens)
        take = min(n_prompt - n_fed, cap, self.tokens_left)
        if take > 0:
            take = min(take, self.budget.prefill_room_tokens(self._load()))
        feed = _Feed(slot, n_prompt, n_fed, cap, all_logits, due_s)
        if take > 0:
            feed.chunk = len(self.chunks)
            feed.n_tokens = take
            self._chunk(slot, n_fed, take, want_logits=n_fed + take >= n_prompt, decode=False,
                        all_logits=all_logits)
        self.feeds.append(feed)

    def _hurry(self) -> None:
        """Lengthen this step's prefill chunks, in feed order, by the tokens the budget asks
        for so that prompts its pace would give a late first token get it now
        (``StepBudget.hurry_tokens``), within each chunk's cap and the tokens left. A
        prompt admitted without a chunk gets one after the others (such prompts are
        always the last fed: the room only shrinks as chunks are added)."""
        if not self.feeds or self.tokens_left <= 0:
            return
        now = self.view.now
        queued = [QueuedPrompt(f.n_prompt - f.n_fed - f.n_tokens,
                               None if f.due_s is None else f.due_s - now) for f in self.feeds]
        extra = min(self.budget.hurry_tokens(self._load(), queued), self.tokens_left)
        for f in self.feeds:
            if extra <= 0:
                break
            grow = min(f.n_prompt - f.n_fed - f.n_tokens, f.cap - f.n_tokens, extra)
            if grow <= 0:
                continue
            f.n_tokens += grow
            chunk = PlannedChunk(f.slot, f.n_fed, f.n_tokens,
                                 want_logits=f.n_fed + f.n_tokens >= f.n_prompt, decode=False,
                                 all_logits=f.all_logits)
            if f.chunk is None:
                f.chunk = len(self.chunks)
                self.chunks.append(chunk)
            else:
                self.chunks[f.chunk] = chunk
            self.tokens_left -= grow
            extra -= grow

    def _admit(self) -> HoldReason | None:
        """Admit from the head of the line; the reason the next one waits, if one does."""
        limit, at_limit = self._admit_limit()
        for i, head in enumerate(self.view.waiting):
            if i == limit:
                return at_limit
            if head.n > len(self.free_left) + len(self.retained_left):
                return "slots"
            if self.tokens_left <= 0:
                return "tokens"
            reuse = self.config.prefix_reuse and not head.prompt_logprobs
            prefix = self._prefix_for(head.prompt_tokens, head.tenant) if reuse else None
            home = _find(self.retained_left, prefix.donor_slot) if prefix else None
            taken = None
            if (home is not None and prefix is not None and self.free_left
                    and prefix.n_tokens < len(home.tokens)):
                taken = self._take(head, home, keep_donor=True)
            if taken is None:
                taken = self._take(head, home, keep_donor=False)
            if taken is None:
                return "kv"  # head-of-line waits for blocks; order is kept
            slots, free, retained, evict, kv_after = taken
            if not self.budget.may_admit(self._load(), head):
                return "step_budget"
            self.free_left, self.retained_left = free, retained
            self.held_tokens += head.n * len(head.prompt_tokens)
            self.kv = kv_after
            if prefix is not None and prefix.donor_slot == slots[0]:
                self.kept.append((slots[0], head.prompt_tokens, prefix.n_tokens, head.tenant))
            n_fed = prefix.n_tokens if prefix else 0
            self.admissions.append(Admission(head.request_id, slots[0], head.reserve_tokens,
                                             prefix, tuple(slots[1:]), tuple(evict)))
            self._prefill(slots[0], len(head.prompt_tokens), n_fed, head.prompt_logprobs,
                          head.first_token_due_s)
        return None

    def _take(self, head: WaitingSeq, home: RetainedSeq | None, *, keep_donor: bool
              ) -> _Taken | None:
        """The slots ``head`` takes, the free and retained slots left, the retained slots
        evicted for its KV, and the KV counts after it; None when its budget does not fit.
        ``home``: the retained donor of its prefix. With ``keep_donor`` the prefix is
        copied out of it into a free slot and it stays retained, since it holds more than
        the part the request shares (None when that leaves too few slots, or the request's
        blocks need the donor's); else the request is admitted into it, which keeps the
        prefix in place."""
        free, retained = list(self.free_left), list(self.retained_left)
        slots: list[int] = []
        pinned: list[RetainedSeq] = []
        if home is not None:
            retained.remove(home)
            if keep_donor:
                pinned.append(home)
            else:
                slots.append(home.slot)  # admitted into the donor: kept in place
        if len(slots) + len(free) + len(retained) < head.n:
            return None  # the donor is the slot its choices need
        while len(slots) < head.n:
            slots.append(free.pop(0) if free else retained.pop(0).slot)
        evict: list[int] = []
        while (kv_after := self._kv_after(head, [*retained, *pinned])) is None:
            lent = [r for r in retained if r.kv_blocks]
            if not lent:
                return None
            retained.remove(lent[0])
            evict.append(lent[0].slot)
            free.append(lent[0].slot)  # cleared: a free slot from now on
        if pinned:  # still retained, in its place in the least-recently-used order
            left = {id(r) for r in [*retained, *pinned]}
            retained = [r for r in self.retained_left if id(r) in left]
        return slots, free, retained, evict, kv_after

    def _kv_after(self, head: WaitingSeq, retained: Sequence[RetainedSeq]) -> KVSnapshot | None:
        """The plan's KV counts once ``head`` reserves its budget in each of its ``n``
        slots, or None if that does not fit beside the blocks ``retained`` fill."""
        kv = self.kv
        lent = sum(r.kv_blocks for r in retained)
        check = replace(kv, free_blocks=max(0, kv.free_blocks - lent))
        for _ in range(head.n):
            if not check.can_allocate(head.reserve_tokens):
                return None
            check = check.after_reserving(head.reserve_tokens)
            kv = kv.after_reserving(head.reserve_tokens)
        return kv

    def _admit_limit(self) -> tuple[int, HoldReason]:
        """How many requests this plan may admit by slots and batching mode, and the reason
        given to a request past that limit."""
        view, mode = self.view, self.config.mode
        idle = len(view.free_slots) + len(view.retained)
        if not idle:
            return 0, "slots"
        if mode == "continuous":
            return idle, "slots"
        if view.running:
            return 0, "mode"  # static and serial admit only into an empty engine
        if mode == "serial":
            return 1, "mode"
        wake = static_wakeup_s(self.config, 0, view.waiting[0] if view.waiting else None)
        full = sum(w.n for w in view.waiting) >= idle  # every slot is idle
        ready = full or wake is None or view.now >= wake
        return (idle, "slots") if ready else (0, "mode")

    def _prefix_for(self, prompt: Sequence[int], tenant: str) -> PrefixCopy | None:
        """The longest prefix of ``prompt`` a donor of ``tenant`` holds (any donor with
        ``share_prefix_across_tenants``), leaving one prompt token to feed for logits:
        retained slots not yet handed out (most recently used first), then slots kept in
        place earlier in this plan, then the running sequences' fed tokens; the first wins
        a tie.

        A request admitted earlier in this plan by a copy is no better donor: what it has
        it copied from a donor that offers at least as long a prefix and comes first."""
        limit = len(prompt) - 1
        if limit < self.config.min_prefix_tokens:
            return None
        donors: list[tuple[int, Sequence[int], int, str]] = [
            (r.slot, r.tokens, len(r.tokens), r.tenant) for r in reversed(self.retained_left)]
        donors += self.kept
        donors += [(r.slot, r.tokens, r.n_fed, r.tenant) for r in self.view.running]
        shared = self.config.share_prefix_across_tenants
        best_len, best_slot = 0, -1
        for slot, tokens, n_held, owner in donors:
            if not shared and owner != tenant:
                continue
            n = common_prefix_tokens(prompt, tokens, min(limit, n_held))
            if n > best_len:
                best_len, best_slot = n, slot
        if best_len == 0 or best_len < self.config.min_prefix_tokens:
            return None
        return PrefixCopy(best_slot, best_len)


@dataclass(slots=True)
class _Feed:
    """A prompt this plan feeds: its slot, length, the tokens fed before this step, its
    chunk cap, and this step's chunk (its index in the plan's chunks and its tokens; None
    and 0 while it has none)."""

    slot: int
    n_prompt: int
    n_fed: int
    cap: int
    all_logits: bool
    due_s: float | None
    chunk: int | None = None
    n_tokens: int = 0


_Taken = tuple[list[int], list[int], list[RetainedSeq], list[int], KVSnapshot]
"""An admission's slots, the free and retained slots left, its evictions, the KV after."""


def _find(retained: Sequence[RetainedSeq], slot: int) -> RetainedSeq | None:
    return next((r for r in retained if r.slot == slot), None)
