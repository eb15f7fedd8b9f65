"""Every row of the error table (docs/api.md): status, ``type``, ``code``, ``param``,
Retry-After, and the exact body ``{"error": {"message", "type", "param", "code"}}``."""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from sluice.backends.base import Embedding, ModelSpec
from sluice.backends.synthetic import SyntheticBackend, SyntheticOneShot
from tests.server.live import (
    LiveServer,
    assert_error,
    config_with,
    sse_data,
    synth_chat,
    synth_embed,
    wait_for,
)

CHAT = "synth-chat"
MSG = [{"role": "user", "content": "hello"}]
ENDPOINT_BODIES: dict[str, dict[str, Any]] = {
    "/v1/chat/completions": {"model": CHAT, "messages": MSG, "max_tokens": 2},
    "/v1/completions": {"model": CHAT, "prompt": "hello", "max_tokens": 2},
    "/v1/embeddings": {"model": "synth-a", "input": "hello"},
    "/v1/infer": {"model": CHAT, "input": "hello", "max_new_tokens": 2},
}
ENDPOINTS = list(ENDPOINT_BODIES)
JSON = {"content-type": "application/json"}


# -- 400: malformed JSON, bad and unknown fields ------------------------------------------


@pytest.mark.parametrize("path", ENDPOINTS)
@pytest.mark.parametrize("raw", [b"{", b'{"model": "synth-chat",}', b"\xff\xfe", b"nul"])
def test_malformed_json_is_400_invalid_json(client: httpx.Client, path: str, raw: bytes) -> None:
    err = assert_error(client.post(path, content=raw, headers=JSON), 400, code="invalid_json",
                       type="invalid_request_error")
    assert err["param"] is None


@pytest.mark.parametrize("path", ENDPOINTS)
@pytest.mark.parametrize("raw", [b"[1, 2]", b'"text"', b"42", b"null", b""])
def test_json_that_is_not_an_object_is_400_invalid_json(client: httpx.Client, path: str,
                                                       raw: bytes) -> None:
    assert_error(client.post(path, content=raw, headers=JSON), 400, code="invalid_json")


REQUIRED = {"/v1/chat/completions": "messages", "/v1/completions": "prompt",
            "/v1/embeddings": "input", "/v1/infer": "model"}
"""A required field of each endpoint (``model`` is optional where llama-server makes it so:
the default model serves)."""


@pytest.mark.parametrize("path", ENDPOINTS)
def test_missing_required_field_is_named(client: httpx.Client, path: str) -> None:
    body = dict(ENDPOINT_BODIES[path])
    del body[REQUIRED[path]]
    assert_error(client.post(path, json=body), 400, code="invalid_value",
                 param=REQUIRED[path])


