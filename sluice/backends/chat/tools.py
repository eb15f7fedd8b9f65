"""sluice's generic tool-call format, for templates that have no tool format of their own
(the packaged Gemma 3 base model's included), and the parser of tool calls in output.

The format (documented in docs/models.md, "Tools"):

- the tools go into the system message, one JSON object per line, after an instruction to
  answer a call with only ``{"name": <function>, "arguments": {...}}``;
- an assistant turn that called tools shows those calls as such JSON objects, one a line;
- a ``tool`` message becomes a user turn ``Result of <function>:\\n<content>``.

``parse_tool_calls`` reads calls in that format and in the common native ones:
``<tool_call>{...}</tool_call>`` blocks (Hermes, Qwen), a JSON object or list of objects
with ``name`` and ``arguments`` (or ``parameters``: Llama 3.x), ``{"tool_calls": [...]}``,
each optionally in a Markdown code fence. Only functions the request declared count.
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

TOOL_PREAMBLE = (
    "You can call functions. To call one, reply with only a JSON object of the form "
    '{"name": "<function name>", "arguments": {<the arguments>}} and nothing else. '
    "The functions are:"
)


def tool_preamble(tools: Sequence[Mapping[str, Any]]) -> str:
    """The system text that declares ``tools`` (OpenAI ``{"type": "function",
    "function": {...}}`` entries) in the generic format."""
    lines = [TOOL_PREAMBLE]
    for tool in tools:
        fn = tool.get("function", {})
        entry: dict[str, Any] = {"name": fn.get("name", "")}
        if fn.get("description"):
            entry["description"] = fn["description"]
        entry["parameters"] = fn.get("parameters") or {"type": "object", "properties": {}}
        lines.append(json.dumps(entry, ensure_ascii=False))
    return "\n".join(lines)


def call_text(name: str, arguments: Any) -> str:
    """One call as the generic format writes it (``arguments`` a JSON string or value)."""
    if isinstance(arguments, str):
        with contextlib.suppress(ValueError):
            arguments = json.loads(arguments)
    return json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False)


def result_text(name: str, content: str) -> str:
    """A tool's result as the user turn the generic format gives it."""
    return f"Result of {name}:\n{content}"


def call_schema(tools: Sequence[Mapping[str, Any]], only: str | None = None) -> dict[str, Any]:
    """The JSON schema of one call to any of ``tools`` (or to ``only``): what decoding is
    constrained to when a call is required, so that it always parses."""
    options = []
    for tool in tools:
        fn = tool.get("function", {})
        if only is not None and fn.get("name") != only:
            continue
        params = fn.get("parameters") or {"type": "object", "properties": {}}
        options.append({
            "type": "object",
            "properties": {"name": {"type": "string", "enum": [fn.get("name")]},
                           "arguments": params},
            "required": ["name", "arguments"],
            "additionalProperties": False,
        })
    if len(options) == 1:
        return options[0]
    return {"anyOf": options}


@dataclass(frozen=True, slots=True)
class ToolCall:
    """A call parsed from output: the function and its arguments as a JSON string."""

    name: str
    arguments: str


_TAGGED = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.DOTALL)
_FENCE = re.compile(r"^```(?:json)?\s*(.*?)\s*```$", re.DOTALL)


def parse_tool_calls(
    text: str, names: Sequence[str]
) -> tuple[str, list[ToolCall]] | None:
    """``(content, calls)`` when ``text`` holds calls to declared functions, else None.
    ``content`` is any text before the calls (for tagged calls), usually empty."""
    known = set(names)
    tagged = list(_TAGGED.finditer(text))
    if tagged:
        calls = [c for m in tagged for c in _calls_of(_loads(m.group(1)), known) or []]
        if calls and len(calls) >= len(tagged):
            return text[: tagged[0].start()].strip(), calls
        return None
    body = text.strip()
    fence = _FENCE.match(body)
    if fence:
        body = fence.group(1)
    if not body.startswith(("{", "[")):
        return None
    found = _calls_of(_loads(body), known)
    return ("", found) if found else None


def _loads(text: str) -> Any:
    """The first JSON value in ``text`` (trailing text after it is ignored), or None."""
    try:
        value, _ = json.JSONDecoder().raw_decode(text.strip())
    except ValueError:
        return None
    return value


def _calls_of(value: Any, known: set[str]) -> list[ToolCall] | None:
    if isinstance(value, Mapping) and isinstance(value.get("tool_calls"), list):
        value = value["tool_calls"]
    items = value if isinstance(value, list) else [value]
    calls = []
    for item in items:
        if not isinstance(item, Mapping):
            return None
        if isinstance(item.get("function"), Mapping):  # OpenAI's own shape
            item = item["function"]
        name = item.get("name")
        args = item.get("arguments", item.get("parameters", {}))
        if not isinstance(name, str) or name not in known:
            return None
        if isinstance(args, str):
            parsed = _loads(args)
            args = parsed if isinstance(parsed, Mapping) else None
        if not isinstance(args, Mapping):
            return None
        calls.append(ToolCall(name, json.dumps(args, ensure_ascii=False)))
    return calls or None
