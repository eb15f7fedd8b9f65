"""OpenAI Responses to the core and back: ``input`` (a string or items) and
``instructions`` become the conversation in chat message shapes; the core's output events
become a ``response`` object (output items: ``reasoning``, ``message``, ``function_call``)
or its typed event stream (``response.created``, ``response.in_progress``,
``response.output_item.added`` / ``.done``, ``response.content_part.added`` / ``.done``,
``response.output_text.delta`` / ``.done``, ``response.reasoning_text.delta`` / ``.done``,
``response.function_call_arguments.delta`` / ``.done``, then ``response.completed``,
``response.incomplete`` (``max_output_tokens`` reached) or ``response.failed``). As in
llama-server, a stream's closing event carries ``timings``, ``return_progress`` adds
``response.in_progress`` events with ``prompt_progress`` while the prompt is computed, and
``timings_per_token`` puts ``timings`` on every text delta."""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Callable, Sequence
from typing import Any

from sluice.engine.request import Constraint, PromptProgress
from sluice.engine.request import Request as RtRequest
from sluice.server.core.output import (
    Done,
    Failed,
    OutputEvent,
    ReasoningDelta,
    TextDelta,
    ToolCallDelta,
)
from sluice.server.errors import APIError, bad_param
from sluice.server.params import ToolPlan, format_constraint, plan_tools
from sluice.server.responses.schemas import (
    FunctionCallItem,
    FunctionCallOutputItem,
    InputPart,
    MessageItem,
    NamedTool,
    ReasoningItem,
    ResponsesRequest,
)
from sluice.server.schemas.messages import ResponseFormat
from sluice.server.shapes.timings import progress_object, progress_timings, timings

STATEFUL_FIELDS = ("previous_response_id", "conversation", "background")


def refuse_stateful(body: ResponsesRequest) -> None:
    """400 for the fields that need a stored response (none is kept)."""
    for name in STATEFUL_FIELDS:
        value = getattr(body, name)
        if value is not None and value is not False:
            raise bad_param(name, f"'{name}' is not supported: this server keeps no "
                                  f"responses (store is false); send the whole "
                                  f"conversation as input items", code="unsupported_parameter")


def _part_text(parts: str | list[InputPart], where: str) -> str:
    if isinstance(parts, str):
        return parts
    out = []
    for k, part in enumerate(parts):
        if part.type in ("input_image", "input_file"):
            raise bad_param(f"{where}.content.{k}", f"This model takes text only: "
                                                   f"{part.type} parts are not supported",
                            code="unsupported_content")
        out.append(part.text or part.refusal or "")
    return "".join(out)


def chat_messages(body: ResponsesRequest) -> list[dict[str, Any]]:
    """``instructions`` as the system message, then each item: messages as they are, a run
    of ``function_call`` items as one assistant turn's ``tool_calls``,
    ``function_call_output`` as a ``tool`` message. A reasoning item's text is an assistant
    turn's ``reasoning_content``: the turn before it when that is an assistant turn (as
    llama-server attaches it), else a new turn that the assistant message or function calls
    after it complete (Responses puts the reasoning before what it led to)."""
    out: list[dict[str, Any]] = []
    if body.instructions:
        out.append({"role": "system", "content": body.instructions})
    if isinstance(body.input, str):
        out.append({"role": "user", "content": body.input})
        return out
    for i, item in enumerate(body.input):
        last = out[-1] if out else None
        if isinstance(item, MessageItem):
            content = _part_text(item.content, f"input.{i}")
            if item.role == "assistant" and last is not None and _thinking_only(last):
                last["content"] = content
            else:
                out.append({"role": item.role, "content": content})
        elif isinstance(item, FunctionCallItem):
            call = {"id": item.call_id, "type": "function",
                    "function": {"name": item.name, "arguments": item.arguments}}
            if last is not None and last["role"] == "assistant" and (
                    "tool_calls" in last or _thinking_only(last)):
                last.setdefault("tool_calls", []).append(call)
            else:
                out.append({"role": "assistant", "content": "", "tool_calls": [call]})
        elif isinstance(item, FunctionCallOutputItem):
            out.append({"role": "tool", "tool_call_id": item.call_id, "content": item.text()})
        elif isinstance(item, ReasoningItem) and item.text():
            if last is not None and last["role"] == "assistant":
                thoughts = [t for t in (last.get("reasoning_content"), item.text()) if t]
                last["reasoning_content"] = "\n\n".join(thoughts)
            else:
                out.append({"role": "assistant", "content": "",
                            "reasoning_content": item.text()})
    if not any(m["role"] in ("user", "assistant", "tool") for m in out):
        raise bad_param("input", "input must hold at least one user or assistant message")
    return out


def _thinking_only(message: dict[str, Any]) -> bool:
    """An assistant turn that so far holds only a reasoning item's thinking."""
    return (message["role"] == "assistant" and bool(message.get("reasoning_content"))
            and not message["content"] and "tool_calls" not in message)


