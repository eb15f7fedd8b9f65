"""OpenAI Responses through the real ``openai`` SDK's ``client.responses`` against a real
uvicorn server on the synthetic backend: create and stream (the same greedy text, the typed
events in order, usage), a function call round trip (``function_call`` then
``function_call_output`` items), ``text.format`` json_schema output that validates, the
stateless refusals, and errors in OpenAI's shape with the server serving after."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import jsonschema
import openai
import pytest

from tests.server.live import LiveServer, assert_error, config_with, synth_chat

MODEL = "synth-chat"
BYTES = "synth-bytes"
WEATHER: Any = {"type": "function", "name": "get_weather",
                "description": "Get the weather in a city",
                "parameters": {"type": "object", "properties": {
                    "city": {"type": "string", "maxLength": 12}},
                    "required": ["city"], "additionalProperties": False}}


@pytest.fixture(scope="module")
def live(serve_module: Callable[..., LiveServer]) -> LiveServer:
    return serve_module(config_with(models=[
        synth_chat(MODEL),
        synth_chat(BYTES, byte_tokens=True, vocab_size=300, n_ctx_per_seq=2048)]))


@pytest.fixture(scope="module")
def client(live: LiveServer) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=f"{live.url}/v1", api_key="unused", max_retries=0) as c:
        yield c


def test_create_and_stream_agree(client: openai.OpenAI) -> None:
    args: dict[str, Any] = {"model": MODEL, "input": "hello there", "instructions": "be brief",
                            "max_output_tokens": 10, "temperature": 0}
    whole = client.responses.create(**args)
    assert whole.object == "response" and whole.id.startswith("resp_")
    assert whole.status == "incomplete" and whole.incomplete_details is not None
    assert whole.incomplete_details.reason == "max_output_tokens"
    assert whole.store is False and whole.output_text.strip()
    assert whole.usage is not None and whole.usage.output_tokens == 10
    events = list(client.responses.create(**args, stream=True))
    kinds = [e.type for e in events]
    assert kinds[:4] == ["response.created", "response.in_progress",
                         "response.output_item.added", "response.content_part.added"]
    assert kinds[-4:] == ["response.output_text.done", "response.content_part.done",
                          "response.output_item.done", "response.incomplete"]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == whole.output_text
    last = events[-1]
    assert last.type == "response.incomplete" and last.response.usage is not None
    assert last.response.usage.input_tokens == whole.usage.input_tokens
    assert last.response.output_text == whole.output_text


def test_function_call_round_trip(client: openai.OpenAI) -> None:
    first = client.responses.create(model=BYTES, input="weather in Paris?", tools=[WEATHER],
                                    tool_choice="required", temperature=0,
                                    max_output_tokens=120)
    [call] = [o for o in first.output if o.type == "function_call"]
    assert call.name == "get_weather" and call.call_id.startswith("call_")
    jsonschema.validate(json.loads(call.arguments), WEATHER["parameters"])
    assert first.status == "completed"
    with client.responses.stream(model=BYTES, input="weather in Paris?", tools=[WEATHER],
                                 tool_choice={"type": "function", "name": "get_weather"},
                                 temperature=0, max_output_tokens=120) as stream:
        final = stream.get_final_response()
    [streamed] = [o for o in final.output if o.type == "function_call"]
    assert streamed.arguments == call.arguments
    follow = client.responses.create(
        model=BYTES, tools=[WEATHER], temperature=0, max_output_tokens=4,
        input=[{"role": "user", "content": "weather in Paris?"},
               {"type": "function_call", "call_id": call.call_id, "name": call.name,
                "arguments": call.arguments},
               {"type": "function_call_output", "call_id": call.call_id,
                "output": "sunny, 21 C"}])
    assert follow.usage is not None and first.usage is not None
    assert follow.usage.input_tokens > first.usage.input_tokens
    assert [o.type for o in follow.output] == ["message"]


def test_text_format_json_schema_validates(client: openai.OpenAI) -> None:
    schema = {"type": "object", "properties": {"answer": {"type": "string", "maxLength": 8}},
              "required": ["answer"], "additionalProperties": False}
    r = client.responses.create(model=BYTES, input="hello", temperature=0,
                                max_output_tokens=60,
                                text={"format": {"type": "json_schema", "name": "answer",
                                                 "schema": schema, "strict": True}})
    jsonschema.validate(json.loads(r.output_text), schema)
    assert r.text.format is not None and r.text.format.type == "json_schema"


def test_stateless_refusals_and_errors(client: openai.OpenAI, live: LiveServer) -> None:
    for field, value in (("previous_response_id", "resp_1"), ("background", True)):
        with pytest.raises(openai.BadRequestError) as refused:
            client.responses.create(model=MODEL, input="hi", **{field: value})
        assert refused.value.status_code == 400
        assert refused.value.body["param"] == field  # type: ignore[index]
    with pytest.raises(openai.NotFoundError):
        client.responses.create(model="nope", input="hi")
    with pytest.raises(openai.BadRequestError) as image:
        client.responses.create(model=MODEL, input=[{"role": "user", "content": [
            {"type": "input_image", "image_url": "data:image/png;base64,AAAA"}]}])
    assert "text only" in str(image.value)
    with live.client() as c:
        assert_error(c.post("/v1/responses", content=b"{nope",
                            headers={"content-type": "application/json"}), 400,
                     code="invalid_json")
        assert_error(c.post("/v1/responses", json={"model": MODEL, "input": "hi",
                                                   "tools": [{**WEATHER, "parameters": {
                                                       "type": "string"}}]}), 400)
        assert_error(c.post("/v1/responses", json={"model": MODEL, "input": "hi",
                                                   "max_output_tokens": 600}), 400,
                     code="context_length_exceeded", param="max_output_tokens")
    r = client.responses.create(model=MODEL, input="still serving", max_output_tokens=3)
    assert r.usage is not None and r.usage.output_tokens == 3


def test_a_long_text_input_is_served(client: openai.OpenAI) -> None:
    """A string ``input`` is bounded by its characters, not by the 1,024 items a list may
    hold (a 1,500-character prompt was refused as "at most 1024 items")."""
    words = "word " * 300
    r = client.responses.create(model=MODEL, input=words, max_output_tokens=2)
    assert r.usage is not None and r.usage.input_tokens > 300
    with pytest.raises(openai.BadRequestError) as info:
        client.responses.create(model=MODEL, input=[{"role": "user", "content": "x"}] * 1025,
                                max_output_tokens=2)
    assert "at most 1024 items" in str(info.value)


def test_input_tokens_and_llama_servers_path_and_default_model(
        client: openai.OpenAI, live: LiveServer) -> None:
    """``/v1/responses/input_tokens`` counts what the request runs (its usage's
    ``input_tokens``); ``/responses`` (llama-server's path) with no ``model`` serves the
    default model."""
    body = {"model": MODEL, "input": "hello there", "instructions": "be brief",
            "max_output_tokens": 2}
    whole = client.responses.create(**body)
    assert whole.usage is not None
    with live.client() as c:
        for path in ("/v1/responses/input_tokens", "/responses/input_tokens"):
            r = c.post(path, json=body)
            assert r.status_code == 200, r.text
            assert r.json() == {"object": "response.input_tokens",
                                "input_tokens": whole.usage.input_tokens}
        r = c.post("/responses", json={"input": "hello there", "max_output_tokens": 2})
        assert r.status_code == 200, r.text
        assert r.json()["model"] == MODEL and r.json()["object"] == "response"
        assert_error(c.post("/v1/responses/input_tokens", json={"model": "nope",
                                                                "input": "x"}), 404)
