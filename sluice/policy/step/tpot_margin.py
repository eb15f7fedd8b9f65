"""The TPOT margin learned from the measured error: the share of the TPOT target a planned
step may take (``TpotBudget.margin``), from how the real inter-token cycle compares with
the step time the step-time model predicted for the same step.

The budget plans each step within ``margin × tpot_target_s`` of *predicted* time; what a
running sequence waits between tokens is the real cycle (the forward pass, host noise,
Python between passes, a model that lags a change in the host's speed). A request's TPOT
is the mean of its ~128 cycles, so a single step's tail averages out and what matters is
the ratio's *mean over a request's span* and how it drifts. ``TpotMargin`` keeps the
ratio of sums (Σ measured / Σ predicted: a request living through a span sees that mean)
of each of the last ``spans`` consecutive spans of ``span`` steps with decodes, and plans
with the worst of them::

    margin = clamp(1 / max(span ratios), floor, cap)

so a model that predicts steps 25 % short over a recent span lowers the margin to 0.8,
and one whose every recent span is within 1/cap keeps it at ``cap``. Its window (256
steps by default) is shorter than the step-time model's, so it follows a drift the
model's refit has not yet absorbed.

**The cap is the prior: a measured error only tightens the margin.** A learned margin
allowed above 0.85 (cap 0.97) was measured and failed at 32 clients:
the span ratio is measured at the concurrency the engine has been running, and the
linear step model underpredicts a larger one more (worst span 1.04-1.08 at 8 at once,
1.15-1.16 at 32). After 8 clients the margin rose to 0.92-0.96, the budget admitted all
32 of the next 32 clients, and their TPOT went to p50 155 / p95 177 ms (fixed 0.85: 128 /
142 ms, 23-27 at once); the ratio showed 1.16 only once they were running. So the
measurement lowers the margin when the host or the model is worse than the prior's 15 %
covers (a busy host), and the prior stays the most a step may plan with.

Invariants: until ``min_spans`` spans are complete the margin is ``prior`` (the fixed
0.85, ``DEFAULT_MARGIN``); it is always within [``floor``, ``cap``] (⊂ (0, 1]);
memory is ``spans`` ratios, and each call is O(``spans``). Pure: no clocks; callers pass
measured seconds.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

DEFAULT_MARGIN = 0.85
"""The prior share of the TPOT target a planned step may take (a cold engine, or one that
has not run enough steps with decodes to measure its error): a request's TPOT is the mean
of its steps, which scatter around the prediction (host noise, sampling work), so
planning at the target itself would put about half the requests over it."""

MARGIN_FLOOR = 0.6
"""The least share a measured error may lower the margin to: below it a wrong model
(say a prior from another machine) would starve the engine of concurrency, and the
step-time model's refit, not the margin, is what corrects a model that wrong."""

MARGIN_CAP = DEFAULT_MARGIN
"""The most share a calibrated model may plan with: the prior (see the module: a margin
learned above it admits into an error the engine has not run at yet)."""


@dataclass(frozen=True, slots=True)
class MarginState:
    """What ``/status.json`` shows of a model's margin."""

    margin: float
    """The share of the TPOT target a planned step may take now."""
    cycle_ratio: float | None
    """The worst recent span's measured cycle over predicted step (None while cold)."""
    steps: int
    """Steps with decodes in the window (complete spans and the one being filled)."""


class TpotMargin:
    """The TPOT margin from the recent ratio of measured cycle to predicted step."""

    def __init__(self, *, span: int = 64, spans: int = 4, min_spans: int = 2,
                 prior: float = DEFAULT_MARGIN, floor: float = MARGIN_FLOOR,
                 cap: float = MARGIN_CAP) -> None:
        if not (span >= 1 and 1 <= min_spans <= spans):
            raise ValueError(f"need span >= 1 and 1 <= min_spans <= spans; got span={span}, "
                             f"min_spans={min_spans}, spans={spans}")
        if not 0 < floor <= prior <= cap <= 1:
            raise ValueError(f"need 0 < floor <= prior <= cap <= 1; got {floor}, {prior}, {cap}")
        self.span = span
        self.min_spans = min_spans
        self.prior = prior
        self.floor = floor
        self.cap = cap
        self._spans: deque[float] = deque(maxlen=spans)
        """Each completed span's Σ measured / Σ predicted, oldest first."""
        self._predicted_s = 0.0
        self._measured_s = 0.0
        self._steps = 0
        """The span being filled: its sums and steps so far."""

    def observe(self, predicted_s: float, measured_s: float) -> None:
        """One step with decodes: the seconds the model predicted for its composition
        before it ran, and the cycle a running sequence waited (non-finite or
        non-positive values are ignored)."""
        if not (0 < predicted_s < math.inf and 0 < measured_s < math.inf):
            return
        self._predicted_s += predicted_s
        self._measured_s += measured_s
        self._steps += 1
        if self._steps == self.span:
            self._spans.append(self._measured_s / self._predicted_s)
            self._predicted_s = self._measured_s = 0.0
            self._steps = 0

    def cycle_ratio(self) -> float | None:
        """The worst completed recent span's Σ measured / Σ predicted; None while fewer
        than ``min_spans`` spans are complete."""
        if len(self._spans) < self.min_spans:
            return None
        return max(self._spans)

    def mean_ratio(self) -> float | None:
        """The mean of the completed recent spans' Σ measured / Σ predicted (what the width
        plan scales its predicted steps by: the worst span is the margin's, too noisy a
        scale for how wide to run); None while fewer than ``min_spans`` are complete."""
        if len(self._spans) < self.min_spans:
            return None
        return sum(self._spans) / len(self._spans)

    def margin(self) -> float:
        """The share of the TPOT target a planned step may take now."""
        ratio = self.cycle_ratio()
        if ratio is None:
            return self.prior
        return min(self.cap, max(self.floor, 1.0 / ratio))

    def state(self) -> MarginState:
        return MarginState(self.margin(), self.cycle_ratio(), len(self._spans) * self.span
                           + self._steps)


__all__ = ["DEFAULT_MARGIN", "MARGIN_CAP", "MARGIN_FLOOR", "MarginState", "TpotMargin"]