@pytest.mark.parametrize(("path", "change", "param"), [
    ("/v1/chat/completions", {"temperature": 2.5}, "temperature"),
    ("/v1/chat/completions", {"temperature": "hot"}, "temperature"),
    ("/v1/chat/completions", {"top_p": 0}, "top_p"),
    ("/v1/chat/completions", {"max_tokens": 0}, "max_tokens"),
    ("/v1/chat/completions", {"max_completion_tokens": -1}, "max_completion_tokens"),
    ("/v1/chat/completions", {"messages": []}, "messages"),
    ("/v1/chat/completions", {"messages": [{"role": "robot", "content": "x"}]},
     "messages.0.role"),
    ("/v1/chat/completions", {"messages": [{"role": "system", "content": "x"}]}, "messages"),
    ("/v1/chat/completions", {"stop": ["a", "b", "c", "d", "e"]}, "stop"),
    ("/v1/chat/completions", {"stop": ""}, "stop"),
    ("/v1/chat/completions", {"presence_penalty": 2.5}, "presence_penalty"),
    ("/v1/chat/completions", {"frequency_penalty": -2.1}, "frequency_penalty"),
    ("/v1/chat/completions", {"repetition_penalty": 0}, "repetition_penalty"),
    ("/v1/chat/completions", {"repeat_penalty": 11}, "repeat_penalty"),
    ("/v1/chat/completions", {"repeat_last_n": -2}, "repeat_last_n"),
    ("/v1/chat/completions", {"min_p": 1.5}, "min_p"),
    ("/v1/chat/completions", {"logit_bias": {"5": 101}}, "logit_bias"),
    ("/v1/chat/completions", {"logit_bias": {"five": 1}}, "logit_bias"),
    ("/v1/chat/completions", {"logit_bias": {"512": 1}}, "logit_bias"),
    ("/v1/chat/completions", {"seed": 1.5}, "seed"),
    ("/v1/chat/completions", {"logprobs": "maybe"}, "logprobs"),
    ("/v1/chat/completions", {"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    ("/v1/chat/completions", {"top_logprobs": 2}, "top_logprobs"),
    ("/v1/chat/completions", {"n": 0}, "n"),
    ("/v1/chat/completions", {"n": 17}, "n"),
    ("/v1/chat/completions", {"n": 9}, "n"),
    ("/v1/chat/completions", {"response_format": {"type": "xml"}}, "response_format.type"),
    ("/v1/chat/completions", {"response_format": {"type": "json_schema"}}, "response_format"),
    ("/v1/chat/completions", {"tools": [{"type": "function", "function": {"name": "a b"}}]},
     "tools.0.function.name"),
    ("/v1/chat/completions", {"tools": [{"type": "retrieval"}]}, "tools.0.type"),
    ("/v1/chat/completions", {"tool_choice": "required"}, "tool_choice"),
    ("/v1/chat/completions", {"tool_choice": "sometimes"}, "tool_choice"),
    ("/v1/chat/completions", {
        "tools": [{"type": "function", "function": {"name": "a"}}],
        "tool_choice": {"type": "function", "function": {"name": "b"}}}, "tool_choice"),
    ("/v1/chat/completions", {"messages": [{"role": "tool", "tool_call_id": "c"}]},
     "messages.0"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "http://x"}}]}]}, "messages.0.content.0"),
    ("/v1/chat/completions", {"user": "u" * 257}, "user"),
    ("/v1/completions", {"logprobs": 21}, "logprobs"),
    ("/v1/completions", {"logprobs": -1}, "logprobs"),
    ("/v1/completions", {"echo": "x"}, "echo"),
    ("/v1/completions", {"echo": True, "logprobs": 1, "stream": True}, "echo"),
    ("/v1/completions", {"best_of": 2}, "best_of"),
    ("/v1/completions", {"n": 17}, "n"),
    ("/v1/chat/completions", {"priority": 10}, "priority"),
    ("/v1/chat/completions", {"deadline_ms": 0}, "deadline_ms"),
    ("/v1/chat/completions", {"top_k": -1}, "top_k"),
    ("/v1/chat/completions", {"stream_options": {"include_usage": "maybe"}},
     "stream_options.include_usage"),
    ("/v1/completions", {"prompt": []}, "prompt"),
    ("/v1/completions", {"prompt": ["a", "b"]}, "prompt"),
    ("/v1/completions", {"prompt": [1, 2, 512]}, "prompt"),
    ("/v1/completions", {"prompt": [-1]}, "prompt"),
    ("/v1/embeddings", {"encoding_format": "hex"}, "encoding_format"),
    ("/v1/embeddings", {"input": []}, "input"),
    ("/v1/infer", {"tenant_id": "../etc"}, "tenant_id"),
    ("/v1/infer", {"max_new_tokens": 0}, "max_new_tokens"),
    ("/v1/infer", {"deadline_ms": -5}, "deadline_ms"),
    ("/v1/infer", {"model": "synth-a", "input": MSG}, "input"),
])
def test_invalid_or_out_of_range_parameter_is_400_naming_it(
    client: httpx.Client, path: str, change: dict[str, Any], param: str
) -> None:
    body = {**ENDPOINT_BODIES[path], **change}
    err = assert_error(client.post(path, json=body), 400, param=param,
                       type="invalid_request_error")
    assert err["code"] == "invalid_value"


def test_n_is_bounded_by_the_models_sequence_slots(client: httpx.Client) -> None:
    """The synthetic model runs 8 sequences at once: n = 9 is refused, naming the bound."""
    for path in ("/v1/chat/completions", "/v1/completions"):
        body = {**ENDPOINT_BODIES[path], "n": 9}
        err = assert_error(client.post(path, json=body), 400, param="n", code="invalid_value")
        assert "at most 8" in err["message"]


@pytest.mark.parametrize("path", ENDPOINTS)
def test_unknown_field_is_ignored_and_named_in_a_header(client: httpx.Client,
                                                        path: str) -> None:
    body = {**ENDPOINT_BODIES[path], "frobnicate": True}
    r = client.post(path, json=body)
    assert r.status_code == 200, r.text
    assert r.headers["x-sluice-ignored-fields"] == "frobnicate"
    assert "x-sluice-ignored-fields" not in client.post(path, json=ENDPOINT_BODIES[path]).headers


