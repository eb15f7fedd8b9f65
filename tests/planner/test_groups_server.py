"""Model groups through the HTTP server on synthetic variants: the planner's choice, its
decision record (headers, metrics), early rejection, and naming a variant directly."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from pydantic import ValidationError

from sluice.config import Config
from tests.server.live import LiveServer, assert_error, config_with, metric_sum, scrape


def variant(model_id: str, accuracy: float, batch_fixed_s: float, task: str = "classification",
            **options: Any) -> dict[str, Any]:
    opts: dict[str, Any] = {"accuracy": accuracy, "batch_fixed_s": batch_fixed_s,
                            "per_item_s": 0.0005, "load_s": 0.0, "dim": 8}
    opts.update(options)
    return {"id": model_id, "kind": "oneshot", "backend": "synthetic", "task": task,
            "memory_bytes": 10_000_000, "load_cost_s": 0.1, "options": opts}


def group_config(**group: Any) -> Config:
    models = [variant("slow", 0.90, 0.060), variant("fast", 0.80, 0.002),
              variant("embed-a", 0.7, 0.002, task="embedding")]
    g = {"id": "sentiment", "variants": ["slow", "fast"], **group}
    return config_with(models=models, groups=[g], workers={"count": 1, "budget_bytes": 10**9})


def infer(live: LiveServer, model: str, deadline_ms: float | None = None) -> Any:
    body: dict[str, Any] = {"model": model, "input": "a fine day"}
    if deadline_ms is not None:
        body["deadline_ms"] = deadline_ms
    with live.client() as c:
        return c.post("/v1/infer", json=body)


def test_low_load_serves_the_most_accurate_variant(serve: Callable[..., LiveServer]) -> None:
    live = serve(group_config())
    r = infer(live, "sentiment", deadline_ms=5_000)
    assert r.status_code == 200, r.text
    assert r.headers["x-sluice-variant"] == "slow"
    assert float(r.headers["x-sluice-predicted-wait-ms"]) >= 0
    assert "x-sluice-queue-wait-ms" in r.headers
    # the plan's diagnostics: an idle pool, slow (60 ms) fits alone, a batch of one
    assert r.headers["x-sluice-plan-reason"] == "low_load"
    assert (r.headers["x-sluice-pool-idle"], r.headers["x-sluice-accurate-fits-alone"]) \
        == ("1", "1")
    assert r.headers["x-sluice-batch-size"] == "1"
    assert float(r.headers["x-sluice-predicted-sojourn-ms"]) >= 60
    assert float(r.headers["x-sluice-predicted-run-ms"]) >= 60
    assert float(r.headers["x-sluice-sojourn-ms"]) >= float(r.headers["x-sluice-run-ms"]) >= 60
    assert set(r.json()["output"]) == {"negative", "positive"}
    # the low-load test's inputs: one arrival over the rate's 2 s minimum span, its
    # Poisson error, and a line above it (why the request was planned as at low load)
    rate, stderr, line = map(float, r.headers["x-sluice-plan-arrival"].split())
    assert (rate, stderr) == (0.5, 0.5) and line > rate
    with live.client() as c:
        samples = scrape(c)
        names = [m["id"] for m in c.get("/v1/models").json()["data"]]
        # the arrival meter a simulation of what follows starts from: that one arrival
        arrivals = c.get("/status.json").json()["groups"]["sentiment"]["arrivals"]
    assert len(arrivals["ages_s"]) == 1 and arrivals["first_age_s"] >= arrivals["ages_s"][0] > 0
    assert metric_sum(samples, "sluice_variant_choices_total", group="sentiment",
                      variant="slow", reason="low_load") == 1
    assert "sentiment" in names


def test_a_tight_deadline_moves_to_the_faster_variant(serve: Callable[..., LiveServer]) -> None:
    live = serve(group_config(low_load_utilization=0.0))
    r = infer(live, "sentiment", deadline_ms=30)  # slow needs 60 ms of service alone
    assert r.status_code == 200, r.text
    assert r.headers["x-sluice-variant"] == "fast"
    assert r.headers["x-sluice-plan-reason"] == "meets_deadline"
    assert r.headers["x-sluice-accurate-fits-alone"] == "0"
    r = infer(live, "sentiment", deadline_ms=2_000)
    assert r.headers["x-sluice-variant"] == "slow"
    with live.client() as c:
        samples = scrape(c)
    assert metric_sum(samples, "sluice_variant_choices_total", variant="fast",
                      reason="meets_deadline") == 1


def test_no_feasible_variant_is_rejected_at_once(serve: Callable[..., LiveServer]) -> None:
    live = serve(group_config(low_load_utilization=0.0))
    r = infer(live, "sentiment", deadline_ms=1)
    err = assert_error(r, 503, code="deadline_infeasible")
    assert "fast" in err["message"]
    assert int(r.headers["retry-after"]) >= 1
    with live.client() as c:
        samples = scrape(c)
    assert metric_sum(samples, "sluice_planner_rejections_total", group="sentiment") == 1
    assert metric_sum(samples, "sluice_rejections_total", reason="deadline_infeasible") == 1


def test_group_default_deadline_applies(serve: Callable[..., LiveServer]) -> None:
    live = serve(group_config(low_load_utilization=0.0, default_deadline_ms=30))
    assert infer(live, "sentiment").headers["x-sluice-variant"] == "fast"


def test_naming_a_variant_still_works(serve: Callable[..., LiveServer]) -> None:
    live = serve(group_config(low_load_utilization=0.0))
    r = infer(live, "slow", deadline_ms=30)  # not re-planned, even though it will be late
    assert r.status_code in (200, 504), r.text
    assert "x-sluice-plan-reason" not in r.headers  # no group, no plan
    if r.status_code == 200:
        assert r.headers["x-sluice-variant"] == "slow"
        assert "x-sluice-predicted-wait-ms" in r.headers


def test_baseline_policies(serve: Callable[..., LiveServer]) -> None:
    live = serve(group_config(policy="fastest"))
    assert infer(live, "sentiment", deadline_ms=5_000).headers["x-sluice-variant"] == "fast"


def test_groups_work_on_embeddings(serve: Callable[..., LiveServer]) -> None:
    models = [variant("e-big", 0.9, 0.01, task="embedding"),
              variant("e-small", 0.8, 0.001, task="embedding")]
    cfg = config_with(models=models, groups=[{"id": "embed", "variants": ["e-big", "e-small"]}])
    live = serve(cfg)
    with live.client() as c:
        r = c.post("/v1/embeddings", json={"model": "embed", "input": ["one", "two"]})
    assert r.status_code == 200, r.text
    assert r.json()["model"] == "embed"
    assert len(r.json()["data"]) == 2
    assert r.headers["x-sluice-variant"] == "e-big"


@pytest.mark.parametrize(
    ("group", "match"),
    [
        ({"id": "g", "variants": ["nope"]}, "unknown models"),
        ({"id": "g", "variants": ["slow", "embed-a"]}, "one task"),
        ({"id": "slow", "variants": ["fast"]}, "also a model id"),
        ({"id": "g", "variants": ["slow"], "pessimism": 0}, "pessimism"),
    ],
)
def test_bad_groups_name_the_field(group: dict[str, Any], match: str) -> None:
    models = [variant("slow", 0.9, 0.06), variant("fast", 0.8, 0.002),
              variant("embed-a", 0.7, 0.002, task="embedding")]
    with pytest.raises(ValidationError, match=match):
        config_with(models=models, groups=[group])
