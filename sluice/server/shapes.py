"""Response bodies: OpenAI chat and completion objects and chunks, and sluice's native
shape. A ``Shape`` turns the engine's events into what one endpoint sends: ``on_token`` and
``on_final`` give the chunks of a stream, ``full`` the one body of a non-streamed answer
(from the same events), so both paths render choices, logprobs and tool calls alike.

With ``n`` > 1 every choice is rendered under its ``index``; a stream interleaves them.
Logprobs are rendered from the events' token ids with the tokenizer's bytes.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import sluice
from sluice.backends.base import Tokenizer
from sluice.backends.chat import ToolCall, parse_tool_calls
from sluice.engine.request import Final, PromptProgress, Request, TokenEvent, TokenLogprob
from sluice.server.core.output import (
    CallHold,
    ReasoningDelta,
    ThinkingSplit,
    new_call_id,
    split_thinking,
)
from sluice.server.core.reasoning import ThinkingTags
from sluice.server.errors import APIError

SYSTEM_FINGERPRINT = f"b{sluice.__version__}-sluice"
"""OpenAI's ``system_fingerprint`` (the serving build; llama-server's starts with ``b`` and
its build number too)."""
LOGPROB_FLOOR = -9999.0
"""What a logprob of -inf is reported as (JSON has no infinity; OpenAI uses this value)."""


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, Any]:
    """OpenAI's ``usage``: prompt, completion and total tokens."""
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def _logprob(value: float) -> float:
    return value if math.isfinite(value) else LOGPROB_FLOOR


@dataclass
class ChoiceText:
    """One choice as it ended: its text and finish reason."""

    index: int
    text: str
    finish_reason: str


def choices_of(final: Final) -> list[ChoiceText]:
    """Every choice of a finished request (one unless ``n`` > 1)."""
    if final.choices:
        return [ChoiceText(c.index, c.text, c.finish_reason) for c in final.choices]
    return [ChoiceText(0, final.text, final.finish_reason)]


class TokenText:
    """Token ids as the text and bytes that logprobs report."""

    def __init__(self, tok: Tokenizer) -> None:
        self._tok = tok

    def bytes(self, token_id: int) -> bytes:
        return self._tok.token_bytes(token_id) if token_id >= 0 else b""

    def text(self, token_id: int) -> str:
        return self.bytes(token_id).decode("utf-8", "replace")


def timings(req: Request, n_predicted: int, now_s: float) -> dict[str, float]:
    """llama-server's ``timings``: prompt tokens computed (``prompt_n``; ``cache_n`` reused)
    and the time from the start to the first token; tokens predicted and the time after the
    first (whose rate counts the decode steps, ``n - 1``: the first token comes with the
    prompt's last pass)."""
    t = req.times
    cached = req.cached_prompt_tokens
    prompt_n = len(req.prompt_tokens) - cached
    first = t.first_token_s
    prompt_ms = 0.0 if first is None or t.started_s is None else (first - t.started_s) * 1e3
    end = t.finished_s if t.finished_s is not None else now_s
    predicted_ms = 0.0 if first is None else max(0.0, end - first) * 1e3
    steps = max(0, n_predicted - 1)
    return {
        "cache_n": cached,
        "prompt_n": prompt_n,
        "prompt_ms": prompt_ms,
        "prompt_per_token_ms": prompt_ms / prompt_n if prompt_n else 0.0,
        "prompt_per_second": prompt_n * 1e3 / prompt_ms if prompt_ms > 0 else 0.0,
        "predicted_n": n_predicted,
        "predicted_ms": predicted_ms,
        "predicted_per_token_ms": predicted_ms / steps if steps else 0.0,
        "predicted_per_second": steps * 1e3 / predicted_ms if predicted_ms > 0 else 0.0,
    }


def progress_timings(req: Request, progress: PromptProgress) -> dict[str, float]:
    """``timings`` while the prompt is computed: the prompt tokens computed so far
    (``prompt_n``, from none at the first report) and the time since the request started,
    nothing predicted yet."""
    prompt_n = progress.processed - progress.cache
    started = req.times.started_s
    prompt_ms = 0.0 if started is None else max(0.0, progress.time_s - started) * 1e3
    return {
        "cache_n": progress.cache,
        "prompt_n": prompt_n,
        "prompt_ms": prompt_ms,
        "prompt_per_token_ms": prompt_ms / prompt_n if prompt_n else 0.0,
        "prompt_per_second": prompt_n * 1e3 / prompt_ms if prompt_ms > 0 else 0.0,
        "predicted_n": 0,
        "predicted_ms": 0.0,
        "predicted_per_token_ms": 0.0,
        "predicted_per_second": 0.0,
    }


