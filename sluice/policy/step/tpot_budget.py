"""A step budget from a latency target: how many sequences decode at once, and how long a
prefill chunk may be, follow the predicted step time against the model's TPOT target.

``TpotBudget`` is a ``StepBudget`` (``sluice.policy.step.step_data``) built on the step-time
model (``sluice.policy.step.step_cost``). Every running sequence gets one token per step, so
its time per output token is the step time; the budget keeps the predicted step within
``margin × tpot_target_s``:

- **admission**: a waiting request (``n`` choices) starts only if a decode step of every
  slot-holding sequence plus its ``n``, attending to the KV they will hold once their
  prompts are fed, is predicted within the target. An engine with nothing running always
  admits one (a lone sequence is as fast as it can be; refusing it would serve no one).
- **prefill chunks**: a step's prompt tokens are cut to what fits in the target beside its
  decodes. A step with no decodes has no TPOT to protect (no limit beyond the token
  budget); a step whose decodes already fill the target still feeds ``min_prefill_tokens``
  so that admitted prompts always progress (a bounded overshoot, never a stall).
- **first tokens first** (``hurry_tokens``): that pace binds only the prompts without a
  first-token target, and a prompt with one whose first token it would still bring by
  its due time and in the step after this one. Any other prompt with a target is fed
  now, with every prompt fed before it, past the TPOT target (within the token budget
  and chunk caps): the TPOT target is soft against a first-token target, as
  ``sluice.policy.step.width`` makes it for the batch width. Pacing a prompt does not
  lower the running sequences' mean time per output token (the same prompt tokens are
  fed while they decode, a few a step or all in one), it only smooths their token gaps;
  its cost, the first token held back step after step, falls on one request's wait.

The margin is learned from the measured error (``sluice.policy.step.tpot_margin``); the fixed
``DEFAULT_MARGIN`` is its prior. Pure: no clocks; the engine (and the simulator) builds
one per step from the current (learned) step cost and margin.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass

from sluice.policy.step.step_cost import StepCost
from sluice.policy.step.step_data import QueuedPrompt, StepLoad, WaitingSeq
from sluice.policy.step.tpot_margin import DEFAULT_MARGIN


@dataclass(frozen=True, slots=True)
class TpotBudget:
    """Keeps every step's predicted seconds within ``margin × tpot_target_s``."""

    cost: StepCost
    tpot_target_s: float
    margin: float = DEFAULT_MARGIN
    """Share of the target a planned step may take (``TpotMargin.margin()``)."""
    min_prefill_tokens: int = 16
    """Prompt tokens a step may feed even when its decodes fill the target (progress)."""
    limit_s: float | None = None
    """The longest step to plan when the width plan widened past the budget to start the
    waiting line by its first-token targets (``sluice.policy.step.width``); None: ``margin ×
    tpot_target_s``."""

    def __post_init__(self) -> None:
        if not (self.tpot_target_s > 0 and math.isfinite(self.tpot_target_s)):
            raise ValueError(f"tpot_target_s must be a finite number > 0, got "
                             f"{self.tpot_target_s!r}")
        if not 0 < self.margin <= 1:
            raise ValueError(f"margin must be in (0, 1], got {self.margin!r}")
        if self.limit_s is not None and not self.limit_s > 0:
            raise ValueError(f"limit_s must be > 0, got {self.limit_s!r}")
        if self.min_prefill_tokens < 1:
            raise ValueError(f"min_prefill_tokens must be >= 1, got {self.min_prefill_tokens}")

    @property
    def step_limit_s(self) -> float:
        """The longest step the budget plans."""
        return self.margin * self.tpot_target_s if self.limit_s is None else self.limit_s

    def prefill_room_tokens(self, load: StepLoad) -> int:
        if load.decode_tokens == 0:
            return sys.maxsize
        room = self.cost.prefill_room_tokens(self.step_limit_s, load.decode_tokens,
                                             load.context_tokens) - load.prefill_tokens
        if load.prefill_tokens == 0:
            room = max(room, self.min_prefill_tokens)
        return max(0, room)

    def hurry_tokens(self, load: StepLoad, queued: Sequence[QueuedPrompt]) -> int:
        """The prompt tokens, counted in feed order, up to the end of the last of
        ``queued`` with a due time whose first token, at this budget's pace, comes after
        it or after the next step: each later step feeds ``prefill_room_tokens`` at this
        step's decodes (at least ``min_prefill_tokens``) and takes the longer of
        ``step_limit_s`` and its predicted time; a prompt gets its first token at the end
        of the step that feeds its last token. 0 when no prompt is held back so, or when
        the step has no decodes (its room is then not limited)."""
        if load.decode_tokens == 0:
            return 0
        pace = max(self.min_prefill_tokens,
                   self.cost.prefill_room_tokens(self.step_limit_s, load.decode_tokens,
                                                 load.context_tokens))
        this_step_s = self.cost.predict_s(load.decode_tokens, load.prefill_tokens,
                                          load.context_tokens)
        later_step_s = max(self.step_limit_s, self.cost.predict_s(
            load.decode_tokens, pace, load.context_tokens))
        behind = need = 0
        for prompt in queued:
            behind += prompt.tokens_after_step
            if prompt.tokens_after_step == 0 or prompt.due_in_s is None:
                continue
            steps_after = math.ceil(behind / pace)
            if steps_after > 1 or this_step_s + steps_after * later_step_s > prompt.due_in_s:
                need = behind
        return need

    def may_admit(self, load: StepLoad, request: WaitingSeq) -> bool:
        if load.sequences == 0:
            return True
        return self.decode_step_s(load, request) <= self.step_limit_s

    def decode_step_s(self, load: StepLoad, request: WaitingSeq) -> float:
        """Predicted decode step once ``request`` runs beside the plan's sequences."""
        return self.cost.predict_s(
            load.sequences + request.n, 0,
            load.held_tokens + request.n * len(request.prompt_tokens),
        )