def test_unknown_nested_fields_are_named_by_path(client: httpx.Client) -> None:
    body = {"model": CHAT, "messages": [{"role": "user", "content": "x", "mood": "calm"}],
            "max_tokens": 1, "stream_options": {"include_usage": True, "chunky": 1},
            "stream": True, "metadata": {"k": "v"}}
    with client.stream("POST", "/v1/chat/completions", json=body) as r:
        assert r.status_code == 200
        assert r.headers["x-sluice-ignored-fields"] == \
            "metadata,stream_options.chunky,messages.0.mood"
        assert sse_data(r.iter_lines())[-1] == "[DONE]"


def test_ignored_field_names_are_safe_in_a_header(client: httpx.Client) -> None:
    body = {**ENDPOINT_BODIES["/v1/chat/completions"], "été\r\nX-Evil: 1": True}
    r = client.post("/v1/chat/completions", json=body)
    assert r.status_code == 200
    assert r.headers["x-sluice-ignored-fields"] == "?t???X-Evil??1"
    assert "x-evil" not in r.headers


@pytest.fixture(scope="module")
def strict_server(serve_module: Callable[..., LiveServer]) -> LiveServer:
    return serve_module(config_with(server={"strict_fields": True}))


@pytest.mark.parametrize("path", ENDPOINTS)
def test_strict_fields_refuses_unknown_fields_naming_them(strict_server: LiveServer,
                                                          path: str) -> None:
    with strict_server.client() as c:
        body = {**ENDPOINT_BODIES[path], "frobnicate": True}
        err = assert_error(c.post(path, json=body), 400, param="frobnicate",
                           code="invalid_value")
        assert "frobnicate" in err["message"]
        nested = {"model": CHAT, "messages": [{"role": "user", "content": "x", "mood": "c"}]}
        assert_error(c.post("/v1/chat/completions", json=nested), 400,
                     param="messages.0.mood")
        assert c.post(path, json=ENDPOINT_BODIES[path]).status_code == 200


@pytest.mark.parametrize(("header", "value"), [
    ("x-sluice-priority", "urgent"),
    ("x-sluice-priority", "10"),
    ("x-sluice-priority", "-1"),
    ("x-sluice-priority", "2.5"),
    ("x-sluice-deadline-ms", "0"),
    ("x-sluice-deadline-ms", "-10"),
    ("x-sluice-deadline-ms", "soon"),
    ("x-sluice-deadline-ms", "nan"),
    ("x-sluice-deadline-ms", "inf"),
    ("x-tenant-id", "bad tenant!"),
])
def test_bad_control_header_is_400_naming_it(client: httpx.Client, header: str,
                                             value: str) -> None:
    r = client.post("/v1/infer", json=ENDPOINT_BODIES["/v1/infer"], headers={header: value})
    assert_error(r, 400, param=header, code="invalid_value")


@pytest.mark.parametrize(("path", "model"), [
    ("/v1/chat/completions", "synth-a"),
    ("/v1/completions", "synth-b"),
    ("/v1/embeddings", CHAT),
    ("/v1/embeddings", "synth-b"),  # a classifier is not an embedding model
])
def test_model_of_the_wrong_kind_is_400(client: httpx.Client, path: str, model: str) -> None:
    body = {**ENDPOINT_BODIES[path], "model": model}
    assert_error(client.post(path, json=body), 400, param="model", code="model_kind_mismatch")


# -- 400: context length ------------------------------------------------------------------


@pytest.mark.parametrize(("path", "body", "param"), [
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "w " * 600}]},
     "messages"),
    ("/v1/completions", {"prompt": "w " * 600}, "prompt"),
    ("/v1/completions", {"prompt": [5] * 513}, "prompt"),
    ("/v1/infer", {"input": "w " * 511}, "input"),  # + BOS = 512: no room for one token
])
def test_prompt_longer_than_the_context_is_400(client: httpx.Client, path: str,
                                               body: dict[str, Any], param: str) -> None:
    r = client.post(path, json={**ENDPOINT_BODIES[path], **body})
    err = assert_error(r, 400, code="context_length_exceeded", param=param,
                       type="invalid_request_error")
    assert "512" in err["message"]


