"""The pieces of a replica that need no Ray: sluice's app driven through ``call_asgi`` (one
buffered request, its response as parts, a consumer that leaves cancels the request), and
what the front end reads from a body to route it."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

from sluice.cluster.asgi import HttpCall, ResponseStart, call_asgi
from sluice.cluster.hints import prompt_text, route_hint
from sluice.server.app import create_app
from tests.server.live import config_with, synth_chat

SYSTEM = "You answer questions about invoices, politely and briefly. " * 6


def chat_call(*, stream: bool, max_tokens: int = 4) -> HttpCall:
    body = {"model": "synth-chat", "max_tokens": max_tokens, "stream": stream,
            "messages": [{"role": "system", "content": SYSTEM},
                         {"role": "user", "content": "hello"}]}
    return HttpCall("POST", "/v1/chat/completions",
                    headers=((b"content-type", b"application/json"),),
                    body=json.dumps(body).encode())


async def collect(parts: AsyncIterator[ResponseStart | bytes]) -> tuple[ResponseStart, bytes]:
    start = await parts.__anext__()
    assert isinstance(start, ResponseStart)
    chunks = [p async for p in parts]
    assert all(isinstance(c, bytes) for c in chunks)
    return start, b"".join(c for c in chunks if isinstance(c, bytes))


def with_app(scenario: Any, **model_options: Any) -> None:
    app = create_app(config_with(models=[synth_chat(**model_options)]))

    async def run() -> None:
        async with app.router.lifespan_context(app):
            await scenario(app)

    asyncio.run(run())


def test_a_request_through_the_app_keeps_its_headers_and_body() -> None:
    async def scenario(app: Any) -> None:
        extra = ((b"x-sluice-replica", b"r1"),)
        start, body = await collect(call_asgi(app, chat_call(stream=False), extra))
        assert start.status == 200
        assert start.header("x-sluice-replica") == "r1"
        assert start.header("x-sluice-worker") is not None  # the replica's own decisions
        reply = json.loads(body)
        assert reply["object"] == "chat.completion" and reply["usage"]["completion_tokens"] == 4

        start, body = await collect(call_asgi(app, chat_call(stream=True)))
        assert (start.header("content-type") or "").startswith("text/event-stream")
        events = [e for e in body.decode().split("\n\n") if e]
        assert events[-1] == "data: [DONE]" and len(events) >= 4

        start, body = await collect(call_asgi(app, HttpCall("POST", "/v1/chat/completions",
                                                            body=b"{not json")))
        assert start.status == 400 and json.loads(body)["error"]["code"] == "invalid_json"

    with_app(scenario)


def test_a_consumer_that_leaves_cancels_the_request() -> None:
    async def scenario(app: Any) -> None:
        runtime = app.state.ctx.runtime
        parts = call_asgi(app, chat_call(stream=True, max_tokens=400))
        start = await parts.__anext__()
        assert isinstance(start, ResponseStart) and start.status == 200
        assert isinstance(await parts.__anext__(), bytes)
        assert runtime.snapshot().live_requests == 1
        await parts.aclose()  # what Serve does when the front end cancels
        for _ in range(200):
            if runtime.snapshot().live_requests == 0:
                break
            await asyncio.sleep(0.01)
        assert runtime.snapshot().live_requests == 0
        cancelled = app.state.ctx.registry.get_sample_value(
            "sluice_requests_total", {"model": "synth-chat", "tenant": "default",
                                      "state": "cancelled"})
        assert cancelled == 1
        # ... and the app still serves.
        start, _ = await collect(call_asgi(app, chat_call(stream=False)))
        assert start.status == 200

    with_app(scenario, step_fixed_s=0.01)


def test_an_app_that_answers_nothing_gives_a_500() -> None:
    async def silent(scope: Any, receive: Any, send: Any) -> None:
        raise RuntimeError("boom")

    async def run() -> tuple[ResponseStart, bytes]:
        return await collect(call_asgi(silent, HttpCall("GET", "/")))

    start, body = asyncio.run(run())
    assert start.status == 500 and json.loads(body)["error"]["code"] == "internal_error"


def test_prompt_text_reads_each_surface() -> None:
    chat = {"messages": [{"role": "system", "content": "S"},
                         {"role": "user", "content": [{"type": "text", "text": "U"}]}]}
    assert prompt_text("/v1/chat/completions", chat) == "system\x1eS\x1duser\x1eU\x1d"
    assert prompt_text("/v1/completions", {"prompt": "P"}) == "P"
    assert prompt_text("/v1/completions", {"prompt": ["P", "Q"]}) == "P"
    assert prompt_text("/v1/completions", {"prompt": [5, 6, 7]}) == "5 6 7"
    assert prompt_text("/v1/infer", {"input": "I"}) == "I"
    assert prompt_text("/v1/infer", {"input": chat["messages"]}) == prompt_text(
        "/v1/chat/completions", chat)
    assert prompt_text("/v1/chat/completions", {"messages": "nope"}) == ""


def test_route_hint_keys_long_prompts_and_tolerates_bad_bodies() -> None:
    def hint(path: str, body: Any) -> Any:
        raw = body if isinstance(body, bytes) else json.dumps(body).encode()
        return route_hint(path, raw, default_model="dflt", prefix_chars=64)

    long = {"model": "m", "messages": [{"role": "system", "content": SYSTEM},
                                       {"role": "user", "content": "a"}]}
    other_user = {"model": "m", "messages": [{"role": "system", "content": SYSTEM},
                                             {"role": "user", "content": "b"}]}
    assert hint("/v1/chat/completions", long).prefix_key is not None
    assert hint("/v1/chat/completions", long).prefix_key == hint(
        "/v1/chat/completions", other_user).prefix_key
    assert hint("/v1/completions", {"model": "m", "prompt": "short"}).prefix_key is None
    assert hint("/v1/embeddings", {"model": "e", "input": SYSTEM}).model_id == "e"
    assert hint("/v1/embeddings", {"model": "e", "input": SYSTEM}).prefix_key is None
    for bad in (b"{oops", b"[1, 2]", {"model": 7, "prompt": SYSTEM}):
        assert hint("/v1/completions", bad).model_id == "dflt"
    assert hint("/v1/models", {}).model_id == "dflt"
