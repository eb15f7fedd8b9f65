"""The core's one stream of output events, for adapters that render meaning rather than
tokens (Anthropic Messages, OpenAI Responses): text, reasoning and tool calls split from
the model's output, then usage and the finish, or an error.

``OutputSplitter`` is pure (push a token's text, then finish with the ``Final``), so it is
tested without a server; ``output_events`` drives it from a ``Generation``. Invariants:

- the concatenation of every ``TextDelta`` is the answer, of every ``ReasoningDelta`` the
  thinking, each in order, and no part of a thinking tag reaches either;
- while the output may still be a tool call (it starts like one), its text is held back;
  at the end a call that parses against the offered tools becomes ``ToolCallDelta``s
  (finish reason ``tool_calls``), anything else is flushed as text;
- the last event is exactly one ``Done`` (completed) or one ``Failed`` (anything else).
"""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field

from sluice.backends.chat import parse_tool_calls
from sluice.engine.request import Final, PromptProgress, RequestStatus, TokenEvent
from sluice.server.core.generate import Generation, final_api_error
from sluice.server.core.reasoning import ThinkingTags
from sluice.server.errors import APIError

CALL_STARTS = ("{", "[", "```", "<tool_call>")
"""How the text of a tool call starts (the generic JSON format, fenced, or tagged)."""


@dataclass(frozen=True, slots=True)
class TextDelta:
    """More of the answer."""

    text: str


@dataclass(frozen=True, slots=True)
class ReasoningDelta:
    """More of the thinking (the text between the thinking tags)."""

    text: str


@dataclass(frozen=True, slots=True)
class ToolCallDelta:
    """One whole tool call, its ``arguments`` a JSON object's text that parsed."""

    index: int
    call_id: str
    name: str
    arguments: str


@dataclass(frozen=True, slots=True)
class Done:
    """The request completed: ``finish_reason`` is ``stop``, ``length`` or ``tool_calls``;
    ``stop_sequence`` the stop string that ended it, if one did."""

    finish_reason: str
    prompt_tokens: int
    completion_tokens: int
    stop_sequence: str | None = None


@dataclass(frozen=True, slots=True)
class Failed:
    """The request ended without completing (deadline, backend failure, cancel)."""

    error: APIError


OutputEvent = TextDelta | ReasoningDelta | ToolCallDelta | Done | Failed


def new_call_id() -> str:
    """A fresh tool-call id (``call_`` and 24 hex digits)."""
    return f"call_{secrets.token_hex(12)}"


@dataclass
class CallHold:
    """A streamed answer's text not yet sent: while it may still be a tool call (it starts
    like one), it is held back until the end and parsed."""

    text: str = ""
    mode: str = "undecided"
    """``undecided`` (only whitespace or the start of a call marker so far), ``call``
    (starts like a call: held to the end) or ``content`` (streamed)."""
    events: list[TokenEvent] = field(default_factory=list)
    """What the holder's owner held beside the text (the token events, for logprobs)."""

    def decide(self) -> None:
        start = self.text.lstrip()
        if not start:
            return
        if start.startswith(CALL_STARTS):
            self.mode = "call"
        elif not any(m.startswith(start) for m in CALL_STARTS):
            self.mode = "content"


