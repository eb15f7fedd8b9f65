"""The bad-input table (docs/bad-inputs.md): every row is one malformed, hostile or
impossible request against a running server with API keys and an admin key configured.
Each gets its documented status and, where the app answers, exactly the error body of the
API it came through: OpenAI's, Anthropic's (``{"type": "error", "error": {"type",
"message"}}``) on ``/v1/messages``, llama-server's (``{"error": {"code", "message",
"type"}}``) on its native endpoints; none is a 500; and the server answers ``/health`` 200
after every one, and real requests on every API after the whole table."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from tests.reliability.rawhttp import RawResponse, http_bytes, raw_request
from tests.server.live import (
    ERROR_KEYS,
    LiveServer,
    assert_error,
    config_with,
    error_keys,
    synth_chat,
    synth_embed,
    synth_rerank,
    wait_for,
)

KEY = "sk-table-acme"
ADMIN = "adm-table-secret"
AUTH = {"authorization": f"Bearer {KEY}"}
CHAT = "synth-chat"
MSG = [{"role": "user", "content": "hello"}]
CHAT_BODY: dict[str, Any] = {"model": CHAT, "messages": MSG, "max_tokens": 2}
JSON = {"content-type": "application/json", **AUTH}
RERANK_MAX_DOCUMENTS = 8
RERANK_BODY: dict[str, Any] = {
    "query": "capital of France",
    "documents": ["bananas are yellow", "Paris is the capital of France"],
}


@dataclass(frozen=True)
class Case:
    """One row: how to send it, and what must come back."""

    name: str
    send: Callable[[LiveServer], httpx.Response | RawResponse]
    status: int
    code: str | None = None
    param: str | None = None
    openai_body: bool = True
    """False where uvicorn answers before the app sees the request (no JSON body)."""
    llama_type: str | None = None
    """llama-server's error ``type``, for a row on its native endpoints (``param``: a word
    the message must hold, since that shape has no ``param``)."""
    anthropic: bool = False
    """Anthropic's error body, ``{"type": "error", "error": {"type", "message"}}``; ``code``
    is then the error's ``type``."""
    ollama: bool = False
    """Ollama's error body, ``{"error": message}`` (``param``: a word the message must
    hold)."""


def chat(change: dict[str, Any], headers: dict[str, str] | None = None,
         path: str = "/v1/chat/completions") -> Callable[[LiveServer], httpx.Response]:
    def send(live: LiveServer) -> httpx.Response:
        with live.client() as c:
            return c.post(path, json={**CHAT_BODY, **change},
                          headers=AUTH if headers is None else headers)
    return send


def body(raw: bytes, path: str = "/v1/chat/completions",
         headers: dict[str, str] | None = None) -> Callable[[LiveServer], httpx.Response]:
    def send(live: LiveServer) -> httpx.Response:
        with live.client() as c:
            return c.post(path, content=raw, headers=JSON if headers is None else headers)
    return send


def post(path: str, json_body: dict[str, Any] | None = None,
         headers: dict[str, str] | None = None) -> Callable[[LiveServer], httpx.Response]:
    def send(live: LiveServer) -> httpx.Response:
        with live.client() as c:
            return c.post(path, json=json_body, headers=headers or {})
    return send


JUNK_SLOT = "junk.bin"
"""A file in the table server's slot folder that no slot save wrote."""


def llama(path: str, json_body: dict[str, Any] | None = None,
          headers: dict[str, str] | None = None) -> Callable[[LiveServer], httpx.Response]:
    """A llama-server native endpoint, with the tenant's key unless ``headers`` say else."""
    return post(path, json_body, AUTH if headers is None else headers)


MSG_BODY: dict[str, Any] = {"model": CHAT, "messages": MSG, "max_tokens": 2}
RESP_BODY: dict[str, Any] = {"model": CHAT, "input": "hello", "max_output_tokens": 2}
TOOL = {"name": "get_weather", "input_schema": {"type": "object", "properties": {
    "city": {"type": "string"}}}}
FUNCTION = {"type": "function", "name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}
BAD_SCHEMA = {"type": "object", "properties": {"city": {"type": "text"}}}
IMAGE = {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                     "data": "iVBORw0KGgo="}}


def messages(change: dict[str, Any], headers: dict[str, str] | None = None,
             path: str = "/v1/messages", drop: tuple[str, ...] = ()
             ) -> Callable[[LiveServer], httpx.Response]:
    """A Messages (or ``count_tokens``) body with ``change``, without ``drop``."""
    base = dict(MSG_BODY) if path == "/v1/messages" else {"model": CHAT, "messages": MSG}
    sent = {k: v for k, v in {**base, **change}.items() if k not in drop}
    return post(path, sent, AUTH if headers is None else headers)


def responses(change: dict[str, Any], drop: tuple[str, ...] = ()
              ) -> Callable[[LiveServer], httpx.Response]:
    sent = {k: v for k, v in {**RESP_BODY, **change}.items() if k not in drop}
    return post("/v1/responses", sent, AUTH)


def _user(*blocks: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"role": "user", "content": list(blocks)}]


OLLAMA_BODIES: dict[str, dict[str, Any]] = {
    "/api/chat": {"model": CHAT, "messages": MSG, "stream": False,
                  "options": {"num_predict": 2}},
    "/api/generate": {"model": CHAT, "prompt": "hello", "stream": False,
                      "options": {"num_predict": 2}},
    "/api/embed": {"model": "synth-a", "input": "hello"},
    "/api/embeddings": {"model": "synth-a", "prompt": "hello"},
    "/api/show": {"model": CHAT},
}
"""A body each Ollama endpoint serves."""


