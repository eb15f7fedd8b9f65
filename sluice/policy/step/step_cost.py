"""The cost of one continuous-batching step: seconds per forward pass as a function of what
it feeds. One model for the engine's step budget (TPOT targets), the TTFT predictor, and
the simulator, so that all three predict the same step.

A step's time is modelled as linear in its contents::

    step_s = base_s + per_decode_token_s * decode_tokens
                    + per_prefill_token_s * prefill_tokens
                    + per_context_token_s * context_tokens

where ``decode_tokens`` is the number of sequences decoding one token, ``prefill_tokens``
the prompt tokens fed, and ``context_tokens`` the KV positions the step's tokens attend to
(the sum of the decoding sequences' lengths; attention grows with it). Bare llama.cpp
decode steps of Gemma 3 270M on 2 cores (12 / 42 / 61 / 115 ms at batch 1 / 8 / 16 / 32)
fit this within about 15 %.

``StepCost`` is the fitted model (a value: JSON in, JSON out); ``fit_step_cost`` fits one
to samples by least squares with non-negative coefficients; ``OnlineStepCost`` learns one
from the steps the engine runs (a sliding window of recent samples, refitted every few
observations). Pure: no clocks, no threads; callers pass the measured seconds.
"""

from __future__ import annotations

import json
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np


@dataclass(frozen=True, slots=True)
class StepSample:
    """One measured step."""

    decode_tokens: int
    prefill_tokens: int
    seconds: float
    context_tokens: int = 0


@dataclass(frozen=True, slots=True)
class StepCost:
    """Predicted seconds per step; every coefficient is >= 0, so a step never costs less
    for feeding more."""

    base_s: float
    per_decode_token_s: float
    per_prefill_token_s: float
    per_context_token_s: float = 0.0

    def __post_init__(self) -> None:
        for name, value in asdict(self).items():
            if not value >= 0.0:  # also refuses NaN
                raise ValueError(f"StepCost.{name} must be >= 0, got {value}")

    def predict_s(self, decode_tokens: int, prefill_tokens: int = 0,
                  context_tokens: int = 0) -> float:
        """Seconds for a step feeding ``decode_tokens`` decodes and ``prefill_tokens``
        prompt tokens, attending to ``context_tokens`` KV positions."""
        return (self.base_s + self.per_decode_token_s * decode_tokens
                + self.per_prefill_token_s * prefill_tokens
                + self.per_context_token_s * context_tokens)

    def prefill_room_tokens(self, step_s: float, decode_tokens: int,
                            context_tokens: int = 0) -> int:
        """The most prompt tokens a step with ``decode_tokens`` decodes can add and still
        take at most ``step_s`` seconds (0 if the decodes alone take longer)."""
        spare_s = step_s - self.predict_s(decode_tokens, 0, context_tokens)
        if spare_s <= 0:
            return 0
        if self.per_prefill_token_s == 0:
            return 1 << 30
        return int(spare_s / self.per_prefill_token_s)

    def to_json(self) -> dict[str, float]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> StepCost:
        return cls(base_s=float(data["base_s"]),
                   per_decode_token_s=float(data["per_decode_token_s"]),
                   per_prefill_token_s=float(data["per_prefill_token_s"]),
                   per_context_token_s=float(data.get("per_context_token_s", 0.0)))

    def save(self, path: Path) -> None:
        path.write_text(json.dumps(self.to_json(), indent=2) + "\n")

    @classmethod
    def load(cls, path: Path) -> StepCost:
        return cls.from_json(json.loads(path.read_text()))


DEFAULT_STEP_COST = StepCost(base_s=0.010, per_decode_token_s=0.003,
                             per_prefill_token_s=0.0005, per_context_token_s=0.0)
"""A rough prior for a small model on a few CPU cores (Gemma 3 270M on 2 cores: 12 ms at
batch 1, 115 ms at batch 32), used until a profile is given or the online fit takes over."""


MIN_PREFILL_SPAN_TOKENS = 8
"""The fewest prompt tokens between the samples' smallest and largest prefill for the fit to
learn the per-prompt-token cost from them (below it, the fallback's is kept): more than
the one to three tokens of steps that start restored prompts, fewer than one short
prompt (a prompt's start-up then counts in its tokens' cost, as it does in its step)."""


