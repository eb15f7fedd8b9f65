"""The ``vllm:*`` names the Gateway API Inference Extension's endpoint picker reads and
llama-server's ``llamacpp:*`` names, from the same state as sluice's own gauges."""

from __future__ import annotations

import time
from collections.abc import Callable

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tests.server.live import LiveServer, config_with, metric_sum, scrape, synth_chat, wait_for
from tests.server.test_metrics import _stream_in_background

LLAMA_COUNTERS = ("prompt_tokens", "prompt_tokens_cached", "prompt_seconds", "tokens_predicted",
                  "tokens_predicted_seconds", "n_decode")
LLAMA_GAUGES = ("n_tokens_max", "prompt_tokens_seconds", "predicted_tokens_seconds",
                "requests_processing", "requests_deferred", "n_busy_slots_per_decode")


def types_of(c: httpx.Client) -> dict[str, str]:
    return {f.name: f.type for f in text_string_to_metric_families(c.get("/metrics").text)}


def test_the_picker_gauges_equal_sluices_own_while_one_runs_and_one_waits(
        serve: Callable[..., LiveServer]) -> None:
    live = serve(config_with(models=[synth_chat("one-slot", step_fixed_s=0.02, n_seq_max=1)]))
    with live.client() as c:
        idle = scrape(c)
        assert metric_sum(idle, "vllm:num_requests_waiting") == 0
        assert metric_sum(idle, "vllm:num_requests_running") == 0
        first, lines = _stream_in_background(live, {
            "model": "one-slot", "stream": True, "max_tokens": 60,
            "messages": [{"role": "user", "content": "a"}]})
        wait_for(lambda: len(lines) > 2)
        second, _ = _stream_in_background(live, {
            "model": "one-slot", "stream": True, "max_tokens": 2,
            "messages": [{"role": "user", "content": "b"}]})
        s = wait_for(lambda: m if metric_sum(m := scrape(c), "sluice_requests_waiting") == 1
                     else None)
        types = types_of(c)
        first.join(30)
        second.join(30)
    assert metric_sum(s, "vllm:num_requests_waiting") == 1
    assert metric_sum(s, "vllm:num_requests_running") == metric_sum(
        s, "sluice_requests_running") == 1
    used = metric_sum(s, "sluice_kv_blocks_used")
    total = metric_sum(s, "sluice_kv_blocks_total")
    assert 0 < used <= total
    assert metric_sum(s, "vllm:kv_cache_usage_perc") == used / total
    assert metric_sum(s, "vllm:gpu_cache_usage_perc") == used / total
    ((labels, value),) = s["vllm:cache_config_info"]
    assert value == 1 and labels == {"block_size": "16", "num_gpu_blocks": str(int(total))}
    assert metric_sum(s, "llamacpp:requests_processing") == 1
    assert metric_sum(s, "llamacpp:requests_deferred") == 1
    for name in ("vllm:num_requests_waiting", "vllm:num_requests_running",
                 "vllm:kv_cache_usage_perc", "vllm:cache_config_info"):
        assert types[name] == "gauge"


def test_llama_server_counters_follow_the_requests(serve: Callable[..., LiveServer]) -> None:
    """Two requests one after another sharing a 40-word prefix on one slot: the second's
    prefix is reused (cached), the rest computed; tokens predicted and decode steps add up."""
    live = serve(config_with(models=[synth_chat("one-slot", n_seq_max=1)]))
    shared = " ".join(f"w{i}" for i in range(3, 43))
    with live.client() as c:
        for tail, n in (("first", 3), ("second", 5)):
            r = c.post("/v1/chat/completions", json={
                "model": "one-slot", "max_tokens": n,
                "messages": [{"role": "user", "content": f"{shared} {tail}"}]})
            assert r.status_code == 200
        wait_for(lambda: c.get("/status.json").json()["live_requests"] == 0)
        s = scrape(c)
        types = types_of(c)
        scraped = c.get("/metrics")
        started = int(scraped.headers["Process-Start-Time-Unix"])
        assert b"Process-Start-Time-Unix" in dict(scraped.headers.raw)  # llama-server's case
    assert time.time() - 3600 < started <= time.time()  # llama-server's header
    for name in LLAMA_COUNTERS:
        assert types[f"llamacpp:{name}"] == "counter", name
    for name in LLAMA_GAUGES:
        assert types[f"llamacpp:{name}"] == "gauge", name
    prompt = metric_sum(s, "sluice_tokens_total", kind="prompt")
    cached = metric_sum(s, "llamacpp:prompt_tokens_cached_total")
    assert cached >= 40
    assert metric_sum(s, "llamacpp:prompt_tokens_total") + cached == prompt
    assert metric_sum(s, "llamacpp:tokens_predicted_total") == 8
    # one slot, so every step decodes one sequence; at least a step per generated token
    assert metric_sum(s, "llamacpp:n_decode_total") >= 8
    assert metric_sum(s, "llamacpp:n_busy_slots_per_decode") == 1
    assert metric_sum(s, "llamacpp:prompt_seconds_total") > 0
    assert metric_sum(s, "llamacpp:tokens_predicted_seconds_total") > 0
    assert metric_sum(s, "llamacpp:requests_processing") == 0