def ollama(path: str, change: dict[str, Any], headers: dict[str, str] | None = None
           ) -> Callable[[LiveServer], httpx.Response]:
    """An Ollama endpoint's served body with ``change``."""
    return post(path, {**OLLAMA_BODIES[path], **change}, AUTH if headers is None else headers)


def OL(name: str, send: Callable[[LiveServer], httpx.Response], status: int,
      words: str | None = None) -> Case:
    """A row answered in Ollama's shape, its message holding ``words``."""
    return Case(name, send, status, param=words, ollama=True)


OLLAMA_CASES = [
    OL("/api/chat: malformed JSON", body(b'{"model": "synth-chat", "messages": [',
                                        "/api/chat"), 400, "JSON"),
    OL("/api/chat: stream not a boolean (\"yes\")", ollama("/api/chat", {"stream": "yes"}),
      400, "stream"),
    OL("/api/chat: stream not a boolean (1)", ollama("/api/chat", {"stream": 1}), 400,
      "stream"),
    OL("/api/generate: raw not a boolean (1)", ollama("/api/generate", {"raw": 1}), 400,
      "raw"),
    OL("/api/embed: truncate not a boolean (\"no\")", ollama("/api/embed", {"truncate": "no"}),
      400, "truncate"),
    OL("/api/chat: unknown role", ollama("/api/chat", {"messages": [
        {"role": "robot", "content": "x"}]}), 400, "messages.0.role"),
    OL("/api/chat: options.temperature out of range", ollama(
        "/api/chat", {"options": {"temperature": 9}}), 400, "options.temperature"),
    OL("/api/chat: keep_alive in none of Ollama's forms", ollama(
        "/api/chat", {"keep_alive": "5x"}), 400, "keep_alive"),
    OL("/api/chat: an image on a text model", ollama("/api/chat", {"messages": [
        {"role": "user", "content": "x", "images": ["aGVsbG8="]}]}), 400, "images"),
    OL("/api/chat: format a schema the engine cannot compile", ollama(
        "/api/chat", {"format": {"type": "object", "minProperties": "two"}}), 400),
    OL("/api/generate: prompt longer than the context", ollama(
        "/api/generate", {"prompt": "w " * 600}), 400),
    OL("/api/generate: suffix (no FIM model)", ollama("/api/generate", {"suffix": "end"}), 400,
      "suffix"),
    OL("/api/chat: unknown model", ollama("/api/chat", {"model": "llama9"}), 404, "llama9"),
    OL("/api/chat: a known model with another tag", ollama(
        "/api/chat", {"model": f"{CHAT}:7b"}), 404, f"{CHAT}:7b"),
    OL("/api/show: unknown model", ollama("/api/show", {"model": "llama9:latest"}), 404,
      "llama9"),
    OL("/api/show: no model", ollama("/api/show", {"model": ""}), 400, "model is required"),
    OL("/api/embed: a chat model", ollama("/api/embed", {"model": CHAT}), 400,
      "does not support embeddings"),
    OL("/api/embeddings: unknown model", ollama("/api/embeddings", {"model": "llama9"}), 404,
      "llama9"),
    OL("/api/chat: body over max_body_bytes", body(json.dumps(
        {**OLLAMA_BODIES["/api/chat"], "messages": [
            {"role": "user", "content": "w " * 600_000}]}).encode(), "/api/chat"), 413),
    OL("/api/chat: missing API key", ollama("/api/chat", {}, {}), 401, "API key"),
    OL("/api/generate: wrong API key", ollama("/api/generate", {},
                                             {"authorization": "Bearer sk-guess"}), 401,
      "API key"),
    OL("/api/chat: tenant quota exceeded", lambda live: _twice(
        live, {"authorization": "Bearer sk-table-limited-ollama"}, "/api/chat",
        OLLAMA_BODIES["/api/chat"]), 429, "request rate"),
    OL("/api/chat: impossible deadline (x-sluice-deadline-ms 0.001)", ollama(
        "/api/chat", {}, {**AUTH, "x-sluice-deadline-ms": "0.001"}), 503),
    OL("GET /api/tags without an API key", lambda live: httpx.get(f"{live.url}/api/tags"),
       401, "API key"),
    OL("GET /api/ps with a wrong API key", lambda live: httpx.get(
        f"{live.url}/api/ps", headers={"authorization": "Bearer sk-guess"}), 401, "API key"),
    OL("/api/pull (models are configured)", post("/api/pull", {"model": CHAT}, AUTH), 501,
      "sluice serve FILE.gguf"),
]


def rerank(change: dict[str, Any], path: str = "/v1/rerank") -> Callable[[LiveServer],
                                                                      httpx.Response]:
    return post(path, {**RERANK_BODY, **change}, AUTH)


def raw(data: bytes) -> Callable[[LiveServer], RawResponse]:
    def send(live: LiveServer) -> RawResponse:
        return raw_request(live.url, data)
    return send


def admin_raw(target: str) -> Callable[[LiveServer], RawResponse]:
    return raw(http_bytes("POST", target, headers={"x-admin-key": ADMIN}))


def _twice(live: LiveServer, headers: dict[str, str], path: str = "/v1/chat/completions",
           sent: dict[str, Any] = CHAT_BODY) -> httpx.Response:
    """The first request uses the tenant's only token; the second is over quota."""
    with live.client() as c:
        first = c.post(path, json=sent, headers=headers)
        assert first.status_code == 200, first.text
        return c.post(path, json=sent, headers=headers)


