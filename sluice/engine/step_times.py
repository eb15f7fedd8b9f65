"""Step times by what the step fed: a cumulative tally the engine keeps as it runs.

The linear step-time model (``sluice.policy.step.step_cost``) is what the engine plans with;
this is the measurement beside it, for whoever needs more than a line: llama.cpp's decode
steps are not linear in their decodes on a few cores (Gemma 3 270M on 2 cores: 16 / 32 /
42 / 44 / 54 / 57 ms at 1 to 6), and a simulator charging a line is 25-35 % fast where
open-loop load runs. Steps are grouped by their decodes and whether they fed prompt
tokens: key ``"3"`` is a step of three decodes and nothing else, ``"3+prefill"`` three
decodes beside a prefill chunk (``"0+prefill"``: a prefill alone); a step whose decodes
carried drafted tokens (``sluice.policy.step.speculation``) has ``"+draft"`` after that
(``"3+draft"``, ``"3+prefill+draft"``). Each bucket keeps its step count, total seconds,
total prompt tokens, total context (the KV positions its decodes attended to: whether a
bucket's time moves with its context can be read off), and total drafted and accepted
tokens, never a window, so two snapshots taken around a run give exactly that run's
steps by difference (``minus``).

A step's seconds are the engine's cycle (``ContinuousEngine._learn``): from the end of
the previous step to the end of this one, what a running sequence waits between tokens.

A simulator's cost file holds such a difference (``to_json``): a window of the engine's
recent steps is what a prediction of the next minutes is made from (``recent``), since
a shared machine's step speed moves by 10-20 % between runs minutes apart.

Invariant: at most ``4 * (slots + 1)`` buckets (decodes never exceed the sequence
slots); ``observe`` is a dict lookup and a few additions (it runs every step).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class StepBucket:
    """The steps of one (decodes, prefill or not) kind, summed."""

    steps: int
    seconds: float
    prefill_tokens: int = 0
    context_tokens: int = 0
    draft_tokens: int = 0
    """Drafted tokens its steps verified."""
    accepted_tokens: int = 0
    """Of those, the ones the model agreed with."""

    @property
    def mean_s(self) -> float:
        return self.seconds / self.steps if self.steps else 0.0


_EMPTY = StepBucket(0, 0.0)


def bucket_key(decode_tokens: int, prefill_tokens: int, draft_tokens: int = 0) -> str:
    """``"<decodes>"``, then ``"+prefill"`` if it fed prompt tokens, then ``"+draft"`` if
    it verified drafted tokens."""
    key = f"{decode_tokens}+prefill" if prefill_tokens > 0 else str(decode_tokens)
    return f"{key}+draft" if draft_tokens > 0 else key


class StepTimes:
    """The running tally (owned by one engine; ``snapshot`` is an immutable copy)."""

    def __init__(self) -> None:
        self._buckets: dict[str, list[float]] = {}

    def observe(self, decode_tokens: int, prefill_tokens: int, seconds: float,
                context_tokens: int = 0, draft_tokens: int = 0,
                accepted_tokens: int = 0) -> None:
        """One step (non-finite or non-positive times are ignored, as the step model's)."""
        if not 0.0 < seconds < float("inf"):
            return
        b = self._buckets.get(key := bucket_key(decode_tokens, prefill_tokens, draft_tokens))
        if b is None:
            b = self._buckets[key] = [0, 0.0, 0, 0, 0, 0]
        b[0] += 1
        b[1] += seconds
        b[2] += prefill_tokens
        b[3] += context_tokens
        b[4] += draft_tokens
        b[5] += accepted_tokens

    def snapshot(self) -> dict[str, StepBucket]:
        return {k: StepBucket(int(b[0]), b[1], int(b[2]), int(b[3]), int(b[4]), int(b[5]))
                for k, b in self._buckets.items()}


def minus(after: Mapping[str, StepBucket], before: Mapping[str, StepBucket]
          ) -> dict[str, StepBucket]:
    """The steps counted in ``after`` and not in ``before`` (a later snapshot of the same
    tally), buckets that gained none left out."""
    out = {}
    for key, a in after.items():
        b = before.get(key, _EMPTY)
        if a.steps > b.steps:
            out[key] = StepBucket(a.steps - b.steps, a.seconds - b.seconds,
                                  a.prefill_tokens - b.prefill_tokens,
                                  a.context_tokens - b.context_tokens,
                                  a.draft_tokens - b.draft_tokens,
                                  a.accepted_tokens - b.accepted_tokens)
    return out


def plus(a: Mapping[str, StepBucket], b: Mapping[str, StepBucket]) -> dict[str, StepBucket]:
    """Two windows' steps together (buckets summed)."""
    out = dict(a)
    for key, y in b.items():
        out[key] = _add(out.get(key, _EMPTY), y)
    return out


def _add(x: StepBucket, y: StepBucket) -> StepBucket:
    return StepBucket(x.steps + y.steps, x.seconds + y.seconds,
                      x.prefill_tokens + y.prefill_tokens, x.context_tokens + y.context_tokens,
                      x.draft_tokens + y.draft_tokens, x.accepted_tokens + y.accepted_tokens)


def recent(windows: Sequence[Mapping[str, StepBucket]], min_steps: int
           ) -> dict[str, StepBucket]:
    """A rolling table from consecutive windows of steps, oldest first: each bucket sums
    the newest windows, going back one window at a time while it holds fewer than
    ``min_steps`` steps (all windows if it never does). A bucket the machine ran often
    lately is its latest speed; a rare one borrows older steps rather than being left
    out."""
    out: dict[str, StepBucket] = {}
    for key in {k for w in windows for k in w}:
        total = _EMPTY
        for window in reversed(windows):
            if key in window:
                total = _add(total, window[key])
                if total.steps >= min_steps:
                    break
        out[key] = total
    return out


def to_json(tally: Mapping[str, StepBucket]) -> dict[str, dict[str, Any]]:
    """A tally as ``/status.json`` and cost files hold it (``{key: {steps, seconds,
    prefill_tokens, context_tokens}}``, and ``draft_tokens`` and ``accepted_tokens`` in a
    ``+draft`` bucket), ordered by decodes, each bucket's mean added for reading."""
    def order(key: str) -> tuple[int, str]:
        return int(key.split("+")[0]), key

    def entry(b: StepBucket) -> dict[str, Any]:
        out: dict[str, Any] = {"steps": b.steps, "seconds": round(b.seconds, 6),
                               "prefill_tokens": b.prefill_tokens,
                               "context_tokens": b.context_tokens}
        if b.draft_tokens:
            out["draft_tokens"] = b.draft_tokens
            out["accepted_tokens"] = b.accepted_tokens
        out["mean_ms"] = round(b.mean_s * 1000, 2)
        return out
    return {k: entry(b) for k, b in sorted(tally.items(), key=lambda kv: order(kv[0]))}


def from_json(raw: Mapping[str, Mapping[str, Any]]) -> dict[str, StepBucket]:
    """The inverse of ``to_json`` (extra keys such as ``mean_ms`` ignored)."""
    return {str(k): StepBucket(int(v["steps"]), float(v["seconds"]),
                               int(v.get("prefill_tokens", 0)), int(v.get("context_tokens", 0)),
                               int(v.get("draft_tokens", 0)), int(v.get("accepted_tokens", 0)))
            for k, v in raw.items()}