@pytest.mark.parametrize(("path", "body", "param"), [
    ("/v1/chat/completions", {"max_tokens": 510}, "max_tokens"),
    ("/v1/chat/completions", {"max_completion_tokens": 510}, "max_completion_tokens"),
    ("/v1/completions", {"max_tokens": 511}, "max_tokens"),
    ("/v1/infer", {"max_new_tokens": 511}, "max_new_tokens"),
])
def test_prompt_plus_max_tokens_over_the_context_is_400(
    client: httpx.Client, path: str, body: dict[str, Any], param: str
) -> None:
    r = client.post(path, json={**ENDPOINT_BODIES[path], **body})
    assert_error(r, 400, code="context_length_exceeded", param=param)


def test_a_prompt_that_just_fits_is_served(client: httpx.Client) -> None:
    # BOS + 500 words + 11 new tokens = 512 = n_ctx_per_seq
    r = client.post("/v1/completions", json={"model": CHAT, "prompt": "w " * 500,
                                             "max_tokens": 11})
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["total_tokens"] == 512


# -- 404, 405 -----------------------------------------------------------------------------


@pytest.mark.parametrize("path", ENDPOINTS)
def test_unknown_model_is_404(client: httpx.Client, path: str) -> None:
    body = {**ENDPOINT_BODIES[path], "model": "no-such-model"}
    err = assert_error(client.post(path, json=body), 404, code="model_not_found", param="model",
                       type="invalid_request_error")
    assert "no-such-model" in err["message"]


def test_unknown_route_is_404_and_wrong_method_405(client: httpx.Client) -> None:
    assert_error(client.get("/v2/nothing"), 404, code="not_found")
    assert_error(client.get("/v1/chat/completions"), 405, code="method_not_allowed")
    assert_error(client.delete("/v1/models"), 405, code="method_not_allowed")


# -- 413 ----------------------------------------------------------------------------------


def test_body_over_the_limit_with_content_length_is_413(client: httpx.Client) -> None:
    big = json.dumps({"model": CHAT, "prompt": "w " * 600_000}).encode()
    assert len(big) > 1_000_000
    r = client.post("/v1/completions", content=big, headers=JSON)
    assert_error(r, 413, code="body_too_large", type="invalid_request_error")


def test_body_over_the_limit_chunked_is_413(client: httpx.Client) -> None:
    def chunks() -> Iterator[bytes]:
        yield b'{"model": "synth-chat", "prompt": "'
        for _ in range(25):
            yield b"w " * 50_000
        yield b'"}'

    r = client.post("/v1/completions", content=chunks(), headers=JSON)
    assert r.request.headers.get("transfer-encoding") == "chunked"
    assert "content-length" not in r.request.headers
    assert_error(r, 413, code="body_too_large")


def test_chunked_body_under_the_limit_is_served(client: httpx.Client) -> None:
    def chunks() -> Iterator[bytes]:
        yield b'{"model": "synth-chat", '
        yield b'"prompt": "hello there", "max_tokens": 2}'

    r = client.post("/v1/completions", content=chunks(), headers=JSON)
    assert r.status_code == 200, r.text


def test_a_content_length_that_is_not_a_number_is_refused(synthetic_server: LiveServer
                                                           ) -> None:
    """A malformed Content-Length is refused by uvicorn (400) or by the guard (413)."""
    import socket

    host, port = synthetic_server.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=5) as sock:
        sock.sendall(b"POST /v1/infer HTTP/1.1\r\nHost: x\r\nContent-Length: -5\r\n\r\n")
        head = sock.recv(4096).split(b"\r\n", 1)[0]
    assert head.split()[1] in (b"400", b"413"), head


# -- 401, 403: API keys -------------------------------------------------------------------


@pytest.fixture(scope="module")
def auth_server(serve_module: Callable[..., LiveServer]) -> LiveServer:
    return serve_module(config_with(
        models=[synth_chat(), synth_embed()], workers={"count": 1},
        tenants=[{"id": "acme", "api_keys": ["sk-acme-1", "sk-acme-2"]},
                 {"id": "beta", "api_keys": ["sk-beta"], "priority": 2}],
    ))


@pytest.mark.parametrize("path", ENDPOINTS)
@pytest.mark.parametrize("auth", [None, "Bearer wrong-key", "Bearer", "Basic sk-acme-1",
                                  "sk-acme-1", "Bearer sk-acme-1x"])
