"""What a simulation reports: per model and per tenant TTFT / TPOT / end-to-end latency
percentiles, goodput, rejections by reason, utilisation and the variant mix.

Latencies count from arrival, as a client sees them: TTFT to the first token (a one-shot
request's answer is its first and only token), end-to-end to the terminal state, TPOT the
mean gap between a completed request's later tokens. Goodput is the share of offered
requests completed in time: by their deadline (the server never completes late) and, when
the caller gives one, within the TTFT target. Only completed requests have latencies.
"""

from __future__ import annotations

from array import array
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from sluice.sim.request import SimRequest

PERCENTILES = (50, 95, 99)


def percentiles(values: array[float]) -> dict[str, float | None]:
    """``{"p50", "p95", "p99", "mean"}`` in seconds (``None`` when there are no values)."""
    if not len(values):
        empty: dict[str, float | None] = {f"p{q}": None for q in PERCENTILES}
        empty["mean"] = None
        return empty
    data = np.frombuffer(values, dtype=np.float64)
    out: dict[str, float | None] = {
        f"p{q}": round(float(v), 6)
        for q, v in zip(PERCENTILES, np.percentile(data, PERCENTILES), strict=True)}
    out["mean"] = round(float(data.mean()), 6)
    return out


@dataclass
class _Slice:
    """The requests of one model or one tenant."""

    offered: int = 0
    good: int = 0
    states: Counter[str] = field(default_factory=Counter)
    ttft: array[float] = field(default_factory=lambda: array("d"))
    tpot: array[float] = field(default_factory=lambda: array("d"))
    e2e: array[float] = field(default_factory=lambda: array("d"))

    def add(self, req: SimRequest, good: bool) -> None:
        self.offered += 1
        self.good += good
        self.states[req.status] += 1
        if req.status != "completed" or req.end_s is None:
            return
        first = req.first_token_s if req.first_token_s is not None else req.end_s
        self.ttft.append(first - req.arrival_s)
        self.e2e.append(req.end_s - req.arrival_s)
        if req.generated > 1:
            self.tpot.append((req.end_s - first) / (req.generated - 1))

    def to_json(self, duration_s: float) -> dict[str, Any]:
        return {
            "offered": self.offered,
            "states": dict(sorted(self.states.items())),
            "goodput": round(self.good / self.offered, 6) if self.offered else None,
            "goodput_per_s": round(self.good / duration_s, 4) if duration_s > 0 else None,
            "ttft_s": percentiles(self.ttft),
            "tpot_s": percentiles(self.tpot),
            "e2e_s": percentiles(self.e2e),
        }


class Recorder:
    """Collects every terminal request (``record``) into the report's slices.

    Invariant (conservation): each request is recorded exactly once, in one terminal
    state; ``offered`` equals the requests submitted once the run has drained."""

    def __init__(self, ttft_slo_s: float | None = None) -> None:
        self.ttft_slo_s = ttft_slo_s
        self.all = _Slice()
        self.models: dict[str, _Slice] = {}
        self.tenants: dict[str, _Slice] = {}
        self.rejections: Counter[str] = Counter()
        self.variants: dict[str, Counter[str]] = {}
        self.last_end_s = 0.0

    def is_good(self, req: SimRequest) -> bool:
        if req.status != "completed" or req.end_s is None:
            return False
        if req.deadline_s is not None and req.end_s > req.deadline_s:
            return False
        if self.ttft_slo_s is not None:
            first = req.first_token_s if req.first_token_s is not None else req.end_s
            return first - req.arrival_s <= self.ttft_slo_s
        return True

    def record(self, req: SimRequest) -> None:
        good = self.is_good(req)
        self.all.add(req, good)
        key = req.group or req.model
        s = self.models.get(key)
        if s is None:
            s = self.models[key] = _Slice()
        s.add(req, good)
        t = self.tenants.get(req.tenant)
        if t is None:
            t = self.tenants[req.tenant] = _Slice()
        t.add(req, good)
        if req.status == "rejected":
            self.rejections[req.reason or "unknown"] += 1
        if req.group is not None and req.status != "rejected":
            self.variants.setdefault(req.group, Counter())[req.model] += 1
        if req.end_s is not None and req.end_s > self.last_end_s:
            self.last_end_s = req.end_s

    def to_json(self, duration_s: float) -> dict[str, Any]:
        return {
            "overall": self.all.to_json(duration_s),
            "models": {k: v.to_json(duration_s) for k, v in sorted(self.models.items())},
            "tenants": {k: v.to_json(duration_s) for k, v in sorted(self.tenants.items())},
            "rejections": dict(sorted(self.rejections.items())),
            "variant_mix": {g: dict(sorted(c.items())) for g, c in sorted(self.variants.items())},
        }
