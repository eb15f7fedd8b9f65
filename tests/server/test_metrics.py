"""``/metrics`` in the Prometheus text format, parsed with prometheus_client: the counts
agree with the requests that were made."""

from __future__ import annotations

import threading
from collections.abc import Callable

import httpx

from tests.server.live import (
    LiveServer,
    config_with,
    metric_sum,
    scrape,
    synth_chat,
    synthetic_config,
    wait_for,
)

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
    live = serve(config_with(tenants=[{"id": "t2"}]))  # configured: its own tenant label
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
    # TPOT: one mean per generative request; ITL: one gap per token after each first.
    assert metric_sum(s, "sluice_time_per_output_token_seconds_count") == n_generative
    assert metric_sum(s, "sluice_inter_token_latency_seconds_count") == \
        completion_tokens - n_generative
    tpot_mean = (metric_sum(s, "sluice_time_per_output_token_seconds_sum") / n_generative)
    itl_mean = (metric_sum(s, "sluice_inter_token_latency_seconds_sum")
                / (completion_tokens - n_generative))
    assert tpot_mean > 0 and itl_mean > 0
    prompt_tokens = metric_sum(s, "sluice_tokens_total", kind="prompt")
    assert metric_sum(s, "sluice_prefix_cache_queries_total", model=CHAT) == prompt_tokens
    assert metric_sum(s, "sluice_requests_running") == 0
    assert metric_sum(s, "sluice_requests_waiting") == 0
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
        # stopped from outside the runtime: no replacement comes, so liveness fails
        assert c.get("/health").status_code == 503


def _stream_in_background(live: LiveServer, body: dict[str, object]) -> tuple[
        threading.Thread, list[str]]:
    """Start a streamed chat request; the list gets its SSE lines as they come."""
    lines: list[str] = []

    def run() -> None:
        with live.client() as c, c.stream("POST", "/v1/chat/completions", json=body) as r:
            lines.extend(r.iter_lines())

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, lines


def test_running_waiting_and_prefix_cache_hits(serve: Callable[..., LiveServer]) -> None:
    """One slot: a second request waits while the first runs. Two slots: a second prompt
    sharing a 40-word prefix with a running one copies that prefix's KV (hits)."""
    slow = {"step_fixed_s": 0.02, "n_seq_max": 1}
    live = serve(config_with(models=[synth_chat("one-slot", **slow),
                                     synth_chat("two-slots", **{**slow, "n_seq_max": 2})],
                             workers={"count": 1, "budget_bytes": 800_000_000}))
    shared = " ".join(f"w{i}" for i in range(3, 43))
    with live.client() as c:
        first, lines = _stream_in_background(live, {
            "model": "one-slot", "stream": True, "max_tokens": 60,
            "messages": [{"role": "user", "content": "a"}]})
        wait_for(lambda: len(lines) > 2)
        second, _ = _stream_in_background(live, {
            "model": "one-slot", "stream": True, "max_tokens": 2,
            "messages": [{"role": "user", "content": "b"}]})

        def one_waiting() -> dict[str, list[tuple[dict[str, str], float]]] | None:
            m = scrape(c)
            return m if metric_sum(m, "sluice_requests_waiting") == 1 else None

        s = wait_for(one_waiting)
        assert metric_sum(s, "sluice_requests_running") == 1
        first.join(30)
        second.join(30)

        donor, lines = _stream_in_background(live, {
            "model": "two-slots", "stream": True, "max_tokens": 60,
            "messages": [{"role": "user", "content": shared + " first"}]})
        wait_for(lambda: len(lines) > 2)
        r = c.post("/v1/chat/completions", json={
            "model": "two-slots", "max_tokens": 2,
            "messages": [{"role": "user", "content": shared + " second"}]})
        assert r.status_code == 200
        donor.join(30)
        s = scrape(c)
    hits = metric_sum(s, "sluice_prefix_cache_hits_total", model="two-slots")
    assert hits >= 40
    assert metric_sum(s, "sluice_prefix_cache_queries_total", model="two-slots") >= hits + 2
    assert metric_sum(s, "sluice_prefix_cache_hits_total", model="one-slot") == 0


def test_a_retained_prefix_counts_as_a_prefix_cache_hit(
        serve: Callable[..., LiveServer]) -> None:
    """One slot, one request after another with a shared 40-word prefix: the second finds
    it retained in the slot the first left (no sequence running), and the hits say so;
    with ``engine.retain_prefixes = false`` nothing is kept."""
    shared = " ".join(f"w{i}" for i in range(3, 43))

    def hits_after_two(retain: bool) -> float:
        live = serve(config_with(models=[synth_chat("one-slot", n_seq_max=1)],
                                 engine={"retain_prefixes": retain}))
        with live.client() as c:
            for tail in ("first", "second"):
                r = c.post("/v1/chat/completions", json={
                    "model": "one-slot", "max_tokens": 2,
                    "messages": [{"role": "user", "content": f"{shared} {tail}"}]})
                assert r.status_code == 200
            return metric_sum(scrape(c), "sluice_prefix_cache_hits_total", model="one-slot")

    assert hits_after_two(retain=True) >= 40
    assert hits_after_two(retain=False) == 0
