"""The core's output splitter, with no server: thinking split from the answer whatever the
token boundaries, tool calls held back and parsed at the end, exactly one last event."""

from __future__ import annotations

import pytest

from sluice.engine.request import Final, RequestStatus
from sluice.engine.textstream import TextStream
from sluice.server.core.output import (
    Done,
    Failed,
    OutputEvent,
    OutputSplitter,
    ReasoningDelta,
    TextDelta,
    ToolCallDelta,
)
from sluice.server.core.reasoning import ThinkingTags

OUTPUT = "<think>Let me see: 2+2.</think>\n\nIt is 4."


def run(splitter: OutputSplitter, pieces: list[str],
        final: Final | None = None) -> list[OutputEvent]:
    out: list[OutputEvent] = []
    for piece in pieces:
        out += splitter.push(piece)
    return out + splitter.finish(final or Final(RequestStatus.COMPLETED, "stop",
                                                prompt_tokens=3, completion_tokens=9))


def joined(events: list[OutputEvent], kind: type) -> str:
    return "".join(e.text for e in events if isinstance(e, kind))


@pytest.mark.parametrize("size", [1, 2, 3, 5, 7, len(OUTPUT)])
def test_thinking_is_split_at_any_token_boundary(size: int) -> None:
    pieces = [OUTPUT[i:i + size] for i in range(0, len(OUTPUT), size)]
    events = run(OutputSplitter(thinking=ThinkingTags()), pieces)
    assert joined(events, ReasoningDelta) == "Let me see: 2+2."
    assert joined(events, TextDelta) == "It is 4."
    assert isinstance(events[-1], Done) and events[-1].finish_reason == "stop"
    assert sum(isinstance(e, Done) for e in events) == 1


def test_opened_thinking_and_no_tags() -> None:
    opened = run(OutputSplitter(thinking=ThinkingTags(opened=True)), ["a b</th", "ink>c"])
    assert joined(opened, ReasoningDelta) == "a b" and joined(opened, TextDelta) == "c"
    plain = run(OutputSplitter(thinking=ThinkingTags()), ["<thin", "g>"])
    assert joined(plain, TextDelta) == "<thing>" and not joined(plain, ReasoningDelta)
    unsplit = run(OutputSplitter(), [OUTPUT])
    assert joined(unsplit, TextDelta) == OUTPUT


def test_tool_call_held_then_parsed() -> None:
    call = '{"name": "get_weather", "arguments": {"city": "Paris"}}'
    events = run(OutputSplitter(["get_weather"]), [call[:5], call[5:]])
    assert not any(isinstance(e, TextDelta) for e in events)
    [tool] = [e for e in events if isinstance(e, ToolCallDelta)]
    assert tool.name == "get_weather" and tool.arguments == '{"city": "Paris"}'
    assert isinstance(events[-1], Done) and events[-1].finish_reason == "tool_calls"
    text = run(OutputSplitter(["get_weather"]), ["Hello", " there"])
    assert joined(text, TextDelta) == "Hello there"


def test_failure_is_the_one_last_event() -> None:
    events = run(OutputSplitter(), ["partial"],
                 Final(RequestStatus.EXPIRED, "deadline", error="late", error_code="deadline"))
    assert isinstance(events[-1], Failed) and events[-1].error.status == 504


def test_text_stream_names_the_stop_string() -> None:
    stream = TextStream(["END", "STOP"])
    assert stream.push(b"one two ST") == "one two "
    stream.push(b"OP more")
    assert stream.stopped and stream.matched == "STOP" and stream.text == "one two "
