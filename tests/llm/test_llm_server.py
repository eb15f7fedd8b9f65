"""The real LLM lane end to end: llama.cpp + the packaged Gemma 3 270M behind the HTTP
server, driven by the official openai client. Gemma 3 270M here is the base model, so
content checks use plain completions."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
import uvicorn

from sluice.config import Config
from sluice.server.app import create_app

pytestmark = pytest.mark.llm
llama_cpp = pytest.importorskip("llama_cpp", reason="the llm extra is not installed")

MODEL = "gemma-3-270m"


def config() -> Config:
    return Config.model_validate({
        "models": [{
            "id": MODEL, "kind": "generative", "backend": "llamacpp", "task": "generation",
            "memory_bytes": 600_000_000,
            # Gemma's GGUF has no chat template: the chat tests name its turn format
            "options": {"path": "packaged:gemma-3-270m", "chat_template": "gemma",
                        "n_ctx": 2048, "n_seq_max": 4, "n_threads": 2},
        }],
        "workers": {"count": 1, "inbox_capacity": 32},
        "scheduling": {"queue_capacity": 64},
        "engine": {"kv_block_tokens": 16},
    })


@pytest.fixture(scope="module")
def server() -> Iterator[tuple[str, Any]]:
    app = create_app(config())
    srv = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning"))
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 120
    while not srv.started:
        assert time.monotonic() < deadline and thread.is_alive(), "server did not start"
        time.sleep(0.05)
    port = srv.servers[0].sockets[0].getsockname()[1]
    yield f"http://127.0.0.1:{port}", app.state.ctx.runtime
    srv.should_exit = True
    thread.join(30)


@pytest.fixture(scope="module")
def client(server: tuple[str, Any]) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=f"{server[0]}/v1", api_key="unused", max_retries=0) as c:
        yield c


def kv_state(runtime: Any) -> dict[str, tuple[int, int]]:
    """Run the worker's integrity check on its own thread; returns free/total blocks."""
    state: dict[str, tuple[int, int]] = runtime.workers[0].call(
        runtime.workers[0].integrity).result(timeout=10)
    return state


def wait_idle(runtime: Any, timeout_s: float = 20.0) -> dict[str, tuple[int, int]]:
    end = time.monotonic() + timeout_s
    while True:
        snap = runtime.snapshot()
        if snap.live_requests == 0 and snap.workers[0].active_count == 0:
            state = kv_state(runtime)
            if all(free == total for free, total in state.values()):
                return state
        assert time.monotonic() < end, f"not idle: {snap}"
        time.sleep(0.05)


