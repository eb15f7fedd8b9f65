"""How many sequences decode at once: the TPOT target's width, widened when the waiting
line would otherwise miss its first-token targets.

The TPOT budget (``sluice.policy.step.tpot_budget``) keeps every planned step within
``margin × tpot_target_s``; alone, it queues whatever does not fit, with no limit on how
long the line waits for a first token (32 closed-loop clients of a 16-wide budget wait
half a minute each). ``plan_width`` makes the TPOT target soft: it binds while the waiting
requests still get their first tokens by their first-token targets; when they would not,
the planner widens the batch past the budget, to the width the step-time model says
gets the most requests within **both** targets, and among those the narrowest (the least
TPOT spent for them). A request meets the TPOT target at a width whose predicted cycle is
within ``tpot_target_s`` itself (the margin is slack for noise, spent only under this
pressure): the predicted decode step times the measured cycle ratio (``cycle_ratio``, the
mean over recent spans of the real inter-token cycle over the predicted step,
``TpotMargin.mean_ratio``; 1 while unmeasured or below 1), so a step-time model that runs
short on this host does not widen the batch into a TPOT that no request then meets. It
meets its first-token target when the line's event simulation (``line_first_tokens_s``)
gives it a first token by then. When no width keeps any request within the TPOT target (the
model is slower than the target even alone), the planner takes the width with the most
tokens/s. A request that is late at the chosen width is refused on arrival with a computed
Retry-After (the engine's and the simulator's ``refusal``), so the line never grows without
bound.

Reasons (``WidthPlan.reason``, shown in ``/status.json``):

- ``no_target``: the model sets no TPOT target: every slot;
- ``tpot``: the TPOT budget's width (nothing waits, every waiting request is on time at
  it, or widening would put no more within both targets);
- ``ttft``: widened past the budget to start waiting requests by their first-token
  targets, within the TPOT target;
- ``throughput``: no width meets the TPOT target: the width with the most tokens/s.

Pure: no clocks; times are seconds from now. The engine and the simulator both call
``engine_width`` on their state (one rule, so the two cannot drift).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from sluice.policy.step.kv_blocks import KVBlockAllocator
from sluice.policy.step.step_cost import StepCost
from sluice.policy.step.tpot_budget import TpotBudget
from sluice.policy.step.ttft import (
    LineEntry,
    TtftPrediction,
    line_first_tokens_s,
    max_concurrency,
)

WidthReason = Literal["no_target", "tpot", "ttft", "throughput"]


@dataclass(frozen=True, slots=True)
class WidthPlan:
    """How wide the next steps may run, and the numbers that justified it."""

    concurrency: int
    """Sequences the step budget lets decode at once."""
    step_limit_s: float | None
    """The longest decode step planned (None: no TPOT target)."""
    reason: WidthReason
    tpot_concurrency: int
    """The width within the TPOT budget (``margin × tpot_target_s``)."""
    waiting: int
    """Waiting requests the plan looked at."""
    on_time: int
    """Of those, the ones predicted to get a first token by their target at this width
    (a request without a target counts as on time)."""
    within_both: int
    """Running and waiting requests predicted within both targets at this width."""
    step_s: float
    """The predicted decode step at this width."""


def plan_width(cost: StepCost, *, tpot_target_s: float | None, margin: float, slots: int,
               context_tokens_per_seq: float, running: Sequence[LineEntry],
               waiting: Sequence[LineEntry], ttft_left_s: Sequence[float | None],
               cycle_ratio: float | None = None) -> WidthPlan:
    """The width for the next steps; ``ttft_left_s[i]``: seconds until ``waiting[i]``'s
    first-token target (None: it has none); ``cycle_ratio``: measured cycle over predicted
    step (None: unmeasured). ``slots`` >= 1 bounds every width."""
    if len(ttft_left_s) != len(waiting):
        raise ValueError("ttft_left_s needs one entry per waiting request")
    slots = max(1, slots)

    def step_at(c: int) -> float:
        return cost.predict_s(c, 0, int(c * context_tokens_per_seq))

    if tpot_target_s is None:
        return WidthPlan(slots, None, "no_target", slots, len(waiting), len(waiting),
                         len(running) + len(waiting), step_at(slots))
    budget_limit_s = TpotBudget(cost, tpot_target_s, margin).step_limit_s
    cycle_per_step = max(1.0, cycle_ratio or 1.0)
    target_s = tpot_target_s  # a float from here on, inside the closure too

    def meets_tpot(c: int) -> bool:
        return step_at(c) * cycle_per_step <= target_s

    base = max_concurrency(cost, budget_limit_s, slots, context_tokens_per_seq)

    def on_time_at(c: int) -> int:
        if not any(t is not None for t in ttft_left_s):
            return len(waiting)
        firsts = line_first_tokens_s(cost, concurrency=c,
                                     context_tokens_per_seq=context_tokens_per_seq,
                                     running=running, waiting=waiting)
        return sum(1 for (_, first), left in zip(firsts, ttft_left_s, strict=True)
                   if left is None or first <= left)

    def plan(c: int, reason: WidthReason, on_time: int, both: int) -> WidthPlan:
        limit = budget_limit_s if c == base else max(budget_limit_s, step_at(c))
        return WidthPlan(c, limit, reason, base, len(waiting), on_time, both, step_at(c))

    everyone = len(running) + len(waiting)
    base_on_time = on_time_at(base)
    if meets_tpot(base):
        if base_on_time == len(waiting):
            return plan(base, "tpot", base_on_time, everyone)
        best_c, best_on_time = base, base_on_time
        c = base + 1
        while c <= slots and meets_tpot(c):
            on_time = on_time_at(c)
            if on_time > best_on_time:
                best_c, best_on_time = c, on_time
                if on_time == len(waiting):
                    break  # the narrowest width with everyone on time
            c += 1
        reason: WidthReason = "tpot" if best_c == base else "ttft"
        return plan(best_c, reason, best_on_time, len(running) + best_on_time)
    # not even the budget's width meets the TPOT target: the most tokens/s
    fastest = max(range(1, slots + 1), key=lambda c: (c / step_at(c), -c))
    if base_on_time == len(waiting) or fastest <= base:
        return plan(base, "tpot", base_on_time, 0)
    return plan(fastest, "throughput", on_time_at(fastest), 0)


def engine_slots(n_seq_max: int, kv: KVBlockAllocator, reserve_tokens: int) -> int:
    """Sequences of ``reserve_tokens`` KV each that one engine can hold at once (>= 1)."""
    return min(n_seq_max, max(1, kv.total_blocks // max(1, kv.blocks_needed(reserve_tokens))))


def engine_width(cost: StepCost, *, tpot_target_s: float | None, margin: float,
                 n_seq_max: int, kv: KVBlockAllocator, running: Sequence[LineEntry],
                 held_tokens: Sequence[int], waiting: Sequence[LineEntry],
                 ttft_left_s: Sequence[float | None],
                 cycle_ratio: float | None = None) -> WidthPlan:
    """``plan_width`` for one engine's state, as the engine and the simulator both ask it:
    the slots its KV pool holds at the largest waiting request's ``prompt + max_tokens``;
    each sequence attends to the mean of ``held_tokens`` (the KV positions the running
    sequences hold; the waiting prompts' mean when none runs)."""
    if held_tokens:
        context = sum(held_tokens) / len(held_tokens)
    else:
        context = sum(w.prompt_tokens for w in waiting) / len(waiting) if waiting else 0.0
    reserve = max((w.prompt_tokens + w.tokens_left for w in waiting), default=1)
    return plan_width(cost, tpot_target_s=tpot_target_s, margin=margin,
                      slots=engine_slots(n_seq_max, kv, reserve),
                      context_tokens_per_seq=context, running=running, waiting=waiting,
                      ttft_left_s=ttft_left_s, cycle_ratio=cycle_ratio)


def arrival_due_s(ttft_target_s: float | None, ttft_deadline_s: float | None,
                  now: float, *, line_busy: bool) -> float | None:
    """The first-token time a request reaching an engine at ``now`` is judged against, for
    the refusal on arrival (the engine's and the simulator's): its first-token deadline,
    and its first-token target while that is still ahead and the engine has other work
    (``line_busy``: sequences running or waiting). The soft target sheds what this
    engine's line would make late, so it refuses nothing when the lateness is not the
    line's: a target already passed on arrival (the model was loading, or the request
    queued before the engine), or an engine with nothing else to do (a host slower than
    the target serves a lone request late rather than not at all). None: nothing to
    judge."""
    target = (ttft_target_s if line_busy and ttft_target_s is not None
              and ttft_target_s > now else None)
    due = [t for t in (target, ttft_deadline_s) if t is not None]
    return min(due) if due else None


def predict_engine_ttft(cost: StepCost, *, tpot_target_s: float | None, n_seq_max: int,
                        kv: KVBlockAllocator, running: Sequence[LineEntry],
                        held_tokens: Sequence[int], waiting: Sequence[LineEntry],
                        prompt_tokens: int, n: int, max_tokens: int, margin: float,
                        waiting_ttft_left_s: Sequence[float | None] | None = None,
                        ttft_left_s: float | None = None,
                        cycle_ratio: float | None = None) -> TtftPrediction:
    """The first-token time of a request (``prompt_tokens``, ``n`` choices, ``max_tokens``)
    joining one engine's line now, as the engine and the simulator both ask it: at the
    width ``engine_width`` plans for the line with it at the end (``waiting_ttft_left_s``
    and ``ttft_left_s``: the line's and its own first-token targets; without them, the
    TPOT budget's width: the most sequences whose step stays within ``margin ×
    tpot_target_s``, all the slots without a target)."""
    line = [*waiting, LineEntry(prompt_tokens, max_tokens, n)]
    lefts = [*(waiting_ttft_left_s or [None] * len(waiting)), ttft_left_s]
    width = engine_width(cost, tpot_target_s=tpot_target_s, margin=margin,
                         n_seq_max=n_seq_max, kv=kv, running=running,
                         held_tokens=held_tokens or [prompt_tokens], waiting=line,
                         ttft_left_s=lefts, cycle_ratio=cycle_ratio)
    concurrency = max(1, width.concurrency, n)
    context = (sum(held_tokens) / len(held_tokens)) if held_tokens else float(prompt_tokens)
    start_s, first_s = line_first_tokens_s(cost, concurrency=concurrency,
                                           context_tokens_per_seq=context, running=running,
                                           waiting=line)[-1]
    step_s = cost.predict_s(concurrency, 0, int(concurrency * context))
    return TtftPrediction(first_s, start_s, step_s, concurrency)


__all__ = ["WidthPlan", "WidthReason", "arrival_due_s", "engine_slots", "engine_width",
           "plan_width", "predict_engine_ttft"]
