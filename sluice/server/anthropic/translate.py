"""Anthropic Messages to the core and back: a body becomes the conversation in OpenAI
message shapes (what chat templates take) and a tool plan; the core's output events become
a ``message`` object, or the stream of Anthropic's events (``message_start``,
``content_block_start``, ``ping``, ``content_block_delta``, ``content_block_stop``,
``message_delta``, ``message_stop``; ``error`` for a failure after the stream began)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from sluice.engine.request import PromptProgress
from sluice.server.anthropic.schemas import (
    CountTokensRequest,
    MediaBlock,
    MessagesRequest,
    TextBlock,
    ThinkingBlock,
    ToolResultBlock,
    ToolUseBlock,
)
from sluice.server.core.generate import ChatPrompt
from sluice.server.core.output import (
    Done,
    Failed,
    OutputEvent,
    ReasoningDelta,
    TextDelta,
    ToolCallDelta,
)
from sluice.server.core.reasoning import ThinkingAsk
from sluice.server.errors import APIError, anthropic_error, bad_param
from sluice.server.params import ToolPlan, plan_tools

STOP_REASONS = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}
"""The core's finish reasons → Anthropic's ``stop_reason`` (a stop string:
``stop_sequence``)."""


def _refuse_media(where: str, block: MediaBlock) -> APIError:
    return bad_param(where, f"This model takes text only: {block.type} content blocks are "
                            f"not supported", code="unsupported_content")


def chat_messages(body: CountTokensRequest) -> list[dict[str, Any]]:
    """The conversation in OpenAI message shapes: ``system`` first; a user turn's
    ``tool_result`` blocks become ``tool`` messages (in order), its text a user message; an
    assistant turn's ``tool_use`` blocks become its ``tool_calls`` and its ``thinking``
    blocks its ``reasoning_content`` (their texts joined, as llama-server joins them;
    ``redacted_thinking`` dropped). Images and documents: 400 (the served models read text
    only)."""
    out: list[dict[str, Any]] = []
    system = body.system_text()
    if system:
        out.append({"role": "system", "content": system})
    for i, message in enumerate(body.messages):
        if isinstance(message.content, str):
            out.append({"role": message.role, "content": message.content})
            continue
        text: list[str] = []
        thoughts: list[str] = []
        calls: list[dict[str, Any]] = []
        for j, block in enumerate(message.content):
            where = f"messages.{i}.content.{j}"
            if isinstance(block, MediaBlock):
                raise _refuse_media(where, block)
            if isinstance(block, TextBlock):
                text.append(block.text)
            elif isinstance(block, ToolUseBlock):
                calls.append({"id": block.id, "type": "function", "function": {
                    "name": block.name, "arguments": json.dumps(block.input)}})
            elif isinstance(block, ToolResultBlock):
                if isinstance(block.content, list):
                    for k, part in enumerate(block.content):
                        if isinstance(part, MediaBlock):
                            raise _refuse_media(f"{where}.content.{k}", part)
                if text:
                    out.append({"role": "user", "content": "".join(text)})
                    text = []
                result = block.text()
                out.append({"role": "tool", "tool_call_id": block.tool_use_id,
                            "content": f"Error: {result}" if block.is_error else result})
            else:
                assert isinstance(block, ThinkingBlock)
                if block.type == "thinking" and block.thinking:
                    thoughts.append(block.thinking)
        if message.role == "assistant":
            turn: dict[str, Any] = {"role": "assistant", "content": "".join(text)}
            if calls:
                turn["tool_calls"] = calls
            if thoughts:
                turn["reasoning_content"] = "".join(thoughts)
            out.append(turn)
        elif text:
            out.append({"role": "user", "content": "".join(text)})
    return out


def chat_prompt(body: CountTokensRequest, tools: Sequence[Mapping[str, Any]]) -> ChatPrompt:
    """The conversation with ``tools`` offered. A last assistant turn of text (no
    ``tool_use``) is continued, as Anthropic's prefill: the response goes on from its
    text (``core.prefill``)."""
    messages = chat_messages(body)
    last = messages[-1] if messages else None
    if last is not None and last["role"] == "assistant" and not last.get("tool_calls"):
        return ChatPrompt(messages[:-1], tools, continuation=last["content"])
    return ChatPrompt(messages, tools)


def tool_plan(body: CountTokensRequest) -> ToolPlan:
    """``tools`` and ``tool_choice`` (``auto`` by default; ``any``: a call to one of them;
    ``tool``: that one; ``none``: not offered) on the constraint engine, so a forced call
    always parses against its ``input_schema``."""
    tools = [{"type": "function", "function": {
        k: v for k, v in (("name", t.name), ("description", t.description),
                          ("parameters", t.input_schema)) if v is not None}}
        for t in body.tools or []]
    choice = body.tool_choice
    mode = "auto" if choice is None else {"any": "required", "tool": choice.name or "",
                                          "auto": "auto", "none": "none"}[choice.type]
    return plan_tools(tools, mode)


def thinking_enabled(body: CountTokensRequest) -> bool | None:
    """``thinking`` as the chat template's ``enable_thinking``: false for ``disabled``,
    true for ``enabled`` and ``adaptive``, ``None`` (the model's default) when unset. The
    one mapping: a Messages request's ``ThinkingAsk.enabled`` and ``count_tokens``'s
    rendering both come from it, so the count is of the prompt the request runs."""
    thinking = body.thinking
    if thinking is None:
        return None
    return thinking.type != "disabled"


def thinking_ask(body: MessagesRequest) -> ThinkingAsk:
    """``thinking`` (``enabled`` with ``budget_tokens``, ``disabled``, ``adaptive``) and
    ``output_config.effort``, for a model that thinks in tags; ``enabled`` is
    ``thinking_enabled``'s. As Anthropic has it, ``enabled`` needs a ``budget_tokens`` below
    ``max_tokens`` (400 otherwise); unlike Anthropic, a budget under 1,024 is taken (small
    local models think briefly)."""
    effort = body.output_config.effort if body.output_config else None
    thinking, enabled = body.thinking, thinking_enabled(body)
    if thinking is None:
        return ThinkingAsk.of(effort=effort)
    if not enabled:
        return ThinkingAsk(enabled=False)
    budget = thinking.budget_tokens
    if thinking.type == "enabled":
        if budget is None:
            raise bad_param("thinking.budget_tokens", "thinking.budget_tokens is required "
                                                      "when thinking is enabled")
        if budget >= body.max_tokens:
            raise bad_param("thinking.budget_tokens",
                            f"max_tokens ({body.max_tokens}) must be greater than "
                            f"thinking.budget_tokens ({budget})")
    return ThinkingAsk.of(effort=effort, enabled=enabled, budget_tokens=budget)


def tool_use_id(call_id: str) -> str:
    """Anthropic's ``toolu_`` prefix on the core's call id."""
    return "toolu_" + call_id.removeprefix("call_")


def _tool_input(arguments: str) -> Any:
    try:
        return json.loads(arguments)
    except ValueError:
        return {}


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {"input_tokens": prompt_tokens, "output_tokens": completion_tokens,
            "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0}


def stop_reason(done: Done) -> str:
    if done.finish_reason == "stop" and done.stop_sequence is not None:
        return "stop_sequence"
    return STOP_REASONS.get(done.finish_reason, "end_turn")


class MessageRenderer:
    """One Anthropic ``message`` (``body``) or its event stream (``opening`` then
    ``render`` per batch of output events) for one request."""

    def __init__(self, message_id: str, model: str, prompt_tokens: int) -> None:
        self.message_id = message_id
        self.model = model
        self.prompt_tokens = prompt_tokens
        self._open: str | None = None
        """The type of the content block being streamed (``None``: none open)."""
        self._index = -1
        self._pinged = False

    def _message(self, content: list[dict[str, Any]], reason: str | None,
                 sequence: str | None, output_tokens: int) -> dict[str, Any]:
        return {"id": self.message_id, "type": "message", "role": "assistant",
                "model": self.model, "content": content, "stop_reason": reason,
                "stop_sequence": sequence,
                "usage": usage(self.prompt_tokens, output_tokens)}

    # -- one body ---------------------------------------------------------------------

    def body(self, events: Sequence[OutputEvent]) -> dict[str, Any]:
        """The ``message`` for a completed request's events (the last is its ``Done``)."""
        content: list[dict[str, Any]] = []
        for event in events:
            if isinstance(event, ReasoningDelta | TextDelta):
                kind, key = (("thinking", "thinking") if isinstance(event, ReasoningDelta)
                             else ("text", "text"))
                if content and content[-1]["type"] == kind:
                    content[-1][key] += event.text
                else:
                    block = {"type": kind, key: event.text}
                    if kind == "thinking":
                        block["signature"] = ""
                    content.append(block)
            elif isinstance(event, ToolCallDelta):
                content.append({"type": "tool_use", "id": tool_use_id(event.call_id),
                                "name": event.name, "input": _tool_input(event.arguments)})
        done = events[-1]
        assert isinstance(done, Done)
        return self._message(content, stop_reason(done), done.stop_sequence,
                             done.completion_tokens)

    # -- streaming --------------------------------------------------------------------

    def progress(self, progress: PromptProgress) -> list[bytes]:
        """Nothing: Anthropic's stream has no prompt progress (no request asks for it)."""
        return []

    def opening(self) -> list[bytes]:
        start = self._message([], None, None, 0)
        return [event("message_start", {"type": "message_start", "message": start})]

    def _start_block(self, block: dict[str, Any]) -> list[bytes]:
        out = self._stop_block()
        self._index += 1
        self._open = block["type"]
        out.append(event("content_block_start", {"type": "content_block_start",
                                                 "index": self._index,
                                                 "content_block": block}))
        if not self._pinged:
            self._pinged = True
            out.append(event("ping", {"type": "ping"}))
        return out

    def _stop_block(self) -> list[bytes]:
        if self._open is None:
            return []
        self._open = None
        return [event("content_block_stop", {"type": "content_block_stop",
                                             "index": self._index})]

    def _delta(self, delta: dict[str, Any]) -> bytes:
        return event("content_block_delta", {"type": "content_block_delta",
                                              "index": self._index, "delta": delta})

    def render(self, events: Sequence[OutputEvent]) -> list[bytes]:
        out: list[bytes] = []
        for ev in events:
            if isinstance(ev, ReasoningDelta):
                if self._open != "thinking":
                    out += self._start_block({"type": "thinking", "thinking": "",
                                              "signature": ""})
                out.append(self._delta({"type": "thinking_delta", "thinking": ev.text}))
            elif isinstance(ev, TextDelta):
                if self._open != "text":
                    out += self._start_block({"type": "text", "text": ""})
                out.append(self._delta({"type": "text_delta", "text": ev.text}))
            elif isinstance(ev, ToolCallDelta):
                out += self._start_block({"type": "tool_use", "id": tool_use_id(ev.call_id),
                                          "name": ev.name, "input": {}})
                out.append(self._delta({"type": "input_json_delta",
                                        "partial_json": ev.arguments}))
            elif isinstance(ev, Done):
                out += self._stop_block()
                if not self._pinged:
                    self._pinged = True
                    out.append(event("ping", {"type": "ping"}))
                out.append(event("message_delta", {
                    "type": "message_delta",
                    "delta": {"stop_reason": stop_reason(ev),
                              "stop_sequence": ev.stop_sequence},
                    "usage": usage(ev.prompt_tokens, ev.completion_tokens)}))
                out.append(event("message_stop", {"type": "message_stop"}))
            else:
                assert isinstance(ev, Failed)
                out += self._stop_block()
                out.append(event("error", anthropic_error(ev.error)[1]))
        return out


def event(name: str, data: dict[str, Any]) -> bytes:
    """One SSE event with its ``event:`` name (Anthropic's SDK reads events by name)."""
    return f"event: {name}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n".encode()
