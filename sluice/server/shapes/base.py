"""What every response shape shares: the ``Shape`` base, which turns the engine's events
into what one endpoint sends (``on_token`` and ``on_final`` give the chunks of a stream,
``full`` the one body of a non-streamed answer, from the same events, so both paths render
choices alike), the choices of a finished request, token text for logprobs, and OpenAI's
``usage``.

With ``n`` > 1 every choice is rendered under its ``index``; a stream interleaves them.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import sluice
from sluice.backends.base import Tokenizer
from sluice.engine.request import Final, PromptProgress, Request, TokenEvent
from sluice.server.errors import APIError
from sluice.server.shapes.timings import timings

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


def finite_logprob(value: float) -> float:
    """``value``, or ``LOGPROB_FLOOR`` for -inf (or NaN)."""
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