def progress_object(progress: PromptProgress, req: Request | None) -> dict[str, int]:
    """llama-server's ``prompt_progress``: ``total``, ``cache`` and ``processed`` prompt
    tokens, and ``time_ms`` since the request started (whole milliseconds)."""
    started = None if req is None else req.times.started_s
    time_ms = 0 if started is None else max(0, int((progress.time_s - started) * 1e3))
    return {"total": progress.total, "cache": progress.cache,
            "processed": progress.processed, "time_ms": time_ms}


class Shape:
    """How one endpoint renders a generative result. Subclasses render one choice's delta,
    end, and full body; this class tracks the stream per choice."""

    object_name = ""
    chunk_name = ""
    done_marker: str | None = "[DONE]"
    """The last ``data:`` line of a stream (``None``: none, its last chunk says so)."""

    openai = False
    """OpenAI's shapes: every body and chunk carries ``system_fingerprint``; with the
    ``request``, usage has ``prompt_tokens_details.cached_tokens`` and the body and usage
    chunk llama-server's ``timings``."""

    def __init__(self, response_id: str, model: str, request: Request | None = None) -> None:
        self.id = response_id
        self.model = model
        self.request = request
        self.created = int(time.time())
        self._started: set[int] = set()

    def _envelope(self, name: str, choices: list[dict[str, Any]]) -> dict[str, Any]:
        body: dict[str, Any] = {"id": self.id, "object": name, "created": self.created,
                                "model": self.model, "choices": choices}
        if self.openai:
            body["system_fingerprint"] = SYSTEM_FINGERPRINT
        return body

    def _with_usage(self, body: dict[str, Any], final: Final) -> dict[str, Any]:
        """``body`` with the final's ``usage`` (and, for OpenAI's shapes with the request,
        its cached prompt tokens and ``timings``)."""
        body["usage"] = usage(final.prompt_tokens, final.completion_tokens)
        if self.openai and self.request is not None:
            body["usage"]["prompt_tokens_details"] = {
                "cached_tokens": self.request.cached_prompt_tokens}
            body["timings"] = timings(self.request, final.completion_tokens,
                                      self.request.times.finished_s or 0.0)
        return body

    # -- streaming ------------------------------------------------------------------------

    def on_token(self, event: TokenEvent) -> list[dict[str, Any]]:
        """The chunks to send for one token event (none while text is held back)."""
        first = event.choice not in self._started
        if not event.text and not first:
            return []
        self._started.add(event.choice)
        return [self.delta(event.text, first, event.choice)]

    def on_final(self, final: Final) -> list[dict[str, Any]]:
        """The chunks that end each choice (after any held-back text)."""
        return [self.end(c.finish_reason, c.index) for c in choices_of(final)]

    def on_progress(self, progress: PromptProgress) -> list[dict[str, Any]]:
        """The chunks that report how far the prompt is computed (none: an endpoint without
        llama-server's ``return_progress``)."""
        return []

    def delta(self, text: str, first: bool, choice: int = 0) -> dict[str, Any]:
        raise NotImplementedError

    def end(self, finish_reason: str, choice: int = 0) -> dict[str, Any]:
        raise NotImplementedError

    def error_chunk(self, err: APIError) -> dict[str, Any]:
        """The chunk that ends a stream whose request failed after its first token."""
        return {"error": {"message": err.message, "type": err.type, "param": None,
                          "code": err.code}}

    def usage_chunk(self, final: Final) -> dict[str, Any]:
        return self._with_usage(self._envelope(self.chunk_name, []), final)

    # -- one body -------------------------------------------------------------------------

    def full(self, final: Final, events: Sequence[TokenEvent] = ()) -> dict[str, Any]:
        raise NotImplementedError


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
        return {"token": raw.decode("utf-8", "replace"), "logprob": _logprob(logprob),
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


class CompletionShape(Shape):
    """``text_completion`` objects and chunks; ``logprobs`` in the legacy shape (tokens,
    token_logprobs, top_logprobs with the sampled token added, text_offset); ``echo`` puts
    the prompt (and its logprobs) first."""

    object_name = "text_completion"
    chunk_name = "text_completion"
    openai = True

    def __init__(self, response_id: str, model: str, *, tokens: TokenText | None = None,
                 echo: str | None = None, prompt_ids: Sequence[int] = (),
                 request: Request | None = None) -> None:
        super().__init__(response_id, model, request)
        self.tokens = tokens
        self.echo = echo
        self.prompt_ids = list(prompt_ids)
        self._offsets: dict[int, int] = {}

    def _logprobs(self, events: Sequence[TokenEvent], choice: int) -> dict[str, Any] | None:
        if self.tokens is None:
            return None
        out: dict[str, Any] = {"tokens": [], "token_logprobs": [], "top_logprobs": [],
                               "text_offset": []}
        offset = self._offsets.get(choice, len(self.echo or ""))
        for e in events:
            if e.token_id < 0 or e.logprob is None:
                continue
            text = self.tokens.text(e.token_id)
            top = {self.tokens.text(t.token_id): _logprob(t.logprob) for t in e.top_logprobs}
            top.setdefault(text, _logprob(e.logprob))
            self._add(out, text, _logprob(e.logprob), top, offset)
            offset += len(text)
        self._offsets[choice] = offset
        return out

    @staticmethod
    def _add(out: dict[str, Any], text: str, logprob: float | None,
             top: dict[str, float] | None, offset: int) -> None:
        out["tokens"].append(text)
        out["token_logprobs"].append(logprob)
        out["top_logprobs"].append(top)
        out["text_offset"].append(offset)

    def _prompt_logprobs(self, final: Final) -> dict[str, Any]:
        assert self.tokens is not None
        out: dict[str, Any] = {"tokens": [], "token_logprobs": [], "top_logprobs": [],
                               "text_offset": []}
        offset = 0
        given = list(final.prompt_logprobs)
        for i, token_id in enumerate(self.prompt_ids):
            text = self.tokens.text(token_id)
            lp = given[i] if i < len(given) else None
            value = None if lp is None else _logprob(lp.logprob)
            self._add(out, text, value, None if value is None else {text: value}, offset)
            offset += len(text)
        return out

    def delta(self, text: str, first: bool, choice: int = 0) -> dict[str, Any]:
        return self._envelope(self.chunk_name, [{"index": choice, "text": text,
                                                 "logprobs": None, "finish_reason": None}])

    def on_token(self, event: TokenEvent) -> list[dict[str, Any]]:
        first = event.choice not in self._started
        text = event.text
        if first and self.echo:
            text = self.echo + text
        if self.tokens is None:
            if not text and not first:
                return []
            self._started.add(event.choice)
            return [self.delta(text, first, event.choice)]
        self._started.add(event.choice)
        chunk = self.delta(text, first, event.choice)
        chunk["choices"][0]["logprobs"] = self._logprobs([event], event.choice)
        return [chunk]

    def on_final(self, final: Final) -> list[dict[str, Any]]:
        chunks = []
        for c in choices_of(final):
            if c.index not in self._started and self.echo:
                chunks.append(self.delta(self.echo, True, c.index))
            chunks.append(self.end(c.finish_reason, c.index))
        return chunks

    def end(self, finish_reason: str, choice: int = 0) -> dict[str, Any]:
        return self._envelope(self.chunk_name, [{"index": choice, "text": "", "logprobs": None,
                                                 "finish_reason": finish_reason}])

    def full(self, final: Final, events: Sequence[TokenEvent] = ()) -> dict[str, Any]:
        choices = []
        for c in choices_of(final):
            logprobs = None
            if self.tokens is not None:
                mine = [e for e in events if e.choice == c.index]
                logprobs = self._logprobs(mine, c.index) or {}
                if self.echo is not None and final.prompt_logprobs:
                    head = self._prompt_logprobs(final)
                    logprobs = {k: head[k] + logprobs[k] for k in head}
            choices.append({"index": c.index, "text": (self.echo or "") + c.text,
                            "logprobs": logprobs, "finish_reason": c.finish_reason})
        return self._with_usage(self._envelope(self.object_name, choices), final)


class InferShape(Shape):
    """sluice's native ``/v1/infer`` result."""

    object_name = "sluice.inference"
    chunk_name = "sluice.inference.chunk"

    def delta(self, text: str, first: bool, choice: int = 0) -> dict[str, Any]:
        return {"id": self.id, "object": self.chunk_name, "model": self.model, "delta": text}

    def end(self, finish_reason: str, choice: int = 0) -> dict[str, Any]:
        return {"id": self.id, "object": self.chunk_name, "model": self.model, "delta": "",
                "finish_reason": finish_reason}

    def full(self, final: Final, events: Sequence[TokenEvent] = ()) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": self.object_name,
            "created": self.created,
            "model": self.model,
            "output": final.text if final.result is None else final.result,
            "finish_reason": final.finish_reason,
            "usage": usage(final.prompt_tokens, final.completion_tokens),
        }


__all__ = ["ChatShape", "CompletionShape", "InferShape", "Shape", "TokenLogprob",
           "TokenText", "choices_of"]
