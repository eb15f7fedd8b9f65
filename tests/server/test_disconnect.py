"""A client that goes away cancels its request: the sequence slot and KV blocks are freed
at once and ``sluice_requests_total{state="cancelled"}`` counts it."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from tests.server.live import LiveServer, config_with, metric_sum, scrape, synth_chat, wait_for

SLOW = "slow"


@pytest.fixture(scope="module")
def slow_server(serve_module: Callable[..., LiveServer]) -> LiveServer:
    """One worker; 20 ms per step, so a 500-token request runs for about 10 s."""
    return serve_module(config_with(
        models=[synth_chat(SLOW, step_fixed_s=0.02, load_s=0.0)], workers={"count": 1}))


@pytest.fixture
def watcher(slow_server: LiveServer) -> Iterator[httpx.Client]:
    with slow_server.client() as c:
        yield c


def _cancelled(c: httpx.Client) -> float:
    return metric_sum(scrape(c), "sluice_requests_total", state="cancelled")


def _worker(c: httpx.Client) -> dict[str, Any]:
    return c.get("/status.json").json()["workers"][0]  # type: ignore[no-any-return]


def _idle_and_free(c: httpx.Client) -> bool:
    w = _worker(c)
    models = [m for m in w["models"] if m["model_id"] == SLOW]
    return (w["active"] == 0 and w["inbox_depth"] == 0 and bool(models)
            and models[0]["kv_free_blocks"] == models[0]["kv_total_blocks"]
            and models[0]["running"] == 0 and models[0]["in_use"] == 0)


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/infer"])
def test_streaming_client_that_disconnects_is_cancelled(
    slow_server: LiveServer, watcher: httpx.Client, path: str
) -> None:
    before = _cancelled(watcher)
    body: dict[str, Any] = {"model": SLOW, "stream": True}
    if path == "/v1/infer":
        body.update(input="go", max_new_tokens=500)
    else:
        body.update(messages=[{"role": "user", "content": "go"}], max_tokens=500)
    with slow_server.client() as c, c.stream("POST", path, json=body) as r:
        assert r.status_code == 200
        lines = r.iter_lines()
        got = [line for line in (next(lines) for _ in range(6)) if line.startswith("data:")]
        assert len(got) >= 3  # mid-stream
        w = _worker(watcher)
        assert w["active"] == 1
        kv = next(m for m in w["models"] if m["model_id"] == SLOW)
        assert kv["kv_free_blocks"] < kv["kv_total_blocks"]
    # The response and the connection are closed here, about 9 s before the end.
    wait_for(lambda: _cancelled(watcher) == before + 1, timeout_s=3)
    wait_for(lambda: _idle_and_free(watcher), timeout_s=3)
    assert metric_sum(scrape(watcher), "sluice_requests_total", state="completed",
                      model=SLOW) == 0


def test_non_streaming_client_that_times_out_is_cancelled(
    slow_server: LiveServer, watcher: httpx.Client
) -> None:
    before = _cancelled(watcher)
    with slow_server.client(timeout=httpx.Timeout(10.0, read=0.3)) as c, \
            pytest.raises(httpx.ReadTimeout):
        c.post("/v1/infer", json={"model": SLOW, "input": "go", "max_new_tokens": 500})
    wait_for(lambda: _cancelled(watcher) == before + 1, timeout_s=3)
    wait_for(lambda: _idle_and_free(watcher), timeout_s=3)


def test_server_serves_normally_after_disconnects(watcher: httpx.Client) -> None:
    r = watcher.post("/v1/infer", json={"model": SLOW, "input": "go", "max_new_tokens": 3})
    assert r.status_code == 200
    assert r.json()["usage"]["completion_tokens"] == 3
