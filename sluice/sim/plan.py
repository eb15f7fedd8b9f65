"""Capacity planning with the simulator: the smallest fleet, and its scheduler and batch
settings, that meets a service-level objective for a workload; and the autoscaling target
that keeps one replica within the objective.

``plan`` tries every combination of the candidate schedulers and batch settings; for each
it finds the fewest replicas that meet the objective (doubling, then bisection: more
replicas never serve a fixed workload worse, so the smallest passing count is found in
``O(log R)`` runs), and ranks the combinations by replicas, then TTFT p95.

``waiting_target`` answers the Kubernetes autoscaler's question for one replica of the
chosen shape: how many requests may wait (admitted, not yet running) before a newly
arriving one misses the TTFT objective. One replica is driven past its capacity so that
every backlog occurs; requests are grouped by the backlog they found on arrival, and the
target is the largest backlog up to which every group's TTFT p95 meets the objective.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from sluice.sim.fleet import simulate
from sluice.sim.setup import SimConfig
from sluice.sim.workload import Arrival, WorkloadSpec, generate

MIN_GROUP = 20
"""Requests a backlog group needs before its p95 counts."""


@dataclass(frozen=True)
class Slo:
    """The objective; a field left ``None`` is not checked."""

    ttft_p95_s: float | None = None
    e2e_p95_s: float | None = None
    goodput: float | None = None
    """Share of offered requests completed in time (0..1)."""

    def misses(self, report: dict[str, Any]) -> list[str]:
        """What ``report`` (a simulation's) misses, in words; empty when it meets it."""
        o = report["overall"]
        out = []
        for name, key, limit in (("ttft_p95", "ttft_s", self.ttft_p95_s),
                                 ("e2e_p95", "e2e_s", self.e2e_p95_s)):
            value = o[key]["p95"]
            if limit is not None and (value is None or value > limit):
                out.append(f"{name} {'-' if value is None else f'{value:.3g}'} s > {limit:g} s")
        if self.goodput is not None and (o["goodput"] or 0.0) < self.goodput:
            out.append(f"goodput {o['goodput']:.4f} < {self.goodput:g}")
        return out


def parse_slo(text: str) -> Slo:
    """``ttft_p95=2s,e2e_p95=500ms,goodput=0.99``; ``ValueError`` names a bad part."""
    fields: dict[str, float] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        key, eq, value = part.partition("=")
        if not eq or key not in ("ttft_p95", "e2e_p95", "goodput"):
            raise ValueError(f"slo: {part!r}: want ttft_p95=, e2e_p95= or goodput=")
        try:
            if key == "goodput":
                fields[key] = float(value)
            elif value.endswith("ms"):
                fields[f"{key}_s"] = float(value[:-2]) / 1000.0
            else:
                fields[f"{key}_s"] = float(value.removesuffix("s"))
        except ValueError:
            raise ValueError(f"slo: {part!r}: {value!r} is not a number") from None
    if not fields:
        raise ValueError("slo: give at least one of ttft_p95=, e2e_p95=, goodput=")
    return Slo(**fields)


@dataclass
class Candidate:
    """One combination of settings and the fewest replicas that met the objective."""

    scheduler: str
    max_batch_size: int
    max_batch_tokens: int
    replicas: int | None
    """``None``: not met even with the most replicas tried."""
    summary: dict[str, Any] = field(default_factory=dict)
    misses: list[str] = field(default_factory=list)
    runs: int = 0


def _summary(report: dict[str, Any]) -> dict[str, Any]:
    o = report["overall"]
    return {"goodput": o["goodput"], "ttft_p95_s": o["ttft_s"]["p95"],
            "e2e_p95_s": o["e2e_s"]["p95"], "utilisation": report["utilisation"],
            "rejections": report["rejections"]}


def fewest_replicas(config: SimConfig, arrivals: Sequence[Arrival], slo: Slo,
                    max_replicas: int) -> tuple[int | None, dict[str, Any], list[str], int]:
    """The smallest replica count in [1, max_replicas] meeting ``slo``; with the summary
    of that run (or of the largest tried, when none met it), its misses, and the runs."""
    results: dict[int, tuple[dict[str, Any], list[str]]] = {}

    def check(n: int) -> bool:
        if n not in results:
            report, _ = simulate(dataclasses.replace(config, replicas=n), arrivals,
                                 ttft_slo_s=None)
            results[n] = (_summary(report), slo.misses(report))
        return not results[n][1]

    lo, hi = 0, 1  # lo fails (0 replicas serve nothing), hi is the next to try
    while not check(hi):
        if hi >= max_replicas:
            summary, misses = results[hi]
            return None, summary, misses, len(results)
        lo, hi = hi, min(2 * hi, max_replicas)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if check(mid):
            hi = mid
        else:
            lo = mid
    summary, misses = results[hi]
    return hi, summary, misses, len(results)


def shaped(config: SimConfig, scheduler: str, max_batch_size: int,
           max_batch_tokens: int) -> SimConfig:
    """``config`` with one candidate's settings: its queue's scheduler, its workers'
    one-shot batch size and continuous-batching step tokens."""
    worker = dataclasses.replace(
        config.worker, max_batch_size=max_batch_size,
        engine=dataclasses.replace(config.worker.engine, max_batch_tokens=max_batch_tokens))
    return dataclasses.replace(
        config, queue=dataclasses.replace(config.queue, scheduler=scheduler), worker=worker)


def plan(config: SimConfig, arrivals: Sequence[Arrival], slo: Slo, *,
         schedulers: Sequence[str] = (), max_batch_sizes: Sequence[int] = (),
         max_batch_tokens: Sequence[int] = (), max_replicas: int = 64,
         progress: Callable[[Candidate], None] | None = None) -> list[Candidate]:
    """Every combination, best first (fewest replicas, then lowest TTFT p95)."""
    out = []
    for sched in schedulers or (config.queue.scheduler,):
        for batch in max_batch_sizes or (config.worker.max_batch_size,):
            for tokens in max_batch_tokens or (config.worker.engine.max_batch_tokens,):
                n, summary, misses, runs = fewest_replicas(
                    shaped(config, sched, batch, tokens), arrivals, slo, max_replicas)
                cand = Candidate(sched, batch, tokens, n, summary, misses, runs)
                if progress is not None:
                    progress(cand)
                out.append(cand)
    out.sort(key=lambda c: (c.replicas is None, c.replicas or 0,
                            c.summary.get("ttft_p95_s") or math.inf))
    return out


def waiting_target(config: SimConfig, spec: WorkloadSpec, replicas: int, ttft_p95_s: float,
                   *, loads: Sequence[float] = (0.9, 1.0, 1.1, 1.25), requests: int = 1500,
                   seed: int = 0) -> dict[str, Any]:
    """The autoscaling target for one replica of ``config``'s shape (see the module
    docstring): the per-replica share of ``spec`` scaled by each of ``loads`` (around
    and past the replica's capacity, so that every backlog occurs), queue unbounded,
    ``requests`` arrivals each, the requests pooled by the backlog they found."""
    one = dataclasses.replace(
        config, replicas=1, queue=dataclasses.replace(config.queue, queue_capacity=1_000_000),
        replica_capacity=None)
    by_waiting: dict[int, list[float]] = {}
    for i, load in enumerate(loads):
        share = dataclasses.replace(spec.scaled(load / replicas), deadline_s=None,
                                    requests=requests, duration_s=math.inf)
        _, fleet = simulate(one, generate(share, seed + i), keep_requests=True)
        for r in fleet.requests or ():
            if r.status == "completed" and r.end_s is not None:
                first = r.first_token_s if r.first_token_s is not None else r.end_s
                by_waiting.setdefault(r.waiting_ahead, []).append(first - r.arrival_s)
    rows = []
    target = 0
    meeting = True
    for k in sorted(by_waiting):
        values = by_waiting[k]
        if len(values) < MIN_GROUP:
            continue
        p95 = float(np.percentile(values, 95))
        rows.append({"waiting": k, "requests": len(values), "ttft_p95_s": round(p95, 4)})
        if meeting and p95 <= ttft_p95_s:
            target = k
        else:
            meeting = False
    zero_ok = bool(rows) and rows[0]["waiting"] == 0 and rows[0]["ttft_p95_s"] <= ttft_p95_s
    return {"target_waiting_per_replica": target, "meets_with_none_waiting": zero_ok,
            "ttft_p95_s_by_waiting": rows,
            "per_replica_rate_per_s": round(spec.mean_rate_per_s / replicas, 4),
            "loads": list(loads)}
