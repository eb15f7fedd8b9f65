"""Past thinking reaches the chat template from every API, as ``reasoning_content`` on its
turn (as llama-server passes it): Anthropic ``thinking`` blocks, a chat message's
``reasoning_content`` or vLLM's ``reasoning``, Responses reasoning items and Ollama's
``thinking``, on a real uvicorn server whose synthetic model's vocabulary is the bytes and
whose Jinja template writes ``<think>…</think>`` before an assistant turn's content. A
thinking of N bytes therefore adds exactly N + len("<think></think>") prompt tokens, and
``count_tokens`` counts what ``messages`` runs."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from tests.server.live import LiveServer, config_with, synth_chat

MODEL = "synth-history"
THOUGHT = "I should list the files first."
MARKUP = len("<think></think>")
HISTORY_TEMPLATE = (
    "{% for m in messages %}{{ m.role }}:"
    "{% if m.reasoning_content %}<think>{{ m.reasoning_content }}</think>{% endif %}"
    "{{ m.content }}\n{% endfor %}{% if add_generation_prompt %}assistant:{% endif %}")
"""Qwen3's way with past thinking, abridged: a turn's ``reasoning_content`` in think tags."""
LIST_FILES = {"name": "list_files", "description": "List files",
              "input_schema": {"type": "object", "properties": {"path": {"type": "string"}},
                               "required": ["path"]}}


@pytest.fixture(scope="module")
def live(serve_module: Callable[..., LiveServer]) -> LiveServer:
    return serve_module(config_with(models=[synth_chat(
        MODEL, byte_tokens=True, vocab_size=300, n_ctx_per_seq=2048,
        chat_template=HISTORY_TEMPLATE)]))


@pytest.fixture
def client(live: LiveServer) -> Iterator[httpx.Client]:
    with live.client() as c:
        yield c


def post_ok(client: httpx.Client, path: str, body: dict[str, Any]) -> Any:
    r = client.post(path, json=body)
    assert r.status_code == 200, r.text
    return r.json()


def anthropic_turns(thinking: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{"role": "user", "content": "Fix the bug"},
            {"role": "assistant", "content": [
                *thinking,
                {"type": "tool_use", "id": "call_1", "name": "list_files",
                 "input": {"path": "."}}]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "call_1", "content": "main.py"}]}]


def test_anthropic_thinking_blocks_are_counted_as_they_run(client: httpx.Client) -> None:
    """llama.cpp's test_anthropic_thinking_history_in_count_tokens, exactly: two thinking
    blocks join into one ``reasoning_content``; ``redacted_thinking`` adds nothing."""
    counts = {}
    for name, blocks in (
            ("none", []),
            ("redacted", [{"type": "redacted_thinking", "data": "opaque"}]),
            ("two", [{"type": "thinking", "thinking": THOUGHT[:10], "signature": "s"},
                     {"type": "thinking", "thinking": THOUGHT[10:], "signature": "s"}])):
        body = {"model": MODEL, "messages": anthropic_turns(blocks), "tools": [LIST_FILES]}
        counts[name] = post_ok(client, "/v1/messages/count_tokens", body)["input_tokens"]
        ran = post_ok(client, "/v1/messages", {**body, "max_tokens": 1})
        assert ran["usage"]["input_tokens"] == counts[name], name
    assert counts["redacted"] == counts["none"]
    assert counts["two"] == counts["none"] + MARKUP + len(THOUGHT)


def chat_turns(**thinking: str) -> list[dict[str, Any]]:
    return [{"role": "user", "content": "Fix the bug in main.py"},
            {"role": "assistant", "content": "", **thinking, "tool_calls": [{
                "id": "call_1", "type": "function",
                "function": {"name": "list_files", "arguments": '{"path": "."}'}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "main.py"}]


def test_chat_reasoning_content_and_reasoning_reach_the_template(client: httpx.Client) -> None:
    """llama.cpp's test_anthropic_thinking_history_in_template on ``/apply-template``, and
    chat completions' prompt with either field (``reasoning_content`` wins over
    ``reasoning``)."""
    prompt = post_ok(client, "/apply-template",
                     {"messages": chat_turns(reasoning_content=THOUGHT)})["prompt"]
    assert f"assistant:<think>{THOUGHT}</think>" in prompt
    assert prompt.count("<think>") == 1  # the turns without thinking have none
    tokens = {}
    for name, fields in (("none", {}), ("reasoning_content", {"reasoning_content": THOUGHT}),
                         ("reasoning", {"reasoning": THOUGHT}),
                         ("both", {"reasoning_content": THOUGHT, "reasoning": "other"}),
                         ("empty", {"reasoning_content": ""})):
        out = post_ok(client, "/v1/chat/completions",
                      {"model": MODEL, "messages": chat_turns(**fields), "max_tokens": 1,
                       "verbose": True})
        tokens[name] = out["usage"]["prompt_tokens"]
        if name == "both":
            assert f"<think>{THOUGHT}</think>" in out["__verbose"]["prompt"]
    assert tokens["empty"] == tokens["none"]
    assert tokens["reasoning_content"] == tokens["reasoning"] == tokens["both"] \
        == tokens["none"] + MARKUP + len(THOUGHT)


def test_responses_reasoning_items_are_their_turns_thinking(client: httpx.Client) -> None:
    """A reasoning item opens the assistant turn that its function call (or message)
    completes, as Responses orders them; an item with only a summary adds nothing."""
    call = {"type": "function_call", "call_id": "call_1", "name": "list_files",
            "arguments": '{"path": "."}'}
    output = {"type": "function_call_output", "call_id": "call_1", "output": "main.py"}
    reasoning = {"type": "reasoning", "id": "rs_1", "summary": [],
                 "content": [{"type": "reasoning_text", "text": THOUGHT}]}
    summary_only = {"type": "reasoning", "id": "rs_1",
                    "summary": [{"type": "summary_text", "text": THOUGHT}]}
    user = {"role": "user", "content": "Fix the bug"}
    used = {}
    for name, items in (("none", [user, call, output]),
                        ("reasoning", [user, reasoning, call, output]),
                        ("summary", [user, summary_only, call, output])):
        used[name] = post_ok(client, "/v1/responses", {
            "model": MODEL, "input": items, "max_output_tokens": 1})["usage"]["input_tokens"]
    assert used["summary"] == used["none"]
    assert used["reasoning"] == used["none"] + MARKUP + len(THOUGHT)
    message = {"type": "message", "role": "assistant",
               "content": [{"type": "output_text", "text": "Done."}]}
    one_turn = post_ok(client, "/v1/responses", {
        "model": MODEL, "input": [user, reasoning, message, {"role": "user", "content": "ok"}],
        "max_output_tokens": 1})["usage"]["input_tokens"]
    no_thinking = post_ok(client, "/v1/responses", {
        "model": MODEL, "input": [user, message, {"role": "user", "content": "ok"}],
        "max_output_tokens": 1})["usage"]["input_tokens"]
    assert one_turn == no_thinking + MARKUP + len(THOUGHT)  # one assistant turn, not two


def test_ollama_thinking_on_a_message_reaches_the_template(client: httpx.Client) -> None:
    counts = {}
    for name, extra in (("none", {}), ("thinking", {"thinking": THOUGHT})):
        out = post_ok(client, "/api/chat", {
            "model": MODEL, "stream": False, "options": {"num_predict": 1},
            "messages": [{"role": "user", "content": "hi"},
                         {"role": "assistant", "content": "hello", **extra},
                         {"role": "user", "content": "bye"}]})
        counts[name] = out["prompt_eval_count"]
    assert counts["thinking"] == counts["none"] + MARKUP + len(THOUGHT)