def A(name: str, send: Callable[[LiveServer], httpx.Response], status: int,
      error_type: str) -> Case:
    """A row answered in Anthropic's shape."""
    return Case(name, send, status, error_type, anthropic=True)


ANTHROPIC_CASES = [
    A("messages: malformed JSON", body(b'{"model": "synth-chat", "max_tokens": ',
                                       "/v1/messages"), 400, "invalid_request_error"),
    A("messages: missing max_tokens", messages({}, drop=("max_tokens",)), 400,
      "invalid_request_error"),
    A("messages: missing messages", messages({}, drop=("messages",)), 400,
      "invalid_request_error"),
    A("messages: messages of the wrong type (a string)", messages({"messages": "hello"}), 400,
      "invalid_request_error"),
    A("messages: max_tokens 0", messages({"max_tokens": 0}), 400, "invalid_request_error"),
    A("messages: negative max_tokens", messages({"max_tokens": -3}), 400,
      "invalid_request_error"),
    A("messages: huge max_tokens (10^9)", messages({"max_tokens": 10**9}), 400,
      "invalid_request_error"),
    A("messages: max_tokens past the context", messages({"max_tokens": 100_000}), 400,
      "invalid_request_error"),
    A("messages: unknown content block type", messages({"messages": _user({"type": "video"})}),
      400, "invalid_request_error"),
    A("messages: an image block", messages({"messages": _user(IMAGE)}), 400,
      "invalid_request_error"),
    A("messages: a document block", messages({"messages": _user(
        {"type": "document", "source": {"type": "text", "data": "x"}})}), 400,
      "invalid_request_error"),
    A("messages: tool_choice naming a missing tool", messages(
        {"tools": [TOOL], "tool_choice": {"type": "tool", "name": "get_time"}}), 400,
      "invalid_request_error"),
    A("messages: input_schema not an object", messages(
        {"tools": [{"name": "f", "input_schema": {"type": "string"}}]}), 400,
      "invalid_request_error"),
    A("messages: malformed input_schema (tool_choice auto)", messages(
        {"tools": [{"name": "f", "input_schema": BAD_SCHEMA}]}), 400, "invalid_request_error"),
    A("messages: five stop_sequences", messages({"stop_sequences": list("abcde")}), 400,
      "invalid_request_error"),
    A("messages: a 300-character stop sequence", messages({"stop_sequences": ["s" * 300]}),
      400, "invalid_request_error"),
    A("messages: thinking.budget_tokens >= max_tokens", messages(
        {"thinking": {"type": "enabled", "budget_tokens": 2}}), 400, "invalid_request_error"),
    A("messages: thinking enabled without budget_tokens", messages(
        {"thinking": {"type": "enabled"}}), 400, "invalid_request_error"),
    A("messages: unknown output_config.effort", messages(
        {"output_config": {"effort": "extreme"}}), 400, "invalid_request_error"),
    A("messages: prompt longer than the context", messages(
        {"messages": [{"role": "user", "content": "w " * 600}]}), 400,
      "invalid_request_error"),
    A("messages: stream not a boolean (\"yes\")", messages({"stream": "yes"}), 400,
      "invalid_request_error"),
    A("messages: stream not a boolean (1)", messages({"stream": 1}), 400,
      "invalid_request_error"),
    A("messages: unknown model", messages({"model": "claude-9"}), 404, "not_found_error"),
    A("messages: body over max_body_bytes", body(json.dumps(
        {**MSG_BODY, "system": "w " * 600_000}).encode(), "/v1/messages"), 413,
      "request_too_large"),
    A("messages: wrong x-api-key", messages({}, {"x-api-key": "sk-guess"}), 401,
      "authentication_error"),
    A("messages: tenant quota exceeded", lambda live: _twice(
        live, {"x-api-key": "sk-table-limited-msg"}, "/v1/messages", MSG_BODY), 429,
      "rate_limit_error"),
    A("messages: impossible deadline (1 µs)", messages({"deadline_ms": 0.001}), 529,
      "overloaded_error"),
    A("count_tokens: malformed JSON", body(b'{"model": "synth-chat", "messages": ',
                                           "/v1/messages/count_tokens"), 400,
      "invalid_request_error"),
    A("count_tokens: missing model", messages({}, path="/v1/messages/count_tokens",
                                              drop=("model",)), 400, "invalid_request_error"),
    A("count_tokens: an image block", messages({"messages": _user(IMAGE)},
                                               path="/v1/messages/count_tokens"), 400,
      "invalid_request_error"),
    A("count_tokens: tool_choice naming a missing tool", messages(
        {"tools": [TOOL], "tool_choice": {"type": "tool", "name": "get_time"}},
        path="/v1/messages/count_tokens"), 400, "invalid_request_error"),
    A("count_tokens: unknown model", messages({"model": "claude-9"},
                                              path="/v1/messages/count_tokens"), 404,
      "not_found_error"),
    A("count_tokens: missing key", messages({}, {}, path="/v1/messages/count_tokens"), 401,
      "authentication_error"),
]

