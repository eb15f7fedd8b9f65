"""One request, every API, the same answer: on the packaged chat model (SmolLM2-135M-Instruct,
llama.cpp) with greedy decoding and the same token limit, the same conversation through Chat
Completions and Responses (``openai`` SDK), Anthropic Messages (``anthropic`` SDK), Ollama's
``/api/chat`` (``ollama`` client), the native ``/v1/infer`` and gRPC ``Generate`` gives the
same text and the same prompt and completion token counts, against one real server; so does
a conversation with a system prompt, and a tool call forced to one tool (Chat, Responses,
Anthropic) gives the same call."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import anthropic
import grpc
import httpx
import ollama
import openai
import pytest

from sluice.config import Config
from sluice.v1 import inference_pb2 as pb
from tests.server.grpcclient import grpc_target, stub
from tests.server.live import LiveServer, start_server

pytestmark = pytest.mark.llm
pytest.importorskip("llama_cpp", reason="the llm extra is not installed")

MODEL = "smollm2"
MAX_TOKENS = 24
RAINBOW = "Name three colours of the rainbow."
SUM = "What is 2+2? Reply with the number only."
"""Answered in fewer tokens than the limit: it ends at the end-of-turn token."""
SYSTEM = "You are a pirate. Answer in one short sentence."
WEATHER = {"name": "get_weather", "description": "Get the weather in a city",
           "schema": {"type": "object", "properties": {"city": {"type": "string",
                                                                "maxLength": 20}},
                      "required": ["city"], "additionalProperties": False}}


@dataclass(frozen=True)
class Answer:
    """What one API gave back: the text (or a call's name and arguments), the usage, and
    why it ended in the core's terms (``stop``, ``length``; ``None`` for a tool call)."""

    text: str
    prompt_tokens: int
    completion_tokens: int
    finished: str | None = None


@pytest.fixture(scope="module")
def live() -> Iterator[LiveServer]:
    server = start_server(Config.model_validate({
        "server": {"grpc_port": 0},
        "models": [{"id": MODEL, "kind": "generative", "backend": "llamacpp",
                    "task": "generation", "memory_bytes": 400_000_000,
                    "options": {"path": "packaged:smollm2-135m-instruct", "n_ctx": 4096,
                                "n_seq_max": 2, "n_threads": 2}}],
        "workers": {"count": 1, "inbox_capacity": 8},
    }))
    yield server
    server.stop()


def _turns(system: str | None, user: str) -> list[dict[str, str]]:
    return ([{"role": "system", "content": system}] if system else []) + [
        {"role": "user", "content": user}]


def via_chat(live: LiveServer, system: str | None, user: str) -> Answer:
    with openai.OpenAI(base_url=f"{live.url}/v1", api_key="unused", max_retries=0) as c:
        r = c.chat.completions.create(model=MODEL, messages=_turns(system, user),  # type: ignore[arg-type]
                                      max_tokens=MAX_TOKENS, temperature=0)
    assert r.usage is not None
    return Answer(r.choices[0].message.content or "", r.usage.prompt_tokens,
                  r.usage.completion_tokens, r.choices[0].finish_reason)


def via_responses(live: LiveServer, system: str | None, user: str) -> Answer:
    with openai.OpenAI(base_url=f"{live.url}/v1", api_key="unused", max_retries=0) as c:
        r = c.responses.create(model=MODEL, input=user, instructions=system,
                               max_output_tokens=MAX_TOKENS, temperature=0)
    assert r.usage is not None
    cut = r.status == "incomplete" and r.incomplete_details is not None \
        and r.incomplete_details.reason == "max_output_tokens"
    assert cut or r.status == "completed", r.status
    return Answer(r.output_text, r.usage.input_tokens, r.usage.output_tokens,
                  "length" if cut else "stop")


def via_anthropic(live: LiveServer, system: str | None, user: str) -> Answer:
    with anthropic.Anthropic(base_url=live.url, api_key="unused", max_retries=0) as c:
        extra: dict[str, Any] = {"system": system} if system else {}
        r = c.messages.create(model=MODEL, max_tokens=MAX_TOKENS, extra_body={"temperature": 0},
                              messages=[{"role": "user", "content": user}], **extra)
    text = "".join(b.text for b in r.content if b.type == "text")
    finished = {"end_turn": "stop", "max_tokens": "length"}[r.stop_reason or ""]
    return Answer(text, r.usage.input_tokens, r.usage.output_tokens, finished)


def via_ollama(live: LiveServer, system: str | None, user: str) -> Answer:
    with ollama.Client(host=live.url, timeout=120) as c:
        r = c.chat(model=MODEL, messages=_turns(system, user),
                   options={"temperature": 0, "num_predict": MAX_TOKENS})
    return Answer(r.message.content or "", r.prompt_eval_count or 0, r.eval_count or 0,
                  r.done_reason)


def via_native(live: LiveServer, system: str | None, user: str) -> Answer:
    r = httpx.post(f"{live.url}/v1/infer", timeout=120, json={
        "model": MODEL, "input": _turns(system, user), "max_new_tokens": MAX_TOKENS,
        "temperature": 0})
    assert r.status_code == 200, r.text
    body = r.json()
    return Answer(body["output"], body["usage"]["prompt_tokens"],
                  body["usage"]["completion_tokens"], body["finish_reason"])


def via_grpc(live: LiveServer, system: str | None, user: str) -> Answer:
    messages = [pb.ChatMessage(role=m["role"], content=m["content"])
                for m in _turns(system, user)]
    with grpc.insecure_channel(grpc_target(live)) as ch:
        *tokens, last = stub(ch).Generate(pb.GenerateRequest(
            model=MODEL, messages=pb.ChatMessages(messages=messages), max_tokens=MAX_TOKENS,
            temperature=0), timeout=120)
    usage = last.done.usage
    return Answer("".join(t.token.text for t in tokens), usage.prompt_tokens,
                  usage.completion_tokens, last.done.finish_reason)


SURFACES = {"chat": via_chat, "responses": via_responses, "anthropic": via_anthropic,
            "ollama": via_ollama, "native": via_native, "grpc": via_grpc}


@pytest.mark.parametrize(("system", "user", "finished"), [
    (None, RAINBOW, "length"), (SYSTEM, RAINBOW, "length"), (None, SUM, "stop")],
    ids=["user", "system", "ends-early"])
def test_every_api_gives_the_same_greedy_answer(live: LiveServer, system: str | None,
                                                user: str, finished: str) -> None:
    answers = {name: via(live, system, user) for name, via in SURFACES.items()}
    chat = answers["chat"]
    assert chat.text.strip() and chat.finished == finished
    assert (chat.completion_tokens == MAX_TOKENS) == (finished == "length")
    for name, answer in answers.items():
        assert answer == chat, (name, answer, chat)
    # the prompt is the conversation as the template renders it, system prompt included
    r = httpx.post(f"{live.url}/tokenize", json={
        "model": MODEL, "messages": _turns(system, user), "add_special_tokens": True})
    assert len(r.json()["tokens"]) == chat.prompt_tokens


def call_via_chat(live: LiveServer) -> Answer:
    tool = {"type": "function", "function": {"name": WEATHER["name"],
                                             "description": WEATHER["description"],
                                             "parameters": WEATHER["schema"]}}
    with openai.OpenAI(base_url=f"{live.url}/v1", api_key="unused", max_retries=0) as c:
        r = c.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "Weather in Paris?"}],
            tools=[tool],  # type: ignore[list-item]
            tool_choice={"type": "function", "function": {"name": WEATHER["name"]}},
            max_tokens=40, temperature=0)
    assert r.usage is not None
    [call] = r.choices[0].message.tool_calls or []
    assert r.choices[0].finish_reason == "tool_calls"
    return Answer(_call(call.function.name, json.loads(call.function.arguments)),  # type: ignore[union-attr]
                  r.usage.prompt_tokens, r.usage.completion_tokens)


