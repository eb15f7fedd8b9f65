"""Assistant prefill on chat completions, over HTTP against a real uvicorn server on the
synthetic backend (whose template renders ``role: content`` turns, then ``assistant:``): a
last assistant turn is continued, not closed (llama-server's prefill, vLLM's
``continue_final_message``), ``add_generation_prompt`` false with no turn to continue
renders the conversation without the assistant turn's opening, the combinations
llama-server refuses are 400s, and
``__verbose`` shows the prompt as the model got it (per request, or for every answer with
``server.verbose_answers``, llama-server's ``--verbose``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from tests.server.live import LiveServer, assert_error, config_with, synth_chat

BYTES = "bytes"
USER = {"role": "user", "content": "What is the best book"}


@pytest.fixture(scope="module")
def live(serve_module: Callable[..., LiveServer]) -> LiveServer:
    return serve_module(config_with(
        models=[synth_chat(BYTES, byte_tokens=True, vocab_size=300)], workers={"count": 1}))


def _prompt(live: LiveServer, messages: list[dict[str, Any]], **fields: Any) -> str:
    with live.client() as c:
        r = c.post("/chat/completions", json={"messages": messages, "max_tokens": 2,
                                              "verbose": True, **fields})
    assert r.status_code == 200, r.text
    prompt: str = r.json()["__verbose"]["prompt"]
    return prompt


def test_a_last_assistant_turn_is_continued(live: LiveServer) -> None:
    prompt = _prompt(live, [USER, {"role": "assistant", "content": "Whill"}])
    assert prompt.endswith("user: What is the best book assistant:Whill")
    # text parts of the continued turn are joined by a blank line, as llama-server does
    parts = [{"type": "text", "text": "Wh"}, {"type": "text", "text": "ill"}]
    prompt = _prompt(live, [USER, {"role": "assistant", "content": parts}])
    assert prompt.endswith("assistant:Wh\n\nill")


def test_continue_final_message_and_add_generation_prompt(live: LiveServer) -> None:
    turn = [USER, {"role": "assistant", "content": "Whill"}]
    vllm = _prompt(live, turn, continue_final_message=True, add_generation_prompt=False)
    assert vllm == _prompt(live, turn)
    # llama-server's word for continuing the answer
    assert _prompt(live, turn, continue_final_message="content") == vllm
    closed = "user: What is the best book assistant: Whill assistant:"
    assert _prompt(live, turn, continue_final_message=False).endswith(closed)
    assert _prompt(live, turn, add_generation_prompt=True).endswith(closed)
    # a last user turn is closed as always
    assert _prompt(live, [USER]).endswith("user: What is the best book assistant:")


def test_add_generation_prompt_false_renders_the_conversation_as_it_stands(
        live: LiveServer) -> None:
    # llama-server and vLLM render the template without the assistant turn's opening
    assert _prompt(live, [USER], add_generation_prompt=False).endswith(
        "user: What is the best book")
    turn = [USER, {"role": "assistant", "content": "Hello"}]
    closed = _prompt(live, turn, continue_final_message=False, add_generation_prompt=False)
    assert closed.endswith("user: What is the best book assistant: Hello")
    # the same conversation with the generation prompt differs only by it
    opened = _prompt(live, turn, continue_final_message=False)
    assert opened == closed + " assistant:"


@pytest.mark.parametrize(("fields", "messages", "param"), [
    ({"continue_final_message": True, "add_generation_prompt": True},
     [USER, {"role": "assistant", "content": "Hello"}], "continue_final_message"),
    ({}, [USER, {"role": "assistant", "content": "a"}, {"role": "assistant", "content": "b"}],
     "messages"),
    ({"continue_final_message": True}, [USER], "continue_final_message"),
    ({"continue_final_message": "content"}, [USER], "continue_final_message"),
    ({"continue_final_message": "reasoning_content"},
     [USER, {"role": "assistant", "content": "Hello"}], "continue_final_message"),
    ({"continue_final_message": "yes"},
     [USER, {"role": "assistant", "content": "Hello"}], "continue_final_message"),
    ({}, [USER, {"role": "assistant", "content": "", "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}],
     "messages"),
])
def test_what_llama_server_refuses_is_a_400(live: LiveServer, fields: dict[str, Any],
                                            messages: list[dict[str, Any]], param: str) -> None:
    with live.client() as c:
        r = c.post("/v1/chat/completions", json={"messages": messages, **fields})
        assert_error(r, 400, param=param)
        assert c.post("/v1/chat/completions",
                      json={"messages": [USER], "max_tokens": 1}).status_code == 200


def test_verbose_answers_by_default_with_the_servers_setting(
        serve: Callable[..., LiveServer], live: LiveServer) -> None:
    body = {"messages": [USER], "max_tokens": 1}
    with live.client() as c:
        assert "__verbose" not in c.post("/v1/chat/completions", json=body).json()
    on = serve(config_with(models=[synth_chat(BYTES, byte_tokens=True, vocab_size=300)],
                           workers={"count": 1}, server={"verbose_answers": True}))
    with on.client() as c:
        answer = c.post("/v1/chat/completions", json=body).json()
        assert answer["__verbose"]["prompt"].endswith("assistant:")
        off = c.post("/v1/chat/completions", json={**body, "verbose": False}).json()
        assert "__verbose" not in off
