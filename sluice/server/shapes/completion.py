"""OpenAI's ``text_completion`` objects and chunks, logprobs in the legacy shape."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sluice.engine.request import Final, Request, TokenEvent
from sluice.server.shapes.base import Shape, TokenText, choices_of, finite_logprob


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
            top = {self.tokens.text(t.token_id): finite_logprob(t.logprob) for t in e.top_logprobs}
            top.setdefault(text, finite_logprob(e.logprob))
            self._add(out, text, finite_logprob(e.logprob), top, offset)
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
            value = None if lp is None else finite_logprob(lp.logprob)
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
