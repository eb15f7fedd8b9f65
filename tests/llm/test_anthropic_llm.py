"""Anthropic Messages on the real packaged chat model (SmolLM2-135M-Instruct with its ChatML
template, llama.cpp) through the ``anthropic`` SDK: create and stream give the same greedy
text, ``count_tokens`` equals the usage, and a forced ``tool_use`` validates against its
``input_schema`` and goes round a ``tool_result``."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import anthropic
import jsonschema
import pytest

from sluice.config import Config
from tests.server.live import LiveServer, start_server

pytestmark = pytest.mark.llm
pytest.importorskip("llama_cpp", reason="the llm extra is not installed")

MODEL = "smollm2"
GREEDY = {"temperature": 0}
WEATHER = {"name": "get_weather", "description": "Get the weather in a city",
           "input_schema": {"type": "object", "properties": {
               "city": {"type": "string", "maxLength": 20}},
               "required": ["city"], "additionalProperties": False}}


def chat_config() -> Config:
    return Config.model_validate({
        "models": [{"id": MODEL, "kind": "generative", "backend": "llamacpp",
                    "task": "generation", "memory_bytes": 400_000_000,
                    "options": {"path": "packaged:smollm2-135m-instruct", "n_ctx": 4096,
                                "n_seq_max": 2, "n_threads": 2}}],
        "workers": {"count": 1, "inbox_capacity": 8},
        "scheduling": {"queue_capacity": 16},
    })


@pytest.fixture(scope="module")
def client() -> Iterator[anthropic.Anthropic]:
    live: LiveServer = start_server(chat_config())
    with anthropic.Anthropic(base_url=live.url, api_key="unused", max_retries=0,
                             timeout=120) as c:
        yield c
    live.stop()


def test_create_stream_and_count_tokens(client: anthropic.Anthropic) -> None:
    args: dict[str, Any] = {"model": MODEL, "max_tokens": 24, "extra_body": GREEDY,
                            "system": "You answer in one short sentence.",
                            "messages": [{"role": "user", "content": "What is the sky's colour?"}]}
    msg = client.messages.create(**args)
    text = "".join(b.text for b in msg.content if b.type == "text")
    assert text.strip() and msg.stop_reason in ("end_turn", "max_tokens")
    with client.messages.stream(**args) as stream:
        streamed = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert streamed == text
    assert final.usage.output_tokens == msg.usage.output_tokens
    counted = client.messages.count_tokens(model=MODEL, system=args["system"],
                                           messages=args["messages"])
    assert counted.input_tokens == msg.usage.input_tokens


def test_tool_use_round_trip(client: anthropic.Anthropic) -> None:
    ask: Any = [{"role": "user", "content": "What is the weather in Paris?"}]
    msg = client.messages.create(model=MODEL, max_tokens=60, extra_body=GREEDY, messages=ask,
                                 tools=[WEATHER], tool_choice={"type": "any"})
    assert msg.stop_reason == "tool_use"
    [use] = [b for b in msg.content if b.type == "tool_use"]
    assert use.name == "get_weather"
    jsonschema.validate(use.input, WEATHER["input_schema"])
    history: Any = [*ask, {"role": "assistant", "content": [b.model_dump() for b in msg.content]},
                    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id,
                                                  "content": "Sunny, 21 degrees."}]}]
    answer = client.messages.create(model=MODEL, max_tokens=30, extra_body=GREEDY,
                                    messages=history, tools=[WEATHER])
    assert answer.stop_reason in ("end_turn", "max_tokens", "tool_use")
    assert answer.content