def tool_plan(body: ResponsesRequest) -> ToolPlan:
    """Function ``tools`` and ``tool_choice`` on the constraint engine (a required or named
    call is constrained to the function's parameters)."""
    tools = [t.as_tool() for t in body.tools or []]
    choice = body.tool_choice
    mode = (choice.name if isinstance(choice, NamedTool) else choice) or "auto"
    strict = any(bool(t.strict) for t in body.tools or [])
    return plan_tools(tools, mode, strict=strict)


def format_of(body: ResponsesRequest) -> Constraint | None:
    """``text.format`` as a decoding constraint (``text``: none)."""
    fmt = body.text.format if body.text else None
    if fmt is None or fmt.type == "text":
        return None
    if fmt.type == "json_object":
        return format_constraint(ResponseFormat(type="json_object"))
    return format_constraint(ResponseFormat(type="json_schema",
                                            json_schema=fmt.as_json_schema()))


def _id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(12)}"


def usage(done: Done) -> dict[str, Any]:
    return {"input_tokens": done.prompt_tokens,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": done.completion_tokens,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": done.prompt_tokens + done.completion_tokens}


class ResponseRenderer:
    """One ``response`` object (``body``) or its typed event stream (``opening`` then
    ``render`` per batch of output events); item ids are fixed when an item opens, so the
    added, done and completed forms of an item agree."""

    def __init__(self, response_id: str, body: ResponsesRequest, model: str,
                 req: RtRequest | None = None, clock: Callable[[], float] | None = None
                 ) -> None:
        self.response_id = response_id
        self.request = body
        self.model = model
        """The model that serves it (an alias resolved)."""
        self.req = req
        """The runtime request (with ``clock``, the runtime's): a stream's
        ``response.completed`` carries llama-server's ``timings``, and with
        ``timings_per_token`` so does every text delta."""
        self.clock = clock
        self.created_at = int(time.time())
        self._seq = 0
        self._items: list[dict[str, Any]] = []
        """Output items so far (the open one last, while it streams)."""
        self._open: str | None = None
        self._reasoning_tokens = 0

    def _response(self, status: str, output: list[dict[str, Any]],
                  usage_: dict[str, Any] | None = None, error: dict[str, Any] | None = None,
                  incomplete: dict[str, Any] | None = None) -> dict[str, Any]:
        body = self.request
        fmt = body.text.format if body.text and body.text.format else None
        choice = body.tool_choice
        return {
            "id": self.response_id, "object": "response", "created_at": self.created_at,
            "status": status, "error": error, "incomplete_details": incomplete,
            "instructions": body.instructions, "max_output_tokens": body.max_output_tokens,
            "model": self.model, "output": output, "parallel_tool_calls": True,
            "previous_response_id": None,
            "reasoning": {"effort": body.reasoning.effort if body.reasoning else None,
                          "summary": None},
            "store": False, "temperature": body.temperature,
            "text": {"format": fmt.model_dump(by_alias=True, exclude_none=True)
                     if fmt else {"type": "text"}},
            "tool_choice": (choice.model_dump() if isinstance(choice, NamedTool)
                            else choice or "auto"),
            "tools": [t.model_dump(exclude_none=True) for t in body.tools or []],
            "top_p": body.top_p, "truncation": "disabled", "usage": usage_,
            "user": body.user, "metadata": body.metadata or {},
        }

    def _end(self, ev: Done | Failed) -> tuple[str, dict[str, Any]]:
        """The closing event's type and its response."""
        if isinstance(ev, Failed):
            return "response.failed", self._response("failed", self._items,
                                                     error=error_of(ev.error))
        used = usage(ev)
        used["output_tokens_details"]["reasoning_tokens"] = self._reasoning_tokens
        if ev.finish_reason == "length":
            return "response.incomplete", self._response(
                "incomplete", self._items, used, incomplete={"reason": "max_output_tokens"})
        return "response.completed", self._response("completed", self._items, used)

    # -- one body ---------------------------------------------------------------------

    def body(self, events: Sequence[OutputEvent]) -> dict[str, Any]:
        for ev in events:
            if isinstance(ev, ReasoningDelta):
                item = self._item("reasoning")
                item["content"][0]["text"] += ev.text
            elif isinstance(ev, TextDelta):
                item = self._item("message")
                item["content"][0]["text"] += ev.text
            elif isinstance(ev, ToolCallDelta):
                self._open = None
                self._items.append(self._call_item(ev, "completed"))
        self._close_all()
        last = events[-1]
        assert isinstance(last, Done)
        return self._end(last)[1]

    def _item(self, kind: str) -> dict[str, Any]:
        if self._open != kind:
            self._open = kind
            if kind == "reasoning":
                self._items.append({"type": "reasoning", "id": _id("rs"), "summary": [],
                                    "content": [{"type": "reasoning_text", "text": ""}]})
            else:
                self._items.append({"type": "message", "id": _id("msg"),
                                    "status": "in_progress", "role": "assistant",
                                    "content": [{"type": "output_text", "text": "",
                                                 "annotations": [], "logprobs": []}]})
        return self._items[-1]

    @staticmethod
    def _call_item(ev: ToolCallDelta, status: str) -> dict[str, Any]:
        return {"type": "function_call", "id": _id("fc"), "call_id": ev.call_id,
                "name": ev.name, "arguments": ev.arguments if status == "completed" else "",
                "status": status}

    def _close_all(self) -> None:
        for item in self._items:
            if item["type"] == "message":
                item["status"] = "completed"
        self._open = None

    # -- streaming --------------------------------------------------------------------

    def _event(self, kind: str, **fields: Any) -> bytes:
        data = {"type": kind, "sequence_number": self._seq, **fields}
        self._seq += 1
        return f"event: {kind}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n".encode()

    def opening(self) -> list[bytes]:
        start = self._response("in_progress", [])
        return [self._event("response.created", response=start),
                self._event("response.in_progress", response=start)]

    def progress(self, progress: PromptProgress) -> list[bytes]:
        """llama-server's report of the prompt computed so far: a ``response.in_progress``
        event with ``prompt_progress`` (and ``timings`` with ``timings_per_token``)."""
        extra: dict[str, Any] = {"prompt_progress": progress_object(progress, self.req)}
        if self.request.timings_per_token and self.req is not None:
            extra["timings"] = progress_timings(self.req, progress)
        return [self._event("response.in_progress", response=self._response("in_progress", []),
                            **extra)]

    def _timings(self, done: Done | None = None) -> dict[str, Any]:
        """``timings`` for a text delta (with ``timings_per_token``) or the closing event
        (``done``); none without the runtime request."""
        if self.req is None or self.clock is None:
            return {}
        if done is not None:
            return {"timings": timings(self.req, done.completion_tokens,
                                       self.req.times.finished_s or self.clock())}
        if not self.request.timings_per_token:
            return {}
        return {"timings": timings(self.req, self.req.completion_tokens, self.clock())}

    def _close_open(self) -> list[bytes]:
        if self._open is None:
            return []
        item, index = self._items[-1], len(self._items) - 1
        kind, self._open = self._open, None
        part = item["content"][0]
        if kind == "reasoning":
            return [self._event("response.reasoning_text.done", item_id=item["id"],
                                output_index=index, content_index=0, text=part["text"]),
                    self._event("response.output_item.done", output_index=index, item=item)]
        item["status"] = "completed"
        return [self._event("response.output_text.done", item_id=item["id"],
                            output_index=index, content_index=0, text=part["text"],
                            logprobs=[]),
                self._event("response.content_part.done", item_id=item["id"],
                            output_index=index, content_index=0, part=part),
                self._event("response.output_item.done", output_index=index, item=item)]

    def _open_item(self, kind: str) -> list[bytes]:
        out = self._close_open()
        item = self._item(kind)
        index = len(self._items) - 1
        empty = {**item, "content": [] if kind == "message" else
                 [{"type": "reasoning_text", "text": ""}]}
        out.append(self._event("response.output_item.added", output_index=index, item=empty))
        if kind == "message":
            out.append(self._event("response.content_part.added", item_id=item["id"],
                                   output_index=index, content_index=0,
                                   part={"type": "output_text", "text": "", "annotations": [],
                                         "logprobs": []}))
        return out

    def render(self, events: Sequence[OutputEvent]) -> list[bytes]:
        out: list[bytes] = []
        for ev in events:
            if isinstance(ev, ReasoningDelta | TextDelta):
                kind = "reasoning" if isinstance(ev, ReasoningDelta) else "message"
                if self._open != kind:
                    out += self._open_item(kind)
                item = self._items[-1]
                item["content"][0]["text"] += ev.text
                name = ("response.reasoning_text.delta" if kind == "reasoning"
                        else "response.output_text.delta")
                extra: dict[str, Any] = ({} if kind == "reasoning"
                                         else {"logprobs": [], **self._timings()})
                out.append(self._event(name, item_id=item["id"],
                                       output_index=len(self._items) - 1, content_index=0,
                                       delta=ev.text, **extra))
            elif isinstance(ev, ToolCallDelta):
                out += self._close_open()
                item = self._call_item(ev, "in_progress")
                self._items.append(item)
                index = len(self._items) - 1
                out.append(self._event("response.output_item.added", output_index=index,
                                       item=dict(item)))
                out.append(self._event("response.function_call_arguments.delta",
                                       item_id=item["id"], output_index=index,
                                       delta=ev.arguments))
                item.update(arguments=ev.arguments, status="completed")
                out.append(self._event("response.function_call_arguments.done",
                                       item_id=item["id"], output_index=index,
                                       name=ev.name, arguments=ev.arguments))
                out.append(self._event("response.output_item.done", output_index=index,
                                       item=item))
            else:
                out += self._close_open()
                kind, response = self._end(ev)
                closing = self._timings(ev) if isinstance(ev, Done) else {}
                out.append(self._event(kind, response=response, **closing))
        return out


def error_of(err: APIError) -> dict[str, Any]:
    """An error as ``response.failed`` reports it."""
    return {"code": err.code or err.type, "message": err.message}
