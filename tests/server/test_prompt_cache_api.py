"""The prompt cache in host memory over HTTP (synthetic model): a prompt whose retained
slot was dropped past ``max_retained_slots`` is restored, the same text comes back, and
``/status.json`` and ``sluice_prefix_cache_hits_total`` say so; ``cache_ram_mib = 0`` keeps
none."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx

from tests.server.live import LiveServer, config_with, metric_sum, scrape, synth_chat

PROMPTS = [" ".join(f"w{base + i}" for i in range(40)) for base in (100, 200)]


def _complete(c: httpx.Client, prompt: str) -> str:
    r = c.post("/v1/completions", json={"model": "synth-chat", "prompt": prompt,
                                        "max_tokens": 6, "temperature": 0})
    assert r.status_code == 200, r.text
    text: str = r.json()["choices"][0]["text"]
    return text


def _cache(c: httpx.Client) -> Any:
    [entry] = [m["prompt_cache"] for w in c.get("/status.json").json()["workers"]
               for m in w["models"] if m["model_id"] == "synth-chat"]
    return entry


def test_a_dropped_prompt_is_restored_and_shown(serve: Callable[..., LiveServer]) -> None:
    live = serve(config_with(models=[synth_chat()],
                             engine={"max_retained_slots": 1, "cache_ram_mib": 16}))
    with live.client() as c:
        first = _complete(c, PROMPTS[0])
        _complete(c, PROMPTS[1])
        state = _cache(c)
        assert state["entries"] == 1 and state["bytes_used"] > 0
        assert state["limit_bytes"] == 16 << 20 and state["restored_tokens"] == 0
        hits = metric_sum(scrape(c), "sluice_prefix_cache_hits_total", model="synth-chat")
        assert _complete(c, PROMPTS[0]) == first
        restored = _cache(c)["restored_tokens"]
        assert restored >= 40
        assert metric_sum(scrape(c), "sluice_prefix_cache_hits_total",
                          model="synth-chat") - hits >= restored


def test_no_host_memory_keeps_no_prompt(serve: Callable[..., LiveServer]) -> None:
    live = serve(config_with(models=[synth_chat()],
                             engine={"max_retained_slots": 1, "cache_ram_mib": 0}))
    with live.client() as c:
        for prompt in (*PROMPTS, PROMPTS[0]):
            _complete(c, prompt)
        assert _cache(c) is None
