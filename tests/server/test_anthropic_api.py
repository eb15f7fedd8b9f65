"""Anthropic Messages through the real ``anthropic`` SDK against a real uvicorn server on the
synthetic backend: create and stream (the same greedy text, Anthropic's event order),
``count_tokens`` equal to the usage a create reports (``thinking`` included, as the
template's ``enable_thinking``), tools (a forced ``tool_use`` that
validates against its ``input_schema``, then the ``tool_result`` round trip), and errors as
the SDK's exception types with Anthropic's shape and status codes, the server serving after
each."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import anthropic
import httpx
import jsonschema
import pytest

from tests.server.live import LiveServer, config_with, synth_chat

MODEL = "synth-chat"
BYTES = "synth-bytes"
KEY = "key-a"
WEATHER = {"name": "get_weather", "description": "Get the weather in a city",
           "input_schema": {"type": "object", "properties": {
               "city": {"type": "string", "maxLength": 12},
               "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
               "required": ["city", "unit"], "additionalProperties": False}}
HELLO: Any = [{"role": "user", "content": "hello there"}]
GREEDY = {"temperature": 0}
"""Sent as ``extra_body``: this SDK's ``create`` has no ``temperature`` argument."""
THINKS = "synth-thinks"
THINKING_TEMPLATE = (
    "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant:"
    "{% if enable_thinking %}<think>{% else %}<think></think>{% endif %}{% endif %}")
"""A Jinja template that reads ``enable_thinking`` (an empty thinking block when off)."""


@pytest.fixture(scope="module")
def live(serve_module: Callable[..., LiveServer]) -> LiveServer:
    return serve_module(config_with(
        models=[synth_chat(MODEL), synth_chat(BYTES, byte_tokens=True, vocab_size=300,
                                         n_ctx_per_seq=2048),
                synth_chat(THINKS, byte_tokens=True, vocab_size=300,
                           chat_template=THINKING_TEMPLATE)],
        tenants=[{"id": "a", "api_keys": [KEY]},
                 {"id": "slow", "api_keys": ["key-slow"],
                  "limits": {"requests_per_s": 0.001, "burst": 1}}]))


@pytest.fixture(scope="module")
def client(live: LiveServer) -> Iterator[anthropic.Anthropic]:
    with anthropic.Anthropic(base_url=live.url, api_key=KEY, max_retries=0) as c:
        yield c


def serves(client: anthropic.Anthropic) -> None:
    """A real request still completes."""
    msg = client.messages.create(model=MODEL, max_tokens=4, messages=HELLO, extra_body=GREEDY)
    assert msg.type == "message" and msg.usage.output_tokens >= 1


def text_of(msg: Any) -> str:
    return "".join(b.text for b in msg.content if b.type == "text")


def test_create_and_count_tokens(client: anthropic.Anthropic) -> None:
    msg = client.messages.create(model=MODEL, max_tokens=8, extra_body=GREEDY, messages=HELLO,
                                 system="be brief", metadata={"user_id": "u-1"})
    assert msg.role == "assistant" and msg.model == MODEL and msg.id.startswith("msg_")
    assert msg.stop_reason == "max_tokens" and msg.usage.output_tokens == 8
    assert text_of(msg).strip()
    counted = client.messages.count_tokens(model=MODEL, messages=HELLO, system="be brief")
    assert counted.input_tokens == msg.usage.input_tokens
    blocks = client.messages.count_tokens(
        model=MODEL, messages=HELLO, system=[{"type": "text", "text": "be brief"}])
    assert blocks.input_tokens == counted.input_tokens
    bare = client.messages.count_tokens(model=MODEL, messages=HELLO)
    assert bare.input_tokens < counted.input_tokens  # the system prompt is in the prompt


def test_a_last_assistant_turn_is_prefill(client: anthropic.Anthropic,
                                          live: LiveServer) -> None:
    """Anthropic's prefill: the answer goes on from a last assistant turn's text, the same
    prompt as OpenAI chat's continued turn (and not the closed turn it rendered before);
    ``count_tokens`` counts that prompt."""
    turns: Any = [*HELLO, {"role": "assistant", "content": "The answer is"}]
    msg = client.messages.create(model=BYTES, max_tokens=2, messages=turns, extra_body=GREEDY)
    counted = client.messages.count_tokens(model=BYTES, messages=turns)
    assert counted.input_tokens == msg.usage.input_tokens
    body = {"model": BYTES, "messages": turns, "max_tokens": 1}
    with live.client(headers={"authorization": f"Bearer {KEY}"}) as c:
        chat = c.post("/v1/chat/completions", json={**body, "verbose": True}).json()
        closed = c.post("/v1/chat/completions",
                        json={**body, "continue_final_message": False}).json()
    assert chat["__verbose"]["prompt"].endswith("assistant:The answer is")
    assert msg.usage.input_tokens == chat["usage"]["prompt_tokens"]
    assert msg.usage.input_tokens < closed["usage"]["prompt_tokens"]