OPENAI_CASES = [
    Case("responses: malformed JSON", body(b'{"model": "synth-chat", "input": ',
                                           "/v1/responses"), 400, "invalid_json"),
    Case("responses: body over max_body_bytes", body(json.dumps(
        {**RESP_BODY, "input": "w " * 600_000}).encode(), "/v1/responses"), 413,
         "body_too_large"),
    Case("responses: missing API key", post("/v1/responses", RESP_BODY), 401,
         "invalid_api_key"),
    Case("responses: stream not a boolean (\"true\")", responses({"stream": "true"}), 400,
         "invalid_value", "stream"),
    Case("responses: store not a boolean (0)", responses({"store": 0}), 400, "invalid_value",
         "store"),
    Case("responses: impossible deadline (1 µs)", responses({"deadline_ms": 0.001}), 503,
         "deadline_infeasible"),
    Case("responses: missing input", responses({}, drop=("input",)), 400, "invalid_value",
         "input"),
    Case("responses: input of the wrong type (a number)", responses({"input": 5}), 400,
         "invalid_value", "input"),
    Case("responses: empty input list", responses({"input": []}), 400, "invalid_value",
         "input"),
    Case("responses: unknown input item type", responses({"input": [{"type": "audio"}]}), 400,
         "invalid_value", "input.0"),
    Case("responses: unknown content part type", responses({"input": [
        {"role": "user", "content": [{"type": "input_audio"}]}]}), 400, "invalid_value",
         "input.0.message.content.0.type"),
    Case("responses: an input_image part", responses({"input": [
        {"role": "user", "content": [{"type": "input_image", "image_url": "http://x/y.png"}]}]}),
         400, "unsupported_content", "input.0.content.0"),
    Case("responses: max_output_tokens 0", responses({"max_output_tokens": 0}), 400,
         "invalid_value", "max_output_tokens"),
    Case("responses: negative max_output_tokens", responses({"max_output_tokens": -3}), 400,
         "invalid_value", "max_output_tokens"),
    Case("responses: huge max_output_tokens (10^9)", responses({"max_output_tokens": 10**9}),
         400, "invalid_value", "max_output_tokens"),
    Case("responses: max_output_tokens past the context",
         responses({"max_output_tokens": 100_000}), 400, "context_length_exceeded",
         "max_output_tokens"),
    Case("responses: previous_response_id", responses({"previous_response_id": "resp_1"}),
         400, "unsupported_parameter", "previous_response_id"),
    Case("responses: background", responses({"background": True}), 400,
         "unsupported_parameter", "background"),
    Case("responses: conversation", responses({"conversation": "conv_1"}), 400,
         "unsupported_parameter", "conversation"),
    Case("responses: tool_choice naming a missing function", responses(
        {"tools": [FUNCTION], "tool_choice": {"type": "function", "name": "get_time"}}), 400,
         "invalid_value", "tool_choice"),
    Case("responses: malformed function parameters (tool_choice auto)", responses(
        {"tools": [{**FUNCTION, "parameters": BAD_SCHEMA}]}), 400, "invalid_value",
         "tools.0.parameters"),
    Case("responses: text.format json_schema without a schema", responses(
        {"text": {"format": {"type": "json_schema", "name": "x"}}}), 400, "invalid_value",
         "text.format"),
    Case("responses: text.format schema the engine cannot compile", responses(
        {"text": {"format": {"type": "json_schema", "name": "x",
                             "schema": {"type": "object", "minProperties": "two"}}}}), 400,
         "invalid_value", "text.format"),
    Case("responses: unknown reasoning.effort", responses({"reasoning": {"effort": "extreme"}}),
         400, "invalid_value", "reasoning.effort"),
    Case("responses: negative thinking_budget_tokens",
         responses({"thinking_budget_tokens": -1}), 400, "invalid_value",
         "thinking_budget_tokens"),
    Case("responses: only a system message", responses(
        {"input": [{"role": "system", "content": "be brief"}]}), 400, "invalid_value", "input"),
    Case("responses: unknown model", responses({"model": "gpt-7"}), 404, "model_not_found",
         "model"),
    Case("responses: tenant quota exceeded", lambda live: _twice(
        live, {"authorization": "Bearer sk-table-limited-resp"}, "/v1/responses", RESP_BODY),
         429, "quota"),
    Case("chat: malformed function parameters (tool_choice auto)", chat({"tools": [
        {"type": "function", "function": {"name": "f", "parameters": BAD_SCHEMA}}]}), 400,
         "invalid_value", "tools.0.function.parameters"),
    Case("chat: stream not a boolean (\"true\")", chat({"stream": "true"}), 400,
         "invalid_value", "stream"),
    Case("chat: stream not a boolean (1)", chat({"stream": 1}), 400, "invalid_value",
         "stream"),
    Case("chat: logprobs not a boolean (\"yes\")", chat({"logprobs": "yes"}), 400,
         "invalid_value", "logprobs"),
    Case("chat: stream_options.include_usage not a boolean (1)", chat(
        {"stream": True, "stream_options": {"include_usage": 1}}), 400, "invalid_value",
         "stream_options.include_usage"),
    Case("completions: echo not a boolean (\"yes\")", post(
        "/v1/completions", {"model": CHAT, "prompt": "hi", "max_tokens": 2, "echo": "yes"},
        AUTH), 400, "invalid_value", "echo"),
    Case("/tokenize: none of content, prompt or messages", post(
        "/tokenize", {"with_pieces": True}, AUTH), 400, "invalid_value"),
    Case("/detokenize: a token id outside the vocabulary", post(
        "/detokenize", {"tokens": [5, 99_999]}, AUTH), 400, "invalid_value", "tokens"),
    Case("/tokenize: missing API key", post("/tokenize", {"content": "hi"}), 401,
         "invalid_api_key"),
    Case("/tokenize: with_pieces not a boolean (1)", post(
        "/tokenize", {"content": "hi", "with_pieces": 1}, AUTH), 400, "invalid_value",
         "with_pieces"),
    Case("chat: unknown reasoning_effort", chat({"reasoning_effort": "extreme"}), 400,
         "invalid_value", "reasoning_effort"),
    Case("chat: chat_template_kwargs.enable_thinking not a boolean", chat(
        {"chat_template_kwargs": {"enable_thinking": "maybe"}}), 400, "invalid_value",
         "chat_template_kwargs"),
]


