"""``ChatTemplate``: a model's chat format plus what it cannot do natively, filled in with the
generic tool format, and the marking that keeps user text plain (``prompt``).

A template is a render function ``(messages, tools, RenderOptions) -> str`` and its
``Capabilities``, found by rendering probe conversations (as llama.cpp's minja does): does the
system message show, do tools, tool calls and tool results show, is content trimmed. What the
template cannot show is rewritten before it renders: tools go into the system message in the
generic format, tool calls into assistant text, tool results into user turns, and a system
message into the first user turn.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal

from sluice.backends.chat.prompt import ChatPrompt, mark, mark_json, split_marked
from sluice.backends.chat.tools import call_text, result_text, tool_preamble

Message = Mapping[str, Any]
Tools = Sequence[Mapping[str, Any]]


@dataclass(frozen=True, slots=True)
class RenderOptions:
    """What a request sets for the template beyond its messages and tools (the variables
    of the same names that HF transformers and llama-server give a Jinja template)."""

    add_generation_prompt: bool = True
    """End with the assistant turn's opening (false: the conversation as it stands)."""
    enable_thinking: bool | None = None
    """Whether the model thinks first (templates that read it open or close their
    thinking block); ``None``: the model's default (``backends.base.thinking_default``;
    true where the tokenizer does not resolve it)."""


Render = Callable[[Sequence[Message], Tools | None, RenderOptions], str]


@dataclass(frozen=True, slots=True)
class Capabilities:
    """What a template renders natively."""

    system: bool = True
    tools: bool = False
    tool_calls: bool = False
    tool_responses: bool = False
    trims: bool = False
    """It strips whitespace around message content (then sluice strips it first, since
    marked content cannot be trimmed by the template)."""
    reasoning_trim: Literal["none", "newlines", "whitespace"] = "none"
    """What it strips around a message's ``reasoning_content`` (Qwen3's strips newlines),
    stripped by sluice first for the same reason."""


_PROBE_TOOL = {"type": "function", "function": {
    "name": "sluice_probe_tool", "description": "probe",
    "parameters": {"type": "object", "properties": {"a": {"type": "string"}}}}}
_PROBE_CALL = {"role": "assistant", "content": "", "tool_calls": [{
    "id": "call_probe", "type": "function",
    "function": {"name": "sluice_probe_call", "arguments": {"a": "x"}}}]}
_PROBE_RESULT = {"role": "tool", "tool_call_id": "call_probe", "name": "sluice_probe_call",
                 "content": "sluice_probe_result"}


_PROBE_OPTIONS = RenderOptions(enable_thinking=True)
_PROBE_REASONING = "sluice_probe_reasoning"


def probe(render: Render) -> Capabilities:
    """Render small conversations and look for each probe's text in the output."""

    def shows(messages: list[dict[str, Any]], tools: Tools | None, needle: str) -> str | None:
        try:
            out = render(messages, tools, _PROBE_OPTIONS)
        except ValueError:
            return None
        return out if needle in out else None

    user = {"role": "user", "content": "sluice_probe_user"}
    padded = shows([{"role": "user", "content": "  sluice_probe_user  "}], None,
                   "sluice_probe_user")
    return Capabilities(
        system=shows([{"role": "system", "content": "sluice_probe_system"}, user], None,
                     "sluice_probe_system") is not None,
        tools=shows([user], [_PROBE_TOOL], "sluice_probe_tool") is not None,
        tool_calls=shows([user, _PROBE_CALL], None, "sluice_probe_call") is not None,
        tool_responses=shows([user, _PROBE_CALL, _PROBE_RESULT], None,
                             "sluice_probe_result") is not None,
        trims=padded is not None and "sluice_probe_user  " not in padded,
        reasoning_trim=_reasoning_trim(render),
    )


def _reasoning_trim(render: Render) -> Literal["none", "newlines", "whitespace"]:
    """Render a last assistant turn whose thinking is padded with newlines and spaces (a
    last turn, since templates such as Qwen3's show only the current turn's thinking) and
    see which padding is left."""
    padded = f"\n\n {_PROBE_REASONING} \n\n"
    messages = [{"role": "user", "content": "sluice_probe_user"},
                {"role": "assistant", "content": "sluice_probe_answer",
                 "reasoning_content": padded}]
    try:
        out = render(messages, None, replace(_PROBE_OPTIONS, add_generation_prompt=False))
    except ValueError:
        return "none"
    if _PROBE_REASONING not in out or padded in out:
        return "none"
    return "newlines" if f" {_PROBE_REASONING} " in out else "whitespace"