def call_via_responses(live: LiveServer) -> Answer:
    tool = {"type": "function", "name": WEATHER["name"], "description": WEATHER["description"],
            "parameters": WEATHER["schema"], "strict": False}
    with openai.OpenAI(base_url=f"{live.url}/v1", api_key="unused", max_retries=0) as c:
        r = c.responses.create(model=MODEL, input="Weather in Paris?",
                               tools=[tool],  # type: ignore[list-item]
                               tool_choice={"type": "function", "name": WEATHER["name"]},
                               max_output_tokens=40, temperature=0)
    assert r.usage is not None
    [call] = [item for item in r.output if item.type == "function_call"]
    return Answer(_call(call.name, json.loads(call.arguments)), r.usage.input_tokens,
                  r.usage.output_tokens)


def call_via_anthropic(live: LiveServer) -> Answer:
    tool = {"name": WEATHER["name"], "description": WEATHER["description"],
            "input_schema": WEATHER["schema"]}
    with anthropic.Anthropic(base_url=live.url, api_key="unused", max_retries=0) as c:
        r = c.messages.create(model=MODEL, max_tokens=40, extra_body={"temperature": 0},
                              messages=[{"role": "user", "content": "Weather in Paris?"}],
                              tools=[tool],  # type: ignore[list-item]
                              tool_choice={"type": "tool", "name": WEATHER["name"]})
    assert r.stop_reason == "tool_use"
    [use] = [b for b in r.content if b.type == "tool_use"]
    return Answer(_call(use.name, use.input), r.usage.input_tokens, r.usage.output_tokens)


def _call(name: str, arguments: Any) -> str:
    return json.dumps({"name": name, "arguments": arguments}, sort_keys=True)


def test_a_forced_tool_call_is_the_same_call_on_every_api(live: LiveServer) -> None:
    answers = {"chat": call_via_chat(live), "responses": call_via_responses(live),
               "anthropic": call_via_anthropic(live)}
    chat = answers["chat"]
    assert json.loads(chat.text)["name"] == "get_weather"
    assert json.loads(chat.text)["arguments"]["city"]
    for name, answer in answers.items():
        assert answer == chat, (name, answer, chat)