def test_missing_or_bad_api_key_is_401(auth_server: LiveServer, path: str,
                                       auth: str | None) -> None:
    headers = {} if auth is None else {"authorization": auth}
    with auth_server.client() as c:
        r = c.post(path, json=ENDPOINT_BODIES[path], headers=headers)
    err = assert_error(r, 401, code="invalid_api_key", type="authentication_error")
    assert "sk-acme" not in err["message"]


def test_valid_api_key_maps_to_its_tenant(auth_server: LiveServer) -> None:
    with auth_server.client() as c:
        for key, tenant in (("sk-acme-1", "acme"), ("sk-acme-2", "acme"), ("sk-beta", "beta")):
            r = c.post("/v1/infer", json=ENDPOINT_BODIES["/v1/infer"],
                       headers={"authorization": f"Bearer {key}"})
            assert r.status_code == 200, r.text
            assert r.headers["x-sluice-tenant"] == tenant
        # With keys configured X-Tenant-ID cannot choose another tenant.
        r = c.post("/v1/infer", json=ENDPOINT_BODIES["/v1/infer"],
                   headers={"authorization": "Bearer sk-beta", "x-tenant-id": "acme"})
        assert r.headers["x-sluice-tenant"] == "beta"


def test_tenant_id_of_another_tenant_is_403(auth_server: LiveServer) -> None:
    with auth_server.client() as c:
        r = c.post("/v1/infer", json={**ENDPOINT_BODIES["/v1/infer"], "tenant_id": "beta"},
                   headers={"authorization": "Bearer sk-acme-1"})
        assert_error(r, 403, code="tenant_mismatch", type="permission_error", param="tenant_id")
        r = c.post("/v1/infer", json={**ENDPOINT_BODIES["/v1/infer"], "tenant_id": "acme"},
                   headers={"authorization": "Bearer sk-acme-1"})
        assert r.status_code == 200


# -- 5xx: backend and load failures, internal errors --------------------------------------


@pytest.fixture(scope="module")
def faulty_server(serve_module: Callable[..., LiveServer]) -> LiveServer:
    """Each model serves one test; ``fail_on_calls = [n]`` makes call n raise."""
    return serve_module(config_with(
        models=[
            synth_chat("gen-fail", fail_on_calls=[1]),
            synth_chat("chat-fail", fail_on_calls=[1]),
            synth_chat("stream-fail", fail_on_calls=[1]),
            synth_chat("late-fail", fail_on_calls=[3]),
            synth_embed("embed-fail", fail_on_calls=[1]),
            synth_chat("broken", fail_load=True),
        ],
        workers={"count": 1, "budget_bytes": 10_000_000_000},
    ))


@pytest.fixture
def faulty(faulty_server: LiveServer) -> Iterator[httpx.Client]:
    with faulty_server.client() as c:
        yield c


def _assert_no_leak(err: dict[str, Any]) -> None:
    assert "injected" not in err["message"]
    assert "fault" not in err["message"]
    assert "Error" not in err["message"]


@pytest.mark.parametrize(("path", "body"), [
    ("/v1/infer", {"model": "gen-fail", "input": "x", "max_new_tokens": 3}),
    ("/v1/chat/completions", {"model": "chat-fail", "messages": MSG, "max_tokens": 3}),
    ("/v1/chat/completions", {"model": "stream-fail", "messages": MSG, "max_tokens": 3,
                              "stream": True}),
    ("/v1/embeddings", {"model": "embed-fail", "input": ["a", "b"]}),
])
def test_backend_failure_is_500_without_internals(faulty: httpx.Client, path: str,
                                                  body: dict[str, Any]) -> None:
    r = faulty.post(path, json=body)
    err = assert_error(r, 500, code="backend_error", type="server_error")
    _assert_no_leak(err)
    assert err["message"] == "The model failed while running this request."
    assert "retry-after" not in r.headers
    # Only the first call failed: the model keeps serving.
    r = faulty.post(path, json=body)
    assert r.status_code == 200, r.text


def test_backend_failure_mid_stream_ends_the_stream_with_an_error_event(
    faulty: httpx.Client,
) -> None:
    body = {"model": "late-fail", "messages": MSG, "max_tokens": 8, "stream": True}
    with faulty.stream("POST", "/v1/chat/completions", json=body) as r:
        assert r.status_code == 200  # headers went out with the first token
        events = sse_data(r.iter_lines())
    assert events[-1] == "[DONE]"
    error = events[-2]
    assert set(error) == {"error"}
    assert set(error["error"]) == {"message", "type", "param", "code"}
    assert error["error"]["code"] == "backend_error"
    assert error["error"]["type"] == "server_error"
    _assert_no_leak(error["error"])
    tokens = [e for e in events[:-2] if e["choices"][0]["delta"].get("content")]
    assert len(tokens) == 2  # calls 1 and 2 produced a token each; call 3 raised


