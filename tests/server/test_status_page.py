"""The status page: ``/status.json`` carries the last minutes (the metrics history), each
model's residency, each tenant's usage against its quota and the last decisions; in headless
Chromium the page polls it and renders the queue, every worker, and after real traffic the
charts (SVG paths), the models, the tenants and the decisions. The metrics key guards the
data, not the page (tests/reliability covers the refusals)."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from tests.server.browser import Browser, needs_chromium, render
from tests.server.live import LiveServer, config_with, synth_chat, synth_embed, synthetic_config
from tests.server.live import wait_for as poll

METRICS_KEY = "mk-status-page"
KEY_A, KEY_B = "key-team-a", "key-team-b"


@needs_chromium
def test_status_page_renders_live_numbers(serve: Callable[..., LiveServer]) -> None:
    live = serve(synthetic_config())
    with live.client() as c:
        assert c.post("/v1/infer", json={"model": "synth-a", "input": "x"}).status_code == 200
    dom = render(f"{live.url}/status")
    sub = re.search(r'<div class="sub" id="sub">(.*?)</div>', dom)
    assert sub is not None, dom[:500]
    assert sub.group(1).startswith("scheduler fifo · router residency_aware · updated")
    rows = re.findall(r'<tr class="worker"><td>(\d+)</td>', dom)
    assert rows == ["0", "1"]  # one rendered row per configured worker
    assert "synth-a" in dom and "synth-chat" in dom  # resident models are listed
    assert '<b id="queue">0 / 32</b>' in dom


@pytest.fixture(scope="module")
def busy(serve_module: Callable[..., LiveServer]) -> LiveServer:
    """A server with two tenants (team-a limited to a burst of 2 requests) after traffic:
    six chat completions of team-b, then five of team-a at once, three of them refused by
    its quota; returned once the history holds two points, with both among them."""
    live = serve_module(config_with(
        models=[synth_chat(), synth_embed()],
        tenants=[{"id": "team-a", "api_keys": [KEY_A],
                  "limits": {"requests_per_s": 0.1, "burst": 2, "max_concurrent": 4}},
                 {"id": "team-b", "api_keys": [KEY_B]}],
        server={"metrics_key": METRICS_KEY, "default_model": "synth-chat"}))
    body = {"model": "synth-chat", "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 16}
    with live.client(headers={"Authorization": f"Bearer {KEY_B}"}) as c:
        for _ in range(6):
            assert c.post("/v1/chat/completions", json=body).status_code == 200
    with live.client(headers={"Authorization": f"Bearer {KEY_A}"}) as c:
        codes = sorted(c.post("/v1/chat/completions", json=body).status_code for _ in range(5))
        assert codes == [200, 200, 429, 429, 429]

    def settled() -> bool:
        points = status(live)["history"]["points"]
        return (len(points) >= 2 and any(p["tokens_per_s"] > 0 for p in points)
                and any(p["refusals_per_s"] for p in points))

    poll(settled, timeout_s=15.0, every_s=0.5)
    return live


def status(live: LiveServer) -> dict[str, Any]:
    r = httpx.get(f"{live.url}/status.json", headers={"X-Metrics-Key": METRICS_KEY}, timeout=10)
    assert r.status_code == 200, r.text
    return r.json()  # type: ignore[no-any-return]


def test_status_json_carries_the_history_models_tenants_and_decisions(busy: LiveServer) -> None:
    s = status(busy)
    history = s["history"]
    assert history["interval_s"] == 2.0 and history["span_s"] == 600.0
    points = history["points"]
    ages = [p["age_s"] for p in points]
    assert ages == sorted(ages, reverse=True) and ages[-1] >= 0  # oldest first
    assert any(p["ttft_p95_s"] is not None for p in points)
    assert any(p["tpot_p95_s"] is not None for p in points)
    refused = [p["refusals_per_s"]["quota"] for p in points if p["refusals_per_s"]]
    assert sum(refused) * history["interval_s"] == pytest.approx(3.0, rel=0.2)

    models = {m["id"]: m for m in s["models"]}
    chat = models["synth-chat"]
    assert chat["state"] == "loaded" and chat["workers"] and chat["kv_total_blocks"] > 0
    assert chat["keep_alive"] == "until evicted" and chat["unloads_in_s"] is None
    assert models["synth-a"]["state"] in ("loaded", "unloaded")

    tenants = {t["id"]: t for t in s["tenants"]}
    a = tenants["team-a"]
    assert a["limits"]["request_burst"] == 2 and a["limits"]["max_concurrent"] == 4
    assert a["refusals"] == {"requests": 3}
    assert a["requests_per_s"] > 0  # two admitted within the window
    assert tenants["team-b"]["limits"] is None and tenants["team-b"]["tokens_per_s"] > 0

    decisions = s["decisions"]
    assert [d["request_id"] for d in decisions] == sorted(
        (d["request_id"] for d in decisions), reverse=True)  # newest first
    refusals = [d for d in decisions if d["state"] == "rejected"]
    assert len(refusals) == 3
    assert {(d["tenant_id"], d["reason"], d["worker_id"]) for d in refusals} == {
        ("team-a", "quota", None)}
    served = [d for d in decisions if d["state"] == "completed"]
    assert len(served) == 8 and all(d["route"] and d["worker_id"] is not None for d in served)
    assert all(d["reason"] == "length" and d["ttft_s"] is not None for d in served)


def test_the_pages_answer_without_a_key_while_the_data_needs_it(busy: LiveServer) -> None:
    with busy.client() as c:
        assert c.get("/status").status_code == 200 and c.get("/").status_code == 200
        assert c.get("/status.json").status_code == 401


@needs_chromium
def test_the_status_page_draws_the_last_minutes(busy: LiveServer) -> None:
    with Browser(width=1280, height=1600) as browser:
        browser.goto(f"{busy.url}/status#key={METRICS_KEY}")
        browser.wait_for("document.querySelectorAll('tr.decision').length > 0")
        for chart in ("tokens", "requests", "ttft", "tpot", "refusals"):
            paths = browser.evaluate(
                f"Array.from(document.querySelectorAll('#chart-{chart} path.line'))"
                ".map(p => p.getAttribute('d'))")
            assert paths, chart
            assert all(re.fullmatch(r"M[\d.]+ [\d.]+(L[\d.]+ [\d.]+)*", d) for d in paths), paths
        legend = browser.evaluate(
            "document.querySelector('#chart-refusals figcaption').textContent")
        assert "quota" in legend
        assert len(browser.evaluate(
            "Array.from(document.querySelectorAll('#chart-tokens path.line'))[0]"
            ".getAttribute('d')").split("L")) >= 2  # a line, not a dot
        rows = browser.evaluate(
            "Array.from(document.querySelectorAll('tr.model')).map(r => r.textContent)")
        assert any(r.startswith("synth-chat") and "loaded" in r for r in rows), rows
        tenants = browser.evaluate(
            "Array.from(document.querySelectorAll('tr.tenant')).map(r => r.textContent)")
        assert any(t.startswith("team-a") and "requests 3" in t for t in tenants), tenants
        decisions = browser.evaluate(
            "Array.from(document.querySelectorAll('tr.decision')).map(r => r.textContent)")
        assert sum("rejected quota" in d for d in decisions) == 3, decisions
        assert "disconnected" not in browser.evaluate("document.getElementById('sub').textContent")
