"""Response bodies: OpenAI chat and completion objects and chunks, and sluice's native
shape. One class per shape so the streaming code is shared."""

from __future__ import annotations

import time
from typing import Any

from sluice.engine.request import Final
from sluice.server.schemas import usage


class Shape:
    """How one endpoint renders a generative result."""

    object_name = ""
    chunk_name = ""

    def __init__(self, response_id: str, model: str) -> None:
        self.id = response_id
        self.model = model
        self.created = int(time.time())

    def _envelope(self, name: str, choices: list[dict[str, Any]]) -> dict[str, Any]:
        return {"id": self.id, "object": name, "created": self.created, "model": self.model,
                "choices": choices}

    def delta(self, text: str, first: bool) -> dict[str, Any]:
        raise NotImplementedError

    def end(self, finish_reason: str) -> dict[str, Any]:
        raise NotImplementedError

    def usage_chunk(self, final: Final) -> dict[str, Any]:
        body = self._envelope(self.chunk_name, [])
        body["usage"] = usage(final.prompt_tokens, final.completion_tokens)
        return body

    def full(self, final: Final) -> dict[str, Any]:
        raise NotImplementedError


class ChatShape(Shape):
    object_name = "chat.completion"
    chunk_name = "chat.completion.chunk"

    def delta(self, text: str, first: bool) -> dict[str, Any]:
        delta: dict[str, Any] = {"content": text}
        if first:
            delta["role"] = "assistant"
        return self._envelope(
            self.chunk_name, [{"index": 0, "delta": delta, "logprobs": None,
                               "finish_reason": None}]
        )

    def end(self, finish_reason: str) -> dict[str, Any]:
        return self._envelope(
            self.chunk_name, [{"index": 0, "delta": {}, "logprobs": None,
                               "finish_reason": finish_reason}]
        )

    def full(self, final: Final) -> dict[str, Any]:
        body = self._envelope(
            self.object_name,
            [{"index": 0, "message": {"role": "assistant", "content": final.text},
              "logprobs": None, "finish_reason": final.finish_reason}],
        )
        body["usage"] = usage(final.prompt_tokens, final.completion_tokens)
        return body


class CompletionShape(Shape):
    object_name = "text_completion"
    chunk_name = "text_completion"

    def delta(self, text: str, first: bool) -> dict[str, Any]:
        return self._envelope(
            self.chunk_name, [{"index": 0, "text": text, "logprobs": None,
                               "finish_reason": None}]
        )

    def end(self, finish_reason: str) -> dict[str, Any]:
        return self._envelope(
            self.chunk_name, [{"index": 0, "text": "", "logprobs": None,
                               "finish_reason": finish_reason}]
        )

    def full(self, final: Final) -> dict[str, Any]:
        body = self._envelope(
            self.object_name,
            [{"index": 0, "text": final.text, "logprobs": None,
              "finish_reason": final.finish_reason}],
        )
        body["usage"] = usage(final.prompt_tokens, final.completion_tokens)
        return body


class InferShape(Shape):
    """sluice's native ``/v1/infer`` result."""

    object_name = "sluice.inference"
    chunk_name = "sluice.inference.chunk"

    def delta(self, text: str, first: bool) -> dict[str, Any]:
        return {"id": self.id, "object": self.chunk_name, "model": self.model, "delta": text}

    def end(self, finish_reason: str) -> dict[str, Any]:
        return {"id": self.id, "object": self.chunk_name, "model": self.model, "delta": "",
                "finish_reason": finish_reason}

    def full(self, final: Final) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": self.object_name,
            "created": self.created,
            "model": self.model,
            "output": final.text if final.result is None else final.result,
            "finish_reason": final.finish_reason,
            "usage": usage(final.prompt_tokens, final.completion_tokens),
        }
