"""The generic tool format: parsing calls from output (the generic format and the common
native ones), and the call schema decoding is constrained to when a call is required."""

from __future__ import annotations

import json

import jsonschema
import pytest

from sluice.backends.chat import ToolCall, call_schema, parse_tool_calls, tool_preamble

NAMES = ["get_weather", "add"]
TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "Weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                       "required": ["city"]}}},
    {"type": "function", "function": {"name": "add"}},
]


@pytest.mark.parametrize("text", [
    '{"name": "get_weather", "arguments": {"city": "Paris"}}',
    '  {"name": "get_weather", "arguments": {"city": "Paris"}}\n',
    '```json\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n```',
    '{"name": "get_weather", "parameters": {"city": "Paris"}}',
    '{"name": "get_weather", "arguments": "{\\"city\\": \\"Paris\\"}"}',
    '{"tool_calls": [{"name": "get_weather", "arguments": {"city": "Paris"}}]}',
    '[{"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]',
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
    '{"name": "get_weather", "arguments": {"city": "Paris"}} and some trailing words',
])
def test_one_call_in_any_common_shape(text: str) -> None:
    assert parse_tool_calls(text, NAMES) == ("", [ToolCall("get_weather", '{"city": "Paris"}')])


def test_several_calls_and_text_before_tagged_ones() -> None:
    text = ('Let me check.\n<tool_call>{"name": "get_weather", "arguments": {"city": "A"}}'
            '</tool_call>\n<tool_call>{"name": "add", "arguments": {"a": 1}}</tool_call>')
    content, calls = parse_tool_calls(text, NAMES) or ("", [])
    assert content == "Let me check."
    assert [c.name for c in calls] == ["get_weather", "add"]
    assert json.loads(calls[1].arguments) == {"a": 1}


@pytest.mark.parametrize("text", [
    "The weather in Paris is mild.",
    '{"name": "launch_rockets", "arguments": {}}',  # not a declared function
    '{"name": "get_weather", "arguments": [1, 2]}',  # arguments not an object
    '{"answer": 42}',
    '{"name": "get_weather", "arguments": {"city": ',  # cut off
    "<tool_call>not json</tool_call>",
    "",
])
def test_text_that_is_not_a_call_stays_text(text: str) -> None:
    assert parse_tool_calls(text, NAMES) is None


def test_call_schema_accepts_exactly_calls_to_the_tools() -> None:
    named = call_schema(TOOLS, "get_weather")
    jsonschema.validate({"name": "get_weather", "arguments": {"city": "Oslo"}}, named)
    for bad in ({"name": "add", "arguments": {}}, {"name": "get_weather", "arguments": {}},
                {"name": "get_weather", "arguments": {"city": "Oslo"}, "x": 1}):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(bad, named)
    anyone = call_schema(TOOLS)
    jsonschema.Draft202012Validator.check_schema(anyone)
    jsonschema.validate({"name": "add", "arguments": {"a": 1}}, anyone)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"name": "sub", "arguments": {}}, anyone)


def test_a_call_that_matches_the_schema_parses() -> None:
    """What constrained decoding produces is what the parser reads."""
    call = {"name": "get_weather", "arguments": {"city": "Oslo"}}
    jsonschema.validate(call, call_schema(TOOLS, "get_weather"))
    assert parse_tool_calls(json.dumps(call), NAMES) == (
        "", [ToolCall("get_weather", '{"city": "Oslo"}')])


def test_preamble_lists_each_tool_as_json() -> None:
    lines = tool_preamble(TOOLS).splitlines()
    assert lines[0].startswith("You can call functions.")
    assert json.loads(lines[1])["name"] == "get_weather"
    assert json.loads(lines[2]) == {"name": "add",
                                    "parameters": {"type": "object", "properties": {}}}
