"""Helpers for the cluster tests: a sluice config with a [cluster] section on synthetic
models, deploying it on the session's Serve, finding its replica actors, polling."""

from __future__ import annotations

import os
import time
import warnings
from collections.abc import Callable
from typing import Any

import pytest

from sluice.config import Config
from tests.server.live import config_with, synth_chat, synth_embed

SYSTEM = ("You are the billing assistant of a small company. You answer questions about "
          "invoices, refunds and payment dates, briefly and politely. ")
KEYS = {"open": "key-open", "limited": "key-limited"}


def require_ray() -> Any:
    """``ray`` with Serve imported; skip without it, unless ``SLUICE_REQUIRE_RAY=1``."""
    try:
        with warnings.catch_warnings():
            # Ray's own modules still use pydantic v1 idioms; not ours to fix.
            warnings.simplefilter("ignore", DeprecationWarning)
            import ray
            from ray import serve  # noqa: F401
            from ray.serve import config, handle, request_router  # noqa: F401
    except ImportError:
        if os.environ.get("SLUICE_REQUIRE_RAY") == "1":
            pytest.fail("ray[serve] is not installed (scripts/test.sh installs the cluster "
                        "extra)")
        pytest.skip("ray[serve] is not installed")
    return ray


def cluster_config(cluster: dict[str, Any], *, redis_url: str | None = None,
                   step_s: float = 0.02, **sections: Any) -> Config:
    """Synthetic models (a chat model whose decode steps take ``step_s``, an embedder) on
    one worker per replica; tenants ``open`` and ``limited`` (1 request/s, burst 3)."""
    tenants = [{"id": "open", "api_keys": [KEYS["open"]]},
               {"id": "limited", "api_keys": [KEYS["limited"]],
                "limits": {"requests_per_s": 1, "burst": 3}}]
    quota = ({"backend": "redis", "redis_url": redis_url} if redis_url
             else {"backend": "memory"})
    base = {"num_cpus": 0.25, "ingress_num_cpus": 0.1, "prefix_chars": 64,
            "stats_period_s": 0.25, "health_check_period_s": 1.0}
    return config_with(
        models=[synth_chat(step_fixed_s=step_s), synth_embed()],
        workers={"count": 1}, tenants=tenants, quota=quota,
        server={"default_model": "synth-chat", "drain_timeout_s": 20.0},
        cluster={**base, **cluster}, **sections)


def deploy(config: Config) -> None:
    """Run the sluice app (front end + replicas) on the session's Serve, at ``/``."""
    from sluice.cluster.app import run_app

    run_app(config)


def undeploy(config: Config) -> None:
    from sluice.cluster.app import stop_app

    stop_app(config)


def replica_actors(app_name: str) -> dict[str, Any]:
    """The live replica actors of the app's replica deployment, by replica id."""
    import ray

    prefix = f"SERVE_REPLICA::{app_name}#SluiceReplica#"
    out = {}
    for entry in ray.util.list_named_actors(all_namespaces=True):
        name = entry["name"]
        if name.startswith(prefix):
            try:
                out[name[len(prefix):]] = ray.get_actor(name, namespace=entry["namespace"])
            except ValueError:  # gone between the listing and the lookup
                continue
    return out


def replica_stats(actor: Any) -> dict[str, Any]:
    """What the replica reports to the routers (``SluiceReplica.record_routing_stats``)."""
    import ray

    stats: dict[str, Any] = ray.get(actor.record_routing_stats.remote(), timeout=10)
    return stats


def running_replicas(app_name: str) -> int:
    from sluice.cluster.app import running_replicas as running

    return running(app_name) or 0


def wait_until(predicate: Callable[[], Any], timeout_s: float, what: str,
               every_s: float = 0.1) -> Any:
    end = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > end:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(every_s)


def auth(tenant: str = "open") -> dict[str, str]:
    return {"authorization": f"Bearer {KEYS[tenant]}"}


def chat_body(system: str, user: str, *, max_tokens: int = 4, stream: bool = False,
              model: str = "synth-chat") -> dict[str, Any]:
    return {"model": model, "max_tokens": max_tokens, "stream": stream, "temperature": 0,
            "messages": [{"role": "system", "content": system},
                         {"role": "user", "content": user}]}


