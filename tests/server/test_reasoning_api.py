"""Reasoning output on every API, against a real server with a synthetic model that thinks in
``<think>`` tags (a scripted reply): Chat Completions gives ``reasoning_content`` and
``reasoning`` in the message and the stream's deltas, Responses a ``reasoning`` item,
Anthropic a ``thinking`` block; the answer is the same text everywhere. A thinking budget
ends the thinking (the end tag written for the model), and ``reasoning_effort: none``
or ``enable_thinking: false`` turns it off."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import anthropic
import openai
import pytest

from tests.server.live import LiveServer, config_with, synth_chat

MODEL = "thinker"
PLAIN = "plain"
THOUGHT = "The user greets me. I greet back."
ANSWER = "Hello to you too."
REPLY = f"<think>{THOUGHT}</think>\n\n{ANSWER}"
HELLO: Any = [{"role": "user", "content": "hello"}]


@pytest.fixture(scope="module")
def live(serve_module: Callable[..., LiveServer]) -> LiveServer:
    scripted = {"byte_tokens": True, "vocab_size": 300, "reply": REPLY}
    return serve_module(config_with(
        models=[{**synth_chat(MODEL, **scripted), "reasoning": {}},
                synth_chat(PLAIN, **scripted)],
        engine={"max_retained_slots": 0}))


@pytest.fixture(scope="module")
def oai(live: LiveServer) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=f"{live.url}/v1", api_key="unused", max_retries=0) as c:
        yield c


def test_chat_message_and_stream_carry_both_reasoning_names(oai: openai.OpenAI) -> None:
    r = oai.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=100)
    message: Any = r.choices[0].message
    assert message.content == ANSWER
    assert message.reasoning_content == THOUGHT and message.reasoning == THOUGHT
    reasoning, reasoning_alias, content = [], [], []
    for chunk in oai.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=100,
                                             stream=True):
        if not chunk.choices:
            continue
        delta: Any = chunk.choices[0].delta
        reasoning.append(getattr(delta, "reasoning_content", None) or "")
        reasoning_alias.append(getattr(delta, "reasoning", None) or "")
        content.append(delta.content or "")
    assert "".join(reasoning) == "".join(reasoning_alias) == THOUGHT
    assert "".join(content) == ANSWER
    plain = oai.chat.completions.create(model=PLAIN, messages=HELLO, max_tokens=100)
    assert plain.choices[0].message.content == REPLY  # a model without tags: all answer


def test_responses_reasoning_item_and_anthropic_thinking_block(
    oai: openai.OpenAI, live: LiveServer,
) -> None:
    r = oai.responses.create(model=MODEL, input="hello", max_output_tokens=100)
    assert [o.type for o in r.output] == ["reasoning", "message"]
    reasoning: Any = r.output[0]
    assert reasoning.content[0].text == THOUGHT and r.output_text == ANSWER
    events = list(oai.responses.create(model=MODEL, input="hello", max_output_tokens=100,
                                       stream=True))
    assert "".join(e.delta for e in events
                   if e.type == "response.reasoning_text.delta") == THOUGHT
    assert events[-1].type == "response.completed"
    with anthropic.Anthropic(base_url=live.url, api_key="unused", max_retries=0) as c:
        msg = c.messages.create(model=MODEL, max_tokens=100, messages=HELLO)
        assert [b.type for b in msg.content] == ["thinking", "text"]
        block: Any = msg.content[0]
        assert block.thinking == THOUGHT and msg.content[1].text == ANSWER  # type: ignore[union-attr]
        with c.messages.stream(model=MODEL, max_tokens=100, messages=HELLO) as stream:
            final = stream.get_final_message()
        assert [b.type for b in final.content] == ["thinking", "text"]
        assert final.usage.output_tokens == msg.usage.output_tokens == len(REPLY.encode())


def test_budget_ends_the_thinking_and_off_turns_it_off(oai: openai.OpenAI,
                                                        live: LiveServer) -> None:
    budget = oai.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=100,
                                         extra_body={"thinking_budget_tokens": 5})
    message: Any = budget.choices[0].message
    assert message.reasoning_content == THOUGHT[:5]  # one byte a token
    assert message.content  # the answer goes on after the written end tag
    for extra in ({"reasoning_effort": "none"},
                  {"chat_template_kwargs": {"enable_thinking": False}}):
        off = oai.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=100,
                                          extra_body=extra)
        message = off.choices[0].message
        assert message.reasoning_content is None and message.content
    with anthropic.Anthropic(base_url=live.url, api_key="unused", max_retries=0) as c:
        msg = c.messages.create(model=MODEL, max_tokens=100, messages=HELLO,
                                thinking={"type": "enabled", "budget_tokens": 3})
        block: Any = msg.content[0]
        assert block.type == "thinking" and block.thinking == THOUGHT[:3]