def test_count_tokens_renders_the_requests_thinking(live: LiveServer) -> None:
    """``thinking`` reaches the template on ``count_tokens`` as on ``messages``: each count
    equals the usage of the request it counts, and off differs from on by the template's
    ``</think>`` (one byte token each)."""
    counts: dict[str, int] = {}
    with live.client(headers={"authorization": f"Bearer {KEY}"}) as c:
        for name, thinking in (("unset", None), ("enabled", {"type": "enabled",
                                                             "budget_tokens": 1}),
                               ("adaptive", {"type": "adaptive"}),
                               ("disabled", {"type": "disabled"})):
            body: dict[str, Any] = {"model": THINKS, "messages": HELLO,
                                    **({"thinking": thinking} if thinking else {})}
            counted = c.post("/v1/messages/count_tokens", json=body)
            assert counted.status_code == 200, counted.text
            ran = c.post("/v1/messages", json={**body, "max_tokens": 2})
            assert ran.status_code == 200, ran.text
            counts[name] = counted.json()["input_tokens"]
            assert counts[name] == ran.json()["usage"]["input_tokens"], name
    assert counts["unset"] == counts["enabled"] == counts["adaptive"]  # the default: on
    assert counts["disabled"] == counts["enabled"] + len("</think>")


def test_stream_matches_create_and_follows_the_event_order(
    client: anthropic.Anthropic, live: LiveServer,
) -> None:
    args: dict[str, Any] = {"model": MODEL, "max_tokens": 12, "messages": HELLO,
                            "extra_body": GREEDY}
    whole = client.messages.create(**args)
    with client.messages.stream(**args) as stream:
        streamed = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert streamed == text_of(whole) == text_of(final)
    assert final.usage.input_tokens == whole.usage.input_tokens
    assert final.usage.output_tokens == whole.usage.output_tokens
    assert final.stop_reason == whole.stop_reason
    wire = {"model": MODEL, "max_tokens": 12, "messages": HELLO, "temperature": 0,
            "stream": True}
    with httpx.stream("POST", f"{live.url}/v1/messages", json=wire,
                      headers={"x-api-key": KEY, "anthropic-version": "2023-06-01"}) as r:
        assert r.status_code == 200
        names = [line.removeprefix("event: ") for line in r.iter_lines()
                 if line.startswith("event: ")]
    assert names[:3] == ["message_start", "content_block_start", "ping"]
    assert set(names[3:-3]) == {"content_block_delta"}
    assert names[-3:] == ["content_block_stop", "message_delta", "message_stop"]


def test_stop_sequence_is_reported(client: anthropic.Anthropic) -> None:
    whole = client.messages.create(model=MODEL, max_tokens=12, extra_body=GREEDY, messages=HELLO)
    words = text_of(whole).split()
    assert len(words) >= 3
    stop = words[2]
    msg = client.messages.create(model=MODEL, max_tokens=12, extra_body=GREEDY, messages=HELLO,
                                 stop_sequences=[stop])
    assert msg.stop_reason == "stop_sequence" and msg.stop_sequence == stop
    assert stop not in text_of(msg)


def test_forced_tool_use_then_tool_result_round_trip(client: anthropic.Anthropic) -> None:
    ask: Any = [{"role": "user", "content": "weather in Paris?"}]
    msg = client.messages.create(model=BYTES, max_tokens=120, extra_body=GREEDY, messages=ask,
                                 tools=[WEATHER], tool_choice={"type": "tool",
                                                               "name": "get_weather"})
    assert msg.stop_reason == "tool_use"
    [use] = [b for b in msg.content if b.type == "tool_use"]
    assert use.name == "get_weather" and use.id.startswith("toolu_")
    jsonschema.validate(use.input, WEATHER["input_schema"])
    with client.messages.stream(model=BYTES, max_tokens=120, extra_body=GREEDY, messages=ask,
                                tools=[WEATHER], tool_choice={"type": "any"}) as stream:
        final = stream.get_final_message()
    [streamed] = [b for b in final.content if b.type == "tool_use"]
    jsonschema.validate(streamed.input, WEATHER["input_schema"])
    assert final.stop_reason == "tool_use"
    history: Any = [*ask, {"role": "assistant", "content": [b.model_dump() for b in msg.content]},
                    {"role": "user", "content": [{"type": "tool_result",
                                                  "tool_use_id": use.id,
                                                  "content": "sunny, 21 C"}]}]
    answer = client.messages.create(model=BYTES, max_tokens=6, extra_body=GREEDY,
                                    messages=history, tools=[WEATHER])
    assert answer.role == "assistant" and answer.usage.input_tokens > msg.usage.input_tokens
    counted = client.messages.count_tokens(model=BYTES, messages=history, tools=[WEATHER])
    assert counted.input_tokens == answer.usage.input_tokens


