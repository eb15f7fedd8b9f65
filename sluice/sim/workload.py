"""Workloads: the arrivals a simulation (or a load generator) replays.

An ``Arrival`` is one request as the outside world makes it: when, which model, which
tenant, how many prompt and output tokens, its relative deadline and priority. Arrival
processes are generators (lazy: a million arrivals never sit in memory at once), seeded
with ``random.Random(seed)`` so that one spec and seed always give the same arrivals:

- ``poisson``: exponential gaps at ``rate`` per second;
- ``onoff``: a two-state MMPP (bursty): ``rate`` while on, ``off_rate`` while off, state
  durations exponential with means ``on_s`` / ``off_s``;
- ``diurnal``: a sinusoidal rate between ``rate * trough`` and ``rate`` over ``period_s``
  (a non-homogeneous Poisson process drawn by thinning);
- ``trace``: JSONL replay (``read_trace``), one object per line with ``t`` (seconds from
  the start), ``model``, and optionally ``tenant``, ``prompt_tokens``, ``output_tokens``,
  ``deadline_ms``, ``priority``, ``prefix_id``, ``prefix_tokens``, ``input_chars``.

A spec string names a process and its parameters: ``poisson:rate=20,duration=60,
model=synth-chat,prompt=10,output=16,deadline_ms=2000``. ``model`` and ``tenant`` take a
weighted mix: ``model=synth-a:3|synth-b:1``. ``requests=N`` bounds the count as well as
(or instead of) ``duration``. ``input_chars=N`` (or ``LO-HI``, uniform) gives one-shot
inputs their length in characters, which a padded batch's time grows with (drawn from
a stream of its own: the same seed gives the same arrivals with or without it).
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

PROCESSES = ("poisson", "onoff", "diurnal")


@dataclass(frozen=True, slots=True)
class Arrival:
    """One request as it arrives."""

    time_s: float
    """Seconds from the start of the workload."""
    model: str
    """A model id or a model group id."""
    tenant: str = "default"
    prompt_tokens: int = 16
    output_tokens: int = 16
    """Tokens to generate (``max_tokens``; generation runs to it, as with ``ignore_eos``)."""
    deadline_s: float | None = None
    """Relative deadline (seconds after arrival), or ``None``."""
    priority: int = 5
    prefix_id: int | None = None
    """Requests with the same ``prefix_id`` share their first ``prefix_tokens`` tokens."""
    prefix_tokens: int = 0
    input_chars: int = 0
    """One-shot: the input's length in characters (its longest text; 0: unknown), what
    its batch's time grows with (``ModelCost.batch_s``) and the variant planner plans
    with, as the server's ``input_length``."""

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"t": round(self.time_s, 6), "model": self.model,
                               "tenant": self.tenant, "prompt_tokens": self.prompt_tokens,
                               "output_tokens": self.output_tokens, "priority": self.priority}
        if self.deadline_s is not None:
            out["deadline_ms"] = round(self.deadline_s * 1000.0, 3)
        if self.prefix_id is not None:
            out["prefix_id"] = self.prefix_id
            out["prefix_tokens"] = self.prefix_tokens
        if self.input_chars > 0:
            out["input_chars"] = self.input_chars
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Arrival:
        deadline_ms = data.get("deadline_ms")
        prefix_id = data.get("prefix_id")
        return cls(
            time_s=float(data["t"]),
            model=str(data["model"]),
            tenant=str(data.get("tenant", "default")),
            prompt_tokens=int(data.get("prompt_tokens", 16)),
            output_tokens=int(data.get("output_tokens", 16)),
            deadline_s=None if deadline_ms is None else float(deadline_ms) / 1000.0,
            priority=int(data.get("priority", 5)),
            prefix_id=None if prefix_id is None else int(prefix_id),
            prefix_tokens=int(data.get("prefix_tokens", 0)),
            input_chars=int(data.get("input_chars", 0)),
        )


