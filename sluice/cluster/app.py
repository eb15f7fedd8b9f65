"""The Serve application: a front-end deployment and the replica deployment, from one Config.

``replica_options`` and ``ingress_options`` turn the ``[cluster]`` section (and the sizes in
the rest of the file) into Serve deployment options: replicas min/max with sluice's
autoscaling policy, resources per replica, the request router and its kwargs, the bounds on
what a replica holds and what waits in front of it, the drain time. ``build_app`` binds
them; ``serve_on_ray`` is ``sluice serve --ray``: join (or start) Ray, run the app on Serve's
HTTP proxy at ``server.host:server.port``, and on SIGINT/SIGTERM delete it (Serve drains
every replica first) and leave.
"""

from __future__ import annotations

import contextlib
import logging
import math
import signal
import threading
import warnings
from collections.abc import Iterator
from typing import Any, cast

from sluice.config import Config

log = logging.getLogger("sluice.cluster")

REPLICA_DEPLOYMENT = "SluiceReplica"
INGRESS_DEPLOYMENT = "SluiceIngress"
DRAIN_MARGIN_S = 10.0
"""Shutdown time a replica gets beyond ``server.drain_timeout_s`` (stopping its runtime)."""


@contextlib.contextmanager
def lookback_warning_silenced() -> Iterator[None]:
    """Serve (2.60) still compares ``look_back_period_s`` with its deprecated
    ``metrics_interval_s`` (10 s) each time it parses an autoscaling config, and warns below
    it; the push intervals that replaced that field are environment variables."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*look_back_period_s.*",
                                category=FutureWarning)
        yield


def running_replicas(app_name: str, deployment: str = REPLICA_DEPLOYMENT) -> int | None:
    """A deployment's running replicas, from Serve's status (None if it is not there)."""
    with lookback_warning_silenced():
        status = _serve().status()
    app = status.applications.get(app_name)
    found = app.deployments.get(deployment) if app else None
    if found is None:
        return None
    return int(sum(n for state, n in found.replica_states.items() if state == "RUNNING"))


def _serve() -> Any:
    """``ray.serve``, imported late (the ``cluster`` extra) and typed loosely."""
    from ray import serve

    return serve


def max_ongoing_per_replica(config: Config) -> int:
    """What one replica holds at once: ``cluster.max_ongoing_requests``, or its queue plus
    its workers' inboxes — the most it admits before answering 503 itself."""
    if config.cluster.max_ongoing_requests is not None:
        return config.cluster.max_ongoing_requests
    return config.scheduling.queue_capacity + config.workers.count * config.workers.inbox_capacity


def replica_options(config: Config) -> dict[str, Any]:
    """Serve options of the replica deployment (plain data; the router config is built by
    ``build_app``)."""
    c = config.cluster
    actor: dict[str, Any] = {"num_cpus": c.num_cpus}
    if c.num_gpus:
        actor["num_gpus"] = c.num_gpus
    if c.memory_bytes:
        actor["memory"] = c.memory_bytes
    if c.resources:
        actor["resources"] = dict(c.resources)
    options: dict[str, Any] = {
        "max_ongoing_requests": max_ongoing_per_replica(config),
        "max_queued_requests": c.max_queued_requests,
        "ray_actor_options": actor,
        "graceful_shutdown_timeout_s": config.server.drain_timeout_s + DRAIN_MARGIN_S,
        "graceful_shutdown_wait_loop_s": 0.5,
        "health_check_period_s": c.health_check_period_s,
    }
    if c.min_replicas == c.max_replicas:
        options["num_replicas"] = c.min_replicas
    else:
        options["autoscaling_config"] = {
            "min_replicas": c.min_replicas,
            "max_replicas": c.max_replicas,
            "initial_replicas": c.initial_replicas,
            "upscale_delay_s": c.upscale_delay_s,
            "downscale_delay_s": c.downscale_delay_s,
            "look_back_period_s": c.look_back_period_s,
        }
    return options


def router_kwargs(config: Config) -> dict[str, Any]:
    """The request router's kwargs: the policy, its bound, and each model's size."""
    c = config.cluster
    return {"policy": c.router, "load_factor": c.load_factor,
            "model_bytes": {m.id: m.memory_bytes for m in config.models}}


INGRESS_OVERFLOW = 4
"""A front end holds this many × ``max_queued_requests`` beyond what the replicas hold and
wait for: the overflow it answers itself (503 with a computed Retry-After)."""