def fit_step_cost(samples: Iterable[StepSample], *, with_context: bool = True,
                  fallback: StepCost | None = None, prior_weight: float = 0.0) -> StepCost:
    """Least-squares fit with every coefficient >= 0 (a feature whose free fit is negative
    is dropped and the rest refitted: an active-set NNLS on at most four columns).

    A feature that never varies in the samples cannot be fitted: its coefficient is taken
    from ``fallback`` (its contribution subtracted before fitting the rest), or is 0 and
    absorbed into the base when there is none. So is the prompt-token feature when the
    samples' prompts span fewer than ``MIN_PREFILL_SPAN_TOKENS`` (with a ``fallback``):
    steps that start a request after one prompt token (its prefix restored or copied) carry
    the request's start-up work, which a per-token slope fitted on them alone would charge
    to every prompt token (tens of ms a token, against about 3). Raises ``ValueError`` on
    no samples.

    ``prior_weight`` > 0 (with a ``fallback``) is a ridge towards the fallback: each
    fitted coefficient's typical contribution (its RMS feature value times it, in seconds)
    is pulled to the fallback's as if by that many samples. Samples that barely vary
    (every step at one batch size) fix only the step time there, not how it splits
    between the base and the per-token terms; without the pull, a split fitted to noise
    (say 140 ms + 1.5 ms a sequence from steps of 20 at 170 ms) predicts any smaller
    batch far too slow. With it, the samples decide what they determine and the fallback
    the rest; with varied samples its pull is ``prior_weight`` against their number."""
    rows = [(1.0, s.decode_tokens, s.prefill_tokens, s.context_tokens, s.seconds)
            for s in samples]
    if not rows:
        raise ValueError("fit_step_cost needs at least one sample")
    if prior_weight < 0:
        raise ValueError(f"prior_weight must be >= 0, got {prior_weight}")
    data = np.asarray(rows, dtype=np.float64)
    x, y = data[:, :4], data[:, 4].copy()
    coef = np.zeros(4)
    candidates = [1, 2, 3] if with_context else [1, 2]
    active = [0]
    for j in candidates:
        span = np.ptp(x[:, j])
        if span > 0 and not (j == 2 and fallback is not None
                             and span < MIN_PREFILL_SPAN_TOKENS):
            active.append(j)
        elif fallback is not None:
            coef[j] = _coefficients(fallback)[j]
            y -= coef[j] * x[:, j]
    if prior_weight > 0 and fallback is not None:
        # one pseudo-row per coefficient: sqrt(w) * scale_j * (c_j - prior_j) = 0
        scale = np.sqrt(np.mean(x * x, axis=0)) * np.sqrt(prior_weight)
        ridge = np.diag(scale)
        x = np.vstack([x, ridge])
        y = np.concatenate([y, scale * np.asarray(_coefficients(fallback))])
    while active:
        solution, *_ = np.linalg.lstsq(x[:, active], y, rcond=None)
        negative = [j for j, c in zip(active, solution, strict=True) if c < 0]
        if not negative:
            coef[active] = solution
            break
        worst = min(negative, key=lambda j: solution[active.index(j)])
        active.remove(worst)
    return StepCost(*(float(max(c, 0.0)) for c in coef))


def _coefficients(cost: StepCost) -> tuple[float, float, float, float]:
    return (cost.base_s, cost.per_decode_token_s, cost.per_prefill_token_s,
            cost.per_context_token_s)


PRIOR_WEIGHT = 0.5
"""Samples' worth of pull towards the prior in each online refit (see ``fit_step_cost``):
small against a window of hundreds of varied steps, decisive only where the steps leave
the split between base and per-token cost open."""


class OnlineStepCost:
    """A ``StepCost`` learned from the steps as they run.

    Keeps the last ``window`` samples and refits every ``refit_every`` observations, so a
    change in the machine's speed is followed within a window; each refit is pulled
    towards the prior by ``prior_weight`` samples' worth. Until ``min_samples`` have
    been seen, ``current()`` is the ``prior`` (a profiled file, or a rough default).

    Invariant: memory is bounded by ``window`` samples; ``current()`` never raises."""

    def __init__(self, prior: StepCost, *, window: int = 512, refit_every: int = 32,
                 min_samples: int = 32, prior_weight: float = PRIOR_WEIGHT) -> None:
        if window < 1 or refit_every < 1 or min_samples < 1:
            raise ValueError("window, refit_every and min_samples must be >= 1")
        self._prior = prior
        self._prior_weight = prior_weight
        self._current = prior
        self._samples: deque[StepSample] = deque(maxlen=window)
        self._refit_every = refit_every
        self._min_samples = min_samples
        self._since_fit = 0

    def observe(self, sample: StepSample) -> None:
        """Record one measured step (non-finite or non-positive times are ignored)."""
        if not (0.0 < sample.seconds < float("inf")):
            return
        self._samples.append(sample)
        self._since_fit += 1
        if len(self._samples) >= self._min_samples and self._since_fit >= self._refit_every:
            self._since_fit = 0
            self._current = fit_step_cost(self._samples, fallback=self._prior,
                                          prior_weight=self._prior_weight)

    def current(self) -> StepCost:
        """The model to predict with now."""
        return self._current

    @property
    def samples_seen(self) -> int:
        return len(self._samples)