CASES = [
    # -- the body is not what it claims to be ----------------------------------------
    Case("malformed JSON", body(b'{"model": "synth-chat", "messages": ['), 400, "invalid_json"),
    Case("invalid UTF-8 in the body", body(
        b'{"model": "synth-chat", "messages": [{"role": "user", "content": "\xff\xfe\xc3"}]}'),
        400, "invalid_json"),
    Case("lone UTF-16 surrogate escape in a string", body(
        b'{"model": "synth-chat", "messages": [{"role": "user", "content": "a \\ud800 b"}]}'),
        400, "invalid_value", "messages.0.content"),
    Case("JSON that is not an object", body(b"[1, 2, 3]"), 400, "invalid_json"),
    Case("JSON nested 100 000 deep", body(b'{"model": ' + b"[" * 100_000 + b"]" * 100_000
                                          + b"}"), 400, "invalid_json"),
    Case("NaN where a number is expected", body(
        b'{"model": "synth-chat", "messages": [{"role": "user", "content": "x"}], '
        b'"temperature": NaN}'), 400, "invalid_value", "temperature"),
    Case("integer with 5000 digits", body(
        b'{"model": "synth-chat", "messages": [], "max_tokens": ' + b"9" * 5000 + b"}"),
        400, "invalid_json"),
    Case("body sent as text/plain", body(json.dumps(CHAT_BODY).encode(),
                                         headers={"content-type": "text/plain", **AUTH}),
         400, "invalid_json"),
    Case("body over max_body_bytes", body(json.dumps(
        {"model": CHAT, "prompt": "w " * 600_000}).encode(), "/v1/completions"), 413,
        "body_too_large"),
    # -- fields of the wrong type or out of range -------------------------------------
    Case("wrong type (temperature is a string)", chat({"temperature": "hot"}), 400,
         "invalid_value", "temperature"),
    Case("negative max_tokens", chat({"max_tokens": -5}), 400, "invalid_value", "max_tokens"),
    Case("huge max_tokens (10^9)", chat({"max_tokens": 10**9}), 400, "invalid_value",
         "max_tokens"),
    Case("max_tokens past the context", chat({"max_tokens": 100_000}), 400,
         "context_length_exceeded", "max_tokens"),
    Case("temperature out of range", chat({"temperature": 3.5}), 400, "invalid_value",
         "temperature"),
    Case("empty messages", chat({"messages": []}), 400, "invalid_value", "messages"),
    Case("unknown role", chat({"messages": [{"role": "robot", "content": "x"}]}), 400,
         "invalid_value", "messages.0.role"),
    Case("continue_final_message and add_generation_prompt both true", chat(
        {"messages": [MSG[0], {"role": "assistant", "content": "Hel"}],
         "continue_final_message": True, "add_generation_prompt": True}), 400,
        "invalid_value", "continue_final_message"),
    Case("continue_final_message after a user turn", chat(
        {"messages": [MSG[0]], "continue_final_message": True}), 400, "invalid_value",
        "continue_final_message"),
    Case("two assistant turns at the end", chat(
        {"messages": [MSG[0], {"role": "assistant", "content": "a"},
                      {"role": "assistant", "content": "b"}]}), 400, "invalid_value",
        "messages"),
    Case("continuing an assistant turn with tool calls", chat(
        {"messages": [MSG[0], {"role": "assistant", "content": "", "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}]}),
        400, "invalid_value", "messages"),
    Case("prompt longer than the context", chat(
        {"messages": [{"role": "user", "content": "w " * 600}]}), 400,
        "context_length_exceeded", "messages"),
    Case("token id outside the vocabulary", post(
        "/v1/completions", {"model": CHAT, "prompt": [5, 99_999]}, AUTH), 400,
        "invalid_value", "prompt"),
    Case("/v1/embeddings: an empty input list", post(
        "/v1/embeddings", {"model": "synth-a", "input": []}, AUTH), 400, "invalid_value",
        "input"),
    Case("/v1/embeddings: token ids and a list in one prompt", post(
        "/v1/embeddings", {"model": "synth-a", "input": [12, [34]]}, AUTH), 400,
        "invalid_value", "input"),
    Case("n above the sequence slots", chat({"n": 9}), 400, "invalid_value", "n"),
    Case("top_logprobs above 20", chat({"logprobs": True, "top_logprobs": 21}), 400,
         "invalid_value", "top_logprobs"),
    Case("presence_penalty out of range", chat({"presence_penalty": 2.7}), 400,
         "invalid_value", "presence_penalty"),
    Case("a tool without its function", chat({"tools": [{"type": "function"}]}), 400,
         "invalid_value", "tools.0.function"),
    Case("five stop strings", chat({"stop": ["a", "b", "c", "d", "e"]}), 400,
         "invalid_value", "stop"),
    Case("bad x-sluice-deadline-ms header", chat({}, {**AUTH, "x-sluice-deadline-ms": "soon"}),
         400, "invalid_value", "x-sluice-deadline-ms"),
    # -- models ---------------------------------------------------------------------------
    Case("unknown model", chat({"model": "gpt-7"}), 404, "model_not_found", "model"),
    Case("model of the wrong kind (chat on an encoder)", chat({"model": "synth-a"}), 400,
         "model_kind_mismatch", "model"),
    # -- keys -----------------------------------------------------------------------------
    Case("missing API key", chat({}, {}), 401, "invalid_api_key"),
    Case("wrong API key", chat({}, {"authorization": "Bearer sk-guess"}), 401,
         "invalid_api_key"),
    Case("revoked API key (no longer in the config)",
         chat({}, {"authorization": "Bearer sk-table-revoked"}), 401, "invalid_api_key"),
    Case("API key in the wrong scheme", chat({}, {"authorization": f"Basic {KEY}"}), 401,
         "invalid_api_key"),
    Case("tenant_id of another tenant", post(
        "/v1/infer", {"model": CHAT, "input": "x", "tenant_id": "other"}, AUTH), 403,
        "tenant_mismatch", "tenant_id"),
    Case("tenant quota exceeded (second request in a 1-request burst)",
         lambda live: _twice(live, {"authorization": "Bearer sk-table-limited"}), 429,
         "quota"),
    # -- deadlines --------------------------------------------------------------------------
    Case("impossible deadline (1 µs)", chat({"deadline_ms": 0.001}), 503,
         "deadline_infeasible"),
    Case("deadline of zero", chat({"deadline_ms": 0}), 400, "invalid_value", "deadline_ms"),
    # -- admin API --------------------------------------------------------------------------
    Case("admin call without the admin key", post(f"/admin/models/{CHAT}/load"), 401,
         "invalid_admin_key"),
    Case("admin call with a tenant's API key", post(f"/admin/models/{CHAT}/load",
                                                    headers=AUTH), 401, "invalid_admin_key"),
    Case("admin path traversal (../../etc/passwd)",
         admin_raw("/admin/models/../../etc/passwd/load"), 404, "not_found"),
    Case("admin path traversal (%2e%2e%2f encoded)",
         admin_raw("/admin/models/%2e%2e%2f%2e%2e%2fetc%2fpasswd/load"), 404, "not_found"),
    Case("admin model id '..'", admin_raw("/admin/models/../load"), 400, "invalid_value",
         "path.model_id"),
    Case("admin model id with a NUL byte", admin_raw("/admin/models/synth-a%00/load"), 400,
         "invalid_value", "path.model_id"),
    # -- HTTP itself ------------------------------------------------------------------------
    Case("wrong method", lambda live: httpx.get(f"{live.url}/v1/chat/completions"), 405,
         "method_not_allowed"),
    Case("unknown path", lambda live: httpx.post(f"{live.url}/v1/engines/x/completions"), 404,
         "not_found"),
    Case("request head over uvicorn's limit (200 KB header)", raw(http_bytes(
        "POST", "/v1/chat/completions", b"{}", {"x-padding": "p" * 200_000})), 400,
        openai_body=False),
    Case("not HTTP at all", raw(b"\x16\x03\x01\x02\x00 hello\r\n\r\n"), 400, openai_body=False),
    # -- llama-server's native endpoints (its error shape) --------------------------------
    Case("/completion: wrong type (n_predict is a string)",
         llama("/completion", {"prompt": "hi", "n_predict": "many"}), 400,
         param="n_predict", llama_type="invalid_request_error"),
    Case("/completion: negative n_predict", llama("/completion", {"prompt": "hi",
                                                                 "n_predict": -5}),
         400, param="n_predict", llama_type="invalid_request_error"),
    Case("/completion: huge n_probs", llama("/completion", {"prompt": "hi", "n_probs": 10**4}),
         400, param="n_probs", llama_type="invalid_request_error"),
    Case("/completion: several prompts in one streamed request",
         llama("/completion", {"prompt": [[1, 2], [3]], "stream": True}), 400, param="prompt",
         llama_type="invalid_request_error"),
    Case("/completion: a sampler sluice does not run (mirostat)",
         llama("/completion", {"prompt": "hi", "mirostat": 2}), 400, param="mirostat",
         llama_type="invalid_request_error"),
    Case("/completion: prompt past the context", llama("/completion", {"prompt": "w " * 600}),
         400, param="context", llama_type="exceed_context_size_error"),
    Case("/completion: missing API key", llama("/completion", {"prompt": "hi"}, {}), 401,
         llama_type="authentication_error"),
    Case("/completion: malformed JSON", body(b'{"prompt": "hi", ', "/completion"), 400,
         param="JSON", llama_type="invalid_request_error"),
    Case("/completion: stream not a boolean (\"true\")",
         llama("/completion", {"prompt": "hi", "stream": "true"}), 400, param="stream",
         llama_type="invalid_request_error"),
    Case("/completion: cache_prompt not a boolean (1)",
         llama("/completion", {"prompt": "hi", "cache_prompt": 1}), 400, param="cache_prompt",
         llama_type="invalid_request_error"),
    Case("/completion: unknown model", llama("/completion", {"prompt": "hi",
                                                             "model": "gpt-7"}), 404,
         param="gpt-7", llama_type="not_found_error"),
    Case("/completion: body over max_body_bytes", body(json.dumps(
        {"prompt": "w " * 600_000}).encode(), "/completion"), 413,
         param="larger than", llama_type="invalid_request_error"),
    Case("/completion: tenant quota exceeded", lambda live: _twice(
        live, {"authorization": "Bearer sk-table-limited-llama"}, "/completion",
        {"prompt": "hi", "n_predict": 2}), 429, param="request rate",
         llama_type="rate_limit_exceeded"),
    Case("/completion: impossible deadline (1 µs)",
         llama("/completion", {"prompt": "hi", "deadline_ms": 0.001}), 503,
         llama_type="unavailable_error"),
    Case("/infill: stream not a boolean (\"yes\")",
         llama("/infill", {"input_prefix": "a", "input_suffix": "b", "stream": "yes"}), 400,
         param="stream", llama_type="invalid_request_error"),
    Case("/infill: unknown model", llama("/infill", {
        "model": "gpt-7", "input_prefix": "a", "input_suffix": "b"}), 404, param="gpt-7",
         llama_type="not_found_error"),
    Case("/apply-template: missing API key", llama("/apply-template", {"messages": MSG}, {}),
         401, llama_type="authentication_error"),
    Case("POST /props without an API key", llama("/props", {}, {}), 401,
         llama_type="authentication_error"),
    Case("/slots: erase without an API key", llama("/slots/0?action=erase", None, {}), 401,
         llama_type="authentication_error"),
    Case("/apply-template: unknown model", llama("/apply-template", {
        "model": "gpt-7", "messages": MSG}), 404, param="gpt-7", llama_type="not_found_error"),
    Case("/infill: a model without FIM tokens",
         llama("/infill", {"input_prefix": "a", "input_suffix": "b"}), 501,
         param="Infill is not supported", llama_type="not_supported_error"),
    Case("/infill: an input_extra chunk without text",
         llama("/infill", {"input_prefix": "a", "input_suffix": "b",
                           "input_extra": [{"filename": "x.py"}]}), 400,
         param="input_extra", llama_type="invalid_request_error"),
    Case("/apply-template: no messages", llama("/apply-template", {"messages": []}), 400,
         param="messages", llama_type="invalid_request_error"),
    Case("POST /props", llama("/props", {}), 501, llama_type="not_supported_error"),
    Case("/slots: unknown slot id", llama("/slots/99?action=erase"), 400,
         param="Invalid slot ID", llama_type="invalid_request_error"),
    Case("/slots: unknown action", llama("/slots/0?action=nuke"), 400, param="action",
         llama_type="invalid_request_error"),
    Case("/slots: save to a path out of the slot folder",
         llama("/slots/0?action=save", {"filename": "../../etc/passwd"}), 400,
         param="Invalid filename", llama_type="invalid_request_error"),
    Case("/slots: restore from a file not in the slot folder",
         llama("/slots/0?action=restore", {"filename": "never-saved.bin"}), 404,
         param="never-saved.bin", llama_type="not_found_error"),
    Case("/slots: restore from a file that is no saved slot",
         llama("/slots/0?action=restore", {"filename": JUNK_SLOT}), 400,
         param="not a saved sequence", llama_type="invalid_request_error"),
    *ANTHROPIC_CASES,
    *OPENAI_CASES,
    *OLLAMA_CASES,
    # -- rerank (OpenAI's shape) ----------------------------------------------------------
    Case("/v1/rerank: empty documents", rerank({"documents": []}), 400, "invalid_value",
         "documents"),
    Case("/v1/rerank: more documents than server.rerank_max_documents",
         rerank({"documents": ["d"] * (RERANK_MAX_DOCUMENTS + 1)}), 400, "invalid_value",
         "documents"),
    Case("/v1/rerank: documents of the wrong type", rerank({"documents": [1, 2]}), 400,
         "invalid_value", "documents.0"),
    Case("/v1/rerank: a query that is not text", rerank({"query": ["a"]}), 400,
         "invalid_value", "query"),
    Case("/v1/rerank: an unknown model", rerank({"model": "bge-reranker-v9"}), 404,
         "model_not_found", "model"),
    Case("/v1/rerank: a generative model", rerank({"model": CHAT}), 400,
         "model_kind_mismatch", "model"),
    Case("/rerank: a huge negative top_n", rerank({"top_n": -(10**30)}, "/rerank"), 400,
         "invalid_value", "top_n"),
    Case("/v1/rerank: return_documents not a boolean (\"yes\")",
         rerank({"return_documents": "yes"}), 400, "invalid_value", "return_documents"),
    Case("/v1/rerank: body over max_body_bytes", body(json.dumps(
        {**RERANK_BODY, "query": "w " * 600_000}).encode(), "/v1/rerank"), 413,
         "body_too_large"),
    Case("/v1/rerank: malformed JSON", body(b'{"query": "x", ', "/v1/rerank"), 400,
         "invalid_json"),
    Case("/v1/rerank: missing API key", post("/v1/rerank", RERANK_BODY), 401,
         "invalid_api_key"),
    Case("/v1/rerank: tenant quota exceeded", lambda live: _twice(
        live, {"authorization": "Bearer sk-table-limited-rerank"}, "/v1/rerank", RERANK_BODY),
         429, "quota"),
    Case("/v1/infer on a reranker", post("/v1/infer", {"model": "synth-rerank", "input": "x"},
                                         AUTH), 400, "model_kind_mismatch", "model"),
]


@pytest.fixture(scope="module")
def table_server(serve_module: Callable[..., LiveServer],
                 tmp_path_factory: pytest.TempPathFactory) -> LiveServer:
    slots = tmp_path_factory.mktemp("slots")
    (slots / JUNK_SLOT).write_bytes(b"not a saved slot")
    return serve_module(config_with(
        models=[synth_chat(), synth_embed(), synth_rerank()],
        workers={"count": 1},
        tenants=[{"id": "acme", "api_keys": [KEY]}, {"id": "other", "api_keys": ["sk-other"]},
                 *({"id": f"limited{suffix}", "api_keys": [f"sk-table-limited{suffix}"],
                    "limits": {"requests_per_s": 0.001, "burst": 1}}
                   for suffix in ("", "-msg", "-resp", "-ollama", "-llama", "-rerank"))],
        server={"admin_key": ADMIN, "default_model": CHAT, "open_metrics": True,
                "slot_save_path": str(slots), "rerank_max_documents": RERANK_MAX_DOCUMENTS},
    ))


def test_the_table_has_at_least_25_distinct_cases() -> None:
    assert len({c.name for c in CASES}) == len(CASES) >= 25


def assert_anthropic_error(r: httpx.Response, status: int, error_type: str | None
                           ) -> dict[str, Any]:
    """Exactly Anthropic's error body with ``status`` and ``error_type``; the error."""
    assert r.status_code == status, r.text
    assert r.headers.get("x-request-id")
    payload = r.json()
    assert set(payload) == {"type", "error"} and payload["type"] == "error", payload
    err: dict[str, Any] = payload["error"]
    assert set(err) == {"type", "message"} and err["type"] == error_type, err
    assert isinstance(err["message"], str) and err["message"]
    return err


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_bad_input_gets_its_status_and_the_server_stays_healthy(
    table_server: LiveServer, case: Case
) -> None:
    r = case.send(table_server)
    if case.llama_type is not None:
        assert isinstance(r, httpx.Response)
        assert r.status_code == case.status, r.text
        assert r.headers.get("x-request-id")
        err = r.json()["error"]
        assert set(r.json()) == {"error"} and error_keys(err) == {
            "code", "message", "type"}, err
        assert (err["code"], err["type"]) == (case.status, case.llama_type), err
        assert isinstance(err["message"], str) and (case.param or "") in err["message"]
    elif isinstance(r, httpx.Response) and case.anthropic:
        err = assert_anthropic_error(r, case.status, case.code)
    elif isinstance(r, httpx.Response) and case.ollama:
        assert r.status_code == case.status, r.text
        assert r.headers.get("x-request-id")
        payload = r.json()
        assert set(payload) == {"error"} and isinstance(payload["error"], str), payload
        assert payload["error"] and (case.param or "") in payload["error"], payload
        err = {"message": payload["error"]}
    elif isinstance(r, httpx.Response) and case.openai_body:
        err = assert_error(r, case.status, code=case.code, param=case.param)
    else:
        status = r.status_code if isinstance(r, httpx.Response) else r.status
        content = r.content if isinstance(r, httpx.Response) else r.body
        assert status == case.status, (status, content)
        err = None
        if case.openai_body:
            assert isinstance(r, RawResponse)
            assert r.headers.get("x-request-id")
            payload = r.json()
            assert set(payload) == {"error"}, payload
            assert error_keys(payload["error"]) == ERROR_KEYS, payload
            err = payload["error"]
            assert err["code"] == case.code, err
            if case.param is not None:
                assert err["param"] == case.param, err
    if err is not None:
        assert KEY not in err["message"] and ADMIN not in err["message"]
    assert case.status != 500  # never a 500
    if case.status in (429, 503, 529):
        assert int(r.headers["retry-after"]) >= 1
    with table_server.client() as c:
        assert c.get("/health").json() == {"status": "ok"}
        wait_for(lambda: c.get("/status.json").json()["live_requests"] == 0)


def test_a_good_request_is_served_after_the_whole_table(table_server: LiveServer) -> None:
    with table_server.client() as c:
        r = c.post("/v1/chat/completions", json=CHAT_BODY, headers=AUTH)
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["completion_tokens"] == 2
        r = c.post("/v1/messages", json=MSG_BODY, headers={"x-api-key": KEY})
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["output_tokens"] == 2
        r = c.post("/v1/messages/count_tokens", json={"model": CHAT, "messages": MSG},
                   headers=AUTH)
        assert r.status_code == 200 and r.json()["input_tokens"] > 0, r.text
        r = c.post("/v1/responses", json=RESP_BODY, headers=AUTH)
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["output_tokens"] == 2
        for path in ("/api/chat", "/api/generate"):
            r = c.post(path, json=OLLAMA_BODIES[path], headers=AUTH)
            assert r.status_code == 200, r.text
            assert r.json()["done"] is True and r.json()["eval_count"] == 2
        r = c.post("/api/embed", json=OLLAMA_BODIES["/api/embed"], headers=AUTH)
        assert r.status_code == 200 and len(r.json()["embeddings"]) == 1, r.text
        r = c.post("/completion", json={"prompt": "hi", "n_predict": 2}, headers=AUTH)
        assert r.status_code == 200 and r.json()["tokens_predicted"] == 2, r.text
        ranked = c.post("/v1/rerank", json=RERANK_BODY, headers=AUTH)
        assert ranked.status_code == 200, ranked.text
        assert [x["index"] for x in ranked.json()["results"]] == [1, 0]
        state = table_server.runtime.workers[0].call(
            table_server.runtime.workers[0].integrity).result(timeout=10)
        assert all(free == total for free, total in state.values())
