"""N-gram speculation: drafts from a sequence's own text, and how many of them a step
verifies.

A decode step at a small batch reads every weight of the model to compute a handful of
tokens; feeding a few more positions of one sequence in the same pass costs little more.
When the text a sequence is writing repeats text it already holds (a rewrite, a quote,
an edit of its prompt), the tokens that followed the latest earlier occurrence of its
last few tokens are a good guess at what comes next (prompt lookup decoding, llama.cpp's
``ngram-simple``): the engine feeds them after the sequence's decode token, reads the
model's choice after each, and keeps the longest prefix the model agrees with.

- ``NgramIndex``: the per-sequence index over prompt + output. ``propose(k)`` finds the
  latest earlier occurrence of the last ``n`` tokens (``n`` from ``max_n`` down to
  ``min_n``, the longest match wins) and returns up to ``k`` tokens that followed it.
- ``AcceptanceRate``: a sequence's measured share of drafted tokens accepted, smoothed
  towards a prior and decayed so that it follows the text as it changes.
- ``choose_draft_lengths``: each sequence's draft length for one step, from the step-time
  model (``sluice.policy.step.step_cost``), the acceptance rates and the step's time limit.

The choice. A draft token ``j`` of a sequence whose drafts are accepted with probability
``a`` each yields a token with probability ``a ** j`` (every draft before it must be
accepted too) and costs what the step-time model charges for one more token with a
logits row: ``per_decode_token_s`` plus its attention over the sequence's context. The
step as planned yields ``E`` tokens in ``T`` seconds; one more draft token is worth
adding when ``a ** j / cost > E / T`` -- when it raises the step's expected tokens per
second -- and while no stream's expected time per token passes the step's limit (the TPOT
target's), or the plain step's time where that is past the limit already: a sequence that
takes one token this step waits the whole step, a drafting one the step over its expected
tokens. So a lone sequence drafts even when one plain step is longer than the target
(drafting only shortens its time per token), while one that would slow its neighbours
past the target does not. Candidates are
taken best first (highest ``a ** j / cost``), so the rule stops at the first that does
not pay. At a small batch ``T`` is mostly the step's fixed cost and drafting pays even at
modest acceptance; as the batch grows the step becomes compute-bound, ``E / T`` approaches
``1 / per_decode_token_s`` and no draft accepted with probability below 1 beats it: the
lengths fall to 0 by themselves.

Pure: no clocks, no model. The engine owns one index and one rate per sequence; the step
planner (``sluice.policy.step.step_planner``) calls ``choose_draft_lengths``.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from sluice.policy.step.step_cost import StepCost

DEFAULT_MAX_NGRAM = 3
"""Longest suffix looked up (llama.cpp's prompt lookup and HF's default match 1-3)."""
DEFAULT_DRAFT_MAX_TOKENS = 16
"""The most tokens one sequence drafts in a step (llama-server's ``--draft-max``)."""


class NgramIndex:
    """The n-grams of one sequence's tokens (prompt + output), by where they last ended.

    Invariant: ``tokens`` only grows (the caller appends, never changes or removes); after
    ``_catch_up``, ``_last_end[g]`` is the largest ``e < len(tokens)`` with
    ``tokens[e - len(g):e] == g`` for every gram ``g`` of ``min_n .. max_n`` tokens, i.e.
    the latest occurrence that is not the sequence's current suffix itself. Memory is
    ``O((max_n - min_n + 1) * len(tokens))``; each appended token costs that many dict
    writes, each ``propose`` that many lookups."""

    def __init__(self, tokens: Sequence[int], *, max_n: int = DEFAULT_MAX_NGRAM,
                 min_n: int = 1) -> None:
        if not 1 <= min_n <= max_n:
            raise ValueError(f"n-gram sizes must satisfy 1 <= min_n <= max_n, got "
                             f"min_n={min_n}, max_n={max_n}")
        self.tokens = tokens
        """The sequence's tokens: read, never written (the engine's own list)."""
        self.max_n = max_n
        self.min_n = min_n
        self._last_end: dict[tuple[int, ...], int] = {}
        self._indexed_to = 0
        """Every gram ending at or before this position is in ``_last_end``."""

    def _catch_up(self) -> None:
        tokens = self.tokens
        top = len(tokens) - 1  # the gram ending at len(tokens) is the suffix: not indexed
        for end in range(self._indexed_to + 1, top + 1):
            for n in range(self.min_n, min(self.max_n, end) + 1):
                self._last_end[tuple(tokens[end - n:end])] = end
        self._indexed_to = max(self._indexed_to, top)

    def propose(self, k: int) -> tuple[int, ...]:
        """Up to ``k`` tokens that followed the latest earlier occurrence of the longest
        suffix (``max_n`` down to ``min_n`` tokens) that occurred before; ``()`` when no
        suffix did or ``k`` < 1. The proposal may run into the suffix itself (a repeated
        token proposes itself again)."""
        if k < 1:
            return ()
        self._catch_up()
        tokens = self.tokens
        size = len(tokens)
        for n in range(min(self.max_n, size - 1), self.min_n - 1, -1):
            end = self._last_end.get(tuple(tokens[size - n:]))
            if end is not None:
                return tuple(tokens[end:min(end + k, size)])
        return ()


@dataclass(slots=True)
class AcceptanceRate:
    """A sequence's chance that a drafted token is accepted, given the drafts before it
    were: accepted drafts over verified ones (a draft after the first rejected one is not
    verified), smoothed by ``prior_weight`` verified drafts at ``prior`` and decayed by
    ``decay`` per verified draft (a memory of about ``1 / (1 - decay)`` drafts).

    ``idle()`` (a step the sequence had a proposal but drafted nothing) decays the
    evidence alone, so a rate that stopped drafting drifts back towards the prior and the
    sequence probes again now and then rather than never.

    Invariant: ``0 < rate < 1``."""

    prior: float = 0.7
    """Where a sequence starts: optimistic enough that a first draft pays at batch 1 on a
    step model whose per-token cost is as large as its fixed cost (the threshold there is
    ``per_decode / (base + per_decode)``, 0.5), so a sequence that copies its prompt
    starts drafting; one whose drafts fail falls below within a few."""
    prior_weight: float = 2.0
    decay: float = 0.9
    idle_decay: float = 0.99
    accepted: float = 0.0
    verified: float = 0.0

    def __post_init__(self) -> None:
        if not 0.0 < self.prior < 1.0:
            raise ValueError(f"prior must be in (0, 1), got {self.prior}")
        if not self.prior_weight > 0:
            raise ValueError(f"prior_weight must be > 0, got {self.prior_weight}")
        for name in ("decay", "idle_decay"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"{name} must be in [0, 1], got {getattr(self, name)}")

    @property
    def rate(self) -> float:
        return ((self.accepted + self.prior * self.prior_weight)
                / (self.verified + self.prior_weight))

    def observe(self, drafted: int, accepted: int) -> None:
        """A step verified ``drafted`` tokens and the model agreed with the first
        ``accepted`` of them (``0 <= accepted <= drafted``)."""
        if not 0 <= accepted <= drafted:
            raise ValueError(f"accepted ({accepted}) must be within 0..drafted ({drafted})")
        if drafted == 0:
            return
        verified = accepted + (1 if accepted < drafted else 0)
        keep = self.decay ** verified
        self.accepted = self.accepted * keep + accepted
        self.verified = self.verified * keep + verified

    def idle(self) -> None:
        """A step in which the sequence could have drafted and did not."""
        self.accepted *= self.idle_decay
        self.verified *= self.idle_decay


@dataclass(frozen=True, slots=True)
class DraftCandidate:
    """One decoding sequence that has a proposal."""

    max_tokens: int
    """Drafted tokens it may verify at most (its proposal's length)."""
    acceptance: float
    """Its acceptance rate (``AcceptanceRate.rate``), in [0, 1)."""
    context_tokens: int
    """KV positions each of its drafted tokens attends to (its fed tokens)."""


@dataclass(frozen=True, slots=True)
class DraftBudget:
    """What drafting may spend in one step: the step-time model it is priced on, and the
    longest step to plan (the TPOT budget's limit; ``None``: no limit but the tokens)."""

    cost: StepCost
    step_limit_s: float | None = None

    def __post_init__(self) -> None:
        if self.step_limit_s is not None and not self.step_limit_s > 0:
            raise ValueError(f"step_limit_s must be > 0, got {self.step_limit_s!r}")


@dataclass(frozen=True, slots=True)
class PlannedStep:
    """The step before drafting, as the step-time model prices it."""

    decode_tokens: int
    prefill_tokens: int
    context_tokens: int
    output_tokens: int
    """Tokens the step yields without drafts (its chunks that want logits)."""


def draft_token_s(cost: StepCost, context_tokens: int) -> float:
    """Seconds one drafted token adds to a step: a token with a logits row (as a decode)
    attending to ``context_tokens`` positions."""
    return cost.per_decode_token_s + cost.per_context_token_s * context_tokens


def choose_draft_lengths(budget: DraftBudget, step: PlannedStep,
                         candidates: Sequence[DraftCandidate],
                         token_room: int) -> tuple[int, ...]:
    """Each candidate's draft length for this step (in candidate order, each within
    ``0 .. max_tokens``, together at most ``token_room``): drafted tokens are added best
    first while each raises the step's expected tokens per second and no decoding
    sequence's expected time per token passes ``max(budget.step_limit_s, plain step)``
    (see the module docstring). ``step.decode_tokens`` counts every decoding sequence,
    the candidates among them."""
    lengths = [0] * len(candidates)
    if token_room <= 0 or not candidates:
        return tuple(lengths)
    cost = budget.cost
    step_s = cost.predict_s(step.decode_tokens, step.prefill_tokens, step.context_tokens)
    expected = float(step.output_tokens)
    limit_s = math.inf if budget.step_limit_s is None else budget.step_limit_s
    bound_s = max(limit_s, step_s)
    yields = [1.0] * len(candidates)  # each candidate's expected tokens this step
    # decoding sequences that take exactly one token this step (none of their drafts yet)
    single = max(0, step.decode_tokens - len(candidates)) + len(candidates)
    heap: list[tuple[float, int, float, float]] = []  # (-value per s, index, gain, seconds)

    def push(i: int) -> None:
        c = candidates[i]
        if lengths[i] >= c.max_tokens or not 0.0 < c.acceptance < 1.0:
            return
        gain = c.acceptance ** (lengths[i] + 1)
        seconds = draft_token_s(cost, c.context_tokens)
        value = gain / seconds if seconds > 0 else math.inf
        heapq.heappush(heap, (-value, i, gain, seconds))

    for i in range(len(candidates)):
        push(i)
    room = token_room
    while heap and room > 0:
        _, i, gain, seconds = heapq.heappop(heap)
        # worth it only if it raises expected tokens per second: gain / s > E / T
        if gain * step_s <= expected * seconds:
            break  # the best remaining candidate does not pay, so none does
        single_after = single - (lengths[i] == 0)
        slowest_s = step_s + seconds  # what a sequence taking one token waits
        if not single_after:  # every stream drafts: the least expected tokens wait most
            slowest_s /= min(y + gain if k == i else y for k, y in enumerate(yields))
        if slowest_s > bound_s:
            continue  # it would slow a stream past the limit: this sequence drafts no more
        lengths[i] += 1
        yields[i] += gain
        single = single_after
        step_s += seconds
        expected += gain
        room -= 1
        push(i)
    return tuple(lengths)


@dataclass(slots=True)
class _Arm:
    """Measured output tokens per second of one kind of step, smoothed."""

    rate: float = 0.0
    samples: int = 0

    def observe(self, tokens_per_s: float, alpha: float) -> None:
        self.rate = tokens_per_s if self.samples == 0 else (
            (1.0 - alpha) * self.rate + alpha * tokens_per_s)
        self.samples += 1


@dataclass(frozen=True, slots=True)
class GateArms:
    """The draft gate at one decode batch size, as the status page shows it."""

    batch: int
    """Decoding sequences of the steps measured."""
    plain_tokens_per_s: float | None
    """Smoothed output tokens per second of its steps that verified no drafts (None:
    none measured)."""
    draft_tokens_per_s: float | None
    """The same of its steps that verified drafts (None: none measured)."""
    drafting: bool
    """The arm the gate takes at this size outside its exploration turns
    (``DraftGate.prefers_drafting``)."""


@dataclass(slots=True)
class DraftGate:
    """The measured check on the priced rule: per decode batch size, the output tokens per
    second of the steps that verified drafts and of those that did not, as the engine's
    cycles measured them (host work between passes included, which the step-time model
    does not price). Drafting is allowed at a batch size while its measured rate is at
    least the plain one's; the arm that loses is still taken every ``explore_every``-th
    decision at that size, so a change in the text or the host can turn the choice back.

    Why: ``choose_draft_lengths`` prices a draft on the step-time model, which is fitted on
    whole steps; where the model is off (drafts' logits rows, the verification and KV trims
    on the host), drafting at a batch of 8 ran 0.8x of not drafting on a 2-core host. With
    the gate, ``speculation = "auto"`` can cost no more than its exploration.

    Invariant: at each batch size ``allow`` answers False until the plain arm has
    ``min_samples`` steps (plain steps are what drafting must beat), then True until the
    drafting arm has them, then the arm measured faster except on every
    ``explore_every``-th turn. Pure: the caller passes what it measured."""

    explore_every: int = 16
    min_samples: int = 4
    alpha: float = 0.125
    _draft: dict[int, _Arm] = field(default_factory=dict)
    _plain: dict[int, _Arm] = field(default_factory=dict)
    _turns: dict[int, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.explore_every < 2 or self.min_samples < 1 or not 0.0 < self.alpha <= 1.0:
            raise ValueError(f"explore_every >= 2, min_samples >= 1 and alpha in (0, 1] "
                             f"required, got {self.explore_every}, {self.min_samples}, "
                             f"{self.alpha}")

    def _measured(self, arms: dict[int, _Arm], batch: int) -> bool:
        arm = arms.get(batch)
        return arm is not None and arm.samples >= self.min_samples

    def prefers_drafting(self, batch: int) -> bool:
        """Whether steps at ``batch`` decoding sequences draft outside exploration turns:
        not before the plain arm is measured (plain steps are what drafting must beat),
        then until the drafting arm is measured (to measure it), then while drafting's
        measured rate is at least the plain one's. Pure."""
        if not self._measured(self._plain, batch):
            return False
        if not self._measured(self._draft, batch):
            return True
        return self._draft[batch].rate >= self._plain[batch].rate

    def allow(self, batch: int) -> bool:
        """May the next step at ``batch`` decoding sequences draft? Once both arms are
        measured, each call is a turn, and every ``explore_every``-th takes the losing
        arm."""
        wins = self.prefers_drafting(batch)
        if not (self._measured(self._plain, batch) and self._measured(self._draft, batch)):
            return wins
        turn = self._turns.get(batch, 0) + 1
        self._turns[batch] = turn
        return (not wins) if turn % self.explore_every == 0 else wins

    def observe(self, batch: int, drafted: bool, tokens: int, seconds: float) -> None:
        """A step at ``batch`` decoding sequences (no prompt fed) yielded ``tokens`` output
        tokens in ``seconds``; ``drafted``: it verified drafts."""
        if batch < 1 or not seconds > 0:
            return
        arms = self._draft if drafted else self._plain
        arms.setdefault(batch, _Arm()).observe(tokens / seconds, self.alpha)

    def state(self) -> tuple[GateArms, ...]:
        """Each batch size with a measured step, smallest first: both arms' measured
        tokens/s and the arm it prefers. Pure (no exploration turn is taken)."""
        return tuple(
            GateArms(b, self._plain[b].rate if b in self._plain else None,
                     self._draft[b].rate if b in self._draft else None,
                     self.prefers_drafting(b))
            for b in sorted({*self._draft, *self._plain}))
