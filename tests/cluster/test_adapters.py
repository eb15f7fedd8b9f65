"""The Ray-facing adapters without a running Ray: Serve options from the [cluster] section,
replica views from routing stats, the autoscaling policy on a context like Serve's."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from tests.cluster.raylocal import cluster_config, require_ray

require_ray()

from sluice.cluster.app import (  # noqa: E402
    ingress_options,
    max_ongoing_per_replica,
    replica_options,
    router_kwargs,
)
from sluice.cluster.autoscale import SluiceAutoscalePolicy  # noqa: E402
from sluice.cluster.hints import RouteHint  # noqa: E402
from sluice.cluster.router import hint_of, replica_view  # noqa: E402
from sluice.config import Config  # noqa: E402


def test_fixed_fleet_and_autoscaled_fleet_options() -> None:
    fixed = replica_options(cluster_config({"min_replicas": 2, "max_replicas": 2}))
    assert fixed["num_replicas"] == 2 and "autoscaling_config" not in fixed
    config = cluster_config({"min_replicas": 1, "max_replicas": 3, "num_cpus": 2,
                             "num_gpus": 1, "resources": {"pool": 1.0}})
    options = replica_options(config)
    assert options["autoscaling_config"]["max_replicas"] == 3
    assert options["ray_actor_options"] == {"num_cpus": 2, "num_gpus": 1,
                                            "resources": {"pool": 1.0}}
    # Default: the replica's queue plus its workers' inboxes (32 + 1 × 8 in the example).
    assert options["max_ongoing_requests"] == max_ongoing_per_replica(config) == 40
    assert options["graceful_shutdown_timeout_s"] == config.server.drain_timeout_s + 10
    front = ingress_options(config)
    assert front["max_ongoing_requests"] >= 3 * 40 + config.cluster.max_queued_requests
    assert router_kwargs(config)["model_bytes"] == {m.id: m.memory_bytes
                                                    for m in config.models}
    assert set(router_kwargs(config)["model_bytes"]) == {"synth-chat", "synth-a"}


def test_cluster_section_is_validated_and_ignored_elsewhere() -> None:
    data = cluster_config({}).model_dump()
    data["cluster"] = {"min_replicas": 3, "max_replicas": 2}
    with pytest.raises(ValueError, match=r"cluster\.max_replicas"):
        Config.model_validate(data)
    data["cluster"] = {"min_replicas": 1, "max_replicas": 2, "initial_replicas": 5}
    with pytest.raises(ValueError, match="initial_replicas"):
        Config.model_validate(data)
    data["cluster"] = {"router": "random"}
    with pytest.raises(ValueError, match="router"):
        Config.model_validate(data)


def test_replica_view_reads_stats_and_tolerates_none() -> None:
    view = replica_view("r1", 3, 8, {"resident": ["m"], "free_bytes": 10, "draining": True})
    assert view.resident == frozenset({"m"}) and view.free_bytes == 10 and view.draining
    bare = replica_view("r2", -1, 0, None)  # before its first report
    assert (bare.ongoing, bare.capacity, bare.resident) == (0, 1, frozenset())
    hint = RouteHint("m", "k")
    assert hint_of(SimpleNamespace(args=["x", hint], kwargs={})) is hint
    assert hint_of(SimpleNamespace(args=[], kwargs={"h": hint})) is hint
    assert hint_of(None) is None


def test_autoscale_policy_on_serve_like_context() -> None:
    policy = SluiceAutoscalePolicy(target_load_per_replica=4.0, target_kv_use=0.8)
    ctx = SimpleNamespace(
        aggregated_metrics={"sluice_load": {"r1": 6.0, "r2": 3.0, "gone": 50.0},
                            "sluice_kv_use": {"r1": 0.2, "r2": 0.1}},
        running_replicas=["r1", "r2"], current_num_replicas=2, target_num_replicas=2,
        capacity_adjusted_min_replicas=1, capacity_adjusted_max_replicas=4,
        total_queued_requests=1.0, policy_state={"kept": 1})
    replicas, state = policy(ctx)
    assert replicas == 3  # (6 + 3 + 1 queued) / 4 → 3; a replica that left is not counted
    assert state["kept"] == 1 and "→ 3" in state["sluice_reason"]
    ctx.aggregated_metrics, ctx.total_queued_requests = None, 0.0  # no report yet: stay
    assert policy(ctx)[0] == 2


def test_serve_ray_flag_hands_the_config_to_ray_serve(monkeypatch: pytest.MonkeyPatch) -> None:
    from sluice import cli
    from sluice.cluster import app
    from tests.server.live import SYNTHETIC_TOML

    calls: list[tuple[Config, str | None]] = []
    monkeypatch.setattr(app, "serve_on_ray",
                        lambda config, address=None: calls.append((config, address)) or 0)
    assert cli.main(["serve", "--ray", "--ray-address", "auto", "-c", str(SYNTHETIC_TOML),
                     "--port", "9123"]) == 0
    [(config, address)] = calls
    assert address == "auto" and config.server.port == 9123
    assert config.cluster.min_replicas == 1  # the file has no [cluster]: the defaults