def ingress_options(config: Config) -> dict[str, Any]:
    """Serve options of the front end: it holds every request a replica holds or waits
    for, plus an overflow it refuses itself; only past twice that does the proxy refuse
    with Serve's own 503."""
    c = config.cluster
    per_ingress = math.ceil(c.max_replicas * max_ongoing_per_replica(config) / c.ingress_replicas)
    held = per_ingress + (1 + INGRESS_OVERFLOW) * c.max_queued_requests
    return {
        "num_replicas": c.ingress_replicas,
        "max_ongoing_requests": held,
        # Requests still being assigned count as queued at the proxy, so a burst of
        # simultaneous arrivals needs room here even while the front end has plenty.
        "max_queued_requests": held,
        "ray_actor_options": {"num_cpus": c.ingress_num_cpus},
        "graceful_shutdown_timeout_s": config.server.drain_timeout_s + DRAIN_MARGIN_S,
    }


def build_app(config: Config) -> Any:
    """The bound Serve application (front end → replicas)."""
    from ray.serve import config as serve_config

    from sluice.cluster.autoscale import SluiceAutoscalePolicy
    from sluice.cluster.ingress import SluiceIngress
    from sluice.cluster.replica import SluiceReplica
    from sluice.cluster.router import SluiceRequestRouter

    serve, cfg = _serve(), cast(Any, serve_config)  # Ray's annotations are partial
    c = config.cluster
    options = replica_options(config)
    if "autoscaling_config" in options:
        policy = cfg.AutoscalingPolicy(
            policy_function=SluiceAutoscalePolicy,
            policy_kwargs={"target_load_per_replica": c.target_load_per_replica,
                           "target_kv_use": c.target_kv_use})
        with lookback_warning_silenced():
            options["autoscaling_config"] = cfg.AutoscalingConfig(
                **options["autoscaling_config"], policy=policy)
    options["request_router_config"] = cfg.RequestRouterConfig(
        request_router_class=SluiceRequestRouter,
        request_router_kwargs=router_kwargs(config),
        request_routing_stats_period_s=c.stats_period_s,
        request_routing_stats_timeout_s=max(c.stats_period_s, 5.0),
    )
    data = config.model_dump(mode="json")
    replica = serve.deployment(SluiceReplica, name=REPLICA_DEPLOYMENT).options(**options)
    ingress = serve.deployment(SluiceIngress, name=INGRESS_DEPLOYMENT).options(
        **ingress_options(config))
    return ingress.bind(replica.bind(data), data)


def run_app(config: Config) -> None:
    """Deploy (or update) the app on the running Serve, at ``/``; returns once it runs."""
    with lookback_warning_silenced():
        _serve().run(build_app(config), name=config.cluster.app_name, route_prefix="/")


def connect(config: Config, *, address: str | None = None) -> None:
    """Join the Ray cluster at ``address`` (``cluster.address`` when None; a new local Ray
    when both are unset), unless this process is already connected."""
    import ray

    if not ray.is_initialized():
        ray.init(address=address or config.cluster.address, include_dashboard=False,
                 log_to_driver=False)


def start(config: Config, *, address: str | None = None) -> None:
    """Connect to Ray, start Serve's proxy on ``server.host:server.port`` and run the app;
    returns once every replica is running."""
    connect(config, address=address)
    _serve().start(http_options={"host": config.server.host, "port": config.server.port})
    run_app(config)
    log.info("sluice on Ray Serve: http://%s:%d (app %s)", config.server.host,
             config.server.port, config.cluster.app_name)


def stop_app(config: Config) -> None:
    """Delete the app; Serve drains each replica (its requests finish) before stopping it."""
    _serve().delete(config.cluster.app_name)


def stop(config: Config) -> None:
    """Delete the app (draining every replica) and shut Serve down."""
    stop_app(config)
    _serve().shutdown()


def serve_on_ray(config: Config, *, address: str | None = None) -> int:
    """``sluice serve --ray``: run until SIGINT/SIGTERM, then drain and leave."""
    import ray

    connect(config, address=address)
    # Over the handlers ray.init installed, before the (long) deployment, so a signal that
    # comes while the replicas start still drains them rather than ending the process.
    done = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: done.set())
    start(config, address=address)
    while not done.wait(0.5):  # a timed wait, so the handler runs between waits
        pass
    log.info("draining the replicas")
    stop(config)
    ray.shutdown()
    return 0
