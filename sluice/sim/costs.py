"""Cost models the simulator charges on its virtual clock, read from measurements.

Per model, one ``ModelCost``:

- one-shot models: seconds per batch of ``n`` (``batch_s``), from a profile of batch sizes
  (``sluice profile``'s ``batch_ms``, or a model's ``options.service_ms``), interpolated
  linearly between profiled sizes and extrapolated along the last segment past them;
  with a ``length_prior`` (``sluice profile``'s fit of how a batch's time grows with its
  longest input, the one the variant planner starts from), a batch whose longest input
  has ``L`` characters takes what the planner's ``ServiceEstimator`` predicts from that
  prior before it has seen a batch: the curve × its length factor at ``L`` for that
  batch size (a batch is padded to its longest member);
- generative models: a ``StepCost`` (``sluice.policy.step.step_cost``: the same linear step-time
  model the engine's TPOT budget uses), from a JSON file fitted by a profiling run; and,
  where a model's decode steps are not linear in the sequences they decode (llama.cpp on
  a few cores: measured 16 / 31 / 42 / 44 / 54 / 57 ms at 1 to 6 decodes), measured
  tables the simulator charges instead of the line: the engine's own tally of its steps
  (``step_times``, as ``/status.json`` publishes it: ``{"3": {"steps", "seconds",
  "prefill_tokens"}, "3+prefill": ...}``, see ``sluice.engine.step_times``), read as a
  decode-step table (steps that fed no prompt, by decodes) and a table of what feeding
  a prompt adds to a step (by decodes: the mean time of steps that fed one less the
  decode table's time, at their mean prompt tokens; with no decodes, the whole step),
  each from buckets of at least ``MIN_BUCKET_STEPS`` steps; or an older
  ``decode_step_ms`` (``{decodes: ms}``) alone. The decode table is interpolated like
  ``batch_ms``; the prefill table linearly between measured decode counts and flat past
  them (a few prefill buckets are measured: extrapolating their slope has no ground),
  and a step's prompt tokens above (below) the table's mean cost ``per_prefill_token_s``
  each more (less);
- one-shot models with an ``estimate`` (``sluice costs`` takes it from a live server's
  ``/status.json``: ``ServiceEstimator.state`` per variant): the batch times that
  server's planner predicted, the profile × its learned drift (faster or slower than
  the profile) with its length fit: the estimator's own code, restored;
- every model: its load time in seconds, and the latency a request spends outside the
  workers (``overhead_ms``: HTTP, tokenization, streaming; measured by the profile, it adds
  to latency but occupies no worker).

Where they come from, first match wins: a costs file given to the simulator (``--costs``,
JSON ``{model_id: {"load_s", "batch_ms" | "service_ms", "step_cost", "step_times" |
"decode_step_ms", "overhead_ms", "cv", "draft_acceptance"}}``; ``draft_acceptance`` is read
by ``sluice.sim.setup``),
or a ``sluice profile`` result (``variants.*.model`` / ``batch_ms`` / ``length``); then the
model's own options (``service_ms``, ``length_prior``, ``step_cost`` as an object or a
path to a JSON file, ``load_s``); then the
synthetic backend's cost options (its own model of time, which is one more such file);
else ``ValueError`` naming the model, since a guess would make every prediction wrong.
"""

from __future__ import annotations

import bisect
import json
import math
import random
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from sluice.policy.step.step_cost import StepCost
from sluice.policy.variants.service_estimator import LengthPrior, ServiceEstimator


