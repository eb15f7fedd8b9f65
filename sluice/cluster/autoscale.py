"""Ray Serve's autoscaling policy for the replica deployment, on sluice's own signal.

Serve averages each replica's ``record_autoscaling_stats`` (``sluice_load``,
``sluice_kv_use``) over ``look_back_period_s`` and calls this policy on its control loop;
the pure ``desired_replicas`` turns the reports (plus the requests waiting at the front
ends' handles) into a replica count. Serve's wrapper then applies the configured up/down
delays and the min/max bounds. On scale-down Serve stops routing to the chosen replica and
waits for its requests to finish before stopping it (``graceful_shutdown_timeout_s``), so
no request is lost.
"""

from __future__ import annotations

import logging
from typing import Any

from sluice.policy.capacity.autoscale import AutoscaleConfig, ReplicaLoad, desired_replicas

log = logging.getLogger("sluice.cluster")

LOAD_METRIC = "sluice_load"
"""Requests a replica admitted and has not finished (queued, in inboxes, running)."""
KV_METRIC = "sluice_kv_use"
"""KV-block use of a replica's most used generative model, in [0, 1]."""


def reports_from(metrics: dict[str, dict[Any, float]] | None,
                 replicas: list[Any]) -> list[ReplicaLoad]:
    """One ``ReplicaLoad`` per running replica that has reported."""
    metrics = metrics or {}
    loads, kv = metrics.get(LOAD_METRIC, {}), metrics.get(KV_METRIC, {})
    return [ReplicaLoad(max(0.0, float(loads[r])), min(1.0, max(0.0, float(kv.get(r, 0.0)))))
            for r in replicas if r in loads]


class SluiceAutoscalePolicy:
    """``policy_function`` for Serve's ``AutoscalingPolicy`` (kwargs: the targets)."""

    def __init__(self, target_load_per_replica: float = 4.0,
                 target_kv_use: float = 0.8) -> None:
        self.config = AutoscaleConfig(target_load_per_replica, target_kv_use)

    def __call__(self, ctx: Any) -> tuple[int, dict[str, Any]]:
        reports = reports_from(ctx.aggregated_metrics, list(ctx.running_replicas))
        decision = desired_replicas(
            self.config, reports, current=ctx.current_num_replicas,
            min_replicas=ctx.capacity_adjusted_min_replicas,
            max_replicas=ctx.capacity_adjusted_max_replicas,
            queued_in_front=max(0.0, float(ctx.total_queued_requests or 0.0)),
        )
        state = dict(ctx.policy_state)
        if decision.replicas != ctx.target_num_replicas:
            log.info("sluice autoscaling: %s", decision.reason)
        state["sluice_reason"] = decision.reason
        return decision.replicas, state
