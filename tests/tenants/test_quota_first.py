"""Quota before tokenizing, through HTTP on both stores (memory, and a real Redis): a tenant
over its quota is refused on every surface of the serving core without its prompt being
tokenized (the tokenizer's calls counted), and a reservation made from the prompt's byte
bound is settled to the exact prompt tokens plus ``max_tokens`` once the prompt is
tokenized (the bucket, and on Redis the reservation's hold key, say so while the request
runs)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from sluice.server.quota import (
    FailoverQuotaStore,
    MemoryQuotaStore,
    QuotaGate,
    QuotaStore,
    RedisQuotaStore,
)
from sluice.server.quota.stores import ScaledStore
from tests.server.live import LiveServer, config_with, synth_chat, wait_for
from tests.tenants.redisproc import RedisProcess

AUTH = {"authorization": "Bearer key-t"}
OTHER = {"authorization": "Bearer key-other"}
MODEL = "synth-chat"
HELLO = [{"role": "user", "content": "hello there"}]

STORES = ["memory", "redis"]


def _server(serve: Callable[..., LiveServer], request: pytest.FixtureRequest, store: str,
            limits: dict[str, Any], **model: Any) -> LiveServer:
    quota: dict[str, Any] = {}
    if store == "redis":
        redis: RedisProcess = request.getfixturevalue("redis")
        quota = {"backend": "redis", "redis_url": redis.url}
    return serve(config_with(
        models=[synth_chat(**model)], quota=quota,
        tenants=[{"id": "t", "api_keys": ["key-t"], "limits": limits},
                 {"id": "other", "api_keys": ["key-other"]}]))


def gate(live: LiveServer) -> QuotaGate:
    return live.server.config.app.state.ctx.quota  # type: ignore[no-any-return,union-attr]


class TokenizeCalls:
    """Counts the calls of the served model's tokenizer (the one the core tokenizes with)."""

    def __init__(self, live: LiveServer, monkeypatch: pytest.MonkeyPatch) -> None:
        tok = live.runtime.tokenizer(MODEL)
        real = tok.tokenize
        self.calls = 0

        def counted(*args: Any, **kwargs: Any) -> list[int]:
            self.calls += 1
            return list(real(*args, **kwargs))

        monkeypatch.setattr(tok, "tokenize", counted)


SURFACES: list[tuple[str, dict[str, Any]]] = [
    ("/v1/chat/completions", {"model": MODEL, "messages": HELLO, "max_tokens": 4}),
    ("/v1/completions", {"model": MODEL, "prompt": "hello there", "max_tokens": 4}),
    ("/v1/messages", {"model": MODEL, "messages": HELLO, "max_tokens": 4}),
    ("/v1/messages/count_tokens", {"model": MODEL, "messages": HELLO}),
    ("/v1/responses", {"model": MODEL, "input": "hello there", "max_output_tokens": 4}),
    ("/v1/infer", {"model": MODEL, "input": "hello there", "max_new_tokens": 4}),
    ("/api/chat", {"model": MODEL, "messages": HELLO, "stream": False,
                   "options": {"num_predict": 4}}),
    ("/api/generate", {"model": MODEL, "prompt": "hello there", "stream": False,
                       "options": {"num_predict": 4}}),
    ("/tokenize", {"model": MODEL, "content": "hello there"}),
]


def _refused(r: httpx.Response, path: str) -> None:
    assert r.status_code == 429, (path, r.text)
    assert int(r.headers["retry-after"]) >= 1
    body = r.json()
    if path.startswith("/api/"):
        assert set(body) == {"error"} and isinstance(body["error"], str), body
    elif path.startswith("/v1/messages"):
        assert body["type"] == "error" and body["error"]["type"] == "rate_limit_error", body
    else:
        assert body["error"]["code"] == "quota", body


@pytest.mark.parametrize("store", STORES)
def test_a_tenant_over_its_request_rate_is_refused_before_tokenizing(
    serve: Callable[..., LiveServer], request: pytest.FixtureRequest,
    monkeypatch: pytest.MonkeyPatch, store: str,
) -> None:
    live = _server(serve, request, store, {"requests_per_s": 0.001, "burst": 1})
    calls = TokenizeCalls(live, monkeypatch)
    with live.client() as c:
        r = c.post("/v1/chat/completions", headers=AUTH, json=SURFACES[0][1])
        assert r.status_code == 200, r.text
        assert calls.calls > 0  # the admitted request was tokenized (the spy sees it)
        for path, body in SURFACES:
            calls.calls = 0
            _refused(c.post(path, headers=AUTH, json=body), path)
            assert calls.calls == 0, path
        # another tenant is served, and tokenized
        r = c.post("/v1/messages", headers=OTHER, json=SURFACES[2][1])
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["input_tokens"] > 0 and calls.calls > 0


