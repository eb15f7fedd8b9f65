"""OpenAI's ``chat.completion`` objects and chunks: thinking apart from the answer, tool
calls parsed from the text, logprobs rendered from the events' token ids with the
tokenizer's bytes."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sluice.backends.chat import ToolCall, parse_tool_calls
from sluice.engine.request import Final, PromptProgress, Request, TokenEvent
from sluice.server.core.output import (
    CallHold,
    ReasoningDelta,
    ThinkingSplit,
    new_call_id,
    split_thinking,
)
from sluice.server.core.reasoning import ThinkingTags
from sluice.server.shapes.base import Shape, TokenText, choices_of, finite_logprob
from sluice.server.shapes.timings import progress_object


class ChatShape(Shape):
    """``chat.completion`` objects and chunks: ``logprobs.content`` per token when asked,
    and tool calls parsed from the text when the request offered tools."""

    object_name = "chat.completion"
    chunk_name = "chat.completion.chunk"
    openai = True

    def __init__(self, response_id: str, model: str, *, tokens: TokenText | None = None,
                 tool_names: Sequence[str] = (), thinking: ThinkingTags | None = None,
                 request: Request | None = None) -> None:
        super().__init__(response_id, model, request)
        self.tokens = tokens
        """Set when the request asked for logprobs."""
        self.tool_names = list(tool_names)
        self.thinking = thinking
        """Set for a model that thinks in tags: its thinking is ``reasoning_content`` and
        ``reasoning`` (both names: clients read one or the other), apart from ``content``."""
        self._held: dict[int, CallHold] = {}
        self._splits: dict[int, ThinkingSplit] = {}
        self.verbose: dict[str, Any] | None = None
        """Set when the request asked for llama-server's ``__verbose`` (the body has it)."""

    def _split_of(self, choice: int) -> ThinkingSplit | None:
        if self.thinking is None:
            return None
        split = self._splits.get(choice)
        if split is None:
            split = self._splits[choice] = ThinkingSplit(self.thinking)
        return split

    def _reasoning_chunk(self, choice: int, text: str) -> dict[str, Any]:
        return self._chunk(choice, {"reasoning_content": text, "reasoning": text})

    def _answer_of(self, choice: int, text: str, chunks: list[dict[str, Any]]) -> str:
        """The answer part of ``text`` (all of it without thinking); the thinking part goes
        out as reasoning chunks (added to ``chunks``)."""
        split = self._split_of(choice)
        if split is None:
            return text
        answer = []
        for piece in split.push(text) if text else split.flush():
            if isinstance(piece, ReasoningDelta):
                chunks.append(self._reasoning_chunk(choice, piece.text))
            else:
                answer.append(piece.text)
        return "".join(answer)

    def logprob_entry(self, event: TokenEvent) -> dict[str, Any]:
        assert self.tokens is not None
        return {**self._alt(event.token_id, event.logprob or 0.0),
                "top_logprobs": [self._alt(t.token_id, t.logprob) for t in event.top_logprobs]}

    def _alt(self, token_id: int, logprob: float) -> dict[str, Any]:
        assert self.tokens is not None
        raw = self.tokens.bytes(token_id)
        return {"token": raw.decode("utf-8", "replace"), "logprob": finite_logprob(logprob),
                "bytes": list(raw)}

    def _logprobs(self, events: Sequence[TokenEvent]) -> dict[str, Any] | None:
        if self.tokens is None:
            return None
        return {"content": [self.logprob_entry(e) for e in events
                            if e.token_id >= 0 and e.logprob is not None]}

    def _chunk(self, choice: int, delta: dict[str, Any], finish_reason: str | None = None,
               events: Sequence[TokenEvent] = ()) -> dict[str, Any]:
        return self._envelope(self.chunk_name, [{
            "index": choice, "delta": delta, "logprobs": self._logprobs(events),
            "finish_reason": finish_reason}])

    def _held_of(self, choice: int) -> CallHold:
        held = self._held.get(choice)
        if held is None:
            mode = "undecided" if self.tool_names else "content"
            held = self._held[choice] = CallHold(mode=mode)
        return held

    def _opening(self, choice: int) -> list[dict[str, Any]]:
        """The role chunk that opens a choice's stream (``content`` null, as OpenAI and
        llama-server send it), the first time ``choice`` is seen."""
        if choice in self._started:
            return []
        self._started.add(choice)
        return [self._chunk(choice, {"role": "assistant", "content": None})]

    def on_progress(self, progress: PromptProgress) -> list[dict[str, Any]]:
        """llama-server's progress chunk: a role delta carrying ``prompt_progress``."""
        chunk = self._chunk(0, {"role": "assistant", "content": None})
        chunk["prompt_progress"] = progress_object(progress, self.request)
        return [chunk]

    def on_token(self, event: TokenEvent) -> list[dict[str, Any]]:
        held = self._held_of(event.choice)
        chunks = self._opening(event.choice)
        held.events.append(event)
        if event.text:
            held.text += self._answer_of(event.choice, event.text, chunks)
        if self.tool_names and held.mode != "content":
            held.decide()
        if held.mode != "content" or not held.text:
            return chunks
        chunk = self._chunk(event.choice, {"content": held.text}, events=held.events)
        held.text, held.events = "", []
        return [*chunks, chunk]

    def on_final(self, final: Final) -> list[dict[str, Any]]:
        chunks: list[dict[str, Any]] = []
        for c in choices_of(final):
            held = self._held_of(c.index)
            chunks += self._opening(c.index)
            if self.thinking is not None:
                held.text += self._answer_of(c.index, "", chunks)
            calls = None
            if self.tool_names and held.mode != "content":
                calls = parse_tool_calls(held.text, self.tool_names)
            if calls is not None:
                content, parsed = calls
                delta: dict[str, Any] = {"content": content or None,
                                         "tool_calls": _call_deltas(parsed)}
                chunks.append(self._chunk(c.index, delta, events=held.events))
                chunks.append(self._chunk(c.index, {}, "tool_calls"))
                continue
            if held.text or held.events:
                chunks.append(self._chunk(c.index, {"content": held.text},
                                          events=held.events))
            chunks.append(self._chunk(c.index, {}, c.finish_reason))
        return chunks

    def full(self, final: Final, events: Sequence[TokenEvent] = ()) -> dict[str, Any]:
        choices = []
        for c in choices_of(final):
            text = c.text
            message: dict[str, Any] = {"role": "assistant", "content": text}
            if self.thinking is not None:
                reasoning, text = split_thinking(self.thinking, c.text)
                message = {"role": "assistant", "content": text,
                           "reasoning_content": reasoning or None, "reasoning": reasoning or None}
            finish = c.finish_reason
            calls = parse_tool_calls(text, self.tool_names) if self.tool_names else None
            if calls is not None:
                message["content"] = calls[0] or None
                message["tool_calls"] = [_call(t) for t in calls[1]]
                finish = "tool_calls"
            choices.append({"index": c.index, "message": message,
                            "logprobs": self._logprobs([e for e in events
                                                        if e.choice == c.index]),
                            "finish_reason": finish})
        body = self._with_usage(self._envelope(self.object_name, choices), final)
        if self.verbose is not None:
            body["__verbose"] = self.verbose
        return body


def _call(call: ToolCall) -> dict[str, Any]:
    return {"id": new_call_id(), "type": "function",
            "function": {"name": call.name, "arguments": call.arguments}}


def _call_deltas(calls: Sequence[ToolCall]) -> list[dict[str, Any]]:
    return [{"index": i, **_call(c)} for i, c in enumerate(calls)]
