"""When would a new generative request get its first token? A prediction from the waiting
line and the step-time model, for refusing at once what would miss its TTFT deadline.

The engine runs up to ``concurrency`` sequences at once, each getting one token per decode
step of ``decode_step_s``. A slot frees when its sequence has generated its remaining
tokens (``max_tokens`` less those generated: an upper bound, since EOS or a stop string
may end it sooner, so the prediction errs towards refusing). The waiting line takes free
slots in its order; each holds its slot for its prefill plus its whole budget of decode
steps. The new request takes the slot after them and gets its first token at the end of
the step that feeds its prompt (that step's logits give the first token): one step with
its prompt beside the decodes of the sequences holding the other slots then (those running
now if a slot is free now, else every other slot: it starts as one frees), so an idle
engine answers after one prefill step, not after a full-width decode step too. This is
the event simulation of that (a min-heap of slot release times), O(line × log
concurrency). A prompt with a first-token target is fed whole in that step when the
TPOT budget's pace would hold it back (``TpotBudget.hurry_tokens``); a prompt longer than
the token budget or the chunk cap is fed over several steps, each with the decodes'
time: not counted.

Pure: no clocks; times are seconds from now.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass

from sluice.policy.step.step_cost import StepCost


def request_start_by_s(deadline_s: float | None, ttft_deadline_s: float | None,
                       first_token_s: float | None) -> float | None:
    """The time past which it is no use starting a request or letting it wait on: its
    deadline, or its first-token deadline while no token has come, whichever is earlier;
    ``None`` when neither applies. One rule for the server's and the simulator's requests."""
    ttft = ttft_deadline_s if first_token_s is None else None
    if ttft is None or (deadline_s is not None and deadline_s < ttft):
        return deadline_s
    return ttft


@dataclass(frozen=True, slots=True)
class LineEntry:
    """A request ahead of the new one, running or waiting."""

    prompt_tokens: int
    """Prompt tokens still to feed (0 once its prefill is done)."""
    tokens_left: int
    """Tokens it may still generate (each of its ``n`` choices, which run side by side)."""
    n: int = 1
    """Slots it holds (its choices)."""


@dataclass(frozen=True, slots=True)
class TtftPrediction:
    """The predicted first-token time of a new request, and the numbers behind it."""

    ttft_s: float
    """Seconds from now to its first token."""
    start_wait_s: float
    """Seconds from now until a slot is free for it."""
    decode_step_s: float
    concurrency: int


def max_concurrency(cost: StepCost, step_limit_s: float | None, slots: int,
                    context_tokens_per_seq: float) -> int:
    """How many sequences may decode at once: the most (up to ``slots``) whose decode step,
    each attending to ``context_tokens_per_seq`` positions, stays within ``step_limit_s``
    (at least 1; ``slots`` without a limit)."""
    if step_limit_s is None:
        return max(1, slots)
    best = 1
    for n in range(1, slots + 1):
        if cost.predict_s(n, 0, int(n * context_tokens_per_seq)) > step_limit_s:
            break
        best = n
    return best


def line_first_tokens_s(cost: StepCost, *, concurrency: int, context_tokens_per_seq: float,
                        running: Sequence[LineEntry],
                        waiting: Sequence[LineEntry]) -> list[tuple[float, float]]:
    """Each waiting entry's (slot start, first token), seconds from now, when up to
    ``concurrency`` sequences run at once behind ``running`` (holding slots) and the
    entries ahead of it in ``waiting`` (in order): the event simulation of the module."""
    concurrency = max(1, concurrency)
    step_s = cost.predict_s(concurrency, 0, int(concurrency * context_tokens_per_seq))
    per_prefill = cost.per_prefill_token_s
    releases: list[float] = []
    for entry in running:
        done_s = entry.prompt_tokens * per_prefill + entry.tokens_left * step_s
        releases.extend([done_s] * entry.n)
    free = concurrency - len(releases)
    releases.extend([0.0] * max(0, free))
    heapq.heapify(releases)
    out: list[tuple[float, float]] = []
    for entry in waiting:
        n = min(entry.n, concurrency)
        start_s = max(_take(releases) for _ in range(n))
        # its prefill step decodes beside it the sequences holding slots then: those
        # running now when a slot is free at once, else (it starts as a slot frees) a
        # full engine
        width = concurrency - n
        decodes = width if start_s > 0 else min(width, sum(1 for t in releases if t > 0))
        prefill_step_s = cost.predict_s(decodes, entry.prompt_tokens,
                                        int(decodes * context_tokens_per_seq))
        out.append((start_s, start_s + prefill_step_s))
        done_s = start_s + entry.prompt_tokens * per_prefill + entry.tokens_left * step_s
        for _ in range(n):
            heapq.heappush(releases, done_s)
    return out


def predict_ttft(cost: StepCost, *, concurrency: int, context_tokens_per_seq: float,
                 running: Sequence[LineEntry], waiting: Sequence[LineEntry],
                 new_prompt_tokens: int, new_n: int = 1) -> TtftPrediction:
    """The first-token time of a request with a ``new_prompt_tokens`` prompt arriving now,
    behind ``running`` (holding slots) and ``waiting`` (in line, in order)."""
    concurrency = max(1, concurrency, new_n)
    step_s = cost.predict_s(concurrency, 0, int(concurrency * context_tokens_per_seq))
    line = [*waiting, LineEntry(new_prompt_tokens, 0, new_n)]
    start_s, ttft_s = line_first_tokens_s(cost, concurrency=concurrency,
                                          context_tokens_per_seq=context_tokens_per_seq,
                                          running=running, waiting=line)[-1]
    return TtftPrediction(ttft_s, start_s, step_s, concurrency)


def _take(releases: list[float]) -> float:
    """The earliest slot release (the heap holds at least one per slot)."""
    return heapq.heappop(releases)
