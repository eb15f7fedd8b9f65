"""The engine's side of n-gram speculation: which sequences draft, each one's drafting
state, the greedy verification of a drafted chunk, and the counters.

Drafting is for greedy sequences only: temperature below ``MIN_TEMPERATURE`` and nothing
but the argmax between the logits and the token (no penalties, bias, grammar,
log-probabilities or thinking budget), so that verifying a draft is comparing it with
the argmax of the row before it. A greedy sequence's output is then token for token what
it would be without drafting: every token it takes is the argmax of a row computed over
exactly the tokens before it. Sampled sequences are never drafted (their output keeps
the sampling distribution because it is never speculated).

The policy (what to propose, how many to verify) is ``sluice.policy.step.speculation``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from sluice.engine.chooser import TokenChooser
from sluice.engine.request import SamplingParams
from sluice.engine.sampling import MIN_TEMPERATURE, sample_token
from sluice.policy.step.speculation import AcceptanceRate, GateArms, NgramIndex


def drafts_for(params: SamplingParams, chooser: TokenChooser, thinking: object | None) -> bool:
    """Whether a sequence with these parameters may draft: a greedy request that allows
    it, whose token is the raw row's argmax (a plain chooser, no thinking budget)."""
    greedy = not params.temperature >= MIN_TEMPERATURE  # as sample_token decides
    return params.speculation and greedy and chooser.plain and thinking is None


@dataclass(slots=True)
class SequenceDrafts:
    """One sequence's drafting state: its n-gram index over its tokens, its acceptance
    rate, and the proposal it showed the planner this step."""

    index: NgramIndex
    rate: AcceptanceRate = field(default_factory=AcceptanceRate)
    proposal: tuple[int, ...] = ()

    @classmethod
    def over(cls, tokens: Sequence[int]) -> SequenceDrafts:
        """Drafting state over a sequence's own (growing) token list."""
        return cls(NgramIndex(tokens))

    def propose(self, k: int) -> tuple[int, ...]:
        """This step's proposal of up to ``k`` tokens (kept for the chunk the plan builds)."""
        self.proposal = self.index.propose(k)
        return self.proposal


def greedy_verify(rows: np.ndarray, drafted: Sequence[int], params: SamplingParams,
                  chooser: TokenChooser) -> list[int]:
    """The tokens a greedy sequence takes from a drafted chunk: ``rows[i]`` is the logits
    row after the chunk's ``i``-th token (its decode token, then each drafted one). The
    argmax of row 0 is always taken; the argmax of row ``i`` only while the drafts before
    it were each the argmax of the row before them. Returns ``1 .. len(drafted) + 1``
    tokens; ``len(result) - 1`` drafts were accepted."""
    taken: list[int] = []
    for i in range(len(drafted) + 1):
        token = sample_token(rows[i], params, chooser.rng)  # the argmax, checked finite
        taken.append(token)
        if i == len(drafted) or token != drafted[i]:
            break
    return taken


@dataclass(frozen=True, slots=True)
class SpeculationState:
    """An engine's drafting counters (cumulative for this load of the model) and its last
    verifying step's, as the status page shows them (a value: each verifying step makes
    the next one with ``after``)."""

    mode: str = "auto"
    """The model's ``speculation`` setting."""
    draft_tokens: int = 0
    """Drafted tokens verified."""
    accepted_tokens: int = 0
    """Of those, the ones the model agreed with (each a token gained over plain decoding)."""
    verify_steps: int = 0
    """Steps that verified drafted tokens."""
    acceptance: float | None = None
    """``accepted_tokens / draft_tokens`` (``None`` before any draft)."""
    last_step_draft_tokens: int = 0
    last_step_accepted_tokens: int = 0
    draft_gate: tuple[GateArms, ...] = ()
    """Its draft gate's measured tokens/s of plain and drafting steps per decode batch
    size, and the arm it prefers (``DraftGate.state``): set when the worker publishes its
    state, since the gate measures every decode step, not only the verifying ones."""

    def after(self, drafted: int, accepted: int) -> SpeculationState:
        """The counters once a step verified ``drafted`` tokens and the model agreed with
        ``accepted`` of them."""
        total, kept = self.draft_tokens + drafted, self.accepted_tokens + accepted
        return SpeculationState(self.mode, total, kept, self.verify_steps + 1,
                                kept / total if total else None, drafted, accepted,
                                self.draft_gate)