class ChatTemplate:
    """A model's chat format. ``apply`` gives a ``ChatPrompt`` whose user text is plain."""

    def __init__(self, name: str, render: Render, *, bos_text: str = "",
                 caps: Capabilities | None = None) -> None:
        self.name = name
        self._render = render
        self.bos_text = bos_text
        self.caps = caps if caps is not None else probe(render)

    def apply(self, messages: Sequence[Message], tools: Tools | None = None,
              options: RenderOptions | None = None) -> ChatPrompt:
        """Render ``messages`` (OpenAI shapes: ``role``, ``content``, ``name``,
        ``tool_calls``, ``tool_call_id``, ``reasoning_content``; ``developer`` counts as
        ``system``) with ``tools`` offered and ``options`` (default: a generation prompt,
        thinking on). A message's ``reasoning_content`` (its past thinking) reaches the
        template as that key when it is not empty, as llama-server passes it; a template
        that does not read it renders without it.
        ``ValueError`` (a message fit for a client) if the template refuses them."""
        prepared = self._prepare(messages, tools)
        native_tools = [_marked_tool(t) for t in tools] if tools and self.caps.tools else None
        options = options or RenderOptions()
        if options.enable_thinking is None:
            options = replace(options, enable_thinking=True)
        rendered = self._render(prepared, native_tools, options)
        return split_marked(rendered, self.bos_text)

    def render_text(self, messages: Sequence[Message]) -> str:
        """The prompt text of ``messages`` (for display; tokenize ``apply``'s parts)."""
        return self.apply(messages).text

    def _text(self, value: Any) -> str:
        text = "" if value is None else str(value)
        return mark(text.strip() if self.caps.trims else text)

    def _reasoning_text(self, text: str) -> str:
        trim = self.caps.reasoning_trim
        return mark(text.strip("\n") if trim == "newlines"
                    else text.strip() if trim == "whitespace" else text)

    def _prepare(self, messages: Sequence[Message], tools: Tools | None) -> list[dict[str, Any]]:
        caps = self.caps
        call_names: dict[str, str] = {}
        out: list[dict[str, Any]] = []
        rewritten = False
        for message in messages:
            role = "system" if message["role"] == "developer" else str(message["role"])
            content = message.get("content")
            item: dict[str, Any] = {"role": role}
            calls = message.get("tool_calls") or []
            for call in calls:
                call_names[str(call.get("id", ""))] = call["function"]["name"]
            if role == "assistant" and calls and not caps.tool_calls:
                lines = [str(content)] if content else []
                lines += [call_text(c["function"]["name"], c["function"].get("arguments", {}))
                          for c in calls]
                item["content"] = self._text("\n".join(lines))
                rewritten = True
            elif role == "assistant" and calls:
                item["content"] = self._text(content)
                item["tool_calls"] = [_marked_call(c) for c in calls]
            elif role == "tool" and not caps.tool_responses:
                name = call_names.get(str(message.get("tool_call_id", "")), "the function")
                item = {"role": "user", "content": self._text(result_text(name, content or ""))}
                rewritten = True
            elif role == "tool":
                item["content"] = self._text(content)
                item["tool_call_id"] = mark(str(message.get("tool_call_id", "")))
                item["name"] = mark(call_names.get(str(message.get("tool_call_id", "")), ""))
            else:
                item["content"] = self._text(content)
            if message.get("name"):
                item["name"] = mark(str(message["name"]))
            reasoning = message.get("reasoning_content")
            if reasoning:
                item["reasoning_content"] = self._reasoning_text(str(reasoning))
            out.append(item)
        if tools and not caps.tools:
            preamble = self._text(tool_preamble(tools))
            if out and out[0]["role"] == "system":
                out[0] = {**out[0], "content": preamble + "\n\n" + out[0]["content"]}
            else:
                out.insert(0, {"role": "system", "content": preamble})
        if rewritten:
            out = _merge_runs(out)
        if not caps.system:
            out = _system_into_user(out)
        return out


def _marked_call(call: Mapping[str, Any]) -> dict[str, Any]:
    fn = call["function"]
    args: Any = fn.get("arguments", {})
    if isinstance(args, str):
        with contextlib.suppress(ValueError):
            args = json.loads(args)
    return {"id": mark(str(call.get("id", ""))), "type": "function",
            "function": {"name": mark(str(fn["name"])), "arguments": mark_json(args)}}