@dataclass(frozen=True)
class WorkloadSpec:
    """A parsed workload spec (see the module docstring)."""

    process: str
    rate_per_s: float
    duration_s: float = math.inf
    requests: int | None = None
    models: tuple[tuple[str, float], ...] = (("default", 1.0),)
    tenants: tuple[tuple[str, float], ...] = (("default", 1.0),)
    prompt_tokens: int = 16
    output_tokens: int = 16
    deadline_s: float | None = None
    priority: int = 5
    off_rate_per_s: float = 0.0
    on_s: float = 5.0
    off_s: float = 5.0
    period_s: float = 86_400.0
    trough: float = 0.2
    prefixes: int = 0
    """Distinct shared prefixes (0: prompts share nothing)."""
    prefix_tokens: int = 0
    input_chars: tuple[int, int] = (0, 0)
    """One-shot input length in characters, uniform in ``[lo, hi]`` ((0, 0): unknown)."""

    def __post_init__(self) -> None:
        if self.process not in PROCESSES:
            raise ValueError(f"workload process must be one of {PROCESSES}, got {self.process!r}")
        if not self.rate_per_s > 0:
            raise ValueError(f"workload rate must be > 0, got {self.rate_per_s}")
        if self.requests is None and not math.isfinite(self.duration_s):
            raise ValueError("workload needs duration= or requests= (it must end)")
        if not 0.0 <= self.trough <= 1.0:
            raise ValueError(f"workload trough must lie in [0, 1], got {self.trough}")
        lo, hi = self.input_chars
        if not 0 <= lo <= hi:
            raise ValueError(f"workload input_chars must be N or LO-HI with 0 <= LO <= HI, "
                             f"got {lo}-{hi}")

    def scaled(self, factor: float) -> WorkloadSpec:
        """The same workload at ``factor`` × the rate (both states of an on/off process)."""
        from dataclasses import replace

        return replace(self, rate_per_s=self.rate_per_s * factor,
                       off_rate_per_s=self.off_rate_per_s * factor)

    @property
    def mean_rate_per_s(self) -> float:
        """The long-run arrival rate."""
        if self.process == "onoff":
            on = self.on_s / (self.on_s + self.off_s)
            return self.rate_per_s * on + self.off_rate_per_s * (1 - on)
        if self.process == "diurnal":
            return self.rate_per_s * (1 + self.trough) / 2
        return self.rate_per_s


_KEYS = {"rate": "rate_per_s", "duration": "duration_s", "requests": "requests",
         "prompt": "prompt_tokens", "output": "output_tokens", "priority": "priority",
         "off_rate": "off_rate_per_s", "on_s": "on_s", "off_s": "off_s",
         "period_s": "period_s", "trough": "trough", "prefixes": "prefixes",
         "prefix_tokens": "prefix_tokens"}
_INTS = {"requests", "prompt_tokens", "output_tokens", "priority", "prefixes", "prefix_tokens"}


def parse_mix(text: str) -> tuple[tuple[str, float], ...]:
    """``a:3|b:1`` → ``(("a", 3.0), ("b", 1.0))``; a bare name weighs 1."""
    out = []
    for part in text.split("|"):
        name, _, weight = part.partition(":")
        w = float(weight) if weight else 1.0
        if not name or not w > 0:
            raise ValueError(f"workload mix entry {part!r}: want name or name:weight > 0")
        out.append((name, w))
    return tuple(out)


def parse_spec(spec: str) -> WorkloadSpec:
    """Parse ``process:key=value,...``; ``ValueError`` names a bad key or value."""
    process, _, rest = spec.partition(":")
    fields: dict[str, Any] = {"process": process.strip()}
    for part in filter(None, (p.strip() for p in rest.split(","))):
        key, eq, value = part.partition("=")
        if not eq:
            raise ValueError(f"workload spec: {part!r} is not key=value")
        if key == "model":
            fields["models"] = parse_mix(value)
        elif key == "tenant":
            fields["tenants"] = parse_mix(value)
        elif key == "deadline_ms":
            fields["deadline_s"] = float(value) / 1000.0
        elif key == "input_chars":
            lo, _, hi = value.partition("-")
            try:
                fields["input_chars"] = (int(lo), int(hi or lo))
            except ValueError:
                raise ValueError(f"workload spec: input_chars={value!r} is not N or "
                                 f"LO-HI") from None
        elif key in _KEYS:
            name = _KEYS[key]
            try:
                fields[name] = int(value) if name in _INTS else float(value)
            except ValueError:
                raise ValueError(f"workload spec: {key}={value!r} is not a number") from None
        else:
            raise ValueError(f"workload spec: unknown key {key!r} (known: model, tenant, "
                             f"deadline_ms, input_chars, {', '.join(_KEYS)})")
    if "rate_per_s" not in fields:
        raise ValueError("workload spec: rate= is required")
    return WorkloadSpec(**fields)