def assert_anthropic_error(exc: anthropic.APIStatusError, status: int, etype: str) -> None:
    assert exc.status_code == status
    body = exc.response.json()
    assert set(body) == {"type", "error"} and body["type"] == "error"
    assert body["error"]["type"] == etype and body["error"]["message"]


def test_errors_are_the_sdk_exception_types(client: anthropic.Anthropic,
                                            live: LiveServer) -> None:
    with pytest.raises(anthropic.NotFoundError) as nf:
        client.messages.create(model="nope", max_tokens=4, messages=HELLO)
    assert_anthropic_error(nf.value, 404, "not_found_error")
    with pytest.raises(anthropic.BadRequestError) as image:
        client.messages.create(model=MODEL, max_tokens=4, messages=[{"role": "user", "content": [
            {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                         "data": "iVBORw0KGgo="}}]}])
    assert_anthropic_error(image.value, 400, "invalid_request_error")
    assert "text only" in image.value.response.json()["error"]["message"]
    r = httpx.post(f"{live.url}/v1/messages", headers={"x-api-key": KEY},
                   json={"model": MODEL, "messages": HELLO})  # no max_tokens
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
    assert "max_tokens" in r.json()["error"]["message"]
    r = httpx.post(f"{live.url}/v1/messages", headers={"x-api-key": KEY,
                                                       "content-type": "application/json"},
                   content=b"{not json")
    assert r.status_code == 400 and r.json()["type"] == "error"
    bad_tool = {**WEATHER, "input_schema": {"type": "string"}}
    with pytest.raises(anthropic.BadRequestError):
        client.messages.create(model=MODEL, max_tokens=4, messages=HELLO, tools=[bad_tool])
    with (anthropic.Anthropic(base_url=live.url, api_key="wrong", max_retries=0) as bad,
          pytest.raises(anthropic.AuthenticationError) as auth):
        bad.messages.create(model=MODEL, max_tokens=4, messages=HELLO)
    assert_anthropic_error(auth.value, 401, "authentication_error")
    with pytest.raises(anthropic.BadRequestError) as big:
        client.messages.create(model=MODEL, max_tokens=600, messages=HELLO)
    assert "context" in big.value.response.json()["error"]["message"]
    serves(client)


def test_quota_is_429_rate_limit_error_with_retry_after(live: LiveServer,
                                                        client: anthropic.Anthropic) -> None:
    with anthropic.Anthropic(base_url=live.url, api_key="key-slow", max_retries=0) as slow:
        slow.messages.create(model=MODEL, max_tokens=2, messages=HELLO)
        with pytest.raises(anthropic.RateLimitError) as limited:
            slow.messages.create(model=MODEL, max_tokens=2, messages=HELLO)
    assert_anthropic_error(limited.value, 429, "rate_limit_error")
    assert int(limited.value.response.headers["retry-after"]) >= 1
    serves(client)


def test_overload_is_529_overloaded_error_with_retry_after(
    serve: Callable[..., LiveServer],
) -> None:
    live = serve(config_with(models=[synth_chat(MODEL)]))
    with anthropic.Anthropic(base_url=live.url, api_key="unused", max_retries=0) as c:
        serves(c)
        live.runtime.begin_drain()
        with pytest.raises(anthropic.OverloadedError) as over:
            c.messages.create(model=MODEL, max_tokens=2, messages=HELLO)
        with (pytest.raises(anthropic.OverloadedError),
              c.messages.stream(model=MODEL, max_tokens=2, messages=HELLO) as s):
            s.get_final_message()
    assert_anthropic_error(over.value, 529, "overloaded_error")
    assert int(over.value.response.headers["retry-after"]) >= 1


def test_in_stream_error_is_an_anthropic_error_event() -> None:
    from sluice.server.anthropic.translate import MessageRenderer
    from sluice.server.core.output import Failed
    from sluice.server.errors import APIError

    renderer = MessageRenderer("msg_1", MODEL, 3)
    [chunk] = renderer.render([Failed(APIError(504, "deadline passed", code="deadline"))])
    name, data = chunk.decode().strip().split("\n")
    assert name == "event: error"
    assert json.loads(data.removeprefix("data: ")) == {
        "type": "error", "error": {"type": "timeout_error", "message": "deadline passed"}}


def test_structured_output_validates(client: anthropic.Anthropic) -> None:
    schema = {"type": "object", "properties": {"answer": {"type": "string", "maxLength": 8}},
              "required": ["answer"], "additionalProperties": False}
    msg = client.messages.create(
        model=BYTES, max_tokens=60, messages=HELLO, extra_body=GREEDY,
        output_config={"format": {"type": "json_schema", "schema": schema}})
    jsonschema.validate(json.loads(text_of(msg)), schema)
