"""Bounded admission under a burst: every request gets an answer at once — served (200)
or refused with a Retry-After (503) — never a hang, a dropped connection or a timeout."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable

import httpx

from tests.server.live import LiveServer, config_with, metric_sum, scrape, synth_chat, wait_for

N_REQUESTS = 64
MAX_NEW_TOKENS = 10
"""At 50 ms a step an admitted request holds its place for over half a second, so the
burst cannot drain as fast as it arrives even on a loaded machine."""


def test_burst_of_64_gets_only_200_or_503_with_retry_after(
    serve: Callable[..., LiveServer],
) -> None:
    live = serve(config_with(
        models=[synth_chat("slow", step_fixed_s=0.05, load_s=0.0)],
        workers={"count": 1, "inbox_capacity": 1},
        scheduling={"queue_capacity": 8},
    ))

    async def burst() -> list[httpx.Response | BaseException]:
        limits = httpx.Limits(max_connections=N_REQUESTS, max_keepalive_connections=0)
        async with live.async_client(limits=limits, timeout=30.0) as c:
            async def one(i: int) -> httpx.Response:
                payload = {"model": "slow", "input": f"request {i}",
                           "max_new_tokens": MAX_NEW_TOKENS}
                return await c.post("/v1/infer", json=payload)

            return await asyncio.gather(*(one(i) for i in range(N_REQUESTS)),
                                        return_exceptions=True)

    results = asyncio.run(burst())
    errors = [r for r in results if not isinstance(r, httpx.Response)]
    assert errors == [], errors  # no connection errors, no timeouts
    responses = [r for r in results if isinstance(r, httpx.Response)]
    statuses = Counter(r.status_code for r in responses)
    assert set(statuses) <= {200, 503}, statuses
    ok, refused = statuses[200], statuses[503]
    assert ok + refused == N_REQUESTS
    # 8 queue places + 1 inbox place + 8 sequence slots cannot hold 64 at once.
    assert refused > 0 and ok >= 1
    for r in responses:
        assert r.headers.get("x-request-id")
        if r.status_code == 503:
            body = r.json()
            assert body["error"]["code"] == "queue_full"
            assert body["error"]["type"] == "server_overloaded"
            assert r.headers["retry-after"].isdigit(), r.headers["retry-after"]
            assert int(r.headers["retry-after"]) >= 1
        else:
            assert r.json()["usage"]["completion_tokens"] == MAX_NEW_TOKENS
            assert "retry-after" not in r.headers

    with live.client() as c:
        wait_for(lambda: c.get("/status.json").json()["live_requests"] == 0)
        samples = scrape(c)
        status = c.get("/status.json").json()
    assert metric_sum(samples, "sluice_admitted_total") == ok
    assert metric_sum(samples, "sluice_requests_total", state="completed") == ok
    assert metric_sum(samples, "sluice_rejections_total", reason="queue_full") == refused
    assert status["queue_depth"] == 0
    model = status["workers"][0]["models"][0]
    assert model["kv_free_blocks"] == model["kv_total_blocks"]