def _picker(mix: tuple[tuple[str, float], ...], rng: random.Random) -> Iterator[str]:
    names = [n for n, _ in mix]
    if len(names) == 1:
        while True:
            yield names[0]
    weights = [w for _, w in mix]
    while True:
        yield from rng.choices(names, weights, k=256)


def arrival_times(spec: WorkloadSpec, rng: random.Random) -> Iterator[float]:
    """The arrival instants of the spec's process (unbounded; ``generate`` bounds them)."""
    t = 0.0
    if spec.process == "poisson":
        while True:
            t += rng.expovariate(spec.rate_per_s)
            yield t
    elif spec.process == "onoff":
        on = True
        switch = rng.expovariate(1.0 / spec.on_s)
        while True:
            rate = spec.rate_per_s if on else spec.off_rate_per_s
            gap = rng.expovariate(rate) if rate > 0 else math.inf
            if t + gap < switch:
                t += gap
                yield t
            else:
                t = switch
                on = not on
                switch = t + rng.expovariate(1.0 / (spec.on_s if on else spec.off_s))
    else:  # diurnal, by thinning: candidates at the peak rate, kept with rate(t) / peak
        peak = spec.rate_per_s
        while True:
            t += rng.expovariate(peak)
            phase = math.cos(2 * math.pi * t / spec.period_s)  # 1 at t = 0: start at peak
            level = spec.trough + (1 - spec.trough) * (1 + phase) / 2
            if rng.random() < level:
                yield t


def generate(spec: WorkloadSpec, seed: int = 0) -> Iterator[Arrival]:
    """The spec's arrivals in time order, until ``duration`` or ``requests`` ends them."""
    rng = random.Random(seed)
    models = _picker(spec.models, random.Random(rng.random()))
    tenants = _picker(spec.tenants, random.Random(rng.random()))
    prefix_rng = random.Random(rng.random())
    chars_rng = random.Random(f"{seed}:input_chars")  # its own: draws nothing from rng
    lo, hi = spec.input_chars
    limit = spec.requests if spec.requests is not None else math.inf
    for count, t in enumerate(arrival_times(spec, rng)):
        if t > spec.duration_s or count >= limit:
            return
        prefix = prefix_rng.randrange(spec.prefixes) if spec.prefixes else None
        yield Arrival(t, next(models), next(tenants), spec.prompt_tokens, spec.output_tokens,
                      spec.deadline_s, spec.priority, prefix,
                      spec.prefix_tokens if prefix is not None else 0,
                      chars_rng.randint(lo, hi) if hi > lo else lo)


def read_trace(path: Path) -> Iterator[Arrival]:
    """Arrivals from a JSONL trace (blank lines skipped); ``ValueError`` names the line."""
    with open(path) as f:
        last = -math.inf
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                arrival = Arrival.from_json(json.loads(line))
            except (ValueError, KeyError, TypeError) as exc:
                raise ValueError(f"{path}:{n}: not an arrival: {exc}") from None
            if arrival.time_s < last:
                raise ValueError(f"{path}:{n}: arrivals must be in time order")
            last = arrival.time_s
            yield arrival


def write_trace(arrivals: Iterable[Arrival], out: TextIO) -> int:
    """Write arrivals as JSONL; returns how many."""
    n = 0
    for a in arrivals:
        out.write(json.dumps(a.to_json()) + "\n")
        n += 1
    return n