def test_the_grammar_vocabulary_is_built_before_ready(
        server: tuple[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    """The first in this module, before any constrained request: start-up built the
    model's llguidance vocabulary (1-3 s holding the GIL for 262,144 tokens), so a
    constrained request never builds it while the event loop waits."""
    from sluice.engine.constraints import vocab

    def built_again(*_: Any, **__: Any) -> None:
        raise AssertionError("the grammar vocabulary was built after start-up")

    monkeypatch.setattr(vocab, "ll_tokenizer_from_table", built_again)
    r = httpx.post(f"{server[0]}/v1/chat/completions", timeout=60, json={
        "model": MODEL, "messages": [{"role": "user", "content": "A number?"}],
        "max_tokens": 8, "temperature": 0, "response_format": {"type": "json_object"}})
    assert r.status_code == 200, r.text


def test_greedy_completion_names_paris(client: openai.OpenAI) -> None:
    r = client.completions.create(model=MODEL, prompt="The capital of France is the city of",
                                  max_tokens=4, temperature=0)
    assert "Paris" in r.choices[0].text
    assert r.choices[0].finish_reason == "length"
    assert r.usage is not None and r.usage.completion_tokens == 4


def test_usage_counts_are_exact(client: openai.OpenAI, server: tuple[str, Any]) -> None:
    runtime = server[1]
    prompt = "Once upon a time, in a small village,"
    n_prompt = len(runtime.tokenizer(MODEL).tokenize(prompt, add_bos=True))
    r = client.completions.create(model=MODEL, prompt=prompt, max_tokens=7, temperature=0)
    assert r.usage is not None
    assert (r.usage.prompt_tokens, r.usage.completion_tokens) == (n_prompt, 7)


def test_streaming_matches_non_streaming(client: openai.OpenAI) -> None:
    kwargs: dict[str, Any] = {"model": MODEL, "prompt": "The three primary colours are",
                              "max_tokens": 12, "temperature": 0}
    whole = client.completions.create(**kwargs).choices[0].text
    stream = client.completions.create(**kwargs, stream=True,
                                       stream_options={"include_usage": True})
    pieces, usage, reasons = [], None, []
    for chunk in stream:
        if chunk.usage:
            usage = chunk.usage
        for choice in chunk.choices:
            pieces.append(choice.text)
            if choice.finish_reason:
                reasons.append(choice.finish_reason)
    assert "".join(pieces) == whole
    assert reasons == ["length"] and usage is not None and usage.completion_tokens == 12


def test_chat_streaming_and_not(client: openai.OpenAI) -> None:
    messages: Any = [{"role": "system", "content": "You are terse."},
                     {"role": "user", "content": "Name a colour."}]
    r = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=8,
                                       temperature=0)
    assert r.choices[0].message.role == "assistant"
    assert r.choices[0].finish_reason in ("stop", "length")
    chunks = list(client.chat.completions.create(model=MODEL, messages=messages, max_tokens=8,
                                                 temperature=0, stream=True))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == r.choices[0].message.content


def test_stop_string_ends_with_stop(client: openai.OpenAI) -> None:
    base = client.completions.create(model=MODEL, prompt="Count: one, two, three,",
                                     max_tokens=12, temperature=0).choices[0].text
    words = base.split()
    assert len(words) >= 3, base
    stop = words[2]
    r = client.completions.create(model=MODEL, prompt="Count: one, two, three,",
                                  max_tokens=12, temperature=0, stop=[stop])
    assert r.choices[0].finish_reason == "stop"
    assert stop not in r.choices[0].text
    assert base.startswith(r.choices[0].text)


def test_cancel_mid_stream_frees_the_sequence_and_blocks(server: tuple[str, Any]) -> None:
    url, runtime = server
    body = {"model": MODEL, "prompt": "Tell a very long story:", "max_tokens": 400,
            "stream": True, "ignore_eos": True, "temperature": 0}
    with httpx.Client(timeout=30) as http, \
            http.stream("POST", f"{url}/v1/completions", json=body) as resp:
        assert resp.status_code == 200
        seen = 0
        for line in resp.iter_lines():
            if line.startswith("data: "):
                seen += 1
            if seen >= 5:
                break
        busy = kv_state(runtime)[MODEL]
        assert busy[0] < busy[1]  # the running sequence holds blocks
    state = wait_idle(runtime)
    free, total = state[MODEL]
    assert free == total
    metrics = httpx.get(f"{url}/metrics").text
    assert 'sluice_requests_total{model="gemma-3-270m",state="cancelled",tenant="default"}' \
        in metrics


def test_burst_of_twenty_concurrent_requests_completes_and_frees_every_block(
    server: tuple[str, Any],
) -> None:
    url, runtime = server

    async def burst() -> list[httpx.Response]:
        async with httpx.AsyncClient(timeout=120) as http:
            return await asyncio.gather(*(
                http.post(f"{url}/v1/completions", json={
                    "model": MODEL, "prompt": f"Fact number {i}:", "max_tokens": 16,
                    "temperature": 0.7, "seed": i})
                for i in range(20)))

    responses = asyncio.run(burst())
    assert [r.status_code for r in responses] == [200] * 20
    assert all(r.json()["usage"]["completion_tokens"] <= 16 for r in responses)
    free, total = wait_idle(runtime)[MODEL]
    assert free == total


def test_prompt_over_the_context_is_400(server: tuple[str, Any]) -> None:
    url, _ = server
    r = httpx.post(f"{url}/v1/completions", json={
        "model": MODEL, "prompt": "word " * 600, "max_tokens": 16})
    assert r.status_code == 400
    assert r.json()["error"]["code"] == "context_length_exceeded"


def test_a_huge_prompt_is_refused_by_its_length_before_tokenizing(
    server: tuple[str, Any],
) -> None:
    """900 KB of special-token text takes llama.cpp about 10 s to tokenize; its length alone
    proves it cannot fit (a Gemma token stands for at most 48 bytes), so it is refused at
    once and the server goes on serving."""
    url, _ = server
    huge = "<start_of_turn>" * 60_000
    for path, body in (("/v1/completions", {"model": MODEL, "prompt": huge}),
                       ("/v1/chat/completions", {"model": MODEL, "messages": [
                           {"role": "user", "content": huge}]})):
        r = httpx.post(f"{url}{path}", json=body, timeout=60)
        assert r.status_code == 400, r.text
        err = r.json()["error"]
        assert err["code"] == "context_length_exceeded"
        # the length bound answered, not the tokenizer ("the prompt has N")
        assert "bytes) has at least" in err["message"], err
    r = httpx.post(f"{url}/v1/completions", json={"model": MODEL, "prompt": "Hello",
                                                   "max_tokens": 2}, timeout=60)
    assert r.status_code == 200, r.text
