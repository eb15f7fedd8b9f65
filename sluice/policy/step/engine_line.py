"""One engine's line as its width plan and its TTFT prediction see it, and the two
decisions taken on it: the step budget of the next plan (``step_budget``) and the refusal
of an arrival whose first token is predicted late (``late_start``). Both the server's
engine (``sluice.engine.continuous``) and the simulator's (``sluice.sim.engine``) build an
``EngineLine`` from their own sequences and ask these functions, so they budget and refuse
alike. Pure: time is an argument.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from sluice.policy.queues.admission import clamp_retry_after
from sluice.policy.step.kv_blocks import KVBlockAllocator
from sluice.policy.step.step_cost import StepCost
from sluice.policy.step.step_data import TOKENS_ONLY, StepBudget
from sluice.policy.step.tpot_budget import TpotBudget
from sluice.policy.step.ttft import LineEntry, TtftPrediction
from sluice.policy.step.width import WidthPlan, arrival_due_s, engine_width, predict_engine_ttft

MIN_RETRY_AFTER_S = 1.0
MAX_RETRY_AFTER_S = 60.0
"""The Retry-After of a first-token refusal stays within these."""


@dataclass(frozen=True, slots=True)
class EngineLine:
    """The running sequences (and held fork slots), the KV positions the running ones
    hold, the waiting line, and each waiting request's seconds until its first token is
    due (None: no target or deadline)."""

    running: list[LineEntry]
    held_tokens: list[int]
    waiting: list[LineEntry]
    waiting_left_s: list[float | None]


def running_entry(n_prompt: int, n_fed: int, max_tokens: int, generated: int) -> LineEntry:
    """A running sequence in the line: the prompt it has still to feed and the tokens it
    may still generate."""
    return LineEntry(max(0, n_prompt - n_fed), max(0, max_tokens - generated))


def left_s(due_s: float | None, now: float) -> float | None:
    """Seconds until a first token is due (None: none is)."""
    return None if due_s is None else due_s - now


@dataclass(frozen=True, slots=True)
class EngineShape:
    """What an engine's decisions on its line read besides the line: the step-time model,
    the TPOT target, its slots and KV pool, and the margin and cycle ratio learned so far
    (``TpotMargin``)."""

    cost: StepCost
    tpot_target_s: float | None
    n_seq_max: int
    kv: KVBlockAllocator
    margin: float
    cycle_ratio: float | None = None
    """Measured inter-token cycle over predicted step (None: not yet measured)."""

    def predict_ttft(self, line: EngineLine, prompt_tokens: int, n: int, max_tokens: int,
                     ttft_left_s: float | None = None) -> TtftPrediction:
        """When a request joining the end of ``line`` now gets its first token."""
        return predict_engine_ttft(
            self.cost, tpot_target_s=self.tpot_target_s, n_seq_max=self.n_seq_max,
            kv=self.kv, running=line.running, held_tokens=line.held_tokens,
            waiting=line.waiting, prompt_tokens=prompt_tokens, n=n, max_tokens=max_tokens,
            margin=self.margin, waiting_ttft_left_s=line.waiting_left_s,
            ttft_left_s=ttft_left_s, cycle_ratio=self.cycle_ratio)


def step_budget(shape: EngineShape, continuous: bool, line: Callable[[], EngineLine],
                waiting: bool) -> tuple[StepBudget, WidthPlan | None]:
    """The step budget of the next plan: the token budget alone without a TPOT target
    (or in static mode); the TPOT target alone with nothing waiting (the width decides
    nothing then); else within the step limit of the width ``engine_width`` plans for
    ``line()``, which is returned with it."""
    if shape.tpot_target_s is None or not continuous:
        return TOKENS_ONLY, None
    if not waiting:
        return TpotBudget(shape.cost, shape.tpot_target_s, shape.margin), None
    ln = line()
    width = engine_width(shape.cost, tpot_target_s=shape.tpot_target_s, margin=shape.margin,
                         n_seq_max=shape.n_seq_max, kv=shape.kv, running=ln.running,
                         held_tokens=ln.held_tokens, waiting=ln.waiting,
                         ttft_left_s=ln.waiting_left_s, cycle_ratio=shape.cycle_ratio)
    return TpotBudget(shape.cost, shape.tpot_target_s, shape.margin,
                      limit_s=width.step_limit_s), width


@dataclass(frozen=True, slots=True)
class LateStart:
    """An arrival refused because its first token is predicted late."""

    ttft: TtftPrediction
    due_s: float
    """The first-token time it was judged against (``arrival_due_s``)."""
    retry_after_s: float
    """When the line ahead will have drained enough (clamped)."""


def late_start(shape: EngineShape, line: Callable[[], EngineLine], *, prompt_tokens: int,
               n: int, max_tokens: int, ttft_target_s: float | None,
               ttft_deadline_s: float | None, arrival_s: float, now: float,
               line_busy: bool) -> LateStart | None:
    """For a request arriving at an engine whose first token is due (a target or a
    deadline, ``arrival_due_s``) and predicted late even at the widest width the engine
    would plan with it at the end of ``line()``: the prediction and a Retry-After; else
    None (admit it)."""
    due = arrival_due_s(ttft_target_s, ttft_deadline_s, now, line_busy=line_busy)
    if due is None:
        return None
    ttft = shape.predict_ttft(line(), prompt_tokens, n, max_tokens, due - now)
    if now + ttft.ttft_s <= due:
        return None
    retry_s = clamp_retry_after(ttft.ttft_s - (due - arrival_s), MIN_RETRY_AFTER_S,
                                MAX_RETRY_AFTER_S)
    return LateStart(ttft, due, retry_s)
