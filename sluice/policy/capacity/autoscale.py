"""Replica autoscaling on sluice's own load signal: how many replicas the load asks for.

Each replica reports its *load* (requests it has admitted and not finished: queued,
in worker inboxes, running) and its *KV use* (the fraction of KV blocks held, on its most
used generative model). Requests waiting in front of the replicas (the front end's bounded
queue, when every replica is full) are load too. The decision is the larger of

- ``ceil(total load / target_load_per_replica)``: enough replicas that each holds about
  the target number of requests, and
- ``ceil(sum of KV use / target_kv_use)``: enough that KV use per replica falls to the
  target (a few long generations can fill the KV with few requests),

clamped to [min, max]. With no report yet the count stays as it is. The caller (Ray
Serve's autoscaler) applies the up/down delays, so one short burst or lull does not
resize the fleet; a replica leaving is drained first (``sluice.cluster``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class AutoscaleConfig:
    """Targets per replica."""

    target_load_per_replica: float = 4.0
    """Requests admitted and unfinished per replica that the fleet is sized for (> 0)."""
    target_kv_use: float = 0.8
    """KV-block use per replica that the fleet is sized for, in (0, 1]."""

    def __post_init__(self) -> None:
        if not (math.isfinite(self.target_load_per_replica)
                and self.target_load_per_replica > 0):
            raise ValueError("target_load_per_replica must be a finite number > 0, got "
                             f"{self.target_load_per_replica!r}")
        if not 0 < self.target_kv_use <= 1:
            raise ValueError(f"target_kv_use must be in (0, 1], got {self.target_kv_use!r}")


@dataclass(frozen=True, slots=True)
class ReplicaLoad:
    """One replica's report (averaged by the caller over its look-back window)."""

    load: float
    """Requests admitted and not finished (>= 0)."""
    kv_use: float = 0.0
    """Fraction of KV blocks in use on its most used generative model, in [0, 1]."""

    def __post_init__(self) -> None:
        if not (math.isfinite(self.load) and self.load >= 0):
            raise ValueError(f"load must be a finite number >= 0, got {self.load!r}")
        if not 0 <= self.kv_use <= 1:
            raise ValueError(f"kv_use must be in [0, 1], got {self.kv_use!r}")


@dataclass(frozen=True, slots=True)
class ScaleDecision:
    """The replica count asked for, and the numbers behind it."""

    replicas: int
    reason: str


def desired_replicas(
    config: AutoscaleConfig,
    reports: Sequence[ReplicaLoad],
    *,
    current: int,
    min_replicas: int,
    max_replicas: int,
    queued_in_front: float = 0.0,
) -> ScaleDecision:
    """The replica count for this load (see the module docstring); ``current`` when no
    replica has reported yet. Always within [min_replicas, max_replicas]."""
    if not 0 <= min_replicas <= max_replicas:
        raise ValueError(f"need 0 <= min_replicas ({min_replicas}) <= max_replicas "
                         f"({max_replicas})")
    if current < 0:
        raise ValueError(f"current must be >= 0, got {current}")
    if not (math.isfinite(queued_in_front) and queued_in_front >= 0):
        raise ValueError(f"queued_in_front must be a finite number >= 0, got "
                         f"{queued_in_front!r}")
    if not reports and queued_in_front == 0:
        n = min(max(current, min_replicas), max_replicas)
        return ScaleDecision(n, f"no load reported yet: {n}")
    load = sum(r.load for r in reports) + queued_in_front
    kv = sum(r.kv_use for r in reports)
    by_load = math.ceil(load / config.target_load_per_replica)
    by_kv = math.ceil(kv / config.target_kv_use)
    n = min(max(by_load, by_kv, min_replicas), max_replicas)
    return ScaleDecision(
        n,
        f"load {load:.3g} (front {queued_in_front:.3g}) / target "
        f"{config.target_load_per_replica:g} → {by_load}; KV {kv:.3g} / target "
        f"{config.target_kv_use:g} → {by_kv}; within [{min_replicas}, {max_replicas}]: {n}",
    )
