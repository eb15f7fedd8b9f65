"""Extreme-but-well-typed sampling values on the real model (packaged Gemma 3 270M), over
HTTP: each is served (200), the same worker then serves a plain request, and no worker
died. The whole range is covered on the synthetic backend by the property tests in
``tests/reliability/test_sampling_range.py``; these are the cases issue 11 met first."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from bench.lib.extremes import EXTREMES
from tests.llm.test_llm_server import MODEL, config
from tests.server.live import LiveServer, metric_sum, scrape, start_server

pytestmark = pytest.mark.llm
pytest.importorskip("llama_cpp", reason="the llm extra is not installed")


@pytest.fixture(scope="module")
def live() -> Iterator[LiveServer]:
    server = start_server(config())
    yield server
    server.stop()


@pytest.mark.parametrize("fields", EXTREMES, ids=lambda f: ",".join(f))
def test_extreme_values_are_served_and_the_worker_serves_on(
    live: LiveServer, fields: dict[str, Any],
) -> None:
    worker = live.runtime.workers[0]
    with live.client(timeout=120) as c:
        r = c.post("/v1/chat/completions", json={
            "model": MODEL, "max_tokens": 8,
            "messages": [{"role": "user", "content": "Say hello."}], **fields})
        assert r.status_code == 200, r.text
        assert len(r.json()["choices"]) == fields.get("n", 1)
        plain = c.post("/v1/completions", json={"model": MODEL, "prompt": "Hello",
                                                "max_tokens": 2})
        assert plain.status_code == 200, plain.text
        assert metric_sum(scrape(c), "sluice_worker_deaths_total") == 0
    assert live.runtime.workers[0] is worker


def test_counts_add_up(live: LiveServer) -> None:
    with httpx.Client(base_url=live.url, timeout=30) as c:
        s = scrape(c)
    assert metric_sum(s, "sluice_requests_total", state="completed") == 2 * len(EXTREMES)
    assert metric_sum(s, "sluice_requests_total") == 2 * len(EXTREMES)
