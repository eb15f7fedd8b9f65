"""A real Prometheus scrapes a live sluice under a short mixed load, with deploy/'s scrape
job and rule files; then every recording rule, every dashboard query and the autoscaler's
adapter query are evaluated through Prometheus' HTTP API, and each must return data (a
number, not NaN); every alert rule must evaluate without error.

The load covers what the dashboard shows: streamed generations (TTFT, TPOT, tokens, KV,
batches), embeddings, a model group served by the planner (variant mix, predicted wait)
and refused by it (deadline infeasible), a tenant over its quota (429) and bursts past a
small queue (503). Bounded: the test ends as soon as every query has data, or fails after
``DATA_TIMEOUT_S``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from sluice.config import Config
from tests.deploy.deployfiles import (
    PROMETHEUS,
    RULE_FILES,
    Query,
    adapter_queries,
    dashboard_queries,
    recording_rules,
    rules,
)
from tests.deploy.promproc import PrometheusProcess, finite_values
from tests.server.live import LiveServer, config_with

pytestmark = pytest.mark.timeout(120)

DATA_TIMEOUT_S = 45.0
SCRAPE_INTERVAL = "1s"
NAMESPACE, POD = "sluice", "sluice-test-0"
METRICS_KEY = "metrics-key-for-the-scrape"
"""Target labels the Kubernetes scrape job would add (the adapter's rules need them)."""


def _variant(model_id: str, accuracy: float, batch_fixed_s: float) -> dict[str, Any]:
    return {"id": model_id, "kind": "oneshot", "backend": "synthetic",
            "task": "classification", "memory_bytes": 10_000_000, "load_cost_s": 0.1,
            "options": {"accuracy": accuracy, "batch_fixed_s": batch_fixed_s,
                        "per_item_s": 0.0005, "load_s": 0.0}}


def _config() -> Config:
    chat = {"id": "synth-chat", "kind": "generative", "backend": "synthetic",
            "task": "generation", "memory_bytes": 100_000_000, "load_cost_s": 0.1,
            "options": {"load_s": 0.0, "n_seq_max": 4, "n_ctx_per_seq": 256,
                        "step_fixed_s": 0.004, "decode_per_seq_s": 0.0005,
                        "prefill_per_token_s": 0.00005}}
    embed = {"id": "synth-embed", "kind": "oneshot", "backend": "synthetic",
             "task": "embedding", "memory_bytes": 10_000_000, "load_cost_s": 0.1,
             "options": {"dim": 8, "load_s": 0.0, "batch_fixed_s": 0.002,
                         "per_item_s": 0.0005}}
    return config_with(
        models=[chat, embed, _variant("slow", 0.9, 0.03), _variant("fast", 0.8, 0.002)],
        groups=[{"id": "sentiment", "variants": ["slow", "fast"], "low_load_utilization": 0.0}],
        # One request per 100 s: every request after the first is a 429, however slow the
        # machine runs the load.
        tenants=[{"id": "limited", "limits": {"requests_per_s": 0.01, "burst": 1}}],
        # /metrics needs the key, as in deploy/: Prometheus sends it from credentials_file
        server={"metrics_key": METRICS_KEY},
        scheduling={"queue_capacity": 4},
        workers={"count": 2, "budget_bytes": 10**9, "inbox_capacity": 2},
    )


def _prometheus_config(target: str, key_file: Path) -> dict[str, Any]:
    """deploy/prometheus/prometheus.yml with its rule files and scrape job as committed,
    pointed at the test's sluice, scraping every second, and reading the metrics key from
    ``key_file`` (a Compose secret in deploy/)."""
    config: dict[str, Any] = yaml.safe_load((PROMETHEUS / "prometheus.yml").read_text())
    config["global"].update(scrape_interval=SCRAPE_INTERVAL, evaluation_interval=SCRAPE_INTERVAL)
    config["rule_files"] = [str(p) for p in RULE_FILES]
    [job] = [j for j in config["scrape_configs"] if j["job_name"] == "sluice"]
    job["static_configs"] = [{"targets": [target],
                              "labels": {"namespace": NAMESPACE, "pod": POD}}]
    job["authorization"]["credentials_file"] = str(key_file)
    return config


def _load(url: str, stop: threading.Event) -> None:
    """Mixed traffic until ``stop``; statuses are not checked here (refusals are part of
    the point), only that the server answers."""
    chat = {"model": "synth-chat", "messages": [{"role": "user", "content": "hello there"}],
            "max_tokens": 12, "stream": True}
    with httpx.Client(base_url=url, timeout=30) as c, ThreadPoolExecutor(8) as pool:
        while not stop.is_set():
            with c.stream("POST", "/v1/chat/completions", json=chat) as r:
                r.read()
            c.post("/v1/embeddings", json={"model": "synth-embed", "input": ["a", "b"]})
            c.post("/v1/infer", json={"model": "sentiment", "input": "fine", "deadline_ms": 5000})
            c.post("/v1/infer", json={"model": "sentiment", "input": "x", "deadline_ms": 0.01})
            c.post("/v1/completions", headers={"x-tenant-id": "limited"},
                   json={"model": "synth-chat", "prompt": "hi", "max_tokens": 4})
            # A burst past the queue (capacity 4, two inboxes of 2): some are refused.
            list(pool.map(lambda _: c.post("/v1/chat/completions", json={
                **chat, "stream": False, "max_tokens": 24}), range(12)))
            stop.wait(0.2)


@pytest.fixture
def scraped(serve: Callable[..., LiveServer], prometheus: str,
            tmp_path: Path) -> Iterator[PrometheusProcess]:
    """A live sluice under load, scraped by a real Prometheus with deploy/'s rules."""
    live = serve(_config())
    key_file = tmp_path / "metrics-key"
    key_file.write_text(METRICS_KEY + "\n")
    prom = PrometheusProcess(prometheus, _prometheus_config(live.url.removeprefix("http://"),
                                                            key_file))
    stop = threading.Event()
    loader = threading.Thread(target=_load, args=(live.url, stop), daemon=True)
    try:
        prom.start()
        loader.start()
        yield prom
    finally:
        stop.set()
        loader.join(30)
        prom.stop()


def _missing(prom: PrometheusProcess, queries: list[Query]) -> list[str]:
    return [f"{q.source}: {q.expr}" for q in queries if not finite_values(prom.query(q.expr))]


def test_every_rule_and_dashboard_query_returns_data(scraped: PrometheusProcess) -> None:
    prom = scraped
    queries = [*recording_rules(), *dashboard_queries(), *adapter_queries(NAMESPACE, POD)]
    assert len(queries) > 40
    deadline = time.monotonic() + DATA_TIMEOUT_S
    missing = _missing(prom, queries)
    while missing and time.monotonic() < deadline:
        time.sleep(1.0)
        missing = _missing(prom, queries)
    assert not missing, "no data for:\n" + "\n".join(missing) + "\n" + prom.log()

    # Every rule (recording and alerting) was evaluated without error.
    groups = prom.api("rules")["groups"]
    evaluated = [r for g in groups for r in g["rules"]]
    assert len(evaluated) == len(rules())
    bad = [(r["name"], r.get("lastError")) for r in evaluated if r["health"] != "ok"]
    assert not bad, bad

    # The scrape saw one healthy target with the labels the adapter maps to a pod.
    [target] = prom.api("targets")["activeTargets"]
    assert target["health"] == "up"
    assert target["labels"]["pod"] == POD
    # Spot checks that the numbers mean what the panels say.
    assert finite_values(prom.query('sum(sluice_worker_up)')) == [2.0]
    assert max(finite_values(prom.query(
        'sum(increase(sluice_quota_rejections_total{tenant="limited"}[1m]))'))) > 0