def test_model_load_failure_is_500_without_internals(faulty: httpx.Client) -> None:
    for path, body in (("/v1/infer", {"model": "broken", "input": "x"}),
                       ("/v1/completions", {"model": "broken", "prompt": "x"})):
        r = faulty.post(path, json=body)
        err = assert_error(r, 503, code="model_load_failed", type="server_error")
        assert err["message"] == "The model could not be loaded."
        _assert_no_leak(err)


class _NanOneShot(SyntheticOneShot):
    """An embedding model whose output cannot be encoded as JSON."""

    def run_batch(self, inputs: Any) -> list[Any]:
        return [Embedding([math.nan] * self.dim, 1) for _ in inputs]


class _NanBackend(SyntheticBackend):
    def load(self, spec: ModelSpec) -> Any:
        return _NanOneShot(spec) if spec.kind == "oneshot" else super().load(spec)


def test_unhandled_error_is_500_with_request_id_and_keeps_the_connection(
    serve: Callable[..., LiveServer],
) -> None:
    live = serve(config_with(models=[synth_embed(), synth_chat()], workers={"count": 1}),
                 backends={"synthetic": _NanBackend()})
    with live.client() as c:
        r = c.post("/v1/embeddings", json={"model": "synth-a", "input": "x"},
                   headers={"x-request-id": "nan-1"})
        err = assert_error(r, 500, code="internal_error", type="server_error")
        assert err["message"] == "Internal error."
        assert r.headers["x-request-id"] == "nan-1"
        # The same keep-alive connection serves the next request.
        r = c.post("/v1/infer", json={"model": CHAT, "input": "x", "max_new_tokens": 1})
        assert r.status_code == 200, r.text


# -- 503 with Retry-After: overload, infeasible model -------------------------------------


def test_queue_full_is_503_with_retry_after(serve: Callable[..., LiveServer]) -> None:
    """One sequence slot, one inbox place and one queue place: the fourth waiting request
    is refused at once."""
    live = serve(config_with(
        models=[synth_chat("slow", step_fixed_s=0.02, n_seq_max=1, load_s=0.0)],
        workers={"count": 1, "inbox_capacity": 1}, scheduling={"queue_capacity": 1}))

    async def scenario() -> httpx.Response:
        async with live.async_client() as c:
            async def held(n: int) -> None:
                async with c.stream("POST", "/v1/infer", json={
                        "model": "slow", "input": "x", "max_new_tokens": 500,
                        "stream": n == 0}) as r:
                    await r.aread()

            async def state() -> dict[str, Any]:
                return (await c.get("/status.json")).json()  # type: ignore[no-any-return]

            async def until(pred: Callable[[dict[str, Any]], bool]) -> None:
                for _ in range(250):
                    if pred(await state()):
                        return
                    await asyncio.sleep(0.02)
                raise AssertionError(f"state not reached: {await state()}")

            tasks = [asyncio.ensure_future(held(0))]
            await until(lambda s: s["workers"][0]["active"] == 1)
            tasks.append(asyncio.ensure_future(held(1)))
            await until(lambda s: s["workers"][0]["inbox_depth"] == 1)
            tasks.append(asyncio.ensure_future(held(2)))
            await until(lambda s: s["queue_depth"] == 1)
            refused = await c.post("/v1/infer", json={"model": "slow", "input": "x"})
            for t in tasks:
                t.cancel()  # closing the connections cancels the held requests
            await asyncio.gather(*tasks, return_exceptions=True)
            return refused

    r = asyncio.run(scenario())
    err = assert_error(r, 503, code="queue_full", type="server_overloaded")
    assert int(r.headers["retry-after"]) >= 1
    assert "capacity 1" in err["message"]
    with live.client() as c:
        wait_for(lambda: c.get("/status.json").json()["live_requests"] == 0)


def test_model_too_large_for_every_worker_is_a_config_error() -> None:
    huge = {**synth_embed("huge"), "memory_bytes": 5_000_000_000}
    config = config_with(models=[synth_embed(), huge], workers={"count": 1})
    with pytest.raises(ValueError, match=r"models\['huge'\].memory_bytes"):
        config.runtime_config()