@pytest.mark.parametrize("store", STORES)
def test_a_tenant_over_its_token_rate_is_refused_before_tokenizing(
    serve: Callable[..., LiveServer], request: pytest.FixtureRequest,
    monkeypatch: pytest.MonkeyPatch, store: str,
) -> None:
    """60 tokens a minute: a request that generates 50 leaves too few for the next one's
    50, whatever its prompt, so it is refused on its bound before its prompt is counted."""
    live = _server(serve, request, store, {"tokens_per_min": 60})
    calls = TokenizeCalls(live, monkeypatch)
    with live.client(headers=AUTH) as c:
        r = c.post("/v1/completions", json={"model": MODEL, "prompt": "hi", "max_tokens": 50,
                                            "ignore_eos": True})
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["completion_tokens"] == 50
        calls.calls = 0
        for path in ("/v1/chat/completions", "/v1/messages"):
            r = c.post(path, json={"model": MODEL, "messages": HELLO, "max_tokens": 50})
            _refused(r, path)
            assert r.headers["x-sluice-quota-limit"] == "tokens"
            assert calls.calls == 0, path


@pytest.fixture
def frozen_store(request: pytest.FixtureRequest) -> Iterator[Callable[[str], QuotaStore]]:
    """A factory of the production stores on a clock that stands still (no refill, so the
    bucket's level is exactly what is held)."""
    made: list[QuotaStore] = []

    def make(kind: str) -> QuotaStore:
        clock = lambda: 1000.0  # noqa: E731
        store: QuotaStore
        if kind == "memory":
            store = ScaledStore(MemoryQuotaStore(clock, clamp_to_capacity=True), 1.0)
        else:
            redis: RedisProcess = request.getfixturevalue("redis")
            store = FailoverQuotaStore(RedisQuotaStore(redis.url, key_prefix="settle",
                                                       clock=clock),
                                       MemoryQuotaStore(clock), share=1.0)
        made.append(store)
        return store

    yield make


def _token_level(store: QuotaStore, request: pytest.FixtureRequest) -> tuple[float, list[float]]:
    """The tenant's token bucket level, and what its holds record (Redis only)."""
    if isinstance(store, ScaledStore):
        state = store.inner.state("t")
        assert state is not None and state.tokens is not None
        return state.tokens.tokens, []
    assert isinstance(store, FailoverQuotaStore)
    redis: RedisProcess = request.getfixturevalue("redis")
    bucket, _ = store.shared.keys("t")
    with redis.client() as r:
        level = float(r.hget(bucket, "tt"))
        holds = [float(r.get(k)) for k in r.keys("settle:quota:{t}:hold:*")]
    return level, holds


@pytest.mark.parametrize("store", STORES)
@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/messages", "/v1/responses"])
def test_the_reservation_is_settled_to_the_exact_tokens(
    serve: Callable[..., LiveServer], request: pytest.FixtureRequest,
    frozen_store: Callable[[str], QuotaStore], store: str, path: str,
) -> None:
    """While the request runs, the bucket holds exactly prompt + max tokens for it (not the
    byte bound it was admitted on); once it ends, exactly what it used."""
    capacity, max_tokens = 6000.0, 20
    live = _server(serve, request, "memory", {"tokens_per_min": capacity},
                   step_fixed_s=0.02)
    gate(live).store = frozen_store(store)
    messages = [{"role": "user", "content": "the quick brown fox jumps over the lazy dog"}]
    body: dict[str, Any] = {"model": MODEL, "stream": True}
    if path == "/v1/responses":
        body |= {"input": messages, "max_output_tokens": max_tokens}
    else:
        body |= {"messages": messages, "max_tokens": max_tokens}
    if path == "/v1/chat/completions":
        body |= {"stream_options": {"include_usage": True}, "ignore_eos": True}
    with live.client(headers=AUTH) as c:
        with c.stream("POST", path, json=body) as r:
            assert r.status_code == 200
            lines = r.iter_lines()
            payloads = [next(lines)]
            running, holds = _token_level(gate(live).store, request)
            payloads += list(lines)
        prompt, completion = _usage(path, payloads)
    assert running == capacity - (prompt + max_tokens)
    if store == "redis":
        assert holds == [prompt + max_tokens]
    assert gate(live).charged_tokens["t"] == prompt + max_tokens
    # released: what it did not use is given back, and its hold is gone
    wait_for(lambda: _token_level(gate(live).store, request)
             == (capacity - (prompt + completion), []))


def _usage(path: str, lines: list[str]) -> tuple[int, int]:
    """Prompt and completion tokens from a stream's last usage."""
    datas = [json.loads(ln[5:]) for ln in lines if ln.startswith("data:")
             and ln[5:].strip() != "[DONE]"]
    for data in reversed(datas):
        if path == "/v1/chat/completions" and data.get("usage"):
            return data["usage"]["prompt_tokens"], data["usage"]["completion_tokens"]
        if path == "/v1/messages" and data.get("type") == "message_delta":
            return data["usage"]["input_tokens"], data["usage"]["output_tokens"]
        if path == "/v1/responses" and data.get("type") in ("response.completed",
                                                          "response.incomplete"):
            usage = data["response"]["usage"]
            return usage["input_tokens"], usage["output_tokens"]
    raise AssertionError(f"no usage in {datas[-3:]}")