def _held_prefix(text: str, tag: str) -> int:
    """Length of the longest tail of ``text`` that is a proper prefix of ``tag``."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:n]):
            return n
    return 0


class ThinkingSplit:
    """Splits output text into thinking and answer by ``ThinkingTags``: a start tag is
    looked for at the start of the output only (after whitespace); text up to the end tag
    is thinking, the rest the answer (its leading whitespace dropped)."""

    def __init__(self, tags: ThinkingTags) -> None:
        self.tags = tags
        self._state = "thinking" if tags.opened else "start"
        self._buffer = ""
        self._answer_started = False

    @property
    def thinking(self) -> bool:
        """Inside the thinking (or possibly about to open it)."""
        return self._state == "thinking"

    def push(self, text: str) -> list[TextDelta | ReasoningDelta]:
        self._buffer += text
        out: list[TextDelta | ReasoningDelta] = []
        while self._buffer:
            if self._state == "start":
                head = self._buffer.lstrip()
                if head.startswith(self.tags.start):
                    self._buffer = head[len(self.tags.start):]
                    self._state = "thinking"
                    continue
                if self.tags.start.startswith(head):
                    return out  # maybe the start tag: wait
                self._state = "answer"
            elif self._state == "thinking":
                cut = self._buffer.find(self.tags.end)
                if cut >= 0:
                    if cut:
                        out.append(ReasoningDelta(self._buffer[:cut]))
                    self._buffer = self._buffer[cut + len(self.tags.end):]
                    self._state = "answer"
                    continue
                keep = _held_prefix(self._buffer, self.tags.end)
                shown = self._buffer[: len(self._buffer) - keep]
                if shown:
                    out.append(ReasoningDelta(shown))
                self._buffer = self._buffer[len(shown):]
                return out
            else:
                text_out = self._buffer
                if not self._answer_started:
                    text_out = text_out.lstrip()
                    if not text_out:
                        self._buffer = ""
                        return out
                    self._answer_started = True
                out.append(TextDelta(text_out))
                self._buffer = ""
        return out

    def flush(self) -> list[TextDelta | ReasoningDelta]:
        """At the end: whatever was held (a partial tag is text of its part)."""
        rest, self._buffer = self._buffer, ""
        if not rest:
            return []
        if self._state == "thinking":
            return [ReasoningDelta(rest)]
        rest = rest if self._answer_started else rest.lstrip()
        return [TextDelta(rest)] if rest else []


def split_thinking(tags: ThinkingTags, text: str) -> tuple[str, str]:
    """A whole output's ``(thinking, answer)``."""
    split = ThinkingSplit(tags)
    pieces = [*split.push(text), *split.flush()]
    return ("".join(p.text for p in pieces if isinstance(p, ReasoningDelta)),
            "".join(p.text for p in pieces if isinstance(p, TextDelta)))


class OutputSplitter:
    """Token texts in, output events out (see the module's invariants)."""

    def __init__(self, tool_names: Sequence[str] = (),
                 thinking: ThinkingTags | None = None) -> None:
        self.tool_names = list(tool_names)
        self._split = ThinkingSplit(thinking) if thinking is not None else None
        self._hold = CallHold(mode="undecided" if self.tool_names else "content")
        self.answer = ""
        """The answer so far (tool-call text included until it parsed as calls)."""

    def push(self, text: str) -> list[OutputEvent]:
        pieces: Sequence[TextDelta | ReasoningDelta] = (
            self._split.push(text) if self._split is not None else
            ([TextDelta(text)] if text else []))
        return self._route(pieces)

    def _route(self, pieces: Sequence[TextDelta | ReasoningDelta]) -> list[OutputEvent]:
        out: list[OutputEvent] = []
        for piece in pieces:
            if isinstance(piece, ReasoningDelta):
                out.append(piece)
                continue
            self.answer += piece.text
            hold = self._hold
            if hold.mode == "content":
                out.append(piece)
                continue
            hold.text += piece.text
            hold.decide()
            if hold.mode == "content":
                out.append(TextDelta(hold.text))
                hold.text = ""
        return out

    def finish(self, final: Final) -> list[OutputEvent]:
        if final.status != RequestStatus.COMPLETED:
            return [Failed(final_api_error(final))]
        out = self._route(self._split.flush()) if self._split is not None else []
        finish = final.finish_reason
        hold = self._hold
        if hold.text:
            calls = (parse_tool_calls(hold.text, self.tool_names)
                     if hold.mode != "content" else None)
            if calls is not None:
                content, parsed = calls
                if content:
                    out.append(TextDelta(content))
                out.extend(ToolCallDelta(i, new_call_id(), c.name, c.arguments)
                           for i, c in enumerate(parsed))
                finish = "tool_calls"
            else:
                out.append(TextDelta(hold.text))
            hold.text = ""
        out.append(Done(finish, final.prompt_tokens, final.completion_tokens,
                        final.stop_sequence))
        return out


async def output_events(gen: Generation, splitter: OutputSplitter
                        ) -> AsyncIterator[OutputEvent]:
    """``gen``'s events through ``splitter``: deltas as they come, then one ``Done`` or
    ``Failed``, last. The caller cancels ``gen`` if it stops reading early."""
    async for event in gen.events():
        if isinstance(event, Final):
            for out in splitter.finish(event):
                yield out
            return
        if isinstance(event, PromptProgress):
            continue
        for out in splitter.push(event.text):
            yield out