SCHEMA_KEYWORDS = frozenset({
    "$anchor", "$comment", "$defs", "$dynamicAnchor", "$dynamicRef", "$id", "$ref",
    "$schema", "additionalItems", "additionalProperties", "allOf", "anyOf", "const",
    "contains", "contentEncoding", "contentMediaType", "contentSchema", "default",
    "definitions", "dependencies", "dependentRequired", "dependentSchemas", "deprecated",
    "description", "else", "enum", "examples", "exclusiveMaximum", "exclusiveMinimum",
    "format", "if", "items", "maxContains", "maxItems", "maxLength", "maxProperties",
    "maximum", "minContains", "minItems", "minLength", "minProperties", "minimum",
    "multipleOf", "not", "nullable", "oneOf", "pattern", "patternProperties",
    "prefixItems", "properties", "propertyNames", "readOnly", "required", "then", "title",
    "type", "unevaluatedItems", "unevaluatedProperties", "uniqueItems", "writeOnly",
})
"""JSON Schema's keywords: the only keys of a tool's schema left unmarked, since templates
look them up by name (``param.type``, ``parameters.properties``)."""
TYPE_NAMES = frozenset({"array", "boolean", "integer", "null", "number", "object", "string"})
"""The values of ``type`` left unmarked (templates compare them: ``type == 'string'``)."""
_NAMED_SCHEMAS = frozenset({"$defs", "definitions", "dependencies", "dependentSchemas",
                            "patternProperties", "properties"})
"""Keywords whose value maps client-chosen names to schemas."""
_DATA = frozenset({"const", "default", "enum", "examples"})
"""Keywords whose value is client data (every key and string of it is user text)."""


def _marked_schema(schema: Any) -> Any:
    """A JSON schema as a template takes it: every string the client chose (property names,
    ``enum`` values, ``title``, ``description``, ``required`` entries, unknown keys and
    their values) is user text; only JSON Schema's keywords and the type names stay as
    they are."""
    if isinstance(schema, list):
        return [_marked_schema(s) for s in schema]
    if not isinstance(schema, Mapping):
        return mark_json(schema)
    out: dict[Any, Any] = {}
    for key, value in schema.items():
        key = str(key)
        if key not in SCHEMA_KEYWORDS:
            out[mark(key)] = mark_json(value)
        elif key in _NAMED_SCHEMAS and isinstance(value, Mapping):
            out[key] = {mark(str(k)): _marked_schema(v) for k, v in value.items()}
        elif key in _DATA or key in ("required", "dependentRequired"):
            out[key] = mark_json(value)
        elif key == "type":
            out[key] = _marked_type(value)
        else:
            out[key] = _marked_schema(value)
    return out


def _marked_type(value: Any) -> Any:
    if isinstance(value, str):
        return value if value in TYPE_NAMES else mark(value)
    if isinstance(value, list):
        return [_marked_type(v) for v in value]
    return mark_json(value)


def _marked_tool(tool: Mapping[str, Any]) -> dict[str, Any]:
    """A tool for a template that renders tools: every string the client sent is user
    text (the function's name, its description, and all of its schema but JSON Schema's
    keywords and type names); the envelope's keys and ``type: function`` are sluice's."""
    fn = tool.get("function") or {}
    spec: dict[str, Any] = {}
    for key, value in fn.items():
        if key == "parameters":
            spec[key] = _marked_schema(value)
        elif key in ("name", "description"):
            spec[key] = mark(str(value))
        else:
            spec[mark(str(key))] = mark_json(value)
    return {"type": "function", "function": spec}


def _merge_runs(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Consecutive user (or assistant) turns joined, for templates that insist on
    alternation once tool turns have become user and assistant turns; their
    ``reasoning_content`` is joined the same way, so no turn's thinking is lost."""
    out: list[dict[str, Any]] = []
    for m in messages:
        if out and m["role"] == out[-1]["role"] in ("user", "assistant") \
                and "tool_calls" not in m and "tool_calls" not in out[-1]:
            merged = {**out[-1], "content": out[-1]["content"] + "\n\n" + m["content"]}
            thoughts = [t for t in (out[-1].get("reasoning_content"),
                                    m.get("reasoning_content")) if t]
            if thoughts:
                merged["reasoning_content"] = "\n\n".join(thoughts)
            out[-1] = merged
        else:
            out.append(m)
    return out


def _system_into_user(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    system = [m["content"] for m in messages if m["role"] == "system"]
    rest = [m for m in messages if m["role"] != "system"]
    if not system:
        return rest
    prefix = "\n\n".join(system)
    for i, m in enumerate(rest):
        if m["role"] == "user":
            rest[i] = {**m, "content": prefix + "\n\n" + m["content"]}
            return rest
    return [{"role": "user", "content": prefix}, *rest]