@dataclass(frozen=True)
class ModelCost:
    """Service, step and load times of one model (seconds)."""

    def jitter(self, rng: random.Random) -> float:
        """A factor for one step's or batch's time: 1.0 when ``cv`` is 0, else a
        lognormal draw with mean 1 and coefficient of variation ``cv``."""
        if self.cv <= 0:
            return 1.0
        sigma2 = math.log1p(self.cv * self.cv)
        return rng.lognormvariate(-sigma2 / 2, math.sqrt(sigma2))

    load_s: float
    batch_sizes: tuple[int, ...] = ()
    """Profiled one-shot batch sizes, ascending (empty for generative models)."""
    batch_times_s: tuple[float, ...] = ()
    step: StepCost | None = None
    """Generative models: seconds per continuous-batching step."""
    overhead_s: float = 0.0
    """Latency each request spends outside the workers (HTTP parsing, tokenization,
    streaming back): added to its time in the system, not to any worker's busy time."""
    decode_sizes: tuple[int, ...] = ()
    """Decodes per step of a measured decode-step table, ascending (empty: linear)."""
    decode_times_s: tuple[float, ...] = ()
    prefill_sizes: tuple[int, ...] = ()
    """Decodes per step of a measured table of what feeding prompt tokens adds to a step."""
    prefill_times_s: tuple[float, ...] = ()
    """Seconds feeding a prompt added to a step of that many decodes (at 0 decodes: the
    step's whole time)."""
    prefill_mean_tokens: tuple[float, ...] = ()
    """The prompt tokens those steps fed, on average (the table's time is at these)."""
    length_prior: LengthPrior | None = None
    """One-shot: how a batch's time grows with its longest input (None: it does not)."""
    estimate: Mapping[str, Any] | None = field(default=None, compare=False)
    """One-shot: what a live server's service estimator had learned
    (``ServiceEstimator.state``: its drift from the profile, faster or slower, and its
    length fit), so batches take what that server's planner predicted for them."""
    _by_length: ServiceEstimator | None = field(default=None, init=False, repr=False,
                                                compare=False)
    """The planner's service model of the profile, the prior and the ``estimate``, never
    updated (so a pure function of batch size and length): what ``batch_s`` charges
    with a prior or an estimate."""
    cv: float = 0.0
    """Coefficient of variation of a step's (or batch's) time around the model's mean:
    each draws a lognormal factor with mean 1 and this spread (0: every step as
    predicted). A shared machine's steps have a tail; queues near saturation grow with it."""

    def __post_init__(self) -> None:
        for name in ("load_s", "overhead_s", "cv"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        # batches hold at least one request; a step table may have a 0-decode entry
        for what, sizes, times, least in (
                ("batch", self.batch_sizes, self.batch_times_s, 1),
                ("decode", self.decode_sizes, self.decode_times_s, 0),
                ("prefill", self.prefill_sizes, self.prefill_times_s, 0)):
            if list(sizes) != sorted(set(sizes)) or any(b < least for b in sizes):
                raise ValueError(f"{what} sizes must be distinct, >= {least}, ascending: "
                                 f"{sizes}")
            if len(sizes) != len(times) or any(not t >= 0 for t in times):
                raise ValueError(f"{what} times must be one >= 0 per size: {times}")
        if self.length_prior is not None or self.estimate is not None:
            if not self.batch_sizes:
                raise ValueError("a length prior or estimate needs a one-shot batch profile")
            estimator = ServiceEstimator(
                dict(zip(self.batch_sizes, self.batch_times_s, strict=True)),
                length_prior=self.length_prior)
            if self.estimate is not None:
                estimator.restore(self.estimate)
            object.__setattr__(self, "_by_length", estimator)
        if len(self.prefill_mean_tokens) != len(self.prefill_sizes):
            raise ValueError("prefill_mean_tokens must have one entry per prefill size")
        if (self.decode_sizes or self.prefill_sizes) and self.step is None:
            raise ValueError("a step table needs a step cost (its prefill term)")

    def batch_s(self, n: int, longest_chars: int = 0) -> float:
        """Seconds for a one-shot batch of ``n`` (linear between and past profiled sizes)
        whose longest input has ``longest_chars`` characters (0: unknown, the curve)."""
        if not self.batch_sizes:
            raise ValueError("no batch profile: this is not a one-shot model's cost")
        if self._by_length is not None and (longest_chars > 0 or self.estimate is not None):
            return self._by_length.batch_s(n, longest_chars)
        return _interpolate(self.batch_sizes, self.batch_times_s, n)

    def step_s(self, decode_tokens: int, prefill_tokens: int, context_tokens: int) -> float:
        """Seconds of one engine step. Measured tables first: a step feeding prompt tokens
        takes the prefill-step table's time at ``decode_tokens`` decodes, corrected by
        ``per_prefill_token_s`` for the tokens it feeds beyond that bucket's mean; a step
        of decodes alone, or with no prefill table, the decode-step table's time (which
        includes their context) plus ``per_prefill_token_s`` per prompt token fed. Without
        tables (or a step the decode table does not cover: no decodes), the step cost's
        line."""
        step = self.step
        if step is None:
            raise ValueError("no step cost: this is not a generative model's cost")
        if self.decode_sizes and decode_tokens > 0:
            decode_s = _interpolate(self.decode_sizes, self.decode_times_s, decode_tokens)
        elif decode_tokens > 0 or not self.prefill_sizes:
            return step.predict_s(decode_tokens, prefill_tokens, context_tokens)
        else:
            decode_s = 0.0
        if prefill_tokens == 0:
            return decode_s
        if not self.prefill_sizes:
            return decode_s + step.per_prefill_token_s * prefill_tokens
        sizes = self.prefill_sizes
        d = min(max(decode_tokens, sizes[0]), sizes[-1])  # flat past the measured counts
        added_s = _interpolate(sizes, self.prefill_times_s, d)
        mean_tokens = _interpolate(sizes, self.prefill_mean_tokens, d)
        return max(decode_s, decode_s + added_s
                   + step.per_prefill_token_s * (prefill_tokens - mean_tokens))

    @classmethod
    def oneshot(cls, batch_ms: Mapping[Any, float], load_s: float) -> ModelCost:
        pairs = sorted((int(b), float(ms) / 1000.0) for b, ms in batch_ms.items())
        return cls(load_s, tuple(b for b, _ in pairs), tuple(t for _, t in pairs))


def _interpolate(sizes: tuple[int, ...], times: tuple[float, ...], n: int) -> float:
    """Time at ``n`` from measured (size, time) points: linear between them, along the
    nearest end segment past them, proportional to ``n`` from a single point (flat from
    a single point at size 0)."""
    if len(sizes) == 1:
        return times[0] * n / sizes[0] if n > sizes[0] > 0 else times[0]
    i = bisect.bisect_left(sizes, n)
    if i < len(sizes) and sizes[i] == n:
        return times[i]
    i = min(max(i, 1), len(sizes) - 1)  # the segment [i-1, i] (or the nearest one)
    b0, b1, t0, t1 = sizes[i - 1], sizes[i], times[i - 1], times[i]
    return max(0.0, t0 + (t1 - t0) * (n - b0) / (b1 - b0))


def _step_cost(value: Any, base_dir: Path | None) -> StepCost:
    if isinstance(value, Mapping):
        return StepCost.from_json(value)
    path = Path(str(value))
    if not path.is_absolute() and base_dir is not None:
        path = base_dir / path
    return StepCost.load(path)


def _from_entry(kind: str, entry: Mapping[str, Any], load_s: float,
                base_dir: Path | None) -> ModelCost | None:
    load_s = float(entry.get("load_s", load_s))
    overhead_s = float(entry.get("overhead_ms", 0.0)) / 1000.0
    cv = float(entry.get("cv", 0.0))
    if kind == "generative":
        if "step_cost" in entry:
            decode, prefill = step_tables(entry)
            return ModelCost(load_s, step=_step_cost(entry["step_cost"], base_dir),
                             overhead_s=overhead_s, cv=cv,
                             decode_sizes=tuple(d for d, _ in decode),
                             decode_times_s=tuple(t for _, t in decode),
                             prefill_sizes=tuple(d for d, _, _ in prefill),
                             prefill_times_s=tuple(t for _, t, _ in prefill),
                             prefill_mean_tokens=tuple(n for _, _, n in prefill))
        return None
    for key in ("batch_ms", "service_ms"):
        if entry.get(key):
            cost = replace(ModelCost.oneshot(entry[key], load_s), overhead_s=overhead_s,
                           cv=cv)
            raw = entry.get("length_prior")
            return replace(cost, length_prior=LengthPrior.from_json(raw)) if raw else cost
    return None


MIN_BUCKET_STEPS = 10
"""A tally bucket with fewer steps is left out of the tables (interpolated over)."""


def step_tables(entry: Mapping[str, Any]
                ) -> tuple[list[tuple[int, float]], list[tuple[int, float, float]]]:
    """A cost entry's measured tables: ``(decodes, seconds)`` of steps feeding no prompt
    and ``(decodes, seconds added, mean prompt tokens)`` of what feeding one added to a
    step of that many decodes (its time less the decode table's there), ascending. From
    ``step_times`` (the engine's tally) when given, else ``decode_step_ms`` alone."""
    tally = entry.get("step_times")
    if not tally:
        return sorted((int(d), float(ms) / 1000.0)
                      for d, ms in dict(entry.get("decode_step_ms") or {}).items()), []
    decode: list[tuple[int, float]] = []
    with_prefill: list[tuple[int, float, float]] = []
    for key, bucket in dict(tally).items():
        steps = int(bucket["steps"])
        if steps < MIN_BUCKET_STEPS:
            continue
        if str(key).endswith("+draft"):
            continue  # verified drafts: not the plain steps these tables hold
        decodes, plus, _ = str(key).partition("+")
        mean_s = float(bucket["seconds"]) / steps
        if plus:
            with_prefill.append((int(decodes), mean_s,
                                 float(bucket["prefill_tokens"]) / steps))
        elif int(decodes) > 0:
            decode.append((int(decodes), mean_s))
    decode.sort()
    sizes, times = tuple(d for d, _ in decode), tuple(t for _, t in decode)
    added = [(d, max(0.0, t - (_interpolate(sizes, times, d) if d and sizes else 0.0)), n)
             for d, t, n in sorted(with_prefill) if d == 0 or sizes]
    return decode, added


def synthetic_cost(kind: str, options: Mapping[str, Any]) -> ModelCost:
    """The synthetic backend's own cost model (``sluice.backends.synthetic``), same
    defaults."""
    scale = float(options.get("speed_scale", 1.0))

    def opt(key: str, default: float) -> float:
        return float(options.get(key, default)) * scale

    load_s = opt("load_s", 0.01)
    if kind == "generative":
        return ModelCost(load_s, step=StepCost(
            base_s=opt("step_fixed_s", 0.002), per_decode_token_s=opt("decode_per_seq_s", 0.0005),
            per_prefill_token_s=opt("prefill_per_token_s", 0.0001)))
    fixed, item = opt("batch_fixed_s", 0.002), opt("per_item_s", 0.001)
    return ModelCost(load_s, (1, 2), (fixed + item, fixed + 2 * item))


def model_cost(model_id: str, kind: str, backend: str, options: Mapping[str, Any],
               load_cost_s: float, files: Mapping[str, Mapping[str, Any]] | None = None,
               base_dir: Path | None = None) -> ModelCost:
    """The cost of one model (see the module docstring for the order of sources)."""
    load_s = float(options.get("load_s", load_cost_s))
    entry = files.get(model_id, {}) if files else {}
    cost = _from_entry(kind, entry, load_s, base_dir) if entry else None
    if cost is None:
        cost = _from_entry(kind, options, load_s, base_dir)
    if cost is None and backend == "synthetic":
        cost = synthetic_cost(kind, options)
    if cost is None:
        what = ("a step_cost (StepCost JSON)" if kind == "generative"
                else "service_ms / batch_ms")
        raise ValueError(f"models[{model_id!r}]: no cost model: give {what} in a costs file "
                         f"(--costs) or in the model's options")
    if entry.get("estimate") and cost.batch_sizes:  # a live server's, over any profile
        cost = replace(cost, estimate=dict(entry["estimate"]))
    return cost


def read_costs(path: Path) -> dict[str, dict[str, Any]]:
    """A costs file: ``{model_id: {...}}``, or a ``sluice profile`` result (its variants'
    ``batch_ms`` keyed by their served model id)."""
    data = json.loads(path.read_text())
    if not isinstance(data, dict):
        raise ValueError(f"{path}: a costs file is a JSON object")
    if "variants" in data and isinstance(data["variants"], dict):
        out: dict[str, dict[str, Any]] = {}
        for name, v in data["variants"].items():
            entry = out[str(v.get("model", name))] = {"batch_ms": v["batch_ms"]}
            if v.get("length"):
                entry["length_prior"] = v["length"]
        return out
    return {str(k): dict(v) for k, v in data.items()}
