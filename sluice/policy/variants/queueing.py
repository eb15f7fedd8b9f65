"""Queueing formulas of the M/M/c queue: Erlang's C (the probability an arrival waits)
and the mean wait before service. Pure and exact for Poisson arrivals and exponential
service; the variant planner (``sluice.policy.variants.planner``) states what it assumes of them."""

from __future__ import annotations

import math


def erlang_c(servers: int, offered_load: float) -> float:
    """Probability that an arrival waits in an M/M/c queue (Erlang's C formula).

    ``offered_load`` is ``a = λ/μ`` in Erlangs. Computed through the Erlang-B recursion,
    which stays finite for large ``c``. Returns 1.0 when ``a >= c`` (no steady state:
    every arrival waits).
    """
    if servers < 1:
        raise ValueError(f"servers must be >= 1, got {servers}")
    if not offered_load >= 0 or math.isnan(offered_load):
        raise ValueError(f"offered_load must be >= 0, got {offered_load!r}")
    if offered_load == 0:
        return 0.0
    if offered_load >= servers:
        return 1.0
    blocking = 1.0
    for k in range(1, servers + 1):
        blocking = offered_load * blocking / (k + offered_load * blocking)
    return servers * blocking / (servers - offered_load * (1.0 - blocking))


def mmc_wait_s(arrival_per_s: float, service_s: float, servers: int) -> float:
    """Mean time in queue (before service) of an M/M/c queue: ``C(c, a) / (cμ - λ)``.

    ``math.inf`` when the queue is unstable (``λ >= cμ``); 0 with no arrivals.
    """
    if not arrival_per_s >= 0:
        raise ValueError(f"arrival_per_s must be >= 0, got {arrival_per_s!r}")
    if not service_s > 0:
        raise ValueError(f"service_s must be > 0, got {service_s!r}")
    if arrival_per_s == 0:
        return 0.0
    offered = arrival_per_s * service_s
    if offered >= servers:
        return math.inf
    return erlang_c(servers, offered) * service_s / (servers - offered)


__all__ = ["erlang_c", "mmc_wait_s"]
