"""Step times by what the step fed: a cumulative tally the engine keeps as it runs.

The linear step-time model (``sluice.policy.step_cost``) is what the engine plans with;
this is the measurement beside it, for whoever needs more than a line: llama.cpp's decode
steps are not linear in their decodes on a few cores (Gemma 3 270M on 2 cores: 16 / 32 /
42 / 44 / 54 / 57 ms at 1 to 6), and a simulator charging a line is 25-35 % fast where
open-loop load runs. Steps are grouped by their decodes and whether they fed prompt
tokens: key ``"3"`` is a step of three decodes and nothing else, ``"3+prefill"`` three
decodes beside a prefill chunk (``"0+prefill"``: a prefill alone). Each bucket keeps
its step count, total seconds and total prompt tokens, never a window, so two snapshots
taken around a run give exactly that run's steps by difference (``minus``).

A step's seconds are the engine's cycle (``ContinuousEngine._learn``): from the end of
the previous step to the end of this one, what a running sequence waits between tokens.

Invariant: at most ``2 * (slots + 1)`` buckets (decodes never exceed the sequence
slots); ``observe`` is a dict lookup and three additions (it runs every step).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class StepBucket:
    """The steps of one (decodes, prefill or not) kind, summed."""

    steps: int
    seconds: float
    prefill_tokens: int = 0

    @property
    def mean_s(self) -> float:
        return self.seconds / self.steps if self.steps else 0.0


def bucket_key(decode_tokens: int, prefill_tokens: int) -> str:
    """``"<decodes>"`` or ``"<decodes>+prefill"``."""
    return f"{decode_tokens}+prefill" if prefill_tokens > 0 else str(decode_tokens)


class StepTimes:
    """The running tally (owned by one engine; ``snapshot`` is an immutable copy)."""

    def __init__(self) -> None:
        self._buckets: dict[str, list[float]] = {}

    def observe(self, decode_tokens: int, prefill_tokens: int, seconds: float) -> None:
        """One step (non-finite or non-positive times are ignored, as the step model's)."""
        if not 0.0 < seconds < float("inf"):
            return
        b = self._buckets.get(key := bucket_key(decode_tokens, prefill_tokens))
        if b is None:
            b = self._buckets[key] = [0, 0.0, 0]
        b[0] += 1
        b[1] += seconds
        b[2] += prefill_tokens

    def snapshot(self) -> dict[str, StepBucket]:
        return {k: StepBucket(int(b[0]), b[1], int(b[2])) for k, b in self._buckets.items()}


def minus(after: Mapping[str, StepBucket], before: Mapping[str, StepBucket]
          ) -> dict[str, StepBucket]:
    """The steps counted in ``after`` and not in ``before`` (a later snapshot of the same
    tally), buckets that gained none left out."""
    out = {}
    for key, a in after.items():
        b = before.get(key, StepBucket(0, 0.0, 0))
        if a.steps > b.steps:
            out[key] = StepBucket(a.steps - b.steps, a.seconds - b.seconds,
                                  a.prefill_tokens - b.prefill_tokens)
    return out
