"""``/metrics`` in the Prometheus text format, parsed with prometheus_client: the counts
agree with the requests that were made."""

from __future__ import annotations

from collections.abc import Callable

import httpx

from tests.server.live import LiveServer, metric_sum, scrape, synthetic_config, wait_for

CHAT = "synth-chat"


def _generative(c: httpx.Client, i: int) -> int:
    """One of several generative request shapes; returns its completion tokens."""
    n = 2 + i
    msgs = [{"role": "user", "content": f"question {i}"}]
    if i % 4 == 0:
        r = c.post("/v1/chat/completions", json={"model": CHAT, "messages": msgs, "max_tokens": n})
    elif i % 4 == 1:
        with c.stream("POST", "/v1/chat/completions", json={
                "model": CHAT, "messages": msgs, "max_tokens": n, "stream": True}) as r:
            assert r.status_code == 200
            r.read()
    elif i % 4 == 2:
        r = c.post("/v1/completions", json={"model": CHAT, "prompt": f"p {i}", "max_tokens": n},
                   headers={"x-tenant-id": "t2"})
    else:
        with c.stream("POST", "/v1/infer", json={"model": CHAT, "input": "x",
                                                 "max_new_tokens": n, "stream": True}) as r:
            assert r.status_code == 200
            r.read()
    assert r.status_code == 200
    return n


def test_metrics_count_the_requests(serve: Callable[..., LiveServer]) -> None:
    live = serve(synthetic_config())
    n_generative, n_oneshot = 6, 3
    with live.client() as c:
        empty = scrape(c)
        assert metric_sum(empty, "sluice_time_to_first_token_seconds_count") == 0
        assert metric_sum(empty, "sluice_queue_capacity") == 32
        completion_tokens = sum(_generative(c, i) for i in range(n_generative))
        for i in range(n_oneshot):
            assert c.post("/v1/embeddings", json={"model": "synth-a",
                                                  "input": f"text {i}"}).status_code == 200
        # Requests that never reach the runtime are not counted.
        assert c.post("/v1/infer", json={"model": "nope", "input": "x"}).status_code == 404
        assert c.post("/v1/infer", content=b"{", headers={
            "content-type": "application/json"}).status_code == 400
        wait_for(lambda: c.get("/status.json").json()["live_requests"] == 0)
        s = scrape(c)

    n_total = n_generative + n_oneshot
    n_t2 = sum(1 for i in range(n_generative) if i % 4 == 2)
    ttft_count = metric_sum(s, "sluice_time_to_first_token_seconds_count")
    assert ttft_count == n_generative
    assert metric_sum(s, "sluice_time_to_first_token_seconds_count", tenant="t2") == n_t2
    buckets = [(float(labels["le"]), v) for labels, v in
               s["sluice_time_to_first_token_seconds_bucket"] if labels["tenant"] == "default"]
    assert max(buckets)[1] == n_generative - n_t2  # le="+Inf" holds every observation
    assert all(v1 <= v2 for (_, v1), (_, v2) in zip(sorted(buckets), sorted(buckets)[1:],
                                                    strict=False))
    assert metric_sum(s, "sluice_time_to_first_token_seconds_sum") > 0

    assert metric_sum(s, "sluice_requests_total", state="completed") == n_total
    assert metric_sum(s, "sluice_requests_total", state="completed", model=CHAT) == n_generative
    assert metric_sum(s, "sluice_requests_total", state="failed") == 0
    assert metric_sum(s, "sluice_admitted_total") == n_total
    # Every request that started execution is in the queue-wait histogram.
    assert metric_sum(s, "sluice_queue_wait_seconds_count") == n_total
    assert metric_sum(s, "sluice_request_latency_seconds_count") == n_total
    assert metric_sum(s, "sluice_goodput_total") == n_total
    assert metric_sum(s, "sluice_tokens_total", kind="completion") == completion_tokens
    assert metric_sum(s, "sluice_inter_token_latency_seconds_count") == n_generative
    assert metric_sum(s, "sluice_model_loads_total") >= 2
    # Gauges from the snapshot: idle now.
    assert metric_sum(s, "sluice_queue_depth") == 0
    assert metric_sum(s, "sluice_worker_active") == 0
    assert metric_sum(s, "sluice_kv_blocks_used") == 0
    assert metric_sum(s, "sluice_worker_budget_bytes") == 2 * 800_000_000


def test_worker_up_follows_the_worker_threads(serve: Callable[..., LiveServer]) -> None:
    live = serve(synthetic_config())
    with live.client() as c:
        s = scrape(c)
        up = sorted((labels["worker"], v) for labels, v in s["sluice_worker_up"])
        assert up == [("0", 1), ("1", 1)]
        worker = live.runtime.workers[1]
        worker.stop()
        worker.join(5.0)
        assert not worker.is_alive()
        s = scrape(c)
        assert metric_sum(s, "sluice_worker_up", worker="0") == 1
        assert metric_sum(s, "sluice_worker_up", worker="1") == 0
